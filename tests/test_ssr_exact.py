"""The project's most important test: greedy SSR equals plain decoding, token for token.

Five tiny random configurations over four architectures (Llama, Llama with GQA and tied
embeddings, Qwen2, Qwen3, GPT-2) and both chat-template styles, many prompts, every extreme the
engine issue lists, and a Hypothesis property test over random settings.
"""

from __future__ import annotations

import functools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from tests.tiny import ARCHS, current_token_only, make_model, position_only, with_tokens

PROMPTS = ["hello world", "class Garden: rose", "Start with 7. 7 plus 5", "héllo 😀 日本語 the lazy dog"]
SMALL = dict(max_think=16, max_answer=20, max_draft=12, drafting="always")  # the drafts' machinery: forked as planned


@functools.cache
def model(arch: str, style: str = "open", seed: int = 0, scale: float = 3.0):
    return make_model(arch, seed=seed, style=style, init_scale=scale)


def final(events):
    return list(events)[-1]


_baseline_cache: dict = {}


def baseline(lm, prompt, cfg):
    key = (lm, lm.eos_ids, lm.markers, prompt, cfg.max_think, cfg.max_answer)  # the object, not id(): ids get reused
    if key not in _baseline_cache:
        _baseline_cache[key] = final(decode_baseline(lm, prompt, cfg))
    return _baseline_cache[key]


def assert_same(lm, prompt, cfg):
    base = baseline(lm, prompt, cfg)
    ssr = final(decode_ssr(lm, prompt, cfg))
    assert ssr.reasoning_ids == base.reasoning_ids, "reasoning differs from baseline"
    assert ssr.answer_ids == base.answer_ids, "answer differs from baseline"
    assert ssr.answer_text == base.answer_text
    return ssr


EXTREMES = {
    "paper-like": dict(draft_start=6),
    "draft-start-0": dict(draft_start=0),
    "draft-start-late": dict(draft_start=15),
    "max-draft-1": dict(draft_start=4, max_draft=1),
    "iterative-3": dict(draft_start=2, num_drafts=3, draft_interval=4),
    "no-suffix": dict(draft_start=6, suffix_recovery=False),
    "no-lookup": dict(draft_start=6, context_lookup=False),
    "spec-1": dict(draft_start=6, max_spec=1),
    "min-match-1": dict(draft_start=6, min_match=1),
    "spec-factor-1": dict(draft_start=6, spec_factor=1.0),
    "think-spec-0": dict(draft_start=6, think_spec=0),
    "think-spec-1": dict(draft_start=2, num_drafts=2, draft_interval=5, think_spec=1),
}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("style", ["open", "model"])
@pytest.mark.parametrize("case", sorted(EXTREMES))
def test_greedy_equality(arch, style, case):
    lm = model(arch, style)
    for prompt in PROMPTS[:2] if style == "model" else PROMPTS:
        assert_same(lm, prompt, RunConfig(**{**SMALL, **EXTREMES[case]}))


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_draft_start_beyond_reasoning_length(arch):
    """The reasoning ends (naturally) before draft_start: no draft is ever made."""
    lm = model(arch)
    base = baseline(lm, PROMPTS[0], RunConfig(**SMALL, draft_start=3))
    stop_at = base.reasoning_ids[3]  # make the 4th reasoning token the end-of-thinking marker
    steered = with_tokens(lm, close=stop_at)
    ssr = assert_same(steered, PROMPTS[0], RunConfig(**SMALL, draft_start=10))
    assert ssr.stats.drafts == 0 and len(ssr.reasoning_ids) <= 4


def _probe(lm, cfg):
    """A prompt and a token its first draft writes (after the template tail) that the reasoning
    does not: steering that token changes the draft, not the reasoning."""
    for prompt in PROMPTS:
        probe = final(decode_ssr(lm, prompt, cfg))
        for tok in (probe.drafts[0][3:] if probe.drafts else []):
            if tok not in probe.reasoning_ids and tok not in lm.prompt_ids(prompt):
                return prompt, probe, tok
    raise AssertionError("precondition: no prompt gives a draft token to steer")


@pytest.mark.parametrize("arch", ["llama", "gpt2", "qwen2"])
def test_end_of_sequence_inside_a_draft(arch):
    lm = model(arch)
    cfg = RunConfig(**SMALL, draft_start=2)
    prompt, probe, eos = _probe(lm, cfg)  # a token the draft writes: now it ends the draft there
    steered = with_tokens(lm, eos=eos)
    ssr = assert_same(steered, prompt, cfg)
    assert len(ssr.drafts[0]) < len(probe.drafts[0])


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_stray_end_of_thinking_in_draft_and_answer(arch):
    lm = model(arch)
    cfg = RunConfig(**SMALL, draft_start=2)
    prompt, _probe_ids, stray = _probe(lm, cfg)  # the draft writes it: make it the end-of-thinking marker
    steered = with_tokens(lm, close=stray)
    assert_same(steered, prompt, cfg)


