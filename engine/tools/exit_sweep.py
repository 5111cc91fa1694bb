"""Early-exit sweep: ``ssr-exit``'s accuracy against the reasoning tokens it saves, beside baseline and SSR.

    python -m engine.tools.exit_sweep --prompts classes.jsonl (or --dataset, as the bench takes it) \\
        --ks 1,2,3,4 --intervals 16 [--confidences 0,0.9] [--min-think 0] [--num-drafts 12] \\
        --out exit-sweep.json [--html exit-sweep.html] [--model tiny-reasoner] [--db runs.db] [run settings]
    python -m engine.tools.exit_sweep --merge part1.json part2.json --out all.json [--html all.html]

For each problem, ``baseline`` and ``ssr`` (the model's recommended settings, as the bench runs
them) and then ``ssr-exit`` once per setting (every k x interval x confidence; the probes are SSR's
iterative drafts: ``--num-drafts`` of them, one every interval tokens from ``draft_start``), one
after another on the same problem, after an untimed warm-up of each. Every row reports accuracy with
its Wilson 95% interval, the change from baseline on the same problems (answers lost and gained, and
a paired 95% interval), the reasoning tokens against baseline's (all problems' together), the median
per-problem latency ratio to baseline and to SSR with their IQR, and how many runs exited. ``--html``
writes the accuracy-vs-reasoning-tokens curve (one line per interval and confidence, a point per k).
``--merge`` summarises the runs of sweeps made with the same settings on different problems (a
long sweep split in parts that ran side by side) as one.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
from pathlib import Path

from engine.benchmarks.runner import Bench
from engine.benchmarks.summary import Z95, iqr, wilson
from engine.methods.exit.budget import NAME as METHOD
from engine.runlog import RunLog
from engine.runtime.model import ModelLoadError, SSRUnsupportedError
from engine.tools.bench import CONFIG_FLAGS, add_source_args, problems_from_args
from engine.wiring import load_role, run_config

EXIT_FLAGS = ("exit_k", "exit_confidence", "draft_interval", "num_drafts", "exit_min_think")


def setting_name(k: int, interval: int, confidence: float) -> str:
    return f"k={k} every {interval}" + (f" p>={confidence:g}" if confidence > 0 else "")


def sweep_rows(runs: list[dict], settings: list[dict]) -> list[dict]:
    """One summary row for baseline, SSR and each ``ssr-exit`` setting, over the problems every run covers."""
    base = {r["prompt_id"]: r for r in runs if r["method"] == "baseline"}
    ssr = {r["prompt_id"]: r for r in runs if r["method"] == "ssr"}
    rows = [{"setting": "baseline", **_summary(list(base.values()), base, ssr)},
            {"setting": "ssr", **_summary(list(ssr.values()), base, ssr)}]
    for st in settings:
        mine = [r for r in runs if r["method"] == METHOD and r.get("setting") == st["setting"]]
        rows.append({**st, **_summary(mine, base, ssr)})
    return rows


def _grade(run: dict | None) -> bool | None:
    """A run's grade; on a task graded by agreement with baseline (code, free text) baseline's own
    answer is the reference (right by definition), and the others' grade is their agreement with it."""
    if run is None:
        return None
    if run.get("correct") is None and run["method"] == "baseline" and run.get("graded_by") == "agreement with baseline":
        return True
    return None if run.get("correct") is None else bool(run["correct"])


def _summary(runs: list[dict], base: dict, ssr: dict) -> dict:
    graded = [r for r in runs if _grade(r) is not None and _grade(base.get(r["prompt_id"])) is not None]
    right = sum(_grade(r) for r in graded)
    lost = sum(_grade(base[r["prompt_id"]]) and not _grade(r) for r in graded)
    gained = sum(_grade(r) and not _grade(base[r["prompt_id"]]) for r in graded)
    n = len(graded)
    lat_b = [r["latency_s"] / base[r["prompt_id"]]["latency_s"] for r in runs if r["prompt_id"] in base]
    lat_s = [r["latency_s"] / ssr[r["prompt_id"]]["latency_s"] for r in runs if r["prompt_id"] in ssr]
    think = sum(base[r["prompt_id"]]["reasoning_tokens"] for r in runs if r["prompt_id"] in base)
    return {
        "problems": len(runs),
        "accuracy": right / n if n else None,
        "accuracy_interval": list(wilson(right, n)) if n else None,
        "lost": lost, "gained": gained,
        "accuracy_change": (gained - lost) / n if n else None,
        "accuracy_change_interval": list(paired_interval(lost, gained, n)) if n else None,
        "reasoning_ratio": sum(r["reasoning_tokens"] for r in runs if r["prompt_id"] in base) / think if think else None,
        "median_latency_ratio_to_baseline": statistics.median(lat_b) if lat_b else None,
        "latency_ratio_iqr": list(iqr(lat_b)) if lat_b else None,
        "median_latency_ratio_to_ssr": statistics.median(lat_s) if lat_s else None,
        "latency_ratio_to_ssr_iqr": list(iqr(lat_s)) if lat_s else None,
        "exited": sum(r.get("exit_at") is not None for r in runs),
    }


