"""A benchmark's summary per method: what the bench prints and writes, and the studio's results table.

Per method: accuracy with its Wilson 95% interval, latency and tokens/s with their IQR, time to the
first answer token, the median of per-problem latency and FLOPs ratios to ``baseline`` (and, for
RSD's methods, to ``target``) with the ratios' IQR, SSR's answer tokens per target forward
(Spec-Bench's mean accepted tokens: 1.0 for plain decoding), accepted and recovered tokens, RSD's
share of draft steps kept, and for greedy runs how many answers equal baseline's; and per method
a verdict against baseline (:func:`verdict`): "faster", "slower", "cannot tell" or "unreliable",
which the bench CLI and the studio's Benchmark tab print in the same words (:func:`verdict_lines`).
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from engine.events import ProposerAcceptance, parse_acceptance
from engine.forwards import merge
from engine.registry import writes_steps
from engine.runlog.compare import kind_key, per_forward, slow_runs

Z95 = 1.959964
WIDE = 0.25  # a ratio's IQR wider than this, or a latency IQR wider than this share of its median: say so
MIN_RATIOS = 3  # per-problem ratios before a verdict: the quartiles of fewer say nothing about spread
SAME = 0.05  # a ratio's whole IQR within 1 +- this: "about the same" (no difference a user would notice)


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% by default): sensible at 0 of n and n of n."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def iqr(xs: list[float]) -> tuple[float, float]:
    """The quartiles (q1, q3); a single value is its own spread."""
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def tokens_per_forward(run: dict) -> float | None:
    """Answer tokens per forward of the target while answering (a verify gives one or more; the
    forward that ends the reasoning gives the first token, the last one the end of the sequence):
    1.0 for plain decoding that ends its answer itself, a little more when cut at max answer."""
    if writes_steps(run["method"]) or not run.get("answer_tokens") or not run.get("answer_forwards"):
        return None
    return run["answer_tokens"] / run["answer_forwards"]


def _ratios(by: dict, m: str, ref: str, problems: list, key: str) -> list[float]:
    """Per problem, the median over repeats of ``m``'s ``key`` over ``ref``'s."""
    return [statistics.median(r[key] for r in by[(m, p)]) / statistics.median(r[key] for r in by[(ref, p)])
            for p in problems if (m, p) in by and (ref, p) in by and all(r[key] for r in by[(ref, p)])]


def summarize(runs: list[dict], greedy: bool, history: list[dict] | None = None) -> list[dict]:
    """Per method, the figures above (rows in the order methods first ran) and, where baseline ran,
    each other method's ``verdict`` and ``verdict_why`` (:func:`verdict`; ``history``: the run
    log's earlier runs of the model, rows as ``RunLog.runs`` gives them, for the steady time per
    forward)."""
    methods = list(dict.fromkeys(r["method"] for r in runs))
    by: dict = {}
    for r in runs:
        by.setdefault((r["method"], r["prompt_id"]), []).append(r)
    problems = list(dict.fromkeys(r["prompt_id"] for r in runs))
    summary = []
    for m in methods:
        mine = [r for r in runs if r["method"] == m]
        row = {"method": m, "dataset": mine[0].get("dataset"), "runs": len(mine),
               "problems": len({r["prompt_id"] for r in mine}),
               "median_latency_s": statistics.median(r["latency_s"] for r in mine),
               "latency_iqr_s": iqr([r["latency_s"] for r in mine]),
               "median_tokens_per_s": statistics.median(r["tokens_per_s"] for r in mine),
               "tokens_per_s_iqr": iqr([r["tokens_per_s"] for r in mine])}
        ttft = [r["ttft_s"] for r in mine if r.get("ttft_s") is not None]
        if ttft:
            row["median_ttft_s"] = statistics.median(ttft)
        # RSD's benches compare with the target alone; SSR with its lookups alone too (the ablation: what drafts add)
        for ref, to in (("baseline", "baseline"), ("target", "target"), ("ssr-lookups", "lookups")):
            if ref in methods and (ref == "baseline" or (ref == "target" and writes_steps(m))
                                   or (ref == "ssr-lookups" and m == "ssr")):
                ratios = _ratios(by, m, ref, problems, "latency_s")
                if ratios:
                    row[f"median_latency_ratio_to_{to}"] = statistics.median(ratios)
                    row[f"latency_ratio_iqr_to_{to}"] = iqr(ratios)
                    row[f"latency_ratios_to_{to}"] = len(ratios)
                flops = _ratios(by, m, ref, problems, "flops") if all(r.get("flops") for r in mine) else []
                if flops:
                    row[f"median_flops_ratio_to_{to}"] = statistics.median(flops)
        if "baseline" in methods and greedy:
            row["answers_equal_baseline"] = sum(
                by[(m, p)][0]["answer_token_ids"] == by[("baseline", p)][0]["answer_token_ids"]
                for p in problems if (m, p) in by and ("baseline", p) in by)
        if any(r.get("flops") for r in mine):
            row["median_flops"] = statistics.median(r.get("flops", 0.0) for r in mine)
        steps = sum(r["steps_accepted"] + r["steps_rejected"] for r in mine)
        if writes_steps(m) and steps:
            row["fraction_steps_accepted"] = sum(r["steps_accepted"] for r in mine) / steps
        checked = [r["correct"] for r in mine if "correct" in r]
        if checked:
            row["accuracy"] = sum(checked) / len(checked)
            row["accuracy_ci95"] = wilson(sum(checked), len(checked))
            row["graded"] = len(checked)
            row["graded_by"] = ", ".join(sorted({r["graded_by"] for r in mine if "correct" in r and r.get("graded_by")}))
        if any(r.get("drafting") for r in mine):  # SSR's cost-aware drafting: how many runs forked their drafts
            row["drafted_runs"] = f"{sum(1 for r in mine if r.get('drafts'))}/{len(mine)}"
        if any(r.get("drafts") for r in mine):  # the answer forwards the drafts saved that no lookup would have
            row["median_draft_saved"] = statistics.median(r.get("draft_saved", 0) for r in mine if r.get("drafts"))
        step_ratios = [r["step_s_drafting"] / r["step_s_alone"] for r in mine if r["step_s_drafting"] and r["step_s_alone"]]
        if step_ratios:
            row["median_step_ratio_with_draft"] = statistics.median(step_ratios)
        per_forward = [t for r in mine if (t := tokens_per_forward(r)) is not None]
        if per_forward:
            row["median_tokens_per_forward"] = statistics.median(per_forward)
        per_verify = [r["verify_accepted"] / r["verifies"] for r in mine if r.get("verifies")]
        if per_verify:  # the forwards' own figure: accepted proposal tokens per verify, every proposer
            row["median_accepted_per_verify"] = statistics.median(per_verify)
            row["accepted_per_verify_iqr"] = iqr(per_verify)
        row["median_accepted"] = statistics.median(r["accepted"] for r in mine)
        row["median_recovered"] = statistics.median(r["recovered"] for r in mine)
        summary.append(row)
    if "baseline" in methods:
        slow = slow_bench_runs(runs, history or [])
        for row in summary:
            if row["method"] != "baseline":
                row["verdict"], row["verdict_why"] = verdict(row, _slowest(runs, slow, (row["method"], "baseline")))
    return summary


def slow_bench_runs(runs: list[dict], history: list[dict]) -> dict[int, str]:
    """The benchmark's runs flagged slow, by their index in ``runs``, with why: the run log's rule
    (``engine.runlog.compare.slow_runs``: seconds per forward past ``SLOW_FACTOR`` times the median
    of the finished runs of its kind), judged twice: among these runs and ``history`` together (a
    few runs slower than the rest), and each run alone against ``history`` (the log's earlier runs
    of the model: their steady median tells a benchmark that ran slow from start to end)."""
    rows = [{**r, "status": "ok", "id": -(i + 1)} for i, r in enumerate(runs)]  # ids no logged run has
    logged = {r.get("run_id") for r in runs} - {None}
    kinds = {kind_key(r) for r in rows}
    past: dict[tuple, list[dict]] = {}
    for r in history:
        if r.get("id") not in logged and (r.get("id") or 0) > 0 and kind_key(r) in kinds:
            past.setdefault(kind_key(r), []).append(r)
    flagged = {-rid - 1: why for rid, why in slow_runs([*(r for kind in past.values() for r in kind), *rows]).items() if rid < 0}
    for i, row in enumerate(rows):
        if alone := slow_runs([*past.get(kind_key(row), []), row]).get(row["id"]):
            flagged[i] = alone
    return flagged


def _slowest(runs: list[dict], slow: dict[int, str], methods: tuple[str, ...]) -> list[str]:
    """The flagged runs of ``methods`` in a few words each: per method, how many and the slowest
    one's reason (the highest time per forward of its kind)."""
    out = []
    for m in methods:
        mine = [i for i in slow if runs[i]["method"] == m]
        if mine:
            worst = max(mine, key=lambda i: per_forward({**runs[i], "status": "ok"}) or 0.0)
            out.append(f"{len(mine)} of {sum(r['method'] == m for r in runs)} {m} runs slow, the slowest "
                       f"{slow[worst].removeprefix('slow: ')}")
    return out


