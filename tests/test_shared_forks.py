"""Shared forks (long reasoning): SSR's drafts read the main row's prefix from one buffer row
instead of each holding a copy of it (``engine.runtime.batch``), where the model allows; elsewhere
they copy it, and the run says which path it took and why.

Greedy SSR must equal plain decoding token for token through both paths, on every family the
tests build that can take shared forks and on ones that cannot, at contexts of hundreds of
tokens; the cache must hold the prefix once; a shared cache that runs out of room compacts the
slots no row sees rather than growing.
"""

from __future__ import annotations

import functools

import pytest
import torch

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from engine.runtime.batch import RowBatch, unshared
from engine.runtime.probe import capabilities
from tests.families import RECURRENT, SCALED_ROPE, SLIDING, family_model
from tests.tiny import ARCHS, make_model, with_tokens

# four drafts spread over a long reasoning, with reasoning lookups (holes in every row) in the second
LONG = dict(max_think=240, max_answer=24, max_draft=30, drafting="always", num_drafts=4, draft_start=10,
            draft_interval=50)
SETTINGS = {"one-token": dict(think_spec=0), "reasoning-lookups": dict(think_spec=3, min_match=1)}
SHARED_FAMILIES = ("qwen3-moe", "deepseek-v3", "glm4-moe", "gpt2")  # experts, latent attention, Conv1D
PROMPT = "class Garden: rose"


def _final(events):
    return list(events)[-1]


@functools.cache
def _tiny(arch: str):
    return make_model(arch, init_scale=3.0)


def _thinking(lm, cfg: RunConfig):
    """``lm`` with an end of sequence and an end-of-thinking marker its greedy reasoning never
    picks before the budget (tried from the vocabulary's end), so a random model reasons at length."""
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    for eos in range(vocab - 1, vocab - 40, -2):
        steered = with_tokens(lm, eos=eos, close=eos - 1)
        if _final(decode_baseline(steered, PROMPT, cfg)).stats.reasoning_tokens == cfg.max_think:
            return steered
    raise AssertionError("no token pair kept this model reasoning to the budget")


