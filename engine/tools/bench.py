"""Benchmark CLI: methods side by side on the same prompts, interleaved, with ratios to baseline.

    python -m engine.tools.bench --model PATH_OR_ID --methods baseline,ssr,hf,hf-pld \\
        --prompts FILE.jsonl --out results.json [--db runs.db] [--draft-start N] [--max-think N]
        [--max-draft N] [--max-answer N] [--num-drafts N] [--draft-interval N] [--temperature T]
        [--seed S] [--repeat R] [--device D]

Prompts are JSON lines ``{"id": ..., "prompt": ..., "reference": optional, "suite": optional}``;
each prompt is the user message, templated by the engine. For every prompt and repeat the methods
run one after another (A B A B ...), so ratios hold on a noisy machine. ``results.json`` holds
``{"runs": [...], "summary": [...]}``: per method the median latency and its IQR, the median of
per-prompt latency ratios to ``baseline`` (per prompt, the median over repeats) and their IQR, for
RSD's methods the same to ``target`` (and FLOPs), steps kept, the accuracy where a checker applies
(also logged as ``correct`` with ``--db``), and for greedy runs how many answers equal baseline's.
A spread too wide to read a ratio at face value is printed as a warning.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from engine.config import RunConfig, field_help
from engine.events import DoneEvent
from engine.methods.rsd.loop import RSD_METHODS
from engine.registry import METHODS, SINGLE_MODEL, check_method, decoder
from engine.remote.client import BackendError
from engine.remote.model import RemoteModel, check_backend
from engine.runlog import RunLog, RunMeta
from engine.runtime.compiled import COMPILE_MODES
from engine.runtime.model import ModelLoadError, SSRUnsupportedError
from engine.tools.agreement import agreement
from engine.tools.synthetic import check
from engine.wiring import Server, load_role, load_scorer, run_config

# CLI flag -> RunConfig field; a flag left out keeps the config's own default
CONFIG_FLAGS = {"draft_start": int, "max_think": int, "max_draft": int, "max_answer": int, "num_drafts": int,
                "draft_interval": int, "max_spec": int, "think_spec": int, "min_match": int, "spec_factor": float, "temperature": float, "top_p": float,
                "seed": int, "threshold": float, "weighting": str, "weight_param": float, "draft_confidence": float,
                "max_steps": int,
                "max_step_tokens": int}


def read_prompts(path: str) -> list[dict]:
    """Validated prompt records; a clear ValueError names the line that is wrong."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"prompts file {path!r} does not exist")
    prompts = []
    for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{n}: not valid JSON ({err.msg})") from None
        if not isinstance(rec, dict) or not isinstance(rec.get("prompt"), str) or not rec["prompt"].strip():
            raise ValueError(f"{path}:{n}: each line needs a non-empty string field \"prompt\"")
        rec.setdefault("id", str(n))
        rec["id"] = str(rec["id"])
        prompts.append(rec)
    if not prompts:
        raise ValueError(f"prompts file {path!r} has no prompts")
    return prompts


def run_one(models: dict, method: str, prompt: dict, cfg: RunConfig, repeat: int, log: RunLog | None) -> dict:
    lm = models["target"]
    decode = decoder(method, lm, models.get("draft"), models.get("scorer"))
    rsd = method in RSD_METHODS
    reference = prompt.get("reference")
    grade = None if reference is None else (lambda answer: check(prompt.get("suite"), answer, str(reference)))
    meta = RunMeta(method, lm.model_id, prompt["prompt"], cfg.to_dict(), prompt_id=prompt["id"], grade=grade,
                   draft_model=models["draft"].model_id if rsd and method != "target" else None,
                   prm=models["prm_name"] if method == "rsd" else None,
                   reference=prompt.get("reference"), origin="bench", device=getattr(lm, "backend", str(lm.device)),
                   dtype=lm.dtype, think_end=lm.tokenizer.decode([lm.markers.close_id]) if lm.markers else None)
    stream = decode(prompt["prompt"], cfg)
    events = list(log.record(stream, meta) if log else stream)
    done: DoneEvent = events[-1]
    stats = done.stats.to_dict()  # every RunStats field, named as in the runs table
    run = {"prompt_id": prompt["id"], "repeat": repeat, "latency_s": stats["wall_s"], **stats, "method": method,
           "answer_text": done.answer_text, "answer_token_ids": done.answer_ids,
           "reasoning_token_ids": done.reasoning_ids}
    if grade is not None and (correct := grade(done.answer_text)) is not None:
        run["correct"] = correct
    return run