def verdict(row: dict, slow: list[str], ref: str = "baseline") -> tuple[str, str]:
    """A method's summary ``row`` against ``ref``, in a word and why, from the median per-problem
    latency ratio and its IQR:

    * "unreliable": ``slow`` names runs of either method flagged slow (:func:`slow_bench_runs`):
      the machine was busy, so no ratio is read;
    * "cannot tell": fewer than ``MIN_RATIOS`` per-problem ratios, an IQR wider than ``WIDE``
      times the median, or one that straddles 1.0 and reaches past 1 +- ``SAME``;
    * "about the same": the whole IQR within 1 +- ``SAME``;
    * "faster" / "slower": the whole IQR below / above 1.0 (and not within that band).

    >>> verdict({"method": "ssr", "median_latency_ratio_to_baseline": 0.8,
    ...          "latency_ratio_iqr_to_baseline": (0.75, 0.85), "latency_ratios_to_baseline": 5}, [])
    ('faster', "0.80x baseline's latency (median of 5 per-problem ratios, IQR 0.75-0.85)")
    """
    m = row["method"]
    if slow:
        return "unreliable", f"the machine was busy: {'; '.join(slow)}; rerun on an idle machine"
    ratio, spread = row.get(f"median_latency_ratio_to_{ref}"), row.get(f"latency_ratio_iqr_to_{ref}")
    if ratio is None or spread is None:
        return "cannot tell", f"no problem has both a {m} and a {ref} run"
    lo, hi = spread
    n = row[f"latency_ratios_to_{ref}"]
    figures = f"{ratio:.2f}x {ref}'s latency (median of {n} per-problem ratios, IQR {lo:.2f}-{hi:.2f})"
    if n < MIN_RATIOS:
        return "cannot tell", f"{figures}: fewer than {MIN_RATIOS} problems say nothing about the spread"
    if (hi - lo) / ratio > WIDE:
        return "cannot tell", f"{figures}: the IQR is wider than {WIDE:.0%} of the median"
    if 1.0 - SAME <= lo and hi <= 1.0 + SAME:
        return "about the same", f"{figures}: within {SAME:.0%} of 1.0"
    if lo <= 1.0 <= hi:
        return "cannot tell", f"{figures}: the IQR straddles 1.0"
    return ("faster" if hi < 1.0 else "slower"), figures


