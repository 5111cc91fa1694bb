"""The preallocated cache (``engine.runtime.static``) and the compiled fixed-shape steps
(``engine.runtime.compiled``): the same logits as transformers' own dynamic cache, rollbacks that
move a length, forks and dropped rows that copy only used prefixes, holes, every width bucket and
row count, and decoding that is token-for-token the same compiled or not.

Most compiled tests use dynamo with its ``eager`` backend (the same tracing, guards and shapes,
seconds instead of inductor's minutes); one test compiles for real with inductor on the CPU.

Logits are compared within tolerances derived in ``tests/numeric.py`` (dtype, scale, depth), each
shown to catch a real bug (a position off by one, a lost or doubled slot, a rollback too far, the
wrong row kept, a visible hole); decoded tokens are compared exactly.
"""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from engine.runtime.cache import cache_mb, checkpoint, compact, crop, seq_length, take_rows
from engine.runtime.compiled import BUCKETS, CompiledSteps, bucket, compile_reason
from engine.runtime.static import SlotCache, SlotLayer
from tests.families import family_model
from tests.numeric import Gap, bug_id, expect, float64_copy, gap, gap_to_reference
from tests.tiny import counting_compiles, make_model

KINDS = ["llama", "mistral-window", "gemma-4-e4b-it", "qwen3.5-4b", "nemotron-h"]  # full, sliding, KV-shared, recurrent


def _model(kind: str, dtype=torch.float32):
    """The model of ``kind`` (the family models in ``dtype``; "llama" is the float64 tiny model whatever is asked)."""
    return make_model("llama", seed=1, style="open") if kind == "llama" else family_model(kind, dtype=dtype)


def _feed(lm, cache, ids, start, at=None):
    """Logits ``[T, V]`` of ``ids`` appended to a cache of ``start`` slots, at positions ``at``..
    (``start`` unless given: a buggy runtime's cache that lost or doubled a slot)."""
    positions = None if at is None else torch.arange(at, at + len(ids))[None]
    return lm.forward(torch.tensor([ids]), cache, start, positions=positions)[0]


def _dynamic(lm, cache, ids, start):
    """Logits ``[T, V]`` of transformers' own forward on its ``DynamicCache``."""
    positions = torch.arange(start, start + len(ids))[None]
    with torch.inference_mode():
        return lm.model(input_ids=torch.tensor([ids]), cache=cache, position_ids=positions, use_cache=True).logits[0]


def final(events):
    return list(events)[-1]


@pytest.fixture
def eager_compiled(monkeypatch):
    """``compile="on"`` runs dynamo with its eager backend (no C++ compiler, seconds)."""
    def use(lm):
        lm._steps = CompiledSteps(lm.model, cuda_graphs=False, backend="eager")
        monkeypatch.setattr("engine.runtime.compiled.shutil.which", lambda _: "/usr/bin/c++")
        return lm
    return use


# ----------------------------------------------------------------------------- the same numbers

def _static_vs_dynamic(kind: str, bug: str | None = None) -> Gap:
    """Feed a prompt in uneven chunks to our cache (``bug`` done to it after the first chunk), to
    transformers' DynamicCache and to a DynamicCache of the model's float64 copy; the gap of our
    fp32 logits to the float64 ones (``tests.numeric.gap_to_reference``)."""
    lm = _model(kind, torch.float32)
    exact = float64_copy(lm)
    ids = lm.prompt_ids("the lazy dog jumps over the fox")[:30]
    ours, theirs = lm.new_cache(capacity=8), DynamicCache(config=lm.model.config)  # 8: it must grow, twice
    truth = DynamicCache(config=exact.model.config)
    assert isinstance(ours, SlotCache)
    got, want, reference = [], [], []
    at = shift = 0
    for i, width in enumerate((11, 1, 3, 1, 7, 2)):
        chunk = ids[at : at + width]
        if i == 1 and bug is not None:
            shift = _break(bug, lm, ours, ids, at)
        got.append(_feed(lm, ours, chunk, seq_length(ours), at + shift))
        want.append(_dynamic(lm, theirs, chunk, at))  # fp32: its sliding layers hold only the window
        reference.append(_dynamic(exact, truth, chunk, at))
        at += width
    assert bug is not None or seq_length(ours) == at == 25
    return gap_to_reference(torch.cat(got), torch.cat(want), torch.cat(reference), lm)


