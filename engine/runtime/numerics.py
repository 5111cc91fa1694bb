"""The weights' precision on the CPU, chosen at load by what each costs on the loaded model.

A CPU with native bf16 (AVX512-BF16, AMX) runs a small model's linears in bf16 at nearly the cost
of one row whatever the rows, and its LM head several times faster than in fp32; a CPU without
it emulates bf16: some forwards run faster than in fp32, others not. Which holds is measured, not
read from a list of CPU flags: :func:`choose`, at load, when no precision is asked for
(``--dtype``), times the forwards the methods run (:data:`SHAPES`: a prompt's prefill, a lone step
at a short and a long context, a verify of a few tokens, a draft riding) in fp32 and in bf16 on
the model itself (warm, interleaved, the median of several), and keeps bf16 only where it is
faster by :data:`MARGIN` at every one (a CPU that emulates bf16 can run a lone step faster and a
prefill, a verify or a riding row slower: SSR would then lose what it saves) and measured
batch-invariant (the capability probe's ``batch invariance`` check, bitwise: a token alone, beside
other rows and inside wider forwards, which ``engine.runtime.attention``'s whole key blocks make
hold on the CPU), so greedy SSR writes plain decoding's tokens in it. Otherwise fp32 stays, with
the reason. The decision is kept with the capability probe's cache (keyed as the probe keys a
model: its files, the CPU's instruction set, the library versions, the runtime's source), so a
later load reads it back instead of measuring again.

:class:`Numerics` is the decision and its evidence, on the model (``lm.numerics``): the strip's
precision cell and the run log show its sentence.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from engine.presets import BUNDLED_DIR
from engine.runtime.cache import available_bytes, take_rows
from engine.runtime.capabilities import INVARIANCE, Check
from engine.runtime.gguf import Progress, cache_dir
from engine.runtime.model import LoadedModel
from engine.runtime.probe import capabilities, measured_now, probe_identity, timed_in_turn, write_json

FAST = "bfloat16"
MARGIN = 0.9  # bf16 is kept where each forward of SHAPES costs at most this fraction of fp32's
STEPS = 9  # timed steps per precision (after WARM untimed ones), interleaved
WARM = 3
# the forwards timed, in this order, (rows, tokens, context; context 0: a prefill from an empty cache): a prompt's
# prefill, a lone step, a verify, a draft riding, a lone step at a long context; bf16 must be faster at each (on a CPU
# that emulates it, a prefill costs about as many lone steps as its tokens, its rows and widths as many lone steps, and
# its attention grows costlier with the context). The timing stops at the first bf16 does not win: the prefill first,
# as the one an emulating CPU loses by most, before any other shape's own prefill is paid in bf16
SHAPES = ((1, 64, 0), (1, 1, 64), (1, 4, 64), (2, 1, 64), (1, 1, 512))
PREFILLS = (1, 3)  # a prefill shape's warm-up and timed forwards (each is tens of steps' work)


@dataclass(frozen=True)
class Numerics:
    dtype: str  # what the runs' weights are in
    why: str  # how it was chosen, in words, for the strip and the run log
    step_ms: dict[str, list[float]] = field(default_factory=dict)  # SHAPES' median ms in order, per precision (as timed)
    invariance: str | None = None  # the probe's bf16 batch-invariance check, as measured (None: not run)
    cached: str | None = None  # when the decision read back from the cache was measured; None: this process

    @property
    def sentence(self) -> str:
        return self.why + (f" (measured on {self.cached})" if self.cached else "")


def given(lm: LoadedModel, why: str) -> Numerics:
    """The numerics of a model whose precision was not chosen here: asked for, or a device's default."""
    return Numerics(lm.dtype, f"{lm.dtype}: {why}")


