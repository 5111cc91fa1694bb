"""SSR and RSD on every model family: sliding windows, hybrid recurrent layers, scaled RoPE.

Greedy SSR must equal plain decoding token for token on each family, across the settings that
reach every corner of the engine (draft at the first, a middle and the last reasoning token,
iterative drafts, reasoning lookups, one-token verifies, tiny budgets, an end of sequence inside
the reasoning and inside a draft, a stray end-of-thinking marker, multi-byte text); RSD's plumbing
must reduce to the draft alone at threshold 0 and to the target alone above 1, every role played
by the family's model (so the draft's, the PRM's and the target's rollbacks all run on it).
"""

from __future__ import annotations

import functools

import pytest
import torch

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.rsd.loop import decode_rsd
from engine.methods.rsd.prm import MathShepherdScorer
from engine.methods.ssr.loop import decode_ssr
from engine.runtime.cache import checkpoint, crop, restore, seq_length
from tests.families import RECURRENT, SCALED_ROPE, SLIDING, SWITCH, family_model
from tests.numeric import bug_id, expect, gap
from tests.tiny import with_tokens

SMALL = dict(max_think=16, max_answer=20, max_draft=14, drafting="always")  # the drafts' machinery: forked as planned
SETTINGS = {
    "draft-at-0": dict(draft_start=0),
    "draft-at-1": dict(draft_start=1),
    "draft-mid": dict(draft_start=7, think_spec=3),
    "draft-last": dict(draft_start=15, max_spec=64),
    "iterative-think-spec": dict(draft_start=1, num_drafts=3, draft_interval=4, think_spec=2, min_match=1),
    "one-token-verify": dict(draft_start=3, max_spec=1, min_match=4),
    "tiny-budgets": dict(max_think=2, max_answer=3, max_draft=2, draft_start=1),
}
PROMPTS = ("hello world", "héllo 😀 日本語 <think> stray </think>")


def final(events):
    return list(events)[-1]


@functools.cache
def baseline(lm, prompt, max_think, max_answer):
    return final(decode_baseline(lm, prompt, RunConfig(max_think=max_think, max_answer=max_answer)))


def assert_same(lm, prompt, cfg):
    base = baseline(lm, prompt, cfg.max_think, cfg.max_answer)
    ssr = final(decode_ssr(lm, prompt, cfg))
    assert ssr.reasoning_ids == base.reasoning_ids, "reasoning differs from baseline"
    assert ssr.answer_ids == base.answer_ids, "answer differs from baseline"
    return ssr


@pytest.mark.parametrize("setting", sorted(SETTINGS))
@pytest.mark.parametrize("family", [*SLIDING, *RECURRENT])
def test_greedy_ssr_equals_baseline(family, setting):
    lm = family_model(family)
    for prompt in PROMPTS:
        assert_same(lm, prompt, RunConfig(**{**SMALL, **SETTINGS[setting]}))


@pytest.mark.parametrize("family", [*SLIDING, *RECURRENT])
def test_greedy_ssr_with_its_lookups_alone_equals_baseline(family):
    """The ablation ``ssr-lookups`` (SSR's loop, no drafts): lookups in the reasoning (think_spec) and
    the answer, one-token and wide verifies, every token plain decoding's."""
    lm = family_model(family)
    for setting in ("draft-mid", "iterative-think-spec", "one-token-verify"):
        cfg = RunConfig(**{**SMALL, **SETTINGS[setting]})
        for prompt in PROMPTS:
            base = baseline(lm, prompt, cfg.max_think, cfg.max_answer)
            alone = final(decode_ssr(lm, prompt, cfg, method="ssr-lookups", drafts=False))
            assert (alone.reasoning_ids, alone.answer_ids) == (base.reasoning_ids, base.answer_ids), setting
            assert alone.stats.drafts == 0 and alone.stats.method == "ssr-lookups"


LONG = "Write a Python class Garden with fields rose, tulip and daisy, each its letter count times 3. " * 3


