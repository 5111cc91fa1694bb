"""What SSR relies on, measured on a model loaded on llama.cpp (as ``engine.runtime.probe`` measures
it on the torch runtime): a sequence's logits must not depend on the batch around it.

The reference is one-token decoding: a prefix, then a stretch of the model's own greedy tokens fed
one at a time. Each check feeds the same stretch another way and takes the largest logit
difference from it; every check must be **bit-identical** (tolerance 0): llama.cpp has one kernel
route, so a difference anywhere is a batch dependence that greedy SSR could meet at a near tie.
The checks run SSR's own rows (``engine.llamacpp.rows.SeqRows``):

* last-only prefill: the prefix decoded with only its last token's logits asked for (a run's
  prefill), against the same prefix with every token's;
* verify widths: the stretch in forwards of several widths (a verify);
* wide: most of the prefix and the stretch in one forward, wider than a micro-batch
  (``engine.llamacpp.lib.UBATCH``: llama.cpp splits it; at 64 tokens a micro-batch would take
  another kernel path, measured to differ);
* split prefill: the prefix in batches of 16 tokens (a long prompt is split at the batch size);
* rollback: every step feeds its token and three wrong ones, then removes them (``seq_rm``);
* fork: three forked rows beside the main row, each fed its own tokens (``seq_cp``) and rolled
  back, then leaving (the main row's cells must stay in position order: ``engine.llamacpp.rows``);
* rows keeping different counts: the main row verifying four tokens a step beside a row that
  keeps one of its four;
* long context: after a prefix of :data:`LONG` tokens, the main row verifying three tokens a step
  beside two forked rows that roll back and then leave, against its own one-token reference (past
  512 cells llama.cpp's attention may split a lone token's cells across threads: measured to
  differ with an f16 KV cache; and past a sliding window, llama.cpp reuses cells out of it).

The names are this runtime's own: the torch probe's "multi-token" and "holes" have a route around
them there (one token a step, rows without holes), which llama.cpp does not take, so a failed
check here refuses SSR (``Capabilities.failed``).

The result is the ``Capabilities`` the torch runtime's probe gives (``engine.runtime.probe.require``
refuses a method on it); it also measures the KV bytes per cell. It is kept in the cache
(``$SSR_STUDIO_CACHE/probe``) under everything it depends on (the file, llama-cpp-python's version
and build, the contexts' settings, this package's source), and read back by the next load.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import torch

from engine.llamacpp import lib
from engine.llamacpp.rows import SeqRows
from engine.runtime.capabilities import Capabilities, Check
from engine.runtime.gguf import cache_dir
from engine.runtime.probe import read_record, write_record

PREFIX = 80  # tokens before the stretch: past 64, where llama.cpp's micro-batches would change kernel path
STRETCH = 16  # tokens fed after the prefix
LONG = 560  # the long-context check's prefix: past 512 cells
TEXT = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May? Let us think step by step. ")


def probe(lm, progress=None) -> Capabilities:
    """``lm``'s capabilities (a ``LlamaModel``): read back from the cache, else measured (and kept
    there); set on ``lm`` (``require`` reads them) and returned."""
    ident = identity(lm)
    path = cache_dir() / "probe" / f"llama-{Path(lm.native.path).stem}-{_digest(ident)}.json"
    caps = _read(lm, path, ident)
    if caps is None:
        caps = _measure(lm, progress)
        if all(c.error is None for c in caps.checks):
            write_record(path, ident, caps, cell_bytes=lm.cell_bytes)
    lm.capabilities = caps  # what engine.runtime.probe.capabilities returns for this model
    return caps


def identity(lm) -> dict:
    """Everything the probe's result on ``lm`` depends on."""
    L, file = lib.api(), Path(lm.native.path)
    source = hashlib.sha256(b"".join(f.read_bytes() for f in sorted(Path(__file__).parent.glob("*.py"))))
    return {"format": 1, "file": str(file.resolve()), "size": file.stat().st_size, "mtime": file.stat().st_mtime,
            "llama_cpp": lib.version(), "build": L.llama_print_system_info().decode(errors="replace"),
            "kv": lm.kv, "flash": lm.flash, "threads": lm.threads, "ubatch": lib.UBATCH,
            "extra_bufts": os.environ.get("SSR_LLAMA_EXTRA_BUFTS") == "1", "engine": source.hexdigest()[:16]}