def paired_interval(lost: int, gained: int, n: int) -> tuple[float, float]:
    """A 95% interval for the change in accuracy on the same ``n`` problems, from the discordant
    pairs (``lost``: right before, wrong now; ``gained``: the reverse)."""
    d = (gained - lost) / n
    se = math.sqrt(max(gained + lost - n * d * d, 0.0)) / n
    return d - Z95 * se, d + Z95 * se


def chart(rows: list[dict]):
    import plotly.graph_objects as go

    fig = go.Figure()
    base = rows[0]
    for (interval, conf), group in itertools.groupby(
            sorted((r for r in rows if "exit_k" in r and r["accuracy"] is not None),
                   key=lambda r: (r["draft_interval"], r["exit_confidence"], r["exit_k"])),
            key=lambda r: (r["draft_interval"], r["exit_confidence"])):
        group = list(group)
        fig.add_trace(go.Scatter(
            x=[r["reasoning_ratio"] for r in group], y=[r["accuracy"] for r in group], mode="lines+markers+text",
            text=[f"k={r['exit_k']}" for r in group], textposition="top center",
            name=f"ssr-exit, a draft every {interval}" + (f", p >= {conf:g}" if conf else ""),
            error_y=dict(type="data", symmetric=False, array=[r["accuracy_interval"][1] - r["accuracy"] for r in group],
                         arrayminus=[r["accuracy"] - r["accuracy_interval"][0] for r in group])))
    if not fig.data:
        fig.add_annotation(text="no graded runs: accuracy needs references (or a baseline to agree with)",
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    for r, color in ((base, "#6b7280"), (rows[1], "#2563eb")):
        if r["accuracy"] is not None:
            fig.add_trace(go.Scatter(x=[r["reasoning_ratio"]], y=[r["accuracy"]], mode="markers", name=r["setting"],
                                     marker=dict(size=11, color=color, symbol="diamond")))
    fig.update_layout(title=dict(text="Early exit: accuracy against reasoning tokens (k sweep)", x=0, xanchor="left"),
                      xaxis_title="reasoning tokens / baseline's", yaxis_title="accuracy", height=460,
                      legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0))
    fig.update_yaxes(tickformat=".0%")
    fig.update_xaxes(tickformat=".0%")
    return fig


def _fmt(v, f: str) -> str:
    return "-" if v is None else f.format(v)


def format_rows(rows: list[dict]) -> str:
    out = [("setting                 accuracy  95% interval  change (lost/gained)  paired 95%     reasoning/base"
            "  latency/base (IQR)     latency/ssr (IQR)      exited")]
    for r in rows:
        ai, ci = r["accuracy_interval"], r["accuracy_change_interval"]
        out.append(
            f"{r['setting']:<22}  {_fmt(r['accuracy'], '{:8.1%}')}  {_fmt(ai and ai[0], '{:.0%}')}-{_fmt(ai and ai[1], '{:.0%}'):<8}"
            f"  {_fmt(r['accuracy_change'], '{:+6.1%}')} ({r['lost']}/{r['gained']}){'':<7}"
            f"  {_fmt(ci and ci[0], '{:+.1%}')}..{_fmt(ci and ci[1], '{:+.1%}'):<7}"
            f"  {_fmt(r['reasoning_ratio'], '{:13.3f}')}"
            f"  {_fmt(r['median_latency_ratio_to_baseline'], '{:.3f}')} ({_fmt(r['latency_ratio_iqr'] and r['latency_ratio_iqr'][0], '{:.2f}')}-{_fmt(r['latency_ratio_iqr'] and r['latency_ratio_iqr'][1], '{:.2f}')})"
            f"    {_fmt(r['median_latency_ratio_to_ssr'], '{:.3f}')} ({_fmt(r['latency_ratio_to_ssr_iqr'] and r['latency_ratio_to_ssr_iqr'][0], '{:.2f}')}-{_fmt(r['latency_ratio_to_ssr_iqr'] and r['latency_ratio_to_ssr_iqr'][1], '{:.2f}')})"
            f"  {r['exited']}/{r['problems']}")
    return "\n".join(out)