def _break(bug: str, lm, cache, ids, at: int) -> int:
    """Do to a cache holding ``ids[:at]`` what a buggy runtime would; the offset it then feeds at."""
    if bug == "dropped-slot":  # the prompt's last token lost
        crop(cache, at - 1)
    elif bug == "duplicated-slot":  # the prompt's last token written twice
        _feed(lm, cache, ids[at - 1 : at], at, at - 1)
    return 1 if bug == "position+1" else 0  # every step after the prompt one position (rotary offset) late


@pytest.mark.numeric
@pytest.mark.parametrize("kind", KINDS)
def test_static_logits_match_the_dynamic_cache(kind):
    """fp32, fed in uneven chunks: our cache's logits are as close to the float64 computation as
    transformers' DynamicCache's are (both are fp32 roundings of it; the kernels differ)."""
    expect(_static_vs_dynamic(kind))


STATIC_BUGS = [(kind, bug) for kind in KINDS for bug in ("position+1", "dropped-slot", "duplicated-slot")
               if (kind, bug) != ("nemotron-h", "position+1")]  # nemotron-h's attention has no positions (Mamba orders)


@pytest.mark.numeric
@pytest.mark.parametrize("kind, bug", STATIC_BUGS)
def test_the_same_bound_catches_a_broken_static_cache(kind, bug):
    """The companion: with a real bug in our cache the same bound fails, by a wide margin."""
    expect(_static_vs_dynamic(kind, bug), bug)


@pytest.mark.numeric
@pytest.mark.parametrize("kind", KINDS)
def test_fixed_cache_matches_the_eager_one(kind):
    """The fixed-shape layout (whole-capacity mask, device write position) read eagerly."""
    lm = _model(kind, torch.float64)
    ids = lm.prompt_ids("class Garden: rose tulip")[:24]
    eager = lm.new_cache(64)
    fixed = SlotCache(lm.model.config, 64, fixed=True)
    for at, width in ((0, 10), (10, 1), (11, 4), (15, 1)):
        expect(gap(_feed(lm, fixed, ids[at : at + width], at), _feed(lm, eager, ids[at : at + width], at), lm))
    assert fixed.get_seq_length() == eager.get_seq_length() == 16


# ----------------------------------------------------------------------------- rollback, fork, holes

@pytest.mark.numeric
@pytest.mark.parametrize("bug", [None, "rolled-back-too-far"], ids=bug_id)
def test_rollback_moves_a_length_and_keeps_the_buffer(bug):
    lm = _model("llama", torch.float64)
    ids = lm.prompt_ids("hello world, hello again")
    cache, straight = lm.new_cache(64), lm.new_cache(64)
    _feed(lm, cache, ids[:20], 0)
    layer = cache.slot_layers[0]
    where = layer.keys.data_ptr()
    cut = 12 if bug is None else 11  # the companion rolls back one token too far
    crop(cache, cut)
    assert seq_length(cache) == cut and layer.keys.data_ptr() == where  # nothing copied, nothing freed
    _feed(lm, straight, ids[:12], 0)
    expect(gap(_feed(lm, cache, ids[12:18], seq_length(cache), 12), _feed(lm, straight, ids[12:18], 12), lm), bug)


@pytest.mark.numeric
@pytest.mark.parametrize("bug", [None, "kept-the-wrong-row"], ids=bug_id)
@pytest.mark.parametrize("kind", ["llama", "qwen3.5-4b"])
def test_fork_and_drop_rows(kind, bug):
    """A fork copies row 0's used prefix into a new row; each row then goes its own way and
    equals a one-row cache fed the same tokens; dropping a middle row moves the last one down
    (the companion drops the last row instead, as an off-by-one index would)."""
    lm = _model(kind, torch.float64)
    ids = lm.prompt_ids("one two three four five six")
    cache = lm.new_cache(64, rows=3)
    _feed(lm, cache, ids[:10], 0)
    take_rows(cache, [0, 0, 0])
    tails = [ids[10:13], ids[13:16], ids[16:19]]
    got = lm.forward(torch.tensor(tails), cache, 10)
    alone = []
    for tail in tails:
        single = lm.new_cache(64)
        _feed(lm, single, ids[:10], 0)
        alone.append(_feed(lm, single, tail, 10))
    for r in range(3):
        expect(gap(got[r], alone[r], lm))
    take_rows(cache, [0, 2] if bug is None else [0, 1])
    nxt = lm.forward(torch.tensor([[ids[20]], [ids[21]]]), cache, 13)
    single = lm.new_cache(64)
    _feed(lm, single, ids[:10], 0)  # fed in the same chunks (a recurrent layer's chunked and step kernels differ)
    _feed(lm, single, tails[2], 10)
    expect(gap(nxt[1], _feed(lm, single, [ids[21]], 13), lm), bug)