def _digest(ident: dict) -> str:
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]


def _read(lm, path: Path, ident: dict) -> Capabilities | None:
    found = read_record(path, ident)
    if found is None:
        return None
    caps, record = found
    try:
        lm.cell_bytes = float(record["cell_bytes"])
    except (KeyError, TypeError, ValueError):
        return None
    return caps


def _measure(lm, progress=None) -> Capabilities:
    """The checks, measured now."""
    if progress is not None:
        progress(f"measuring what SSR relies on, on {lm.model_id} on llama.cpp (a few short batches)")
    t0 = time.perf_counter()
    prefix = lm.tokenizer(TEXT * 3)["input_ids"][:PREFIX]
    ctx = lm.new_cache(len(prefix) + 4 * STRETCH + 64, role="probe").ctx
    try:
        ref, stretch = _reference(ctx, prefix)
        lm.cell_bytes = _cell_bytes(ctx, prefix)
        checks = [
            _measured("last-only prefill", lambda: _last_only(ctx, prefix, ref)),
            _measured("verify widths", lambda: _widths(ctx, prefix, stretch, ref)),
            _measured("wide", lambda: _wide(ctx, prefix, stretch, ref)),
            _measured("split prefill", lambda: _split(lm, prefix, stretch, ref)),
            _measured("rollback", lambda: _rollback(ctx, prefix, stretch, ref)),
            _measured("fork", lambda: _fork(ctx, prefix, stretch, ref, lm.native.vocab_size)),
            _measured("rows keeping different counts", lambda: _holes(ctx, prefix, stretch, ref, lm.native.vocab_size)),
            _measured("long context", lambda: _long(lm, prefix, lm.native.vocab_size)),
        ]
    except lib.LlamaError as err:  # the reference itself could not run: plain decoding cannot either
        checks = [Check("one-token decoding", False, error=str(err))]
    finally:
        ctx.clear()
    return Capabilities(tuple(checks), False, len(prefix), 0.0, time.perf_counter() - t0)


def exact_refusal(lm) -> str | None:
    """Why exact mode cannot hold on ``lm`` (the checks that were not bit-identical), or None."""
    failed = [c for c in lm.capabilities.checks if not c.ok]
    if not failed:
        return None
    return (f"exact mode is refused on {lm.model_id} on llama.cpp: measured at load, its logits depend on the batch "
            f"({'; '.join(map(str, failed))})")


def _measured(name: str, fn) -> Check:
    try:
        diff = float(fn())
    except lib.LlamaError as err:
        return Check(name, False, error=str(err))
    return Check(name, diff == 0.0, diff)


def _decode(ctx, tokens: list[int], start: int, seq: int = 0) -> torch.Tensor:
    return torch.from_numpy(ctx.decode([lib.Item(t, start + i, seq) for i, t in enumerate(tokens)]))


def _reference(ctx, prefix: list[int]) -> tuple[torch.Tensor, list[int]]:
    """Logits ``[STRETCH + 1, V]`` after the prefix and after each greedy token fed alone, and the tokens."""
    ctx.clear()
    logits = [_decode(ctx, prefix, 0)[-1]]
    stretch = []
    for i in range(STRETCH):
        stretch.append(int(logits[-1].argmax()))
        logits.append(_decode(ctx, stretch[-1:], len(prefix) + i)[0])
    return torch.stack(logits), stretch


def _diff(got: list[torch.Tensor], ref: torch.Tensor) -> float:
    return float((torch.stack(got) - ref[: len(got)]).abs().max())


def _prefilled(ctx, prefix: list[int]) -> list[torch.Tensor]:
    ctx.clear()
    return [_decode(ctx, prefix, 0)[-1]]


def _last_only(ctx, prefix, ref) -> float:
    ctx.clear()
    last = torch.from_numpy(ctx.decode([lib.Item(t, i, 0, i == len(prefix) - 1) for i, t in enumerate(prefix)]))
    return _diff([last[-1]], ref)


def _widths(ctx, prefix, stretch, ref) -> float:
    got, at = _prefilled(ctx, prefix), 0
    for width in (2, 3, 5, 1, 4):
        got += list(_decode(ctx, stretch[at : at + width], len(prefix) + at))
        at += width
    return _diff(got, ref)


