"""RSD threshold sweep: accuracy, fraction of draft steps kept and FLOPs against the threshold.

    python -m engine.tools.rsd_sweep --prompts arithmetic.jsonl (or --dataset, as the bench takes it) --thresholds 0.5,0.6,0.7,0.8,0.9 \\
        --out rsd-sweep.json [--html rsd-sweep.html] [--model tiny-reasoner]
        [--draft-model tiny-reasoner-draft] [--prm tiny-prm] [--db runs.db]

Like the paper's threshold ablation. For each prompt, ``target`` runs once and ``rsd`` once per
threshold (interleaved per prompt); every row reports accuracy, the fraction of draft steps kept,
and the median per-prompt FLOPs ratio to ``target``. ``--html`` writes the plotly chart.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from engine.benchmarks.runner import Bench
from engine.runlog import RunLog
from engine.runtime.model import ModelLoadError
from engine.tools.bench import add_source_args, problems_from_args
from engine.wiring import load_role, load_scorer, run_config


def sweep_rows(runs: list[dict], thresholds: list[float]) -> list[dict]:
    target = {r["prompt_id"]: r for r in runs if r["method"] == "target"}
    rows = [{"setting": "target", "threshold": None, **_summary([*target.values()], target)}]
    for t in thresholds:
        mine = [r for r in runs if r["method"] == "rsd" and r["threshold"] == t]
        rows.append({"setting": f"rsd {t:g}", "threshold": t, **_summary(mine, target)})
    return rows


def _summary(runs: list[dict], target: dict) -> dict:
    checked = [r["correct"] for r in runs if "correct" in r]
    steps = sum(r["steps_accepted"] + r["steps_rejected"] for r in runs)
    return {
        "accuracy": sum(checked) / len(checked) if checked else None,
        "fraction_steps_accepted": sum(r["steps_accepted"] for r in runs) / steps if steps else None,
        "median_flops_ratio_to_target": statistics.median(r["flops"] / target[r["prompt_id"]]["flops"] for r in runs),
        "median_latency_s": statistics.median(r["latency_s"] for r in runs),
    }


def chart(rows: list[dict]):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rsd = [r for r in rows if r["threshold"] is not None]
    target = rows[0]
    xs = [r["threshold"] for r in rsd]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=xs, y=[r["accuracy"] for r in rsd], name="RSD accuracy", mode="lines+markers"))
    fig.add_trace(go.Scatter(x=xs, y=[r["fraction_steps_accepted"] for r in rsd], name="draft steps kept",
                             mode="lines+markers"))
    fig.add_trace(go.Scatter(x=xs, y=[r["median_flops_ratio_to_target"] for r in rsd], name="FLOPs / target",
                             mode="lines+markers", line=dict(dash="dash")), secondary_y=True)
    if target["accuracy"] is not None:
        fig.add_hline(y=target["accuracy"], line_dash="dot", annotation_text="target alone accuracy",
                      annotation_position="bottom left")
    fig.update_layout(title=dict(text="RSD threshold sweep", x=0, xanchor="left"), xaxis_title="threshold (binary rule)",
                      height=440, legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0))
    fig.update_yaxes(title_text="accuracy / fraction", range=[0, 1.05], tickformat=".0%", secondary_y=False)
    fig.update_yaxes(title_text="FLOPs ratio to target", rangemode="tozero", tickformat=".2f", secondary_y=True)
    return fig


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.rsd_sweep", description=__doc__.split("\n")[0])
    add_source_args(ap)
    ap.add_argument("--thresholds", default="0.5,0.6,0.7,0.8,0.9")
    ap.add_argument("--out", required=True)
    ap.add_argument("--html", default=None)
    ap.add_argument("--model", default="tiny-reasoner")
    ap.add_argument("--draft-model", default="tiny-reasoner-draft")
    ap.add_argument("--prm", default="tiny-prm")
    ap.add_argument("--db", default=None)
    ap.add_argument("--max-think", type=int, default=None)
    ap.add_argument("--max-answer", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--draft-confidence", type=float, default=None,
                    help="also rewrite steps the draft doubts (default: the model's tuned value)")
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
        flags = {k: v for k, v in {"max_think": args.max_think, "max_answer": args.max_answer}.items() if v}
        if args.draft_confidence is not None:
            flags["draft_confidence"] = args.draft_confidence
        base = run_config(args.model, flags)
        configs = {t: base.replace(threshold=t) for t in thresholds}
        problems, dataset = problems_from_args(args)
        target = load_role(args.model)
        models = {"target": target, "draft": load_role(args.draft_model, target=target),
                  "scorer": load_scorer(args.prm), "prm_name": args.prm}
    except (ValueError, ModelLoadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    log = RunLog(args.db) if args.db else None
    runs = []
    benches = {t: Bench(models, ["rsd"], cfg, log=log, dataset=dataset) for t, cfg in configs.items()}
    target = Bench(models, ["target"], base, log=log, dataset=dataset)
    for problem in problems:
        runs.append(target.run_one("target", problem, 0))
        for t, bench in benches.items():
            runs.append({**bench.run_one("rsd", problem, 0), "threshold": t})
        print(f"  {problem.id} done", flush=True)
    rows = sweep_rows(runs, thresholds)
    Path(args.out).write_text(json.dumps({"runs": runs, "summary": rows}, indent=1))
    if args.html:
        chart(rows).write_html(args.html, include_plotlyjs="cdn")
    fmt = lambda v, f: "-" if v is None else f.format(v)
    print("setting     accuracy  steps kept  FLOPs/target  latency s")
    for r in rows:
        print(f"{r['setting']:<10}  {fmt(r['accuracy'], '{:8.1%}')}  {fmt(r['fraction_steps_accepted'], '{:10.1%}')}"
              f"  {r['median_flops_ratio_to_target']:12.3f}  {r['median_latency_s']:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