def merged(paths: list[str]) -> tuple[list[dict], list[dict], dict | None]:
    """The runs of several sweeps' results files, their settings and their model and base settings
    (ValueError unless they match and cover different problems)."""
    runs, settings, base, seen = [], None, None, set()
    for path in paths:
        try:
            result = json.loads(Path(path).read_text())
            mine = [{k: r[k] for k in ("setting", *EXIT_FLAGS)} for r in result["summary"] if "exit_k" in r]
            theirs = result["base"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"--merge {path}: not a results file of this sweep ({err})") from None
        if settings is not None and (mine != settings or theirs != base):
            raise ValueError(f"--merge {path}: its model or settings differ from {paths[0]}'s")
        settings, base = mine, theirs
        ids = {r["prompt_id"] for r in result["runs"]}
        if ids & seen:
            raise ValueError(f"--merge {path}: problems already in an earlier file ({', '.join(sorted(ids & seen)[:3])})")
        seen |= ids
        runs += result["runs"]
    return runs, settings or [], base


def _write(rows: list[dict], runs: list[dict], out: str, html: str | None, base: dict | None = None) -> None:
    Path(out).write_text(json.dumps({"base": base, "runs": runs, "summary": rows}, indent=1))
    if html:
        chart(rows).write_html(html, include_plotlyjs="cdn")
    print(format_rows(rows))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.exit_sweep", description=__doc__.split("\n")[0])
    if argv is None:
        argv = sys.argv[1:]
    if "--merge" in argv:  # summarise finished sweeps: no source, no model
        mp = argparse.ArgumentParser(prog="python -m engine.tools.exit_sweep --merge")
        mp.add_argument("--merge", nargs="+", required=True)
        mp.add_argument("--out", required=True)
        mp.add_argument("--html", default=None)
        margs = mp.parse_args(argv)
        try:
            runs, settings, base = merged(margs.merge)
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        _write(sweep_rows(runs, settings), runs, margs.out, margs.html, base)
        return 0
    add_source_args(ap)
    ap.add_argument("--ks", default="1,2,3,4", help="agreeing drafts needed (exit_k), comma-separated")
    ap.add_argument("--intervals", default=None, help="reasoning tokens between drafts (draft_interval), comma-separated "
                    "(default: the run settings' draft_interval)")
    ap.add_argument("--confidences", default="0", help="the agreeing drafts' mean token probability bar (exit_confidence)")
    ap.add_argument("--min-think", type=int, default=0, help="never exit before this many reasoning tokens")
    ap.add_argument("--num-drafts", type=int, default=12, help="the most drafts (probes) an ssr-exit run forks")
    ap.add_argument("--out", required=True)
    ap.add_argument("--html", default=None)
    ap.add_argument("--model", default="tiny-reasoner")
    ap.add_argument("--db", default=None)
    ap.add_argument("--threads", type=int, default=None)
    for name, kind in CONFIG_FLAGS.items():
        if name not in EXIT_FLAGS:
            ap.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        base = run_config(args.model, {k: getattr(args, k) for k in CONFIG_FLAGS
                                       if k not in EXIT_FLAGS and getattr(args, k) is not None})
        ks = [int(k) for k in args.ks.split(",") if k.strip()]
        intervals = [int(i) for i in args.intervals.split(",") if i.strip()] if args.intervals else [base.draft_interval]
        confidences = [float(c) for c in args.confidences.split(",") if c.strip()]
        settings, configs = [], {}
        for k, interval, conf in itertools.product(ks, intervals, confidences):
            name = setting_name(k, interval, conf)
            configs[name] = base.replace(exit_k=k, draft_interval=interval, exit_confidence=conf,
                                         num_drafts=args.num_drafts, exit_min_think=args.min_think).check_ssr()
            settings.append({"setting": name, "exit_k": k, "draft_interval": interval, "exit_confidence": conf,
                             "exit_min_think": args.min_think, "num_drafts": args.num_drafts})
        problems, dataset = problems_from_args(args)
        lm = load_role(args.model)
        lm.require_markers()
    except (ValueError, ModelLoadError, SSRUnsupportedError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    models = {"target": lm}
    log = RunLog(args.db) if args.db else None
    plain = Bench(models, ["baseline", "ssr"], base.check_ssr(), log=log, dataset=dataset)
    exits = {name: Bench(models, [METHOD], cfg, log=log, dataset=dataset) for name, cfg in configs.items()}
    for bench in (plain, *exits.values()):
        bench.warm_up(problems[0])
    runs = []
    for i, problem in enumerate(problems):
        b = plain.run_one("baseline", problem, 0)
        runs += [b, plain.run_one("ssr", problem, 0, b["answer_text"])]
        for name, bench in exits.items():
            runs.append({**bench.run_one(METHOD, problem, 0, b["answer_text"]), "setting": name})
        print(f"  [{i + 1}/{len(problems)}] {problem.id} done", file=sys.stderr, flush=True)
    _write(sweep_rows(runs, settings), runs, args.out, args.html, {"model": args.model, "config": base.to_dict()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
