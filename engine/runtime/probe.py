"""Capability probes: what SSR relies on, measured on the loaded model itself.

SSR verifies several tokens in one forward after a cached state, rolls a row back and re-feeds
it, forks rows and (where the cache allows) leaves holes in a row that only its mask hides. A
list of layer classes cannot promise those hold: Jamba's Mamba layers run any multi-token forward
from a zero state, DeepSeek-V3.2's indexer keeps a cache of its own that a rollback does not
crop. So before the first SSR run on a model, :func:`capabilities` measures each against a
one-token reference on the model as loaded, with a sequence long enough to cross every threshold
its config names (a sliding window, a chunk size, an indexer's top-k):

* **multi-token**: k-token forwards after a cached prefix (a few widths, one after another, so at a
  few offsets) equal one-token forwards. If not,
  the model's later forwards run one token at a time (``Capabilities.one_token_steps``: the
  model's public forward, once per token; plain decoding's prompt prefill, from an empty state,
  is unaffected) and the remaining checks run on that route.
* **split prefill**: the prompt prefilled but for its last token, then that token (as SSR starts)
  leaves the state one prefill leaves (as plain decoding starts).
* **rollback**: fed tokens rolled back (and some of them re-fed) leave the state as if they had
  never been fed.
* **fork**: a forked row equals its source, beside a row fed something else.
* **holes** (caches that allow them, ``CacheLayout.holes_ok``): slots a row rejected, hidden by
  its mask, change nothing; compacting them away changes nothing. If not (a model that places
  ALiBi or relative positions by slot, not by the positions passed: MPT, RoFormer, TrOCR's
  decoder), the model's rows hold none (``Capabilities.holes_unsafe``: SSR feeds one token per row
  per step while drafts ride, as on a sliding-window model), and nothing is refused for it.
* **shared forks** (where the holes hold and the model could take them, ``engine.runtime.batch.unshared``):
  the fork and holes checks again with the rows sharing one buffer row (``RowBatch``'s shared
  forks: a 4-D mask over every row's slots). If not, each draft holds a copy of the prefix
  (``Capabilities.shared_unsafe``), and nothing is refused for it.

A check passes when the largest logit difference is within ``sqrt(eps)`` of the logits' scale for
the model's dtype (float32's at the finest): rounding grows with ``eps``, a lost state with the
logits themselves. A check
that raises fails with the error. A failed rollback, fork or holes check refuses SSR before the
run (:meth:`Capabilities.ssr_refusal`), with what was measured; never a crash mid-run or a silent
divergence. Results are kept per model object and route (they depend on the weights' dtype, the
device and the library versions, all fixed for a loaded model).

**The probe's cache.** What the probe measured on a model loaded from a folder (a GGUF file's
converted folder, a bundled or local model, a Hub model's snapshot) is kept under the cache
(``$SSR_STUDIO_CACHE/probe``, else ``~/.cache/ssr-studio/probe``), keyed by :func:`probe_identity`:
the folder and each of its files' size and modification time (a converted folder's own name is
keyed by its GGUF file's), the dtype, the device, the CPU's instruction set, the torch and
transformers versions and the source of ``engine.runtime`` (the probe and the caches it measures).
A later load of that model with that software reads it back instead of probing again
(:attr:`Capabilities.cached` gives the date it was measured); a record that does not parse, or was
written under another identity, is ignored and the probe runs again. A result in which a check
raised is not kept (the error may be a passing one: memory). Models built in memory (tests,
random weights) are probed every time.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch

from engine.runtime.attention import BLOCKED
from engine.runtime.batch import RowBatch, unshared
from engine.runtime.cache import checkpoint, layout, threshold_length, tolerance, unknown_layer_kinds
from engine.runtime.capabilities import INVARIANCE, UNPROBED, Capabilities, Check
from engine.runtime.gguf import Progress, cache_dir
from engine.runtime.model import LoadedModel, SSRUnsupportedError


class MethodRefused(SSRUnsupportedError):
    """A method the capability probe found this model cannot run exactly (the message says what
    was measured). An ``SSRUnsupportedError``, so every place that reports SSR's refusals reports it."""


STEPS = 6  # tokens fed after the prefix in each check
# the multi-token check's forwards, one after another from the prefix on: several widths at several
# offsets, since a model may be right at one and not the next (DeepSeek-V3.2's indexer picks its top-k
# over a multi-token forward's keys differently at most prefix lengths, not all)
WIDTHS = (STEPS, 2, 3, 5)
SHORT_PROMPTS = (2, 3, 5, 8, 13)  # prompt lengths the split-prefill check also tries
TAIL = sum(WIDTHS) + 2 * STEPS  # tokens after the prefix: the reference's stretch, then junk


