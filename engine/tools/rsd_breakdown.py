"""Where RSD loses accuracy: every wrong answer classified by its first wrong step.

    python -m engine.tools.rsd_breakdown --n 300 --seed 3000000 [--threshold 0.7] [--draft-confidence G]
        [--out breakdown.json]

Runs ``target`` and ``rsd`` on ``--n`` held-out ``arithmetic`` prompts (seeds from ``--seed``,
far from training's and from the docs' other evaluations) and reads each RSD chain against the
prompt's reference chain, paragraph by paragraph:

* ``prm-miss``: the first wrong paragraph was written by the draft and kept by the PRM;
* ``target-slip``: it was written by the target (after the PRM rejected the draft's step);
* ``answer-slip``: every reasoning paragraph is right, the answer is not.

It also reports the PRM as RSD used it: of the draft's steps that were wrong where they stood,
how many it rejected (recall) and at what scores it kept the others; of the draft's right steps,
how many it rejected anyway (each costs a target step). Accuracies carry Wilson 95% intervals.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from engine.answers import check
from engine.events import StepEvent
from engine.methods.rsd.loop import decode_rsd
from engine.runtime.model import ModelLoadError
from engine.tools.synthetic import make_arithmetic_example
from engine.wiring import load_role, load_scorer, run_config


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion k/n (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)


def paragraphs(text: str) -> list[str]:
    """A step's text as the reference chain is written: blank-line paragraphs, no think markers."""
    text = text.replace("<think>", "").replace("</think>", "")
    return [p.strip() for p in text.split("\n\n") if p.strip()]


def classify(events: list, reference: tuple[str, ...]) -> dict:
    """Read one RSD run's steps against the reference chain (reasoning paragraphs, then the answer)."""
    kept: list[tuple[str, str, float | None]] = []  # (paragraph, who wrote it, reward)
    prm = {"wrong_rejected": 0, "wrong_kept": [], "right_rejected": 0, "right_kept": 0}
    for ev in events:
        if not isinstance(ev, StepEvent):
            continue
        at = len(kept)
        right = paragraphs(ev.text) == list(reference[at : at + len(paragraphs(ev.text))])
        if ev.accepted is False:  # a draft step the PRM rejected
            prm["right_rejected" if right else "wrong_rejected"] += 1
            continue
        if ev.source == "draft":
            if right:
                prm["right_kept"] += 1
            else:
                prm["wrong_kept"].append(ev.reward)
        kept += [(p, ev.source, ev.reward) for p in paragraphs(ev.text)]
    first = next((i for i, (p, _, _) in enumerate(kept) if i >= len(reference) or p != reference[i]), None)
    if first is None or first >= len(reference) - 1:
        where = "answer-slip"
    else:
        where = "prm-miss" if kept[first][1] == "draft" else "target-slip"
    return {"where": where, "prm": prm}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.rsd_breakdown", description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--seed", type=int, default=3_000_000)
    ap.add_argument("--threshold", type=float, default=None, help="the PRM's (default: the model's tuned one)")
    ap.add_argument("--draft-confidence", type=float, default=None,
                    help="also rewrite steps the draft doubts (default: the model's tuned value)")
    ap.add_argument("--model", default="tiny-reasoner")
    ap.add_argument("--draft-model", default="tiny-reasoner-draft")
    ap.add_argument("--prm", default="tiny-prm")
    ap.add_argument("--out", default="rsd-breakdown.json")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        target = load_role(args.model)
        draft, scorer = load_role(args.draft_model, target=target), load_scorer(args.prm)
        flags = {k: v for k, v in (("threshold", args.threshold), ("draft_confidence", args.draft_confidence))
                 if v is not None}
        cfg = run_config(args.model, flags)
    except (ValueError, ModelLoadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = []
    for i in range(args.n):
        ex = make_arithmetic_example(args.seed + i)
        t = list(decode_rsd(target, None, None, ex.prompt, cfg, mode="target"))
        r = list(decode_rsd(target, draft, scorer, ex.prompt, cfg, mode="rsd"))
        row = {"seed": args.seed + i, "target_correct": bool(check("arithmetic", t[-1].answer_text, ex.reference)),
               "rsd_correct": bool(check("arithmetic", r[-1].answer_text, ex.reference)),
               "flops_ratio": r[-1].stats.flops / t[-1].stats.flops, "latency_ratio": r[-1].stats.wall_s / t[-1].stats.wall_s}
        row.update(classify(r, ex.steps))
        rows.append(row)
    n = len(rows)
    wrong = [r for r in rows if not r["rsd_correct"]]
    where = {k: sum(r["where"] == k for r in wrong) for k in ("prm-miss", "target-slip", "answer-slip")}
    prm = {k: sum(r["prm"][k] if isinstance(r["prm"][k], int) else len(r["prm"][k]) for r in rows)
           for k in ("wrong_rejected", "wrong_kept", "right_rejected", "right_kept")}
    missed_scores = [s for r in rows for s in r["prm"]["wrong_kept"] if s is not None]
    summary = {
        "n": n, "seeds": f"{args.seed}..{args.seed + n - 1}", "threshold": cfg.threshold,
        "draft_confidence": cfg.draft_confidence,
        "target_accuracy": sum(r["target_correct"] for r in rows) / n,
        "target_wilson95": wilson(sum(r["target_correct"] for r in rows), n),
        "rsd_accuracy": sum(r["rsd_correct"] for r in rows) / n,
        "rsd_wilson95": wilson(sum(r["rsd_correct"] for r in rows), n),
        "median_flops_ratio": statistics.median(r["flops_ratio"] for r in rows),
        "median_latency_ratio": statistics.median(r["latency_ratio"] for r in rows),
        "rsd_wrong": len(wrong), "rsd_wrong_where": where,
        "rsd_wrong_target_also_wrong": sum(not r["target_correct"] for r in wrong),
        "prm_on_wrong_draft_steps": {"rejected": prm["wrong_rejected"], "kept": prm["wrong_kept"],
                                     "recall": prm["wrong_rejected"] / max(1, prm["wrong_rejected"] + prm["wrong_kept"]),
                                     "median_score_when_kept": statistics.median(missed_scores) if missed_scores else None},
        "prm_on_right_draft_steps": {"rejected": prm["right_rejected"], "kept": prm["right_kept"]},
    }
    Path(args.out).write_text(json.dumps({"summary": summary, "runs": rows}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
