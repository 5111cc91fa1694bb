"""Capability probes (``engine.runtime.probe``): what SSR relies on, measured on the model itself.

Every family runs plain decoding; greedy SSR equals it token for token, or is refused before the
run with the measured reason (never a crash mid-run, never a silent divergence); a model whose
multi-token forward ignores its state is routed one token at a time, and the run says so; a
deliberately broken rollback makes the probe refuse SSR and RSD.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.rsd.writer import LocalWriter
from engine.methods.ssr.loop import decode_ssr
from engine.runtime import probe
from engine.runtime.model import LoadedModel
from engine.runtime.probe import MethodRefused, capabilities, tolerance
from tests.families import LINEAR_MLA, MIXED, OWN_CACHE, RECURRENT, SLIDING, SSR_REFUSED, STATE_SPACE, family_model
from tests.family_sweep import plain_matches_generate, tiny_model
from tests.tiny import make_model, make_tokenizer

SMALL = dict(max_think=16, max_answer=20, max_draft=14)
SETTINGS = (dict(draft_start=7, think_spec=3), dict(draft_start=3, max_spec=1, min_match=4),
            dict(draft_start=1, num_drafts=3, draft_interval=4, think_spec=2, min_match=1))
PROMPTS = ("hello world", "héllo 😀 <think> stray </think>")
ONE_TOKEN = {"mamba", "falcon-mamba", "jamba"}  # Mamba-1 mixers: a multi-token forward starts from a zero state


def _fresh(lm: LoadedModel) -> LoadedModel:
    """The same weights in a new LoadedModel: no probe result kept, no route chosen."""
    return LoadedModel(lm.model, lm.tokenizer, lm.model_id + "-fresh", lm.markers)


def _tokens(done) -> tuple[list[int], list[int]]:
    return done.reasoning_ids, done.answer_ids


@pytest.mark.parametrize("family", [*STATE_SPACE, *MIXED])
def test_greedy_ssr_equals_baseline_on_more_families(family):
    lm = family_model(family)
    for prompt in PROMPTS:
        base = list(decode_baseline(lm, prompt, RunConfig(**SMALL)))[-1]
        for setting in SETTINGS:
            ssr = list(decode_ssr(lm, prompt, RunConfig(**SMALL, **setting)))[-1]
            assert _tokens(ssr) == _tokens(base), (family, prompt, setting)
            assert ssr.stats.verify == capabilities(lm).verify


@pytest.mark.parametrize("family", sorted(ONE_TOKEN))
def test_a_multi_token_forward_that_ignores_the_state_is_found_and_routed(family):
    """Mamba-1's scan runs a multi-token forward from a zero state: the probe measures it, routes
    later multi-token forwards one token at a time, and the run says so."""
    caps = capabilities(_fresh(family_model(family)))
    multi = caps.check("multi-token")
    assert not multi.ok and multi.diff > 100 * caps.tolerance  # far beyond rounding, not a near miss
    assert caps.one_token_steps and caps.check("one-token steps").diff == 0.0  # float64: bitwise on that route
    assert caps.verify.startswith("one token per step")


@pytest.mark.parametrize("family", ["qwen3.5-4b", "nemotron-h", "gemma-4-e4b-it", "mistral-window", "gpt2"])
def test_families_that_keep_their_state_verify_k_tokens_per_forward(family):
    caps = capabilities(_fresh(family_model(family)))
    assert all(c.ok for c in caps.checks), [str(c) for c in caps.checks]
    assert not caps.one_token_steps and caps.verify == "k tokens per forward"
    assert caps.check("holes") is not None or not family_model(family).layout.holes_ok


def test_one_token_steps_make_plain_decoding_right_too():
    """Plain decoding feeds the forced end-of-thinking tail in one forward: on Jamba that forward
    ignored the state, so the unprobed baseline's answer was wrong. Probed, it equals one-token
    decoding of the same sequence."""
    lm = _fresh(family_model("jamba"))
    cfg = RunConfig(max_think=6, max_answer=8)
    done = list(decode_baseline(lm, "hello", cfg))[-1]
    assert lm.capabilities.one_token_steps
    seq = lm.prompt_ids("hello") + done.reasoning_ids + done.answer_ids
    cache = lm.new_cache(len(seq) + 4)
    lm.capabilities = dataclasses.replace(lm.capabilities, one_token_steps=False)
    prompt = len(lm.prompt_ids("hello"))
    logits = [lm.step_logits(seq[:prompt], cache, 0)[-1]]
    logits += [lm.step_logits([t], cache, prompt + j)[0] for j, t in enumerate(seq[prompt:-1])]
    generated = [int(x.argmax()) for x in logits]
    forced = set(lm.markers.close_ids)
    picked = [(j, t) for j, t in enumerate(seq[prompt:]) if t not in forced]
    assert all(generated[j] == t for j, t in picked), "a token the model picked is not its greedy choice"


@pytest.mark.parametrize("family, check", sorted(SSR_REFUSED.items()))
def test_ssr_is_refused_before_the_run_where_a_check_fails(family, check):
    lm = family_model(family)
    list(decode_baseline(lm, "hello", RunConfig(**SMALL)))  # plain decoding runs
    events = []
    with pytest.raises(MethodRefused, match=f"SSR is refused on .*{check}.*plain decoding still works"):
        events.extend(decode_ssr(lm, "hello", RunConfig(**SMALL, draft_start=3)))
    assert events == []  # refused before the first event, not mid-run


def test_a_model_that_cannot_decode_is_refused_before_the_run(monkeypatch):
    """One-token decoding itself raises (as MiniMax's did on the engine's cache before it ran on its
    own): plain decoding and SSR are refused before their first event, with the error."""
    lm = _fresh(make_model("llama", seed=4, style="open"))

    def broken(self, tokens, cache, start):
        raise ValueError("this model refuses the cache")

    monkeypatch.setattr(LoadedModel, "step_logits", broken)
    for decode in (decode_baseline, decode_ssr):
        events = []
        with pytest.raises(MethodRefused, match="refused on .*one-token decoding: raised ValueError: this model refuses"):
            events.extend(decode(lm, "hello", RunConfig(**SMALL, draft_start=3)))
        assert events == []


@pytest.mark.parametrize("family, own", [("minimax", "MiniMaxCache"), ("deepseek-v4", "DynamicCache")])
def test_a_model_that_needs_its_own_cache_runs_on_it(family, own):
    """MiniMax refuses any cache class but its own; DeepSeek-V4's compressor layers are kinds the
    SlotCache does not know: both run on the cache transformers builds for them, and plain
    decoding picks what generate()'s path (that cache, one token a forward) picks. (SSR: exact on
    MiniMax, refused on DeepSeek-V4: ``SSR_REFUSED``.)"""
    lm = family_model(family)
    assert lm.layout.own == own and lm.layout.recurrent and not lm.layout.holes_ok
    caps = capabilities(lm)
    assert caps.check("rollback").ok and caps.check("fork").ok  # by checkpoint and re-read
    assert not caps.failed(rollbacks=False), [str(c) for c in caps.checks]
    base = list(decode_baseline(lm, PROMPTS[0], RunConfig(**SMALL)))[-1]
    assert plain_matches_generate(lm, base, PROMPTS[0]) is None
    assert base.answer_ids  # it ran to an answer


@pytest.mark.parametrize("family", [*OWN_CACHE, *LINEAR_MLA])
def test_greedy_ssr_equals_baseline_on_own_caches_and_kimi_linear(family):
    lm = family_model(family)
    base = list(decode_baseline(lm, PROMPTS[0], RunConfig(**SMALL)))[-1]
    for setting in SETTINGS[::2]:
        ssr = list(decode_ssr(lm, PROMPTS[0], RunConfig(**SMALL, **setting)))[-1]
        assert _tokens(ssr) == _tokens(base), (family, setting)


def test_a_model_whose_mask_does_not_hide_holes_runs_ssr_without_them():
    """MPT places ALiBi by slot, not by the positions passed: a hole shifts every later bias. The
    probe finds it, the model's rows hold no holes (one token per row per step while drafts
    ride), and SSR still equals plain decoding."""
    lm = tiny_model("mpt", make_tokenizer("open"))
    caps = capabilities(lm)
    assert not caps.check("holes").ok and not caps.failed() and not lm.holes_ok
    assert "rows hold no holes" in caps.verify
    base = list(decode_baseline(lm, PROMPTS[0], RunConfig(**SMALL)))[-1]
    for setting in SETTINGS:
        ssr = list(decode_ssr(lm, PROMPTS[0], RunConfig(**SMALL, **setting)))[-1]
        assert _tokens(ssr) == _tokens(base), setting
        assert ssr.stats.verify == caps.verify


def test_the_multi_token_check_runs_at_several_offsets():
    """DeepSeek-V3.2's indexer picks its top-k differently in a multi-token forward, even from an
    empty state, at most prefix lengths: the probe finds it at its several widths and offsets
    (routing later forwards one token at a time), and since SSR prefills all but the last prompt
    token where plain decoding prefills all, SSR is refused rather than let diverge."""
    caps = capabilities(_fresh(family_model("deepseek-v32")))
    assert not caps.check("multi-token").ok and caps.one_token_steps
    assert caps.check("rollback").ok and caps.check("fork").ok  # its own cache's rollbacks are right
    assert not caps.check("split prefill").ok


def test_a_broken_rollback_refuses_ssr_and_rsd(monkeypatch):
    """The companion check: a rollback that does nothing (the cache keeps what it was fed) is what
    the probe exists to catch."""
    lm = _fresh(make_model("llama", seed=1, style="open"))
    monkeypatch.setattr(LoadedModel, "rewind", lambda self, cache, ckpt, kept: None)
    caps = capabilities(lm)
    assert not caps.check("rollback").ok
    with pytest.raises(MethodRefused, match="rollback"):
        next(decode_ssr(lm, "hello", RunConfig(**SMALL, draft_start=3)))
    with pytest.raises(MethodRefused, match="RSD .*rollback"):
        LocalWriter(lm, RunConfig(), 64, "draft")
    list(decode_baseline(lm, "hello", RunConfig(**SMALL)))  # plain decoding does not roll back: it runs


def test_the_probe_runs_once_per_model():
    lm = _fresh(make_model("llama", seed=2, style="open"))
    calls = []
    hook = lm.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        first = capabilities(lm)
        measured = len(calls)
        list(decode_ssr(lm, "hi", RunConfig(**SMALL, draft_start=2)))
        during_run = len(calls) - measured
        second = capabilities(lm)
        assert second is first and measured > 0
        run = list(decode_ssr(lm, "hi", RunConfig(**SMALL, draft_start=2)))[-1]
        assert len(calls) - measured - during_run == run.stats.forward_calls  # no probe forwards the second time
    finally:
        hook.remove()


def test_the_probe_leaves_the_run_being_set_up_as_it_was():
    lm = _fresh(make_model("llama", seed=3, style="open"))
    lm.begin_run(exact=True)
    capabilities(lm)
    assert lm.exact  # an RSD writer probes after its loop's begin_run


def test_probe_length_crosses_every_threshold_the_config_names():
    for family, key in (("mistral-window", "sliding_window"), ("nemotron-h", "chunk_size"),
                        ("deepseek-v32", "index_topk")):
        config = family_model(family).model.config
        assert probe.probe_length(config, None) > getattr(config, key)


def test_tolerance_is_rounding_not_a_lost_state():
    assert tolerance(torch.float64) == tolerance(torch.float32) < 1e-3 < tolerance(torch.bfloat16) < 0.1


def test_ssr_counts_its_flops_from_the_tokens_it_feeds():
    """SSR's FLOPs: 2 x parameters x every token position its forwards computed (drafts and
    padding included), counted by a hook on the model itself."""
    lm = family_model("mistral-window")
    capabilities(lm)
    fed = []
    hook = lm.model.register_forward_hook(lambda mod, args, kwargs, out: fed.append(kwargs["input_ids"].numel()),
                                          with_kwargs=True)
    try:
        done = list(decode_ssr(lm, "hello", RunConfig(**SMALL, draft_start=3, num_drafts=2, draft_interval=4)))[-1]
    finally:
        hook.remove()
    assert done.stats.target_tokens == sum(fed) and done.stats.forward_calls == len(fed)
    assert done.stats.flops == 2.0 * lm.num_parameters * sum(fed)


@pytest.mark.parametrize("family", [*SLIDING[:2], *RECURRENT[:2]])
def test_the_probe_agrees_with_the_families_already_tested(family):
    caps = capabilities(family_model(family))
    assert not caps.failed() and not caps.one_token_steps


def test_the_probes_verdicts_are_one_frozen_record_on_the_model():
    """The routes a run takes are read from the probe's record (``lm.capabilities``), derived from its
    checks: nothing else on the model says them, and the record cannot be changed in place."""
    from engine.runtime.capabilities import UNPROBED, Capabilities, Check

    lm = _fresh(make_model("llama"))
    assert lm.capabilities is UNPROBED and not (UNPROBED.one_token_steps or UNPROBED.holes_unsafe
                                                  or UNPROBED.shared_unsafe)
    caps = capabilities(lm)
    assert lm.capabilities is caps and caps is not UNPROBED
    assert not {"one_token_steps", "holes_unsafe", "shared_unsafe", "_capabilities"} & set(vars(lm))
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.one_token_steps = True
    holes = Capabilities((Check("holes", False, 1.0), Check("shared forks", True, 0.0)), False, 8, 1e-3, 0.1)
    assert holes.holes_unsafe and not holes.shared_unsafe and "rows hold no holes" in holes.verify
    shared = Capabilities((Check("holes", True, 0.0), Check("shared forks", False, 1.0)), False, 8, 1e-3, 0.1)
    assert shared.shared_unsafe and not shared.holes_unsafe and not shared.failed()  # a route, not a refusal