@pytest.mark.numeric
@pytest.mark.parametrize("bug", [None, "hole-visible"], ids=bug_id)
def test_holes_are_hidden_then_compacted_away(bug):
    """Row 0 rejects two of four slots (a mask hides them); compacted, its cache equals one that
    never saw them (the companion's mask forgets the hole)."""
    lm = _model("llama", torch.float64)
    ids = lm.prompt_ids("the lazy dog jumps")
    cache = lm.new_cache(64)
    _feed(lm, cache, ids[:8], 0)
    _feed(lm, cache, ids[8:12], 8)  # keeps ids[8:10], rejects ids[10:12]
    mask = torch.tensor([[1] * 10 + ([0, 0] if bug is None else [1, 1]) + [1]])
    with_hole = lm.forward(torch.tensor([[ids[12]]]), cache, 12, positions=torch.tensor([[10]]), attention_mask=mask)[0]
    crop(cache, 12)
    compact(cache, torch.tensor([*range(10)]))
    clean = lm.new_cache(64)
    _feed(lm, clean, ids[:10], 0)
    expected = _feed(lm, clean, [ids[12]], 10)
    expect(gap(with_hole, expected, lm), bug)
    expect(gap(_feed(lm, cache, [ids[12]], 10), expected, lm))


@pytest.mark.numeric
@pytest.mark.parametrize("bug", [None, "rolled-back-too-far"], ids=bug_id)
def test_recurrent_rollback_on_the_static_cache(bug):
    lm = _model("qwen3.5-4b", torch.float64)
    ids = lm.prompt_ids("hello world")
    straight, rolled = lm.new_cache(64), lm.new_cache(64)
    _feed(lm, straight, ids[:20], 0)
    _feed(lm, rolled, ids[:20], 0)
    ckpt = checkpoint(rolled, 20)
    _feed(lm, rolled, ids[20:27], 20)
    lm.rewind(rolled, ckpt, ids[20:22] if bug is None else ids[20:21])
    _feed(lm, straight, ids[20:22], 20)
    expect(gap(_feed(lm, rolled, ids[22:26], seq_length(rolled), 22), _feed(lm, straight, ids[22:26], 22), lm), bug)


@pytest.mark.parametrize("kind", ["qwen3.5-4b", "nemotron-h", "lfm2", "jamba", "mamba"])
def test_every_layer_counts_what_the_cache_holds_after_rollbacks_and_forks(kind):
    """transformers 5.25 gave each linear-attention layer a token counter of its own
    (``cumulative_length_linear``) and made ``Cache.get_seq_length()`` read layer 0, a linear layer
    in Jamba or Mamba (issue 40: "cache holds 36 tokens, expected 24"). After prefills, steps, forks,
    a crop and a checkpoint's restore, the cache's length at every layer index, and every layer's own
    counter where it keeps one, are the tokens the cache holds (5.24 keeps none: the length alone)."""
    lm = family_model(kind, dtype=torch.float32)
    ids = lm.prompt_ids("the lazy dog jumps over the fox and the cat")[:24]
    cache = lm.new_cache(64)

    def held(n):
        assert seq_length(cache) == n
        for i, layer in enumerate(cache.layers):
            assert int(cache.get_seq_length(i)) == n, f"layer {i} ({type(layer).__name__}) says {cache.get_seq_length(i)}"
            counter = getattr(layer, "cumulative_length_linear", None)
            assert counter is None or int(counter) == n, f"layer {i}'s own counter says {int(counter)}, held {n}"

    _feed(lm, cache, ids[:10], 0)
    held(10)
    ckpt = checkpoint(cache, 10)
    _feed(lm, cache, ids[10:11], 10)
    _feed(lm, cache, ids[11:12], 11)
    held(12)
    take_rows(cache, [0, 0])  # a fork: one more row at the same length
    lm.forward(torch.tensor([ids[12:13]] * 2), cache, 12)
    held(13)
    take_rows(cache, [0])
    lm.rewind(cache, ckpt, ids[10:12])  # back to 10, then the kept tokens re-read
    held(12)
    _feed(lm, cache, ids[12:15], 12)
    held(15)