def test_draft_always_right_is_taken_whole():
    lm = current_token_only(make_model("llama", seed=3, init_scale=3.0))
    cfg = RunConfig(**{**SMALL, "max_draft": 40}, draft_start=4, max_spec=8)
    ssr = assert_same(lm, PROMPTS[0], cfg)
    # every verify forward takes up to max_spec draft tokens, then the verifier's own (bonus) token
    bonus = -(-cfg.max_answer // (cfg.max_spec + 1))
    assert ssr.stats.accepted >= min(len(ssr.drafts[0]), cfg.max_answer) - bonus - 2
    assert ssr.stats.forward_calls < final(decode_baseline(lm, PROMPTS[0], cfg)).stats.forward_calls


def test_draft_always_wrong_still_exact():
    lm = position_only(make_model("gpt2", seed=5))
    cfg = RunConfig(**SMALL, draft_start=2, context_lookup=False)
    ssr = assert_same(lm, PROMPTS[0], cfg)
    assert ssr.stats.accepted == 0


def test_several_drafts_all_recorded():
    lm = model("llama")
    cfg = RunConfig(**SMALL, draft_start=1, num_drafts=4, draft_interval=3)
    ssr = assert_same(lm, PROMPTS[1], cfg)
    assert ssr.stats.drafts == 4 and len(ssr.drafts) == 4


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arch=st.sampled_from(ARCHS),
    prompt=st.sampled_from(PROMPTS),
    max_think=st.integers(1, 24),
    draft_start=st.integers(0, 23),
    max_draft=st.integers(1, 24),
    num_drafts=st.integers(1, 3),
    draft_interval=st.integers(1, 8),
    max_spec=st.integers(1, 10),
    min_match=st.integers(1, 3),
    max_answer=st.integers(1, 24),
    suffix=st.booleans(),
    lookup=st.booleans(),
)
def test_property_random_settings(arch, prompt, max_think, draft_start, max_draft, num_drafts, draft_interval,
                                  max_spec, min_match, max_answer, suffix, lookup):
    if draft_start >= max_think:
        draft_start = max_think - 1
    cfg = RunConfig(max_think=max_think, draft_start=draft_start, max_draft=max_draft, num_drafts=num_drafts,
                    draft_interval=draft_interval, max_spec=max_spec, min_match=min_match, max_answer=max_answer,
                    suffix_recovery=suffix, context_lookup=lookup)
    assert_same(model(arch), prompt, cfg)


@pytest.mark.parametrize("arch", ARCHS)
def test_reasoning_lookup_with_holes_is_exact(arch, monkeypatch):
    """Rows that speculate while drafts ride take different numbers of tokens per step; the slots
    a row rejected become holes its mask hides. Greedy output must not change, and holes must
    really occur (else this test would prove nothing)."""
    from engine.runtime.batch import RowBatch

    holes = []
    keep = RowBatch.keep

    def counting_keep(self, kept):
        keep(self, kept)
        holes.append(self.valid is not None and not bool(self.valid.all()))

    monkeypatch.setattr(RowBatch, "keep", counting_keep)
    lm = model(arch)
    cfg = RunConfig(max_think=48, max_answer=24, max_draft=30, draft_start=3, num_drafts=2, draft_interval=9,
                    drafting="always")
    recovered = 0
    for prompt in PROMPTS:
        for spec in (1, 3, 8):
            events = list(decode_ssr(lm, prompt, cfg.replace(think_spec=spec)))
            assert events[-1].reasoning_ids == baseline(lm, prompt, cfg).reasoning_ids
            assert events[-1].answer_ids == baseline(lm, prompt, cfg).answer_ids
            recovered += sum(getattr(e, "stream", None) == "reasoning" and e.status == "recovered" for e in events)
            # drafts are greedy too: speculating only changes how far they get, not what they say
            plain = final(decode_ssr(lm, prompt, cfg.replace(think_spec=0))).drafts
            for fast, slow in zip(events[-1].drafts, plain, strict=True):
                common = min(len(fast), len(slow))
                assert fast[:common] == slow[:common], "a speculating draft row wrote something else"
    assert any(holes), "no step left a hole: the masked path was not exercised"
    assert recovered, "no reasoning token came from a lookup"