@pytest.mark.parametrize("family", [*SLIDING, *RECURRENT])
def test_long_prompt_in_float32(family):
    """A prompt of ~300 tokens (dozens of windows) in float32, as a user's CPU runs it."""
    lm = family_model(family, dtype=torch.float32)
    assert len(lm.prompt_ids(LONG)) > 250
    assert_same(lm, LONG, RunConfig(**SMALL, draft_start=4, think_spec=2, num_drafts=2, draft_interval=6))


@pytest.mark.parametrize("family", ["gemma-4-e4b-it", "qwen3.5-4b", "mistral-window", "lfm2"])
def test_end_of_sequence_inside_the_reasoning_and_inside_a_draft(family):
    lm = family_model(family)
    cfg = RunConfig(**SMALL, draft_start=2)
    probe = final(decode_ssr(lm, PROMPTS[0], cfg))
    in_draft = next(t for t in probe.drafts[0][3:] if t not in probe.reasoning_ids)
    steered = assert_same(with_tokens(lm, eos=in_draft), PROMPTS[0], cfg)
    assert len(steered.drafts[0]) < len(probe.drafts[0])
    ended = assert_same(with_tokens(lm, eos=probe.reasoning_ids[5]), PROMPTS[0], cfg)
    assert ended.answer_ids == [] and len(ended.reasoning_ids) <= 5


@pytest.mark.parametrize("family", [*SLIDING, *RECURRENT])
def test_rsd_plumbing(family):
    target, draft, prm = family_model(family), family_model(family, seed=1), family_model(family, seed=2)
    cfg = dict(max_think=30, max_answer=10, max_step_tokens=5, max_steps=8)

    def run(mode, threshold, scorer=None):
        scorer = MathShepherdScorer(prm) if scorer is None else scorer
        return final(decode_rsd(target, draft, scorer, "Start with 7", RunConfig(**cfg, threshold=threshold), mode))

    for scorer in (None, "target-likelihood"):
        assert run("rsd", 0.0, scorer).reasoning_ids == run("draft", 0.7).reasoning_ids
        rewritten = run("rsd", 1.01, scorer)
        assert rewritten.reasoning_ids == run("target", 0.7).reasoning_ids and rewritten.stats.rsd.steps_rejected > 0


# ----------------------------------------------------------------------------- the runtime's rollbacks

def _at(lm, tokens, cache, position):
    """Logits ``[T, V]`` of ``tokens`` appended to ``cache`` (whatever it holds) at ``position``.."""
    positions = torch.arange(position, position + len(tokens))[None]
    return lm.forward(torch.tensor([tokens]), cache, seq_length(cache), positions=positions)[0]


@pytest.mark.numeric
@pytest.mark.parametrize("bug", [None, "rolled-back-too-far"], ids=bug_id)
@pytest.mark.parametrize("family", ["qwen3.5-4b", "nemotron-h", "gemma-4-e4b-it"])
def test_rollback_restores_the_exact_state(family, bug):
    """Feed, roll back, feed again: the logits equal a cache that never saw the rolled-back tokens
    (within rounding: ``tests.numeric``; the companion rolls back one token too far)."""
    lm = family_model(family)
    ids = lm.prompt_ids("hello world")
    straight, rolled = lm.new_cache(), lm.new_cache()
    lm.step_logits(ids[:20], straight, 0)
    lm.step_logits(ids[:20], rolled, 0)
    ckpt = checkpoint(rolled, 20)
    lm.step_logits(ids[20:27], rolled, 20)  # a verify that will be rejected past its first 2 tokens
    lm.rewind(rolled, ckpt, ids[20:22] if bug is None else ids[20:21])
    lm.step_logits(ids[20:22], straight, 20)
    assert seq_length(straight) == 22 and seq_length(rolled) == (22 if bug is None else 21)
    expected = lm.step_logits(ids[22:26], straight, 22)
    expect(gap(_at(lm, ids[22:26], rolled, 22), expected, lm), bug)
    restore(rolled, ckpt)  # a checkpoint stays valid after use
    assert seq_length(rolled) == 20