def test_cache_memory_is_sized_from_the_budgets():
    lm = _model("llama")
    size = next(lm.model.parameters()).element_size()
    small = final(decode_baseline(lm, "hello", RunConfig(max_think=8, max_answer=8)))
    large = final(decode_baseline(lm, "hello", RunConfig(max_think=200, max_answer=200)))
    layers, kv = lm.model.config.num_hidden_layers, lm.model.config.num_key_value_heads
    head = lm.model.config.hidden_size // lm.model.config.num_attention_heads
    prompt = small.stats.prompt_tokens
    for done, budget in ((small, 16), (large, 400)):
        slots = prompt + budget + len(lm.markers.close_ids)  # the budgets and the forced end of thinking
        assert done.stats.cache_mb == pytest.approx(2 * layers * kv * head * size * slots / 2**20, rel=0.05)
    ssr = final(decode_ssr(lm, "hello", RunConfig(max_think=8, max_answer=8, max_draft=8, draft_start=2, num_drafts=2,
                                                  draft_interval=2)))
    assert ssr.stats.cache_mb > 2.5 * small.stats.cache_mb  # three rows, and room for a verify
    assert cache_mb() == 0


# ----------------------------------------------------------------------------- compiled steps

def test_the_compile_choice():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert "CUDA only" in compile_reason("auto", cpu, False, False)
    assert compile_reason("off", cuda, False, False) == "--compile off"
    assert "exact" in compile_reason("on", cpu, False, True)
    assert "recurrent" in compile_reason("on", cpu, True, False)
    with pytest.raises(ValueError, match="compile must be one of auto, on, off"):
        compile_reason("fast", cpu, False, False)
    with pytest.raises(ValueError, match="Compiled steps \\(compile\\) must be one of auto, on, off; got 'yes'"):
        RunConfig(compile="yes")
    assert [bucket(w) for w in (1, 2, 3, 5, 9, 17, 33, 64, 65)] == [1, 2, 4, 8, 16, 32, 64, 64, None]


@pytest.mark.numeric
def test_every_shape_bucket_compiled_matches_eager(eager_compiled):
    """Every width bucket (a real width padded up to it) at 1 and 3 rows, on a fixed cache, gives
    the eager cache's logits; each shape is traced once and then reused."""
    lm = eager_compiled(_model("llama", torch.float64))
    lm.begin_run(compile="on")
    assert lm.step_mode == "compiled"
    ids = lm.prompt_ids("a b c d e f g h i j k l m n o p q r s t u v w x y z " * 6)
    assert len(ids) > 100
    for rows in (1, 3):
        for width in (*BUCKETS, 3, 5, 33):
            fixed = lm.new_cache(200, rows=3)
            eager = SlotCache(lm.model.config, 200, rows=3)
            for c in (fixed, eager):
                _feed(lm, c, ids[:20], 0)
                take_rows(c, [0] * rows)
            feed = torch.tensor([ids[20 + r : 20 + r + width] for r in range(rows)])
            got = lm.forward(feed, fixed, 20)
            expect(gap(got, lm.forward(feed, eager, 20), lm))
            assert got.shape[1] == width and fixed.get_seq_length() == 20 + width  # the padding was given back
            assert int(fixed.cursor.tensor) == 20 + width  # one device cursor, shared by every layer
            assert (rows, bucket(width), fixed.capacity, fixed.rows_capacity) in lm.compiled.shapes
    assert len(lm.compiled.shapes) == 2 * len(BUCKETS)


SETTINGS = [dict(draft_start=3), dict(draft_start=2, think_spec=4), dict(draft_start=2, num_drafts=3, draft_interval=3),
            dict(draft_start=4, max_spec=40)]