def settle(lm: LoadedModel, asked: str | None, progress: Progress | None = None) -> LoadedModel:
    """``lm`` in the precision its runs will use, with ``.numerics`` saying why: ``asked`` (``--dtype``)
    as asked; on a GPU bf16, the bundled models fp32 (as ``load_model`` loaded them); else
    :func:`choose` by measured cost."""
    folder = (lm.source or {}).get("folder")
    if asked:
        lm.numerics = given(lm, "as asked (--dtype)")
    elif lm.device.type != "cpu":
        lm.numerics = given(lm, f"the default on a {lm.device.type} (--dtype changes it)")
    elif folder and Path(folder).parent == BUNDLED_DIR.resolve():
        lm.numerics = given(lm, f"the bundled models keep the float32 they were trained in ({FAST} costs them accuracy, "
                                "and speed on a CPU without native bf16: docs/BENCHMARKS.md, \"The bundled models in bf16\")")
    else:
        lm = choose(lm, progress)
    return lm


def choose(lm: LoadedModel, progress: Progress | None = None,
           cost: Callable[[LoadedModel, LoadedModel], dict[str, list[float]]] | None = None,
           check: Callable[[LoadedModel], Check | None] | None = None) -> LoadedModel:
    """``lm`` (fp32, on the CPU) or its bf16 twin, whichever :func:`decide` keeps, with
    ``.numerics`` set. ``cost`` (two models -> ms of each shape, per dtype) and ``check`` (a model ->
    the probe's batch-invariance ``Check``) are the measurements, replaceable by scripted ones in tests."""
    identity = probe_identity(lm)
    path = _cache_file(lm, identity) if identity else None
    kept = _read(path, identity) if path else None
    if kept is not None:
        chosen = lm if kept.dtype == lm.dtype else _twin(lm, getattr(torch, kept.dtype))
        chosen.numerics = kept
        return chosen
    need = sum(p.numel() for p in lm.model.parameters()) * 2
    free = available_bytes(lm.device)
    if free is not None and need > 0.8 * free:
        lm.numerics = given(lm, f"no room to measure {FAST} beside it ({need / 2**30:.2f} GB for a copy, "
                                f"{free / 2**30:.2f} GB available); --dtype {FAST} runs in it")
        return lm
    if progress is not None:
        progress(f"measuring {lm.model_id}'s step in float32 and in {FAST}, to run in the faster")
    twin = _twin(lm, torch.bfloat16, copy_weights=True)
    numerics = decide(lm, twin, (cost or step_costs)(lm, twin), check or _invariance)
    chosen = twin if numerics.dtype == FAST else lm
    chosen.numerics = numerics
    if path:
        write_json(path, {"identity": identity, "measured": measured_now(), "numerics": _saved(numerics)})
    return chosen


def decide(base: LoadedModel, twin: LoadedModel, ms: dict[str, list[float]],
           check: Callable[[LoadedModel], Check | None]) -> Numerics:
    """fp32 (``base``) or bf16 (``twin``) by the measured costs ``ms`` (ms of :data:`SHAPES` in order,
    per dtype; the timing stops at the first shape bf16 does not win, so the lists may be shorter):
    bf16 where it costs at most :data:`MARGIN` of fp32's on every shape and ``check`` finds it
    batch-invariant (checked only then)."""
    slow, fast = ms[base.dtype], ms[twin.dtype]
    timed = _shapes(base)[: len(fast)]
    said = "; ".join(f"{what} {f:.1f} against {s:.1f} ms" for what, f, s in zip(timed, fast, slow, strict=True))
    rest = " (the other forwards not timed)" if len(fast) < len(SHAPES) else ""
    costs = f"{FAST} against float32, measured on this model and CPU: {said}{rest}"
    if len(fast) < len(SHAPES) or any(f > MARGIN * s for f, s in zip(fast, slow, strict=True)):
        return Numerics(base.dtype, f"float32, chosen at load: {costs}", ms)
    found = check(twin)
    if found is None or not found.ok:
        return Numerics(base.dtype, f"float32, chosen at load: {FAST} was faster ({costs}) but is not batch-invariant "
                                    f"on this model ({found or 'not measured: the capability probe failed first'}), so "
                                    "SSR in it would not write plain decoding's tokens", ms, str(found))
    return Numerics(FAST, f"{FAST}, chosen at load: {costs}; a token's logits are bitwise the same alone, beside other "
                          "rows and inside wider forwards (measured), so SSR writes plain decoding's tokens in it",
                    ms, str(found))