def verdict_lines(summary: list[dict]) -> list[str]:
    """One line per method with a verdict: "ssr vs baseline: faster: 0.80x baseline's latency (...)"."""
    return [f"{row['method']} vs baseline: {row['verdict']}: {row['verdict_why']}" for row in summary if "verdict" in row]


def spread_warnings(summary: list[dict]) -> list[str]:
    """Where the spread is too wide for a ratio to be read at face value (a loaded machine)."""
    out = []
    for row in summary:
        for key in ("latency_ratio_iqr_to_baseline", "latency_ratio_iqr_to_target"):
            if key in row and row[key][1] - row[key][0] > WIDE:
                out.append(f"{row['method']}: per-problem latency ratios spread {row[key][0]:.2f}-{row[key][1]:.2f} "
                           "(IQR): rerun with --repeat, on an idle machine")
        lo, hi = row["latency_iqr_s"]
        if row["median_latency_s"] and (hi - lo) / row["median_latency_s"] > 2 * WIDE:
            out.append(f"{row['method']}: latencies spread {lo:.3f}-{hi:.3f} s (IQR) around {row['median_latency_s']:.3f} s")
    return out


# (key, heading, format): the printed table, the studio's table and the summary CSV share it
COLUMNS = [("method", "method", "{}"), ("accuracy", "accuracy", "{:.1%}"),
           ("accuracy_ci95", "95% interval", "{0[0]:.0%}-{0[1]:.0%}"), ("graded", "graded", "{}"),
           ("median_latency_s", "latency s (median)", "{:.3f}"), ("latency_iqr_s", "latency IQR", "{0[0]:.3f}-{0[1]:.3f}"),
           ("median_latency_ratio_to_baseline", "latency / baseline (median per problem)", "{:.3f}"),
           ("latency_ratio_iqr_to_baseline", "its IQR", "{0[0]:.2f}-{0[1]:.2f}"),
           ("median_flops_ratio_to_baseline", "FLOPs / baseline (median per problem)", "{:.3f}"),
           ("median_latency_ratio_to_target", "latency / target (median per problem)", "{:.3f}"),
           ("median_flops_ratio_to_target", "FLOPs / target (median per problem)", "{:.3f}"),
           ("median_latency_ratio_to_lookups", "latency / SSR's lookups alone (median per problem)", "{:.3f}"),
           ("latency_ratio_iqr_to_lookups", "its IQR", "{0[0]:.2f}-{0[1]:.2f}"),
           ("median_tokens_per_s", "tok/s", "{:.1f}"), ("median_ttft_s", "first answer s", "{:.3f}"),
           ("median_tokens_per_forward", "answer tok / forward", "{:.2f}"),
           ("median_accepted_per_verify", "accepted / verify (median)", "{:.2f}"),
           ("accepted_per_verify_iqr", "its IQR", "{0[0]:.2f}-{0[1]:.2f}"),
           ("median_accepted", "accepted", "{:.0f}"), ("median_recovered", "recovered", "{:.0f}"),
           ("answers_equal_baseline", "= baseline", "{}"),
           ("median_step_ratio_with_draft", "step s with drafts / alone", "{:.2f}"),
           ("drafted_runs", "runs that drafted", "{}"),
           ("median_draft_saved", "forwards the drafts saved beyond lookups (median, drafted runs)", "{:.0f}"),
           ("fraction_steps_accepted", "steps kept", "{:.1%}"), ("verdict", "verdict", "{}")]