def test_compiled_decoding_is_token_for_token_the_same_and_never_compiles_mid_run(monkeypatch):
    """Every setting in turn on one model: compiled plain decoding and SSR give eager decoding's
    tokens, and a backend that counts dynamo's compiles (first compiles and recompiles alike;
    dynamo's eager backend underneath) sees none once a run's first non-"compiling" event is out
    (issue 22, finding 6). The count caught SSR with 3 drafts making 4 compiles inside its run,
    for shapes the runs before it had compiled beside buffers of fewer rows (dynamo guards those
    too: now part of a shape's key)."""
    lm, compiles = counting_compiles(monkeypatch)
    for settings in SETTINGS:
        cfg = RunConfig(max_think=24, max_answer=30, max_draft=14, drafting="always", **settings)
        for prompt in ("hello world", "class Garden: rose"):
            off = final(decode_baseline(lm, prompt, cfg.replace(compile="off")))
            for decode in (decode_baseline, decode_ssr):
                before, events = None, []
                for ev in decode(lm, prompt, cfg.replace(compile="on")):
                    events.append(ev)
                    if before is None and getattr(ev, "phase", None) != "compiling":
                        before = len(compiles)
                assert len(compiles) == before, f"{settings}: {len(compiles) - before} compiles inside the run"
                on = events[-1]
                assert (on.reasoning_ids, on.answer_ids) == (off.reasoning_ids, off.answer_ids), settings
                assert on.stats.step_mode == "compiled"
    assert compiles and lm.compile_seconds > 0 and {2, 4} <= {s[0] for s in lm.compiled.shapes}


class FakeClock:
    """A ``time`` module whose ``perf_counter`` moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now


COMPILE_S = 100.0  # what each new shape's compile takes on the fake clock; nothing else moves it


def test_compile_time_is_spent_before_the_run_and_reported_apart(eager_compiled, monkeypatch):
    """Each shape's first call (its compile) takes COMPILE_S on a fake clock that the run's
    recorder and the compile timer both read: the run's clock, started after the compiles,
    reads less than one of them, whatever the machine's speed; counting them would read 700+."""
    lm = eager_compiled(make_model("llama", seed=3, style="open"))
    clock = FakeClock()
    monkeypatch.setattr("engine.methods.recorder.time", clock)
    monkeypatch.setattr("engine.runtime.compiled.time", clock)
    steps, traced = lm._steps, lm._steps._fn

    def compiling(**inputs):
        cache = inputs["cache"]
        if (*inputs["input_ids"].shape, cache.capacity, cache.rows_capacity) not in steps.shapes:  # a first call compiles
            clock.now += COMPILE_S
        return traced(**inputs)

    monkeypatch.setattr(steps, "_fn", compiling)
    cfg = RunConfig(max_think=12, max_answer=12, compile="on")
    events = list(decode_baseline(lm, "hello", cfg))
    shapes = dict(lm.compiled.shapes)
    compiling = events[: len(shapes) + 1]  # the runtime's progress, relayed: before the first shape, after each
    assert [(e.phase, e.done, e.total) for e in compiling] == [("compiling", n, len(shapes)) for n in range(len(shapes) + 1)]
    assert events[len(compiling)].phase == "prefill" and events[len(compiling)].t < COMPILE_S
    first = events[-1].stats
    assert first.compile_s == COMPILE_S * len(shapes) and len(shapes) == len(BUCKETS)  # every compile, reported
    assert first.wall_s < COMPILE_S  # the run's clock excludes them
    again = list(decode_baseline(lm, "hello", cfg))
    assert "compiling" not in [getattr(e, "phase", None) for e in again]
    second = again[-1].stats
    assert second.compile_s == 0 and lm.compiled.shapes == shapes  # nothing new in the run


def test_models_with_recurrent_states_and_exact_mode_run_eagerly(eager_compiled):
    lm = eager_compiled(family_model("qwen3.5-4b"))
    done = final(decode_baseline(lm, "hi", RunConfig(max_think=6, max_answer=4, compile="on")))
    assert done.stats.step_mode.startswith("eager: the model has recurrent states") and done.stats.compile_s == 0
    lm = eager_compiled(make_model("llama", seed=3, style="open"))
    done = final(decode_baseline(lm, "hi", RunConfig(max_think=6, max_answer=4, compile="on", exact=True,
                                                     exact_route="rows")))
    assert done.stats.step_mode == "exact rows: one call per token row and per query" and lm.compiled is None