def shapes(lm: LoadedModel) -> list[tuple[int, int, int]]:
    """The forwards timed, ``(rows, tokens, context)``: :data:`SHAPES`, within the model's positions."""
    room = (lm.context_length or 1 << 30) - (WARM + STEPS) * 4 - 4
    return [(rows, tokens, min(context, room)) for rows, tokens, context in SHAPES]


def _shapes(lm: LoadedModel) -> list[str]:
    def words(rows: int, tokens: int, context: int) -> str:
        if not context:
            return f"a {tokens}-token prefill"
        what = "a lone step" if (rows, tokens) == (1, 1) else "two rows (a draft riding)" if rows == 2 \
            else f"a {tokens}-token verify"
        return f"{what} at {context} tokens"

    return [words(*shape) for shape in shapes(lm)]


def step_costs(base: LoadedModel, twin: LoadedModel) -> dict[str, list[float]]:
    """The median ms of a forward of each of :func:`shapes` in turn, per model's dtype: the two
    models' forwards interleaved (``timed_in_turn``: a busy machine weighs on each alike), after
    warm-up forwards; stopped after the first shape ``twin`` does not run faster by :data:`MARGIN`
    (the choice is made then: a CPU that emulates bf16 pays for none of its slow prefills)."""
    models = (base, twin)
    vocab = min(m.model.get_output_embeddings().weight.shape[0] for m in models)
    ms: dict[str, list[float]] = {m.dtype: [] for m in models}
    for rows, width, context in shapes(base):
        warm, timed = (WARM, STEPS) if context else PREFILLS
        ids = [(7919 * i + 13) % vocab for i in range(context + (warm + timed) * width)]
        got = timed_in_turn([_forwards(m, ids, rows, width, context) for m in models], warm, timed)
        for m, median in zip(models, got, strict=True):
            ms[m.dtype].append(median)
        if ms[twin.dtype][-1] > MARGIN * ms[base.dtype][-1]:
            break
    return ms


def _forwards(lm: LoadedModel, ids: list[int], rows: int, width: int, context: int) -> Callable[[int], Callable[[], object]]:
    """Round ``j``'s forward of one shape on ``lm`` (for ``timed_in_turn``): ``rows`` rows of
    ``width`` tokens after the ``context`` tokens prefilled once, each round appending; a prefill
    (``context`` 0) each round from an empty cache made before the clock."""

    def cache_of(slots: int):
        cache = lm.new_cache(slots + 4, rows=rows)
        if context:
            lm.step_logits(ids[:context], cache, 0)
        take_rows(cache, [0] * rows)
        return cache

    held = cache_of(len(ids)) if context else None

    def prepare(j: int) -> Callable[[], object]:
        at = context + j * width if context else 0
        return functools.partial(lm.forward, torch.tensor([ids[at : at + width]] * rows), held if held is not None else cache_of(width), at)

    return prepare


def _invariance(lm: LoadedModel) -> Check | None:
    """The capability probe's bf16 batch-invariance check on ``lm`` (the probe is then kept with the
    model: its later ``capabilities`` call reads it, nothing is measured twice); None where the probe
    ran no such check (plain decoding itself failed there)."""
    return capabilities(lm).check(INVARIANCE)


def _twin(lm: LoadedModel, dtype: torch.dtype, copy_weights: bool = False) -> LoadedModel:
    """``lm`` in ``dtype``: a copy (``copy_weights``: ``lm`` is kept as it is), else ``lm``'s own weights cast."""
    model = copy.deepcopy(lm.model) if copy_weights else lm.model
    twin = LoadedModel(model.to(dtype), lm.tokenizer, lm.model_id, lm.markers, lm.preset)
    twin.source = lm.source
    return twin


def _cache_file(lm: LoadedModel, identity: dict) -> Path:
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "numerics" / f"{Path(lm.source['folder']).name}-{key}.json"


def _saved(numerics: Numerics) -> dict:
    saved = asdict(numerics)
    del saved["cached"]
    return saved


def _read(path: Path, identity: dict) -> Numerics | None:
    try:
        record = json.loads(path.read_text())
        if record["identity"] != identity:
            return None
        return Numerics(**record["numerics"], cached=str(record["measured"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