def require(lm: LoadedModel, method: str, rollbacks: bool = True, identical: bool = True) -> Capabilities:
    """The model's probed capabilities; ``MethodRefused`` (a ValueError) naming what was measured
    when ``method`` cannot run exactly on it (``identical``: it promises plain decoding's tokens
    on the fast path, :meth:`Capabilities.failed`)."""
    caps = capabilities(lm)
    why = caps.refusal(method, lm.model_id, rollbacks, identical)
    if why:
        raise MethodRefused(why)
    return caps


def probe_length(config, context: int | None) -> int:
    """A prefix long enough to cross every threshold the config names, within the context."""
    length = threshold_length(config)
    return min(length, context - TAIL) if context else length


def capabilities(lm: LoadedModel, progress: Progress | None = None) -> Capabilities:
    """The probe's result for ``lm``: measured once per model object and kept; for a model loaded
    from a folder or a Hub snapshot, read back from the probe's cache where this model was probed
    with this software before, else measured and written there. ``progress`` hears a line when
    the probe actually runs."""
    caps = lm.capabilities
    if caps is UNPROBED:
        identity = probe_identity(lm)
        path = _cache_file(lm, identity) if identity else None
        caps = _read(lm, path, identity) if path else None
        if caps is None:
            if progress is not None:
                progress(f"measuring what SSR relies on, on {lm.model_id} (the capability probe: a few short forwards)")
            caps = _measure(lm)
            if path and all(c.error is None for c in caps.checks):
                _write(lm, path, identity, caps)
        lm.capabilities = caps
    return caps


CACHE_FORMAT = 3  # the cached record's layout; a change makes every old record another identity's


@functools.lru_cache(maxsize=1)
def _runtime_source() -> str:
    """A digest of ``engine.runtime``'s source: the probe and the caches, forks and rollbacks it measures."""
    digest = hashlib.sha256()
    for file in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:16]


def probe_identity(lm: LoadedModel) -> dict | None:
    """Everything the probe's result on ``lm`` depends on (None: ``lm`` was not loaded from a
    folder or a Hub snapshot, so its result is not cached)."""
    if getattr(lm, "source", None) is None:
        return None
    import transformers

    device = lm.device.type
    if device == "cuda":
        device += ":" + torch.cuda.get_device_name(lm.device)
    return {"format": CACHE_FORMAT, "source": lm.source, "dtype": lm.dtype, "device": device,
            "machine": platform.machine(), "cpu": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "transformers": transformers.__version__, "engine": _runtime_source()}


def _cache_file(lm: LoadedModel, identity: dict) -> Path:
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    name = Path(lm.source["folder"]).name
    return cache_dir() / "probe" / f"{name}-{key}.json"


def read_record(path: Path, identity: dict) -> tuple[Capabilities, dict] | None:
    """A probe's cached result at ``path`` and its whole record (what else the probe kept); None
    where there is none, it does not parse or its identity is not ``identity``. For this probe
    and llama.cpp's (``engine.llamacpp.probe``)."""
    try:
        record = json.loads(path.read_text())
        if record["identity"] != identity:
            return None
        saved = dict(record["capabilities"])
        checks = tuple(Check(**c) for c in saved.pop("checks"))
        if saved.get("fork_ms") is not None:
            saved["fork_ms"] = tuple(saved["fork_ms"])
        return Capabilities(checks=checks, **saved, cached=str(record["measured"])), record
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_record(path: Path, identity: dict, caps: Capabilities, **kept) -> None:
    """Keep ``caps`` (and what else the probe measured: ``kept``) at ``path`` under ``identity``,
    written whole or not at all (a cache that cannot be written, a read-only home: the next load
    probes again)."""
    saved = asdict(caps)
    del saved["cached"]
    write_json(path, {"identity": identity, "measured": measured_now(), "capabilities": saved, **kept})


def measured_now() -> str:
    """When a cached record is written, as its readers show it ("2026-12-05 03:10 UTC")."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def write_json(path: Path, record: dict) -> None:
    """``record`` at ``path``, written whole or not at all (a cache that cannot be written, a
    read-only home: the next load measures again)."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