def _same(lm, cfg: RunConfig, way: str):
    lm.share_forks = way == "shared"
    try:
        base = _final(decode_baseline(lm, PROMPT, cfg))
        ssr = _final(decode_ssr(lm, PROMPT, cfg))
    finally:
        lm.share_forks = None
    assert ssr.reasoning_ids == base.reasoning_ids, "reasoning differs from baseline"
    assert ssr.answer_ids == base.answer_ids, "answer differs from baseline"
    assert ssr.stats.drafts >= 2, "the drafts this test is about never forked"
    return ssr, base


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("way", ["shared", "copied"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_ssr_equals_baseline_through_shared_and_copied_forks(arch, way, setting):
    lm = _tiny(arch)
    ssr, _ = _same(lm, RunConfig(**LONG, **SETTINGS[setting]), way)
    assert ssr.stats.reasoning_tokens >= 100, "a context long enough to matter"
    if way == "shared":
        assert ssr.stats.forks == "shared prefix"
    else:
        assert ssr.stats.forks == "copied prefix: shared forks turned off (LoadedModel.share_forks)"


@pytest.mark.parametrize("name", SHARED_FAMILIES)
def test_families_that_can_share_do_and_stay_exact(name):
    cfg = RunConfig(**{**LONG, "max_think": 90, "max_answer": 16, "draft_interval": 20})
    lm = _thinking(family_model(name), cfg)
    lm.share_forks = True  # whatever the riding steps cost on this machine (by cost: test_forks_are_chosen_by_cost)
    assert unshared(lm) is None and capabilities(lm).check("shared forks").ok
    ssr, _ = _same(lm, cfg, "shared")
    assert ssr.stats.forks == "shared prefix"


@pytest.mark.parametrize("name, why", [(SLIDING[0], "sliding-window"), (SLIDING[2], "sliding-window"),
                                       (RECURRENT[2], "recurrent states"), (SCALED_ROPE[0], "longrope")])
def test_families_that_cannot_share_copy_and_say_why(name, why):
    cfg = RunConfig(**{**LONG, "max_think": 80, "draft_interval": 20, "max_draft": 12})
    lm = _thinking(family_model(name), cfg)
    ssr, _ = _same(lm, cfg, "shared")
    assert ssr.stats.forks.startswith("copied prefix: ") and why in ssr.stats.forks, ssr.stats.forks
    assert capabilities(lm).check("shared forks") is None  # not probed where the layout rules it out


def test_the_cache_holds_the_prefix_once():
    """Four drafts spread over 440 reasoning tokens: the shared cache is the main row's budgets
    plus one live draft's slots (at most 1.3x baseline's); copies hold the prefix in every row."""
    cfg = RunConfig(max_think=440, max_answer=16, max_draft=30, drafting="always", num_drafts=4, draft_start=40,
                    draft_interval=100)
    lm = _thinking(_tiny("llama"), cfg)
    shared, base = _same(lm, cfg, "shared")
    copied, _ = _same(lm, cfg, "copied")
    assert shared.stats.cache_mb <= 1.3 * base.stats.cache_mb, (shared.stats.cache_mb, base.stats.cache_mb)
    assert copied.stats.cache_mb >= 4.5 * base.stats.cache_mb


def test_a_shared_cache_out_of_room_compacts_what_no_row_sees():
    """Rows that keep one of three fed slots leave two dead slots a step; at the cache's capacity
    they are compacted away (the buffers never grow) and every logit stays the reference's."""
    lm = _tiny("llama")
    prefix = list(range(5, 25))
    tokens = list(range(30, 60))
    alone = lm.new_cache(len(prefix) + len(tokens))
    lm.step_logits(prefix, alone, 0)
    want = lm.step_logits(tokens, alone, len(prefix))  # [len(tokens), V]: the main row's reference
    cache = lm.new_cache(len(prefix) + 32)  # room for 32 slots past the prefix: the steps feed 72, keep 24
    lm.step_logits(prefix, cache, 0)
    batch = RowBatch(lm, cache, len(prefix), shared=True)
    batch.fork()
    capacity = [layer.capacity for layer in cache.slot_layers]
    for i, tok in enumerate(tokens[:12]):
        logits = batch.forward([[tok, 1, 2], [tok + 40, 3, 4]])  # [2, 3, V]
        assert torch.allclose(logits[0, 0], want[i], atol=1e-9), f"step {i}"
        batch.keep([1, 1])
    assert [layer.capacity for layer in cache.slot_layers] == capacity, "the buffers grew"
    assert batch.length <= len(prefix) + 32
    batch.select([0])
    assert batch.length == len(prefix) + 12  # the main row's own slots, in order
    assert torch.allclose(batch.forward([[tokens[12]]])[0, 0], want[12], atol=1e-9)


def test_a_shared_cache_out_of_room_with_nothing_dead_grows_by_an_eighth():
    """Rows that keep every slot they are fed leave nothing to compact: past the capacity the
    buffers grow (by an eighth, not doubled), the used slots copied once, every logit the reference's."""
    lm = _tiny("llama")
    prefix = list(range(5, 25))
    tokens = list(range(30, 60))
    alone = lm.new_cache(len(prefix) + len(tokens))
    lm.step_logits(prefix, alone, 0)
    want = lm.step_logits(tokens, alone, len(prefix))
    cache = lm.new_cache(len(prefix) + 16)
    lm.step_logits(prefix, cache, 0)
    batch = RowBatch(lm, cache, len(prefix), shared=True)
    batch.fork()
    for i, tok in enumerate(tokens[:12]):  # 24 slots kept past the prefix, in a cache with room for 16
        logits = batch.forward([[tok], [tok + 40]])
        assert torch.allclose(logits[0, 0], want[i], atol=1e-9), f"step {i}"
        batch.keep([1, 1])
    grown = {layer.capacity for layer in cache.slot_layers}
    assert len(grown) == 1 and len(prefix) + 24 <= grown.pop() < 2 * (len(prefix) + 16), "grown by an eighth at a time"
    batch.select([0])
    assert batch.length == len(prefix) + 12
    assert torch.allclose(batch.forward([[tokens[12]]])[0, 0], want[12], atol=1e-9)


def test_the_strip_and_the_log_say_which_path_the_forks_took(tmp_path):
    from engine.runlog import RunLog, RunMeta
    from ssr_ui.export import logged_view
    from ssr_ui.render import TraceView, metrics_html

    lm = _tiny("llama")
    lm.share_forks = True  # whatever the riding steps cost on this machine
    cfg = RunConfig(**{**LONG, "max_think": 60, "draft_interval": 10})
    log = RunLog(tmp_path / "runs.db")
    view = TraceView(method="ssr")
    for ev in log.record(decode_ssr(lm, PROMPT, cfg), RunMeta("ssr", "tiny", PROMPT, cfg.to_dict())):
        view.apply(ev)
    [row] = log.runs(limit=1)
    assert row["forks"] == "shared prefix"
    for v in (view, logged_view(row, log.events(row["id"]))):
        assert 'forks</div><div class="v">shared prefix' in metrics_html(v, "SSR")


def test_the_scaling_benchmark_reports_both_paths_side_by_side(tmp_path, capsys):
    import json

    from engine.tools.scaling import main

    out = tmp_path / "scaling.json"
    assert main(["--model", "tiny-reasoner", "--think", "48", "--drafts", "1,2", "--draft-start", "4", "--max-draft", "16",
                 "--max-answer", "8", "--out", str(out)]) == 0
    table = json.loads(out.read_text())["table"]
    assert [(r["drafts"], r["forks"]) for r in table] == [(1, "shared"), (1, "copied"), (2, "shared"), (2, "copied")]
    assert all(r["identical"] and r["ssr_vs_baseline"] > 0 and r["baseline_step_ms"] > 0 for r in table)
    by = {(r["drafts"], r["forks"]): r for r in table}
    assert by[(2, "shared")]["path"] == "shared prefix" and by[(2, "copied")]["path"].startswith("copied prefix")
    assert by[(2, "shared")]["cache_mb"] < by[(2, "copied")]["cache_mb"]
    assert "ssr/base" in capsys.readouterr().out


@pytest.mark.parametrize("args, says", [(["--think", "0"], "--think takes whole numbers of at least 1"),
                                        (["--drafts", "two"], "--drafts takes whole numbers"),
                                        (["--forks", "cloned"], "--forks takes shared and/or copied"),
                                        (["--think-spec", "-1"], "--think-spec must be 0 or more")])
def test_the_scaling_benchmark_refuses_bad_flags_by_name(tmp_path, capsys, args, says):
    from engine.tools.scaling import main

    assert main(["--model", "tiny-reasoner", *args, "--out", str(tmp_path / "x.json")]) == 2
    assert says in capsys.readouterr().err


def test_a_window_under_another_name_keeps_copies():
    """GPT-Neo's local layers window by slot index under ``window_size`` (no ``sliding_window`` for
    the cache layout to see): its drafts copy the prefix."""
    from transformers import AutoModelForCausalLM, GPTNeoConfig

    from engine.runtime.model import LoadedModel, find_markers
    from tests.tiny import make_tokenizer

    tok = make_tokenizer()
    config = GPTNeoConfig(vocab_size=len(tok), hidden_size=16, num_layers=2, attention_types=[[["global", "local"], 1]],
                          num_heads=2, window_size=8, max_position_embeddings=128)
    lm = LoadedModel(AutoModelForCausalLM.from_config(config).eval(), tok, "tiny-gpt-neo", find_markers(tok))
    assert "sliding-window" in unshared(lm)


def test_learned_positions_keep_a_shared_cache_within_them():
    """GPT-2 (learned absolute positions) with drafts that would take a shared cache past its 512
    positions: the drafts copy the prefix, and the run says why; still identical to baseline."""
    cfg = RunConfig(max_think=400, max_answer=16, max_draft=200, drafting="always", num_drafts=2, draft_start=40,
                    draft_interval=100)
    lm = _thinking(_tiny("gpt2"), cfg)
    ssr, _ = _same(lm, cfg, "shared")
    assert "more than the model's 512 positions" in ssr.stats.forks, ssr.stats.forks


def test_the_cache_is_sized_by_one_pure_function():
    """``size_cache``: no drafts, one row of the run's capacity; drafts that may share, one row of the main
    row's budgets and the drafts live at once; drafts that must copy, or a shared cache past a learned-position
    model's context, one row per draft, each of the capacity, and the reason said."""
    from engine.methods.ssr.loop import run_tokens, size_cache
    from tests.tiny import make_model

    markers, cfg = make_model("llama").markers, RunConfig(max_think=40, max_answer=20, num_drafts=3, draft_start=8)
    alone = size_cache(cfg, markers, 10, 0, None, False, False, 2048)
    assert (alone.slots, alone.rows, alone.shared) == (alone.capacity, 1, False)
    assert alone.capacity == 10 + run_tokens(cfg, markers, 0) + max(cfg.max_spec, cfg.think_spec) + 1
    shared = size_cache(cfg, markers, 10, 3, None, False, False, 2048)
    assert shared.rows == 1 and shared.shared and shared.copied is None and shared.slots > alone.capacity
    copied = size_cache(cfg, markers, 10, 3, "its cache cannot share", False, False, 2048)
    assert (copied.rows, copied.shared, copied.copied) == (4, False, "its cache cannot share")
    tight = size_cache(cfg, markers, 10, 3, None, True, False, shared.slots - 1)
    assert tight.rows == 4 and "more than the model's" in tight.copied


def test_forks_are_chosen_by_the_riding_step_the_probe_measured():
    """Where both ways hold, the probe times a riding step shared and copied; the drafts copy the
    prefix only where that measured cheaper, and the run says so with the figures. Forced costs here
    (which is cheaper depends on the machine); an operator's switch overrides either way."""
    import dataclasses

    lm = make_model("llama", init_scale=3.0, seed=5)
    caps = capabilities(lm)
    assert caps.fork_ms is not None and all(ms > 0 for ms in caps.fork_ms), "the probe timed both ways"
    cfg = RunConfig(**{**LONG, "max_think": 60, "draft_interval": 10})
    base = _final(decode_baseline(lm, PROMPT, cfg))
    try:
        lm.capabilities = dataclasses.replace(caps, fork_ms=(2.0, 1.0))  # copies cheaper
        assert unshared(lm) == lm.capabilities.copies_cheaper
        ssr = _final(decode_ssr(lm, PROMPT, cfg))
        assert ssr.stats.forks == ("copied prefix: a step with a draft riding measured 1.00 ms copied against "
                                   "2.00 ms shared on this model (the capability probe)")
        assert (ssr.reasoning_ids, ssr.answer_ids) == (base.reasoning_ids, base.answer_ids) and ssr.stats.drafts >= 2
        lm.share_forks = True  # the operator's switch: shared whatever the costs
        assert _final(decode_ssr(lm, PROMPT, cfg)).stats.forks == "shared prefix"
        lm.share_forks = None
        lm.capabilities = dataclasses.replace(caps, fork_ms=(1.0, 0.95))  # within the margin: sharing (less memory)
        ssr = _final(decode_ssr(lm, PROMPT, cfg))
        assert ssr.stats.forks == "shared prefix"
        assert (ssr.reasoning_ids, ssr.answer_ids) == (base.reasoning_ids, base.answer_ids)
    finally:
        lm.capabilities, lm.share_forks = caps, None