def test_exact_modes_fixed_route_compiles_its_one_shape(eager_compiled):
    """Exact mode's fixed route runs the model's own kernels, so its steps compile: one shape
    (8 rows x 32 tokens) whatever the run, and SSR still equals plain decoding on it."""
    lm = eager_compiled(make_model("llama", seed=3, style="open", dtype=torch.float32))
    cfg = RunConfig(max_think=12, max_answer=10, max_draft=8, draft_start=3, think_spec=2, compile="on", exact=True,
                    exact_route="fixed")
    base, ssr = final(decode_baseline(lm, "hi", cfg)), final(decode_ssr(lm, "hi", cfg))
    assert base.stats.step_mode == ssr.stats.step_mode == "exact fixed 8x32 compiled"
    assert (ssr.reasoning_ids, ssr.answer_ids) == (base.reasoning_ids, base.answer_ids)
    assert {shape[:2] for shape in lm.compiled.shapes} == {(8, 32)}


@pytest.mark.skipif(compile_reason("on", torch.device("cpu"), False, False) is not None,
                    reason="no torch.compile or C++ compiler here")
def test_inductor_compiles_plain_decoding_on_the_cpu():
    """The real thing: inductor on the CPU, seven width buckets of a tiny model."""
    lm = make_model("llama", seed=4, style="open")
    cfg = RunConfig(max_think=10, max_answer=10)
    off = final(decode_baseline(lm, "hello", cfg.replace(compile="off")))
    on = final(decode_baseline(lm, "hello", cfg.replace(compile="on")))
    assert (on.reasoning_ids, on.answer_ids) == (off.reasoning_ids, off.answer_ids)
    assert on.stats.step_mode == "compiled" and on.stats.compile_s > 0 and len(lm.compiled.shapes) == len(BUCKETS)
    assert isinstance(lm.new_cache(40).slot_layers[0], SlotLayer)


def test_gpu_check_times_compiled_against_eager_steps(monkeypatch):
    import functools

    from engine.tools import gpu_check

    monkeypatch.setattr("engine.runtime.model.CompiledSteps", functools.partial(CompiledSteps, backend="eager"))
    monkeypatch.setattr("engine.runtime.compiled.shutil.which", lambda _: "/usr/bin/c++")
    budgets = {"short": RunConfig(max_think=24, max_answer=8), "longer": RunConfig(max_think=60, max_answer=20)}
    out = gpu_check.compiled_vs_eager(torch.device("cpu"), 1, budgets)  # the tool's path, at small budgets
    assert set(out) == {"short", "longer", "compile_s", "shapes"} and out["shapes"] >= len(BUCKETS)
    assert all(out[k]["compiled_over_eager_tokens_per_s"] > 0 for k in budgets)


@pytest.mark.parametrize("scorer", ["prm", "target-likelihood"])
def test_compiled_rsd_is_token_for_token_the_same(eager_compiled, scorer):
    """RSD with both writers compiled (each with its own fixed cache, the PRM eager): the same
    steps, verdicts and tokens as with eager steps."""
    from engine.methods.rsd.loop import decode_rsd
    from engine.methods.rsd.prm import MathShepherdScorer

    target = eager_compiled(make_model("llama", seed=1, init_scale=2.0))
    draft = eager_compiled(make_model("qwen2", seed=2, init_scale=2.0))
    prm = MathShepherdScorer(make_model("llama", seed=3)) if scorer == "prm" else scorer
    cfg = RunConfig(max_think=40, max_answer=20, max_step_tokens=12, threshold=0.5)
    runs = {mode: final(decode_rsd(target, draft, prm, "Start with 7", cfg.replace(compile=mode))) for mode in ("off", "on")}
    assert (runs["on"].reasoning_ids, runs["on"].answer_ids) == (runs["off"].reasoning_ids, runs["off"].answer_ids)
    assert (runs["on"].stats.rsd.steps_accepted, runs["on"].stats.rsd.steps_rejected) == \
        (runs["off"].stats.rsd.steps_accepted, runs["off"].stats.rsd.steps_rejected)
    assert runs["on"].stats.step_mode == "compiled" and runs["on"].stats.compile_s > 0 and runs["on"].stats.cache_mb > 0


def test_a_step_past_a_fixed_cache_says_so():
    lm = _model("llama", torch.float64)
    cache = SlotCache(lm.model.config, 16, fixed=True)
    _feed(lm, cache, list(range(10, 22)), 0)
    with pytest.raises(RuntimeError, match="a 8-token step at slot 12 does not fit a cache of 16 slots"):
        _feed(lm, cache, list(range(30, 38)), 12)