def _wide(ctx, prefix, stretch, ref) -> float:
    ctx.clear()
    _decode(ctx, prefix[:8], 0)
    return _diff(list(_decode(ctx, prefix[8:] + stretch, 8)[len(prefix) - 9 :]), ref)


def _split(lm, prefix, stretch, ref) -> float:
    small = lm.context(len(prefix) + STRETCH + 64, 1, batch=16, ubatch=16)
    try:
        got = [_decode(small, prefix, 0)[-1]]
        got += [_decode(small, [t], len(prefix) + i)[0] for i, t in enumerate(stretch)]
    finally:
        small.close()
    return _diff(got, ref)


def _rollback(ctx, prefix, stretch, ref) -> float:
    got = _prefilled(ctx, prefix)
    for i, t in enumerate(stretch):
        pos = len(prefix) + i
        got.append(_decode(ctx, [t, (t + 5) % 97, (t + 6) % 97, (t + 7) % 97], pos)[0])
        ctx.seq_rm(0, pos + 1)
    return _diff(got, ref)


def _fork(ctx, prefix, stretch, ref, vocab: int) -> float:
    """Three forked rows beside the main row, each fed two tokens a step and keeping one; halfway
    they leave (their cells parked), and the main row goes on alone past where they were."""
    got = _prefilled(ctx, prefix)
    rows = SeqRows(_Cache(ctx), len(prefix))
    for _ in range(3):
        rows.fork()
    for i, t in enumerate(stretch):
        others = [[(t * 7 + 13 * r + i) % vocab, (t + r) % vocab] for r in range(1, rows.rows)]
        logits = rows.forward([[t], *others])
        rows.keep([1] * rows.rows)
        got.append(logits[0, 0])
        if i == STRETCH // 3:
            rows.select([0])
    return _diff(got, ref)


def _holes(ctx, prefix, stretch, ref, vocab: int) -> float:
    """The main row verifies 4 tokens a step (the right ones: it keeps them all) beside a row fed
    4 tokens that keeps 1; the rows' cells interleave, and the main row's positions stay its own."""
    got = _prefilled(ctx, prefix)
    rows = SeqRows(_Cache(ctx), len(prefix))
    rows.fork()
    for at in range(0, STRETCH, 4):
        feed = stretch[at : at + 4]
        logits = rows.forward([feed, [(t * 3 + 1) % vocab for t in feed]])
        rows.keep([len(feed), 1])
        got += list(logits[0, : len(feed)])
    return _diff(got, ref)


def _long(lm, prefix: list[int], vocab: int) -> float:
    """One prefill of :data:`LONG` tokens; the one-token reference after it; then, rolled back to
    the prefix (as the rollback check vouches), the same stretch three tokens a forward beside two
    forked rows fed two tokens and keeping one, which leave a third of the way."""
    long = (prefix * (LONG // len(prefix) + 1))[:LONG]
    ctx = lm.context(LONG + 4 * STRETCH + 64)
    try:
        ref, stretch = _reference(ctx, long)
        ctx.seq_rm(0, LONG)
        rows, got = SeqRows(_Cache(ctx), LONG), [ref[0]]
        rows.fork()
        rows.fork()
        for at in range(0, STRETCH, 3):
            feed = stretch[at : at + 3]
            others = [[(t * 5 + r) % vocab, (t + 7 * r) % vocab] for r, t in zip(range(1, rows.rows), feed, strict=False)]
            logits = rows.forward([feed, *others])
            rows.keep([len(feed)] + [1] * (rows.rows - 1))
            got += list(logits[0, : len(feed)])
            if at == 3:
                rows.select([0])
    finally:
        ctx.close()
    return _diff(got, ref)


class _Cache:
    """What SeqRows reads of a cache, for the checks' own contexts."""

    def __init__(self, ctx) -> None:
        self.ctx, self.fed = ctx, 0


def _cell_bytes(ctx, prefix: list[int]) -> float:
    """KV bytes per cell: sequence 0's saved state at two lengths (its fixed header cancels out)."""
    _prefilled(ctx, prefix[:16])
    small = ctx.seq_bytes(0)
    _decode(ctx, prefix[16:], 16)
    return (ctx.seq_bytes(0) - small) / (len(prefix) - 16)