def _read(lm: LoadedModel, path: Path, identity: dict) -> Capabilities | None:
    """The cached result at ``path``, applied to ``lm`` as the probe would have (its cache class and a
    slot's bytes; the caller sets the record, whose checks decide the routes); None where there is none,
    it does not parse or its identity is not ``identity``."""
    found = read_record(path, identity)
    if found is None:
        return None
    caps, record = found
    checks = caps.checks
    try:
        own = _cache_class(record["cache_class"])
        slot_bytes = record["slot_bytes"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ImportError):
        return None
    typed = (isinstance(caps.one_token_steps, bool) and isinstance(caps.tokens, int)
             and all(isinstance(c.ok, bool) for c in checks) and isinstance(slot_bytes, (float, int, type(None))))
    if not typed or own is False:
        return None
    lm._cache_plan = own, layout(lm.model.config, own)
    lm.slot_bytes = slot_bytes
    return caps


def _cache_class(name: str | None) -> type | None | bool:
    """The cache class a record names ("module:qualname"; None: a SlotCache); False where it names
    anything but a transformers cache class."""
    from transformers.cache_utils import Cache

    if name is None:
        return None
    module, _, qualname = name.partition(":")
    found = functools.reduce(getattr, qualname.split("."), importlib.import_module(module))
    return found if isinstance(found, type) and issubclass(found, Cache) else False


def _write(lm: LoadedModel, path: Path, identity: dict, caps: Capabilities) -> None:
    """Keep ``caps`` and what the probe set on ``lm`` at ``path``."""
    own = lm._plan()[0]
    write_record(path, identity, caps, slot_bytes=lm.slot_bytes,
                 cache_class=None if own is None else f"{own.__module__}:{own.__qualname__}")


def _measure(lm: LoadedModel) -> Capabilities:
    """The checks, on the eager route with exact mode off; the run being set up (if any) gets its
    own settings back after. A probe cut short (an error outside a check, an interrupt) leaves the model
    unprobed, never with the record so far (the next call probes again)."""
    saved = lm.exact, lm.compiled, lm.compile_why, lm.share_forks
    lm.begin_run()
    lm.share_forks = True  # the probe measures what the model can do, whatever an operator switched off
    try:
        return _checks(lm)
    except BaseException:
        lm.capabilities = UNPROBED
        raise
    finally:
        lm.exact, lm.compiled, lm.compile_why, lm.share_forks = saved
        lm.rope.begin_run(lm.model)  # position-dependent RoPE state back to a fresh run's


def _checks(lm: LoadedModel) -> Capabilities:
    """Every check, each on the routes the checks before it chose (``lm.capabilities`` is the record so
    far while they run: a later check, like every later run, takes the route an earlier one decided)."""
    t0 = time.perf_counter()
    lm.capabilities = UNPROBED
    length = probe_length(lm.model.config, lm.context_length)
    if lm.rope.kind:  # stay below a RoPE switch point: past it a wide forward is not the reference's either
        length = max(1, min(length, lm.rope.switch - TAIL))
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    ids = [(7919 * i + 13) % vocab for i in range(length + TAIL)]
    prefix, stretch, junk = ids[:length], ids[length : length + sum(WIDTHS)], ids[length + sum(WIDTHS) :]
    true = stretch[:STEPS]
    tol = tolerance(next(lm.model.parameters()).dtype)
    try:
        ref = _reference(lm, prefix, stretch)
    except Exception as err:  # noqa: BLE001 (any failure is the finding: plain decoding cannot run)
        broken = Check("one-token decoding", False, error=_short(err))
        lm.capabilities = Capabilities((broken,), False, length, tol, time.perf_counter() - t0)
        return lm.capabilities
    scale = max(1.0, float(ref.abs().max()))

    def measured(name: str, fn) -> Check:
        try:
            diff = float(fn())
        except Exception as err:  # noqa: BLE001 (a probe that raises has found what SSR would meet mid-run)
            return Check(name, False, error=_short(err))
        return Check(name, diff <= tol * scale, diff)

    checks = [measured("multi-token", lambda: _multi_token(lm, prefix, stretch, ref))]
    fork_ms = None
    one_token = not checks[0].ok

    def decided() -> Capabilities:  # the record so far, on the model: the routes the next checks take
        lm.capabilities = Capabilities(tuple(checks), one_token, length, tol, time.perf_counter() - t0)
        return lm.capabilities

    decided()
    if one_token:  # the route the checks below (and every later run) take: retried on it
        checks.append(measured("one-token steps", lambda: _multi_token(lm, prefix, stretch, ref)))
    checks.append(measured("split prefill", lambda: _split_prefill(lm, prefix, true, ref)))
    unknown = unknown_layer_kinds(lm.model.config)
    if unknown:  # plain decoding runs on them (one state, fed as generate() feeds it); SSR's forks and rollbacks
        checks.append(Check("layer kinds", False, reason=(  # rely on what such a state does on every input
            f"its cache holds layers the engine does not know ({', '.join(unknown)}), whose state may select or "
            "compress by value, so passing the checks on one input vouches for no other (DeepSeek-V4 in float32 "
            "passed every check and still diverged)")))
    checks.append(measured("rollback", lambda: _rollback(lm, prefix, true, junk, ref)))
    checks.append(measured("fork", lambda: _fork(lm, prefix, true, junk, ref)))
    if lm.layout.holes_ok:
        checks.append(measured("holes", lambda: _holes(lm, prefix, true, junk, ref)))
        if not decided().holes_unsafe and unshared(lm) is None:  # (the holes check failed: rows hold none, no sharing)
            checks.append(measured("shared forks", lambda: max(_fork(lm, prefix, true, junk, ref, shared=True),
                                                               _holes(lm, prefix, true, junk, ref, shared=True))))
            if checks[-1].ok:  # both ways hold: the cheaper is taken (engine.runtime.batch.unshared)
                fork_ms = fork_costs(lm, vocab)
    if lm.device.type == "cpu" and next(lm.model.parameters()).dtype in BLOCKED:
        decided()  # its forwards take the routes decided so far
        checks.append(_invariance(lm))
    return dataclasses.replace(decided(), fork_ms=fork_ms)  # the whole record (shared forks failed: drafts copy)