@pytest.mark.numeric
@pytest.mark.parametrize("bug", [None, "rolled-back-too-far"], ids=bug_id)
def test_sliding_layers_keep_every_token_so_a_crop_past_the_window_works(bug):
    lm = family_model("mistral-window")  # window of 6
    cache = lm.new_cache()
    ids = lm.prompt_ids("hello world")
    lm.step_logits(ids[:25], cache, 0)
    crop(cache, 12 if bug is None else 11)
    again = _at(lm, ids[12:20], cache, 12)
    fresh = lm.new_cache()
    expect(gap(again, lm.step_logits(ids[:20], fresh, 0)[12:], lm), bug)
    assert not lm.layout.holes_ok and family_model("qwen3.5-4b").layout.kind == "recurrent"


# ----------------------------------------------------------------------------- position-scaled RoPE

@pytest.mark.parametrize("family", SCALED_ROPE)
def test_baseline_matches_generate_across_the_switch(family):
    """A 22-token prompt and 30 reasoning tokens pass the switch at 40 positions: our plain loop
    re-encodes (longrope) or grows its frequencies (dynamic) exactly as ``generate()`` does."""
    lm = family_model(family)
    ids = lm.prompt_ids("hi")
    assert len(ids) < SWITCH < len(ids) + 30
    ours = baseline(lm, "hi", 30, 4).reasoning_ids[:29]  # the 30th is the budget-forced end of thinking
    lm.begin_run()
    with torch.inference_mode():
        theirs = lm.model.generate(torch.tensor([ids]), max_new_tokens=len(ours), do_sample=False, min_new_tokens=1,
                                   eos_token_id=None, pad_token_id=0)[0, len(ids):].tolist()
    assert ours == theirs
    # the dynamic state is reset per run: a long run first does not change the next one
    final(decode_baseline(lm, "a much longer prompt " * 4, RunConfig(max_think=30, max_answer=2)))
    assert final(decode_baseline(lm, "hi", RunConfig(max_think=30, max_answer=4))).reasoning_ids[:29] == ours


ACROSS = {  # SSR settings whose runs pass longrope's switch point (40) in every phase, with lookups and holes
    "in-the-reasoning": dict(max_think=30, max_answer=10, max_draft=8, draft_start=4),
    "drafts-ahead": dict(max_think=30, max_answer=10, max_draft=14, draft_start=8, num_drafts=3, draft_interval=4),
    "lookups-and-holes": dict(max_think=30, max_answer=12, max_draft=10, draft_start=3, think_spec=4, min_match=1,
                              num_drafts=2, draft_interval=9),
    "at-the-forced-end": dict(max_think=18, max_answer=12, max_draft=6, draft_start=5, think_spec=3, min_match=1),
    "in-the-answer": dict(max_think=8, max_answer=30, max_draft=20, draft_start=2, max_spec=16, min_match=1),
    "one-token-verify": dict(max_think=10, max_answer=24, max_draft=12, draft_start=1, max_spec=1),
}


@pytest.mark.parametrize("setting", sorted(ACROSS))
def test_ssr_equals_baseline_across_the_longrope_switch(setting):
    """SSR past longrope's switch point: no row is fed up to it before the main row, the main row's
    first forward past it re-encodes every live row (as plain decoding re-encodes its sequence), and
    greedy SSR equals plain decoding token for token, whichever phase the switch falls in."""
    lm = family_model("phi3-longrope")
    for prompt in ("hi", "ok?", "hello world"):
        cfg = RunConfig(**ACROSS[setting])
        base = baseline(lm, prompt, cfg.max_think, cfg.max_answer)
        n = len(lm.prompt_ids(prompt))
        assert n < SWITCH < n + len(base.reasoning_ids) + len(base.answer_ids)
        assert_same(lm, prompt, cfg)