def add_agreement(lm, prompt: str, batch: list[dict]) -> None:
    """Greedy runs of one prompt: each single-model method's agreement with ``baseline`` ("identical",
    or where it diverged and the top-2 logit margin there), so numerics read as numerics."""
    base = next((r for r in batch if r["method"] == "baseline"), None)
    if base is None:
        return
    base_ids = base["reasoning_token_ids"] + base["answer_token_ids"]
    for r in batch:
        if r["method"] in SINGLE_MODEL and r["method"] != "baseline":
            a = agreement(lm, prompt, base_ids, r["reasoning_token_ids"] + r["answer_token_ids"])
            r.update(agreement=str(a), diverged_at=a.diverged_at, margin=a.margin)


def _tokens_line(r: dict) -> str:
    """A run's own figures: SSR's accepted / recovered answer tokens, RSD's steps kept."""
    if r["method"] in RSD_METHODS:
        return f"steps kept {r['steps_accepted']}/{r['steps_accepted'] + r['steps_rejected']}"
    return f"accepted {r['accepted']} recovered {r['recovered']}"


def _iqr(xs: list[float]) -> tuple[float, float]:
    """The quartiles (q1, q3); a single value is its own spread."""
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


WIDE = 0.25  # a ratio's IQR wider than this, or a latency IQR wider than this share of its median: say so


def spread_warnings(summary: list[dict]) -> list[str]:
    """Where the spread is too wide for a ratio to be read at face value (a loaded machine)."""
    out = []
    for row in summary:
        for key in ("latency_ratio_iqr_to_baseline", "latency_ratio_iqr_to_target"):
            if key in row and row[key][1] - row[key][0] > WIDE:
                out.append(f"{row['method']}: per-prompt latency ratios spread {row[key][0]:.2f}-{row[key][1]:.2f} "
                           "(IQR): rerun with --repeat, on an idle machine")
        lo, hi = row["latency_iqr_s"]
        if row["median_latency_s"] and (hi - lo) / row["median_latency_s"] > 2 * WIDE:
            out.append(f"{row['method']}: latencies spread {lo:.3f}-{hi:.3f} s (IQR) around {row['median_latency_s']:.3f} s")
    return out


def _ratios(by: dict, m: str, ref: str, prompts: list, key: str) -> list[float]:
    """Per prompt, the median over repeats of ``m``'s ``key`` over ``ref``'s."""
    return [statistics.median(r[key] for r in by[(m, p)]) / statistics.median(r[key] for r in by[(ref, p)])
            for p in prompts if (m, p) in by and (ref, p) in by and all(r[key] for r in by[(ref, p)])]