# the bench's printed table by default (about 90 columns; ``--full-table`` prints COLUMNS): a key tuple is one cell
COMPACT_COLUMNS = [("method", "method", "{}"), ("accuracy", "accuracy", "{:.0%}"),
                   ("median_latency_s", "latency s", "{:.3f}"),
                   (("median_latency_ratio_to_baseline", "latency_ratio_iqr_to_baseline"), "/ baseline (IQR)",
                    "{0[0]:.2f} ({0[1][0]:.2f}-{0[1][1]:.2f})"),
                   (("median_latency_ratio_to_target", "latency_ratio_iqr_to_target"), "/ target (IQR)",
                    "{0[0]:.2f} ({0[1][0]:.2f}-{0[1][1]:.2f})"),
                   (("median_latency_ratio_to_lookups", "latency_ratio_iqr_to_lookups"), "/ lookups alone (IQR)",
                    "{0[0]:.2f} ({0[1][0]:.2f}-{0[1][1]:.2f})"),
                   ("median_tokens_per_s", "tok/s", "{:.1f}"), ("answers_equal_baseline", "= baseline", "{}"),
                   ("drafted_runs", "drafted", "{}"), ("verdict", "verdict", "{}")]


def where_time_went(runs: list[dict]) -> list[str]:
    """Per method, a line on where its time went (medians over runs: the share of the wall time
    inside forwards, the drafts' cost beyond a lone reasoning step) and, per proposer, its verifies
    pooled over runs: count, mean accepted of mean proposed, the acceptance rate at the 1st, 2nd
    and 4th position of a proposal (``engine.forwards``)."""
    lines = []
    for m in sorted({r["method"] for r in runs}):
        mine = [r for r in runs if r["method"] == m and r.get("wall_s")]
        if not mine or not any(r.get("forward_s") for r in mine):
            continue
        inside = statistics.median(r["forward_s"] / r["wall_s"] for r in mine)
        drafting = statistics.median(r.get("drafting_s", 0.0) / r["wall_s"] for r in mine)
        line = f"{m}: {inside:.0%} of the time inside forwards (median), drafting {drafting:.0%}"
        pooled = merge(parse_acceptance(r.get("acceptance")) for r in mine)
        for who, a in sorted(pooled.items(), key=lambda kv: -sum(kv[1]["hist"])):
            n = sum(a["hist"])
            rates = ", ".join(f"{k + 1}: {a['taken'][k] / a['reached'][k]:.0%}" for k in (0, 1, 3)
                              if k < len(a["reached"]) and a["reached"][k])
            line += f"; {who}: {n} verifies, accepted {ProposerAcceptance.of(who, a).per_verify()} (by position {rates})"
        lines.append(line)
    return lines