@pytest.mark.parametrize("broken", ["no-re-encode", "no-limits"])
def test_the_longrope_checks_can_fail(broken, monkeypatch):
    """Without the re-encode, or with rows fed up to the switch point early, SSR diverges from plain
    decoding on the same runs: the test above can fail."""
    from engine.runtime.rope import Rope

    lm = family_model("phi3-longrope")
    monkeypatch.setattr(Rope, "crosses" if broken == "no-re-encode" else "limits", lambda self, *a: None)
    runs = [(prompt, RunConfig(**ACROSS[s])) for s in ("in-the-reasoning", "drafts-ahead", "lookups-and-holes")
            for prompt in ("hi", "hello world")]
    diverged = 0
    for prompt, cfg in runs:
        base = baseline(lm, prompt, cfg.max_think, cfg.max_answer)
        ssr = final(decode_ssr(lm, prompt, cfg))
        diverged += (ssr.reasoning_ids, ssr.answer_ids) != (base.reasoning_ids, base.answer_ids)
    assert diverged > 0


@pytest.mark.numeric
@pytest.mark.parametrize("bug", [None, "no-re-encode"], ids=bug_id)
def test_the_re_encode_gives_rows_of_other_lengths_holes(bug, monkeypatch):
    """Rows of different lengths at the switch point (the main row ahead of a draft, as when its
    lookups were accepted more often): the re-encode gives the shorter row holes, and the main row's
    logits at and after the switch equal plain decoding's re-encoded sequence (within rounding:
    ``tests.numeric``; the companion skips the re-encode)."""
    from engine.runtime.batch import RowBatch
    from engine.runtime.cached import CachedModel
    from engine.runtime.rope import Rope

    lm = family_model("phi3-longrope")
    ids = [(7 * i + 3) % 200 + 5 for i in range(48)]
    plain = CachedModel(lm, 64)  # plain decoding: re-encodes its sequence at the switch
    plain.feed(ids[:40])
    expected = torch.stack([plain.feed(ids[40:41]), plain.feed(ids[41:42]), plain.feed(ids[42:43])])
    if bug:
        monkeypatch.setattr(Rope, "crosses", lambda self, *a: False)
    prefix = ids[:35]
    cache = lm.new_cache(64, rows=2)
    lm.step_logits(prefix, cache, 0)
    batch = RowBatch(lm, cache, len(prefix), prefix)
    batch.fork()
    batch.forward([ids[35:38], ids[40:41]])
    batch.keep([3, 1])  # row 0 at 38 tokens, row 1 at 36: two holes
    assert batch.limits(1) == [2, 4]  # nothing reaches the switch (40) before row 0 does
    batch.forward([ids[38:40], ids[41:42]])
    batch.keep([2, 1])  # row 0 at 40: its next forward passes the switch
    assert batch.limits(1) is None
    crossing = batch.forward([ids[40:41], ids[42:43]])[0, 0]
    batch.keep([1, 1])
    assert bug or (batch.valid is not None and batch.positions == [41, 38])
    after = batch.forward([ids[41:43], ids[43:44]])[0]
    expect(gap(torch.cat([crossing[None], after]), expected, lm), bug)


def test_dynamic_ntk_refuses_ssr_past_the_switch_with_the_measured_reason():
    """Dynamic NTK: a 7-token forward across the switch point gives other logits than plain
    decoding's one-token forwards, because the frequencies follow the forward's longest position;
    SSR is refused there with that reason, and is exact below it."""
    lm = family_model("llama-dynamic")
    ids = lm.prompt_ids("hello world, once more")[:SWITCH] + list(range(3, 9))
    lm.begin_run()
    wide = lm.step_logits(ids, lm.new_cache(), 0)[SWITCH - 1 :]  # [7, V]
    lm.begin_run()
    cache = lm.new_cache()
    one = [lm.step_logits(ids[:SWITCH], cache, 0)[-1]]
    one += [lm.step_logits([t], cache, SWITCH + j)[0] for j, t in enumerate(ids[SWITCH:])]
    assert float((wide - torch.stack(one)).abs().max()) > 1e-3  # float64: far beyond rounding
    with pytest.raises(ValueError, match="rope_type 'dynamic'.*past 40 tokens.*not exact"):
        list(decode_ssr(lm, "hi", RunConfig(max_think=16, max_answer=8, max_draft=12, draft_start=2)))
    assert_same(lm, "hi", RunConfig(max_think=6, max_answer=4, max_draft=5, draft_start=2))
