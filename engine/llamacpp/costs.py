"""What a row and a verify width cost on llama.cpp, measured on the loaded model: the median time
of a batch of ``rows`` sequences fed one token each, and of one sequence fed ``width`` tokens, at
``context`` tokens of context, each over the same one-token step (where speculation pays on this
runtime follows from these: docs/BENCHMARKS.md "llama.cpp as a runtime").

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


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.llamacpp.costs --model smollm2-135m-instruct [--kv f16] [--no-flash]``: the
    probe's checks and the costs on a context of these settings (what docs/BENCHMARKS.md compares)."""
    import argparse
    import sys

    from engine.llamacpp import lib
    from engine.llamacpp.model import load_llama
    from engine.runtime.model import ModelLoadError

    ap = argparse.ArgumentParser(prog="python -m engine.llamacpp.costs", description=main.__doc__)
    ap.add_argument("--model", default="smollm2-135m-instruct", help="a registry model or a .gguf file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv", choices=tuple(lib.KV_TYPES), default=lib.KV, help="the KV cache type")
    ap.add_argument("--no-flash", action="store_true", help="flash attention off")
    ap.add_argument("--context", type=int, default=200, help="tokens of context the costs are measured at")
    args = ap.parse_args(argv)
    try:
        lm = load_llama(args.model, args.threads, kv=args.kv, flash=not args.no_flash)
    except ModelLoadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(lm.step_mode)
    for check in lm.capabilities.checks:
        print(f"  {check}")
    print(said(costs(lm, args.context)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
