"""What a row and a verify width cost on llama.cpp, measured on the loaded model: the median time
of a batch of ``rows`` sequences fed one token each, and of one sequence fed ``width`` tokens, at
``context`` tokens of context, each over the same one-token step (where speculation pays on this
runtime follows from these: docs/BENCHMARKS.md "llama.cpp").

>>> costs(lm)["widths"][9]   # a 9-token verify, in one-token steps
"""

from __future__ import annotations

import statistics
import time

from engine.llamacpp.lib import Item

WIDTHS = (2, 3, 4, 9, 17, 33)
ROWS = (2, 3, 4)


def costs(lm, context: int = 200, repeat: int = 15) -> dict:
    """``{"step_ms": one-token step, "widths": {k: x step}, "rows": {r: x step}, "context": ...}``."""
    cache = lm.new_cache(context + 2 * max(WIDTHS) + 64, role="costs")
    ctx = cache.ctx
    vocab = lm.native.vocab_size
    prefix = [(17 * i + 5) % vocab for i in range(context)]
    ctx.decode([Item(t, i, 0, i == context - 1) for i, t in enumerate(prefix)])
    for seq in range(1, max(ROWS)):
        ctx.seq_cp(0, seq)

    def timed(items: list[Item]) -> float:
        times = []
        for _ in range(repeat + 2):
            t0 = time.perf_counter()
            ctx.decode(items)
            times.append(time.perf_counter() - t0)
            for seq in {it.seq for it in items}:
                ctx.seq_rm(seq, context)
        return statistics.median(times[2:])  # the first two: warm-up

    one = timed([Item(1, context, 0)])
    widths = {k: timed([Item(1 + j, context + j, 0) for j in range(k)]) / one for k in WIDTHS}
    rows = {r: timed([Item(1 + s, context, s) for s in range(r)]) / one for r in ROWS}
    ctx.clear()
    return {"context": context, "step_ms": one * 1e3, "widths": widths, "rows": rows}


def said(c: dict) -> str:
    widths = ", ".join(f"{k} {x:.2f}x" for k, x in c["widths"].items())
    rows = ", ".join(f"{r} {x:.2f}x" for r, x in c["rows"].items())
    return (f"llama.cpp costs at {c['context']} tokens of context: one step {c['step_ms']:.1f} ms; a verify of k tokens "
            f"({widths}); r rows of one token ({rows})")