def _value(row: dict, key: str | tuple):
    """A cell's value: ``row[key]``, or for a tuple of keys their values (None when any is missing)."""
    if isinstance(key, tuple):
        values = tuple(row.get(k) for k in key)
        return None if None in values else values
    return row.get(key)


def table_cells(summary: list[dict], columns: list = COLUMNS) -> tuple[list[str], list[list[str]]]:
    """The headings and formatted cells of the columns any row has ("-" where a row has none)."""
    cols = [c for c in columns if any(_value(row, c[0]) is not None for row in summary)]
    return [h for _, h, _ in cols], [[f.format(v) if (v := _value(row, k)) is not None else "-" for k, _, f in cols]
                                     for row in summary]


def format_table(summary: list[dict], full: bool = False) -> str:
    """The summary as aligned text: the compact columns (about 90 characters a line), or every column."""
    head, body = table_cells(summary, COLUMNS if full else COMPACT_COLUMNS)
    cells = [head, *body]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in cells)


RUN_CSV_COLUMNS = ("dataset", "prompt_id", "repeat", "method", "task", "graded_by", "reference", "correct",
                   "latency_s", "ttft_s", "tokens_per_s", "reasoning_tokens", "answer_tokens", "answer_forwards",
                   "accepted", "recovered", "generated", "rejected", "flops", "steps_accepted", "steps_rejected",
                   "step_mode", "agreement", "answer_text")


def write_csv(path: str | Path, runs: list[dict]) -> None:
    """One row per run, the columns a spreadsheet compares (the JSON holds every field)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.DictWriter(fh, RUN_CSV_COLUMNS, extrasaction="ignore")
        out.writeheader()
        for r in runs:
            out.writerow({k: r.get(k) for k in RUN_CSV_COLUMNS})
