"""Long reasoning: how SSR's cost grows with the length of the thinking, beside plain decoding.

    python -m engine.tools.scaling --model smollm2-135m-instruct --think 256,1024,2048 --drafts 1,4 \\
        [--forks shared,copied] [--prompt TEXT] [--max-answer 128] [--think-spec N] [--repeat 1] --out scaling.json

For each reasoning budget (``--think``), one baseline run and, for each number of drafts and each
way of holding the prefix (``--forks``: ``shared``, the drafts read the main row's cache; ``copied``,
each draft holds a copy of it, as before shared forks), one SSR run (greedy, drafting ``always``,
a draft every ``max(1, think / (drafts + 1))`` tokens from ``draft_start`` so the drafts spread over
the reasoning), interleaved on one loaded model after an untimed warm-up of each. ``--repeat N``
repeats the whole round and reports medians with their range. The default prompt asks for a long
essay, so the model's reasoning runs to the budget; the table says how long each reasoning was
(a model that ends its reasoning before the budget measures a shorter context).

Per row: SSR's latency over baseline's (the same budget, identical tokens checked), the same for
the reasoning phase alone (what the drafts riding cost there: the answer's savings, fixed in size,
weigh less as the reasoning grows, so the whole run's ratio drifts towards 1 by arithmetic), baseline's
median reasoning step, SSR's main row's median step alone (one row, one token: the steps where no
draft rode) and with drafts riding, each run's KV cache (the preallocated buffers, every row) and
the process's peak resident memory during the run (Linux: ``VmHWM`` reset before each run; weights
included, so compare rows, not absolutes; host memory only, so on a GPU read the KV cache column;
``None`` elsewhere). "drafts (forked)": the drafts asked for, and how many forked (a reasoning
that ends early forks fewer). The figures are written to ``--out``
as JSON and printed as a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from engine.events import ForwardEvent, TokenEvent
from engine.registry import decoder
from engine.runtime.model import ModelLoadError, SSRUnsupportedError
from engine.wiring import load_role, run_config

ESSAY = ("Think it through at great length before answering: write out every consideration, every counterargument "
         "and every example you can. Question: how did mathematics develop from ancient Babylon to today, century by "
         "century?")
FORKS = ("shared", "copied")


def peak_reset() -> None:
    """Reset the process's peak resident memory (Linux: ``VmHWM``), where the OS allows it."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_mb() -> float | None:
    """The process's peak resident memory since the last :func:`peak_reset`, in MiB (None: unreadable)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def measure(run, prompt: str, cfg) -> dict:
    """One run's figures: its latency, reasoning length, step times, cache and peak memory, and its tokens."""
    peak_reset()
    events = list(run(prompt, cfg))
    stats = events[-1].stats
    steps = [e for e in events if isinstance(e, ForwardEvent) and e.phase == "reasoning"]
    alone = [e.wall_s for e in steps if len(e.rows) == 1 and e.rows[0].fed == 1]
    riding = [e.wall_s for e in steps if len(e.rows) > 1]
    return {"wall_s": stats.wall_s, "reasoning_s": stats.reasoning_s, "reasoning_tokens": stats.reasoning_tokens, "cache_mb": stats.cache_mb,
            "peak_mb": peak_mb(), "step_alone_ms": 1e3 * statistics.median(alone) if alone else None,
            "step_drafting_ms": 1e3 * statistics.median(riding) if riding else None, "forks": stats.forks,
            "drafts": stats.drafts,
            "tokens": [e.token_id for e in events if isinstance(e, TokenEvent) and e.stream in ("reasoning", "answer")]}