def _invariance(lm: LoadedModel) -> Check:
    """bf16's batch-invariant route on the CPU (``engine.runtime.attention``), bitwise: a token alone,
    beside other rows and inside wider forwards (exact mode's self-check, on the fast path)."""
    from engine.runtime.exact import invariance

    try:
        found = invariance(lm, False)
    except Exception as err:  # noqa: BLE001 (a check that raises has found what a run would meet)
        return Check(INVARIANCE, False, error=_short(err))
    if found.exact:
        return Check(INVARIANCE, True, 0.0)
    return Check(INVARIANCE, False, reason=f"{found}: SSR's tokens would not be plain decoding's in "
                                           f"{lm.dtype} here; run in float32 (--dtype float32) or in exact mode")


RIDING_CONTEXT = 128  # the prefix a riding step is timed after (within the model's positions)
RIDING_STEPS, RIDING_WARM = 9, 3


def fork_costs(lm: LoadedModel, vocab: int) -> tuple[float, float]:
    """The median ms of a step of the main row and one draft riding, one token each, the draft's
    prefix shared and copied: both batches stepped in turn (a busy machine weighs on each alike),
    after warm-up steps."""
    context = min(RIDING_CONTEXT, (lm.context_length or RIDING_CONTEXT * 4) // 2)
    ids = [(7919 * i + 13) % vocab for i in range(context + RIDING_WARM + RIDING_STEPS)]

    def riding(shared: bool) -> Callable[[int], Callable[[], object]]:
        cache = lm.new_cache(len(ids) * 2 + 8, rows=2)
        lm.step_logits(ids[:context], cache, 0)
        batch = RowBatch(lm, cache, context, shared=shared)
        batch.fork()

        def step(token: int) -> None:
            batch.forward([[token], [(token * 7 + 1) % vocab]])
            batch.keep([1, 1])

        return lambda j: functools.partial(step, ids[context + j])

    shared_ms, copied_ms = timed_in_turn([riding(True), riding(False)], RIDING_WARM, RIDING_STEPS)
    return shared_ms, copied_ms


def timed_in_turn(rounds: list[Callable[[int], Callable[[], object]]], warm: int, timed: int) -> list[float]:
    """The median ms of each subject's call, timed round after round with the subjects in turn (so a
    busy machine weighs on each alike), after ``warm`` untimed rounds. ``rounds[i](j)`` prepares
    subject ``i``'s round ``j`` (untimed: a fresh cache, say) and returns the call to time."""
    seconds: list[list[float]] = [[] for _ in rounds]
    for j in range(warm + timed):
        for prepare, spent in zip(rounds, seconds, strict=True):
            call = prepare(j)
            t0 = time.perf_counter()
            call()
            if j >= warm:
                spent.append(time.perf_counter() - t0)
    return [round(1000 * statistics.median(s), 3) for s in seconds]


def _short(err: Exception) -> str:
    return f"{type(err).__name__}: {str(err).splitlines()[0][:160]}" if str(err) else type(err).__name__


def _prefilled(lm: LoadedModel, prefix: list[int]):
    cache = lm.new_cache(len(prefix) + TAIL, rows=2)
    lm.step_logits(prefix, cache, 0)  # from an empty state: what plain decoding's prefill does
    return cache


def _reference(lm: LoadedModel, prefix: list[int], stretch: list[int]) -> torch.Tensor:
    """Logits ``[len(stretch), V]`` after the prefix and each token of ``stretch``, fed one token a
    forward (the other checks compare their first :data:`STEPS` rows)."""
    cache = _prefilled(lm, prefix)
    ref = torch.stack([lm.step_logits([t], cache, len(prefix) + j)[0] for j, t in enumerate(stretch)]).double()
    if getattr(cache, "nbytes", 0):  # what one slot of one row costs, for the memory check before runs
        lm.slot_bytes = cache.nbytes / (cache.capacity * cache.rows_capacity)
    return ref


def _diff(logits: torch.Tensor, ref: torch.Tensor) -> float:
    return float((logits.double() - ref).abs().max())


def _multi_token(lm, prefix, stretch, ref) -> float:
    """The stretch fed in forwards of :data:`WIDTHS` tokens, one after another."""
    cache, at, diffs = _prefilled(lm, prefix), 0, []
    for width in WIDTHS:
        diffs.append(_diff(lm.step_logits(stretch[at : at + width], cache, len(prefix) + at), ref[at : at + width]))
        at += width
    return max(diffs)


def _split_prefill(lm, prefix, true, ref) -> float:
    """The prefix prefilled but for its last token, that token alone, then the true tokens: SSR
    prefills so (the last prompt token is its main row's first input), plain decoding in one
    forward. A model whose multi-token forward differs from one-token forwards even from an empty
    state (DeepSeek-V3.2's indexer) cannot give both runs the same state."""
    n = len(prefix)
    cache = _prefilled(lm, prefix[:-1])
    lm.step_logits(prefix[-1:], cache, n - 1)
    diffs = [_diff(lm.step_logits(true, cache, n), ref[:STEPS])]
    for k in (k for k in SHORT_PROMPTS if k < n):  # short prompts too: a state that compresses or selects
        whole = _prefilled(lm, prefix[:k])          # by length can agree at one length and not at another
        split = _prefilled(lm, prefix[: k - 1])
        lm.step_logits(prefix[k - 1 : k], split, k - 1)
        diffs.append(_diff(lm.step_logits(true, split, k), lm.step_logits(true, whole, k).double()))
    return max(diffs)


def _rollback(lm, prefix, true, junk, ref) -> float:
    """Junk fed and rolled back, then the true tokens; then two true tokens kept of a mixed feed."""
    n = len(prefix)
    cache = _prefilled(lm, prefix)
    mark = checkpoint(cache, n)
    lm.step_logits(junk, cache, n)
    lm.rewind(cache, mark, [])
    first = _diff(lm.step_logits(true, cache, n), ref[:STEPS])
    cache = _prefilled(lm, prefix)
    mark = checkpoint(cache, n)
    lm.step_logits(true[:2] + junk[:3], cache, n)
    lm.rewind(cache, mark, true[:2])
    return max(first, _diff(lm.step_logits(true[2:], cache, n + 2), ref[2:STEPS]))


def _fork(lm, prefix, true, junk, ref, shared: bool = False) -> float:
    """Row 0 forked; both rows fed the true token, then row 1 something else; row 0 alone after
    (``shared``: the rows share one buffer row, ``RowBatch``'s shared forks)."""
    batch = RowBatch(lm, _prefilled(lm, prefix), len(prefix), shared=shared)
    batch.fork()
    out = [batch.forward([[true[0]], [true[0]]])[:, 0]]
    batch.keep([1, 1])
    diffs = [_diff(out[0][0], ref[0]), _diff(out[0][1], ref[0])]
    diffs.append(_diff(batch.forward([[true[1]], [junk[0]]])[0, 0], ref[1]))
    batch.keep([1, 1])
    batch.select([0])
    diffs.append(_diff(batch.forward([[true[2]]])[0, 0], ref[2]))
    return max(diffs)


def _holes(lm, prefix, true, junk, ref, shared: bool = False) -> float:
    """Row 1 keeps three tokens where row 0 keeps one (two holes in row 0), then row 0 alone."""
    batch = RowBatch(lm, _prefilled(lm, prefix), len(prefix), shared=shared)
    batch.fork()
    diffs = [_diff(batch.forward([[true[0]], [true[0], junk[0], junk[1]]])[0, 0], ref[0])]
    batch.keep([1, 3])
    diffs.append(_diff(batch.forward([[true[1]], [junk[2]]])[0, 0], ref[1]))
    batch.keep([1, 1])
    batch.select([0])  # row 0's holes compacted away
    diffs.append(_diff(batch.forward([[true[2]]])[0, 0], ref[2]))
    return max(diffs)