def summarize(runs: list[dict], greedy: bool) -> list[dict]:
    methods = list(dict.fromkeys(r["method"] for r in runs))
    by = {}
    for r in runs:
        by.setdefault((r["method"], r["prompt_id"]), []).append(r)
    prompts = list(dict.fromkeys(r["prompt_id"] for r in runs))
    summary = []
    for m in methods:
        mine = [r for r in runs if r["method"] == m]
        row = {"method": m, "runs": len(mine),
               "median_latency_s": statistics.median(r["latency_s"] for r in mine),
               "latency_iqr_s": _iqr([r["latency_s"] for r in mine]),
               "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine)}
        for ref in ("baseline", "target"):  # RSD's benches compare with the target alone
            if ref in methods and (ref == "baseline" or m in RSD_METHODS):
                ratios = _ratios(by, m, ref, prompts, "latency_s")
                row[f"median_latency_ratio_to_{ref}"] = statistics.median(ratios)
                row[f"latency_ratio_iqr_to_{ref}"] = _iqr(ratios)
        if "baseline" in methods and greedy:
            row["answers_equal_baseline"] = sum(
                by[(m, p)][0]["answer_token_ids"] == by[("baseline", p)][0]["answer_token_ids"] for p in prompts)
        if "target" in methods:
            ratios = _ratios(by, m, "target", prompts, "flops") if m in RSD_METHODS else []
            if ratios:
                row["median_flops_ratio_to_target"] = statistics.median(ratios)
            row["median_flops"] = statistics.median(r["flops"] for r in mine)
        steps = sum(r["steps_accepted"] + r["steps_rejected"] for r in mine)
        if m in RSD_METHODS and steps:
            row["fraction_steps_accepted"] = sum(r["steps_accepted"] for r in mine) / steps
        checked = [r["correct"] for r in mine if "correct" in r]
        if checked:
            row["accuracy"] = sum(checked) / len(checked)
        step_ratios = [r["step_s_drafting"] / r["step_s_alone"] for r in mine if r["step_s_drafting"] and r["step_s_alone"]]
        if step_ratios:
            row["median_step_ratio_with_draft"] = statistics.median(step_ratios)
        row["median_accepted"] = statistics.median(r["accepted"] for r in mine)
        row["median_recovered"] = statistics.median(r["recovered"] for r in mine)
        summary.append(row)
    return summary


def format_table(summary: list[dict]) -> str:
    cols = [("method", "method", "{}"), ("median_latency_s", "latency s (median)", "{:.3f}"),
            ("latency_iqr_s", "latency IQR", "{0[0]:.3f}-{0[1]:.3f}"),
            ("median_latency_ratio_to_baseline", "latency / baseline (median per prompt)", "{:.3f}"),
            ("latency_ratio_iqr_to_baseline", "its IQR", "{0[0]:.2f}-{0[1]:.2f}"),
            ("median_latency_ratio_to_target", "latency / target (median per prompt)", "{:.3f}"),
            ("median_tokens_per_s", "tok/s", "{:.1f}"),
            ("median_accepted", "accepted", "{:.0f}"), ("median_recovered", "recovered", "{:.0f}"),
            ("answers_equal_baseline", "= baseline", "{}"), ("accuracy", "accuracy", "{:.1%}"),
            ("median_step_ratio_with_draft", "step x draft", "{:.2f}"),
            ("median_flops_ratio_to_target", "FLOPs / target (median per prompt)", "{:.3f}"),
            ("fraction_steps_accepted", "steps kept", "{:.1%}")]
    cols = [c for c in cols if any(c[0] in row for row in summary)]
    cells = [[h for _, h, _ in cols]] + [[f.format(row[k]) if row.get(k) is not None else "-" for k, _, f in cols]
                                          for row in summary]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-reasoner", help="bundled name, preset, local folder or Hub id")
    ap.add_argument("--methods", default="baseline,ssr", help=f"comma-separated, from {','.join(METHODS)}")
    ap.add_argument("--prompts", required=True, help='JSON lines: {"id", "prompt", "reference" (optional), '
                    '"suite" (optional: classes / arithmetic, for the checker)}; python -m engine.tools.synthetic writes some')
    ap.add_argument("--out", required=True, help="results JSON: every run and the summary table")
    ap.add_argument("--db", default=None, help="also log every run to this SQLite file")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per prompt and method, interleaved (default: 1)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs before measuring")
    ap.add_argument("--device", default=None, help="cuda, mps or cpu (default: CUDA, then MPS, then the CPU)")
    ap.add_argument("--random-weights", action="store_true",
                    help="build the preset's architecture offline with random weights (real per-token costs)")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--draft-model", default="tiny-reasoner-draft", help="RSD's draft model")
    ap.add_argument("--prm", default="tiny-prm", help="RSD's PRM: a math-shepherd-format model, a "
                    "Qwen2.5-Math-PRM id (needs --trust-remote-code) or 'target-likelihood'")
    ap.add_argument("--trust-remote-code", action="store_true", help="allow a PRM's own modelling code to run")
    notes, defaults = field_help(), RunConfig()
    for name, kind in CONFIG_FLAGS.items():
        what = notes.get(name, name.replace("_", " "))
        ap.add_argument("--" + name.replace("_", "-"), type=kind, default=None, metavar=kind.__name__.upper(),
                        help=f"{what} (default: the model's tuned value if it has one, else {getattr(defaults, name)})")
    ap.add_argument("--backend", choices=("transformers", "vllm"), default=None,
                    help="where --model runs: in process (transformers, the default) or on a vLLM server (--base-url)")
    ap.add_argument("--base-url", default=None, help="run --model on a vLLM server at this URL (e.g. "
                    "http://host:8000): baseline, ssr and RSD's target; --model still names it, for its tokenizer")
    ap.add_argument("--served-model", default=None, help="the server's name for the model (default: what it serves)")
    ap.add_argument("--draft-base-url", default=None, help="RSD's draft model on a vLLM server at this URL")
    ap.add_argument("--draft-served-model", default=None, help="that server's name for the draft model")
    ap.add_argument("--prm-base-url", default=None, help="RSD's PRM on a vLLM server at this URL (math-shepherd "
                    "format, served with STEP pooling: engine/remote/prm.py)")
    ap.add_argument("--prm-served-model", default=None, help="that server's name for the PRM")
    ap.add_argument("--api-key", default=None, help="the server's API key, if it asks for one")
    ap.add_argument("--compile", choices=COMPILE_MODES, default=None,
                    help="compiled fixed-shape steps: auto (default: CUDA only), on, off; compile time is reported apart")
    ap.add_argument("--exact", action="store_true", default=None,
                    help="batch- and width-invariant forwards: slow, bitwise reproducible (docs/SSR.md)")
    return ap.parse_args(argv)


def _server(base_url: str | None, api_key: str | None, served_name: str | None) -> Server | None:
    return Server(base_url, api_key, served_name) if base_url else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        for m in methods:
            check_method(m)
        if args.repeat < 1:
            raise ValueError(f"--repeat={args.repeat} must be >= 1")
        flags = {k: getattr(args, k) for k in (*CONFIG_FLAGS, "exact", "compile") if getattr(args, k) is not None}
        cfg = run_config(args.model, flags)
        prompts = read_prompts(args.prompts)
        log = RunLog(args.db) if args.db else None
        if args.random_weights and set(methods) & {"rsd", "target", "draft"}:
            raise ValueError("--random-weights measures single-model methods; RSD needs trained models")
        check_backend(args.backend, args.base_url)
        lm = load_role(args.model, args.device, _server(args.base_url, args.api_key, args.served_model),
                       random_weights=args.random_weights)
        if isinstance(lm, RemoteModel):
            for m in methods:
                decoder(m, lm)  # a method that does not run on a server says so now
        models = {"target": lm, "prm_name": args.prm}
        if "ssr" in methods:
            lm.require_markers()
            cfg.check_ssr()
        if {"rsd", "draft"} & set(methods):
            models["draft"] = load_role(args.draft_model, args.device, target=lm, server=_server(
                args.draft_base_url, args.api_key, args.draft_served_model))
        if "rsd" in methods:
            models["scorer"] = load_scorer(args.prm, args.device, _server(args.prm_base_url, args.api_key,
                                                                          args.prm_served_model), args.trust_remote_code)
    except (ValueError, ModelLoadError, SSRUnsupportedError, BackendError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for _ in range(args.warmup):
        for m in methods:
            list(decoder(m, lm, models.get("draft"), models.get("scorer"))(prompts[0]["prompt"], cfg))
    compiled = [m for m in (lm, models.get("draft")) if getattr(m, "compiled", None) is not None]
    if compiled:  # the warm-up compiled them; no run's latency holds compile time (see RunStats.compile_s)
        print(f"compiled {sum(len(m.compiled.shapes) for m in compiled)} step shapes in "
              f"{sum(m.compile_seconds for m in compiled):.1f} s (before any timed run)", flush=True)
    runs = []
    for prompt in prompts:
        for rep in range(args.repeat):
            batch = []
            for m in methods:
                batch.append(run_one(models, m, prompt, cfg, rep, log))
                r = batch[-1]
                print(f"  {prompt['id']:>14} r{rep} {m:>8}: {r['latency_s']:.3f}s  {_tokens_line(r)}"
                      + (f"  correct={r['correct']}" if "correct" in r else ""), flush=True)
            if cfg.greedy and not args.base_url:  # agreement reads logits in process
                add_agreement(lm, prompt["prompt"], batch)
            runs += batch
    summary = summarize(runs, cfg.greedy)
    Path(args.out).write_text(json.dumps({"model": args.model, "config": cfg.to_dict(), "step_mode": next((r["step_mode"] for r in runs if r["step_mode"]), None),
                                          "compile_s": getattr(lm, "compile_seconds", 0.0), "runs": runs, "summary": summary}, indent=1))
    print(format_table(summary))
    for warning in spread_warnings(summary):
        print(f"warning: {warning}")
    for r in runs:
        if r.get("agreement", "identical") != "identical":
            print(f"  {r['method']} on {r['prompt_id']} r{r['repeat']}: {r['agreement']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