def rounds(lm, prompt: str, thinks: list[int], drafts: list[int], forks: list[str], settings: dict,
           repeat: int, model: str) -> list[dict]:
    """Every run's figures, as rows: one baseline and one SSR per (drafts, forks) per budget, ``repeat`` times."""
    rows = []
    for think in thinks:
        base_cfg = run_config(model, {**settings, "max_think": think, "drafting": "always", "temperature": 0.0})
        warm = base_cfg.replace(max_think=min(think, 16), max_answer=4, draft_start=4, max_draft=4)
        for m in ("baseline", "ssr"):
            list(decoder(m, lm)(prompt, warm))  # untimed: the first run of each kind pays for what is cold
        for rep in range(repeat):
            base = measure(decoder("baseline", lm), prompt, base_cfg)
            rows.append({"think": think, "method": "baseline", "repeat": rep, **base})
            for n in drafts:
                interval = max(1, think // (n + 1))
                start = min(base_cfg.draft_start, think - 1)
                cfg = base_cfg.replace(num_drafts=n, draft_interval=interval, draft_start=start)
                for way in forks:
                    lm.share_forks = way == "shared"
                    try:
                        got = measure(decoder("ssr", lm), prompt, cfg)
                    finally:
                        lm.share_forks = None
                    got["identical"] = got["tokens"] == base["tokens"]
                    got["ratio"] = got["wall_s"] / base["wall_s"]
                    got["reasoning_ratio"] = got["reasoning_s"] / base["reasoning_s"] if base["reasoning_s"] else None
                    got["cache_vs_baseline"] = got["cache_mb"] / base["cache_mb"] if base["cache_mb"] else None
                    rows.append({"think": think, "method": "ssr", "num_drafts": n, "way": way, "repeat": rep,
                                 "baseline_step_ms": base["step_alone_ms"], **got})
    for r in rows:
        del r["tokens"]
    return rows


def table(rows: list[dict]) -> list[dict]:
    """One line per (budget, drafts, forks): medians over the repeats, the ratio's range."""
    keys = sorted({(r["think"], r["num_drafts"], r["way"]) for r in rows if r["method"] == "ssr"},
                  key=lambda k: (k[0], k[1], FORKS.index(k[2])))
    out = []
    for think, n, way in keys:
        mine = [r for r in rows if r["method"] == "ssr" and (r["think"], r["num_drafts"], r["way"]) == (think, n, way)]

        def med(key, mine=mine):
            values = [r[key] for r in mine if r[key] is not None]
            return statistics.median(values) if values else None

        ratios = [r["ratio"] for r in mine]
        out.append({"think": think, "reasoning": med("reasoning_tokens"), "drafts": n, "forked": med("drafts"), "forks": way,
                    "ssr_vs_baseline": med("ratio"), "ratio_range": [min(ratios), max(ratios)],
                    "reasoning_vs_baseline": med("reasoning_ratio"),
                    "baseline_step_ms": med("baseline_step_ms"), "ssr_alone_step_ms": med("step_alone_ms"),
                    "ssr_drafting_step_ms": med("step_drafting_ms"), "cache_mb": med("cache_mb"),
                    "cache_vs_baseline": med("cache_vs_baseline"), "peak_mb": med("peak_mb"),
                    "identical": all(r["identical"] for r in mine), "path": mine[0]["forks"]})
    return out


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def print_table(lines: list[dict]) -> None:
    head = ("think", "reasoned", "drafts (forked)", "forks", "ssr/base", "range", "reasoning ssr/base", "base step ms", "alone ms", "riding ms",
            "cache MB", "cache/base", "peak MB", "identical")
    print(" | ".join(head))
    for r in lines:
        print(" | ".join([str(r["think"]), _fmt(r["reasoning"], ".0f"), f"{r['drafts']} ({_fmt(r['forked'], '.0f')})", r["forks"],
                          _fmt(r["ssr_vs_baseline"], ".3f"), f"{r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}",
                          _fmt(r["reasoning_vs_baseline"], ".3f"),
                          _fmt(r["baseline_step_ms"], ".1f"), _fmt(r["ssr_alone_step_ms"], ".1f"),
                          _fmt(r["ssr_drafting_step_ms"], ".1f"), _fmt(r["cache_mb"], ".1f"),
                          _fmt(r["cache_vs_baseline"], ".2f"), _fmt(r["peak_mb"], ".0f"), str(r["identical"])]))
    copied = [r for r in lines if r["forks"] == "shared" and not r["path"].startswith("shared")]
    for r in copied:
        print(f"note: at think {r['think']}, {r['drafts']} drafts, 'shared' ran as {r['path']}")


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes whole numbers separated by commas; got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"{flag} takes whole numbers of at least 1; got {text!r}")
    return values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.scaling", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-reasoner", help="bundled name, registry model, preset or local folder")
    ap.add_argument("--think", default="256,1024,2048", help="reasoning budgets (max_think), comma-separated")
    ap.add_argument("--drafts", default="1,4", help="numbers of drafts, comma-separated")
    ap.add_argument("--forks", default="shared,copied", help=f"how the drafts hold the prefix: {', '.join(FORKS)}")
    ap.add_argument("--prompt", default=ESSAY, help="the user message (default: a long essay question)")
    ap.add_argument("--max-answer", type=int, default=128)
    ap.add_argument("--draft-start", type=int, default=None, help="the first draft's fork (default: the model's)")
    ap.add_argument("--max-draft", type=int, default=None, help="tokens per draft (default: the model's)")
    ap.add_argument("--think-spec", type=int, default=None,
                    help="most lookup tokens a row verifies per reasoning step (default: the model's; 0: one token a step)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds of every run (medians and ranges over them)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", required=True, help="results JSON: every run and the table")
    args = ap.parse_args(argv)
    try:
        thinks, drafts = _ints(args.think, "--think"), _ints(args.drafts, "--drafts")
        forks = [f.strip() for f in args.forks.split(",") if f.strip()]
        bad = [f for f in forks if f not in FORKS]
        if bad or not forks:
            raise ValueError(f"--forks takes {' and/or '.join(FORKS)}; got {args.forks!r}")
        if args.think_spec is not None and args.think_spec < 0:
            raise ValueError(f"--think-spec must be 0 or more; got {args.think_spec}")
        if args.repeat < 1:
            raise ValueError(f"--repeat must be at least 1; got {args.repeat}")
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        settings = {k: v for k, v in (("max_answer", args.max_answer), ("draft_start", args.draft_start),
                                      ("max_draft", args.max_draft), ("think_spec", args.think_spec)) if v is not None}
        lm = load_role(args.model, args.device)
        lm.require_markers()
        rows = rounds(lm, args.prompt, thinks, drafts, forks, settings, args.repeat, args.model)
    except (ValueError, ModelLoadError, SSRUnsupportedError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    lines = table(rows)
    Path(args.out).write_text(json.dumps({"model": args.model, "prompt": args.prompt, "table": lines, "runs": rows},
                                         indent=1))
    print_table(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
