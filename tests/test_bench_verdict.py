"""Issue 43 (a, b): one verdict per method against baseline, from one function, in the bench CLI and
the studio's Benchmark tab alike: faster, slower, about the same, "cannot tell" (few problems, an IQR
that straddles 1.0 or is too wide) or "unreliable" (runs flagged slow against their kind's steady
time per forward: a busy machine). Scripted runs: no model's timing decides a test."""

from __future__ import annotations

import html
import json

import pytest

from engine.benchmarks import runner as runner_mod
from engine.benchmarks.summary import (
    COLUMNS,
    MIN_RATIOS,
    SAME,
    WIDE,
    format_table,
    summarize,
    verdict_lines,
)
from engine.events import RunStats
from engine.runlog.compare import SLOW_FACTOR
from engine.tools import bench

MS = 0.010  # the scripted steady time per forward, 10 ms (any value: every bound below is relative to it)


def run(method: str, pid: str, latency: float, per_forward: float | None = None, **kw) -> dict:
    """A benchmark result as ``Bench.runs`` yields it; ``per_forward``: its seconds per forward
    (default: the steady ``MS``; forwards follow from the latency)."""
    forwards = max(1, round(latency / (per_forward or MS)))
    return {**RunStats().to_dict(), "method": method, "prompt_id": pid, "repeat": 0, "latency_s": latency, "wall_s": latency,
            "forward_calls": forwards, "tokens_per_s": 100.0, "ttft_s": 0.1, "accepted": 0, "recovered": 0,
            "steps_accepted": 0, "steps_rejected": 0, "step_s_drafting": None, "step_s_alone": None,
            "answer_token_ids": [1], "answer_tokens": 1, "answer_forwards": 1, "answer_text": "42", "model": "m",
            "device": "cpu", "dtype": "float32", "step_mode": "eager", "config": {"temperature": 0.0},
            "reasoning_token_ids": [], "run_id": None, **kw}


def bench_of(ratios: list[float], slow: dict[tuple[str, int], float] | None = None) -> list[dict]:
    """Baseline at 1 s and ssr at ``ratio`` s on problem k, interleaved; ``slow``: (method, k) ->
    how many times the steady time per forward that run took (the same forwards, more seconds)."""
    slow = slow or {}
    out = []
    for k, ratio in enumerate(ratios):
        for m, latency in (("baseline", 1.0), ("ssr", ratio)):
            factor = slow.get((m, k), 1.0)
            out.append(run(m, f"p{k}", latency * factor, per_forward=MS * factor, forward_calls=round(latency / MS)))
    return out


def ssr_verdict(runs: list[dict], history: list[dict] | None = None) -> tuple[str, str]:
    row = next(r for r in summarize(runs, greedy=True, history=history) if r["method"] == "ssr")
    return row["verdict"], row["verdict_why"]


def test_a_clear_difference_is_said_with_its_numbers():
    word, why = ssr_verdict(bench_of([0.70, 0.72, 0.75, 0.74, 0.71]))
    assert word == "faster" and "0.72x baseline's latency (median of 5 per-problem ratios, IQR 0.71-0.74)" in why
    assert ssr_verdict(bench_of([1.30, 1.35, 1.32, 1.31, 1.40]))[0] == "slower"
    # within the band around 1.0 on both quartiles: about the same (the tempting wrong answer: "slower" at 1.01)
    word, why = ssr_verdict(bench_of([1.01, 1.02, 1.01, 1.00, 1.02]))
    assert word == "about the same" and f"within {SAME:.0%} of 1.0" in why


def test_a_straddling_or_wide_iqr_or_too_few_problems_cannot_tell():
    # issue 43's CLI: 1.07 with an IQR of 0.98-1.21 read as "slower" by one, "faster" by the other
    word, why = ssr_verdict(bench_of([0.97, 0.98, 1.07, 1.21, 1.25]))
    assert word == "cannot tell" and "straddles 1.0" in why and "IQR 0.98-1.21" in why
    word, why = ssr_verdict(bench_of([0.30, 0.40, 0.60, 0.80, 0.85]))  # all below 1.0, but spread 0.4-0.8
    assert word == "cannot tell" and f"wider than {WIDE:.0%} of the median" in why
    word, why = ssr_verdict(bench_of([0.5] * (MIN_RATIOS - 1)))
    assert word == "cannot tell" and f"fewer than {MIN_RATIOS} problems" in why


def test_a_busy_machine_makes_the_measurement_unreliable_with_how_many_and_how_much():
    # two ssr runs took 3x the steady time per forward: their ratios would read "slower"
    runs = bench_of([0.7, 0.7, 0.7, 0.7, 0.7], slow={("ssr", 1): 3.0, ("ssr", 3): 3.0, ("baseline", 0): 1.1})
    word, why = ssr_verdict(runs)
    assert word == "unreliable" and "the machine was busy: 2 of 5 ssr runs slow" in why
    assert "3.0x the median time per forward of 5 ssr runs of m (30.0 ms against 10.0 ms" in why
    assert "baseline runs slow" not in why and "rerun on an idle machine" in why
    # the whole benchmark on a busy machine: every run 3x, its own median is 3x too, so only the log's
    # steady runs of the model (any prompt) tell
    busy = bench_of([0.7] * 5, slow={(m, k): 3.0 for m in ("baseline", "ssr") for k in range(5)})
    assert ssr_verdict(busy)[0] == "faster"  # nothing to judge by: the ratio stands
    steady = [{**run(m, "other", 2.0), "id": i, "status": "ok", "config": "{}"} for i, m in
              enumerate(["baseline", "ssr"] * 4, 1)]
    word, why = ssr_verdict(busy, history=steady)
    assert word == "unreliable" and "5 of 5 ssr runs slow" in why and "5 of 5 baseline runs slow" in why
    # the history's unfinished runs, and runs of another kind (another device), never set the median
    other = [{**r, "device": "cuda"} for r in steady] + [{**r, "status": "cancelled"} for r in steady]
    assert ssr_verdict(busy, history=other)[0] == "faster"
    # below the factor: not slow
    calm = bench_of([0.7] * 5, slow={("ssr", 2): SLOW_FACTOR * 0.9})
    assert ssr_verdict(calm)[0] == "faster"


def test_the_compact_table_fits_a_terminal_and_the_full_one_has_every_column():
    runs = bench_of([0.70, 0.72, 0.75, 0.74, 0.71])
    runs += [run("target", r["prompt_id"], 1.1) for r in runs if r["method"] == "baseline"]
    runs += [run("rsd", r["prompt_id"], 0.9, steps_accepted=3, steps_rejected=1) for r in runs
             if r["method"] == "baseline"]
    summary = summarize([{**r, "correct": True} for r in runs], greedy=True)
    compact = format_table(summary)
    assert max(map(len, compact.splitlines())) <= 100, compact
    assert "/ baseline (IQR)" in compact and "0.72 (0.71-0.74)" in compact and "faster" in compact
    full = format_table(summary, full=True)
    assert "95% interval" in full and "latency / baseline (median per problem)" in full and "verdict" in full
    assert max(map(len, full.splitlines())) > 100  # what the compact one replaces
    shown = {h for _, h, _ in COLUMNS if h in full}
    assert {"method", "accuracy", "tok/s", "= baseline", "steps kept"} <= shown


@pytest.fixture
def scripted(monkeypatch):
    """The bench's loop yields these runs (the CLI's and the tab's alike), logged ids and all, with
    no warm-up run: each path's verdict comes from them alone."""
    runs = bench_of([0.97, 0.98, 1.07, 1.21, 1.25])
    runs = [{**r, "run_id": 100 + i} for i, r in enumerate(runs)]

    def fake_runs(self, problems, repeat=1, stop=None, wrap=None):
        yield from (dict(r) for r in runs)

    monkeypatch.setattr(runner_mod.Bench, "runs", fake_runs)
    monkeypatch.setattr(runner_mod.Bench, "warm_up", lambda self, problem, stop=None: True)
    monkeypatch.setattr(runner_mod.Bench, "history", lambda self, limit=200: [])
    return runs


@pytest.mark.parametrize("ratios_slow", ["straddling", "busy", "faster"])
def test_the_tab_and_the_cli_print_the_same_verdict_for_the_same_runs(scripted, tmp_path, capsys, ratios_slow):
    from ssr_ui.handlers import Studio

    if ratios_slow == "busy":
        scripted[:] = [{**r, "run_id": 100 + i} for i, r in
                       enumerate(bench_of([0.7] * 5, slow={("ssr", 0): 4.0, ("ssr", 4): 4.0}))]
    elif ratios_slow == "faster":
        scripted[:] = [{**r, "run_id": 100 + i} for i, r in enumerate(bench_of([0.6, 0.62, 0.61, 0.63, 0.6]))]
    path = tmp_path / "five.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{k}", "prompt": f"Start with {k}", "reference": "1"}) + "\n"
                            for k in range(5)))
    out = tmp_path / "o.json"
    assert bench.main(["--dataset", str(path), "--methods", "baseline,ssr", "--out", str(out)]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ssr vs baseline: ")]
    frames = list(Studio(db=str(tmp_path / "studio.db")).benchmark(upload=str(path), methods=["baseline", "ssr"],
                                                                    limit=5))
    assert frames[-1].verdicts == printed and len(printed) == 1
    assert printed[0] == verdict_lines(json.loads(out.read_text())["summary"])[0]  # the JSON's summary says it too
    word = {"straddling": "cannot tell", "busy": "unreliable", "faster": "faster"}[ratios_slow]
    assert printed[0].startswith(f"ssr vs baseline: {word}: ")
    status = frames[-1].status
    assert all(html.escape(part) in status for part in printed[0].split(": ", 1))  # shown in the tab's status
    verdict_column = frames[-1].summary["headers"].index("verdict")
    assert [row[verdict_column] for row in frames[-1].summary["data"]] == ["-", word]


def test_the_warm_up_is_the_same_for_both_and_stops_when_asked(tmp_path):
    """The tab runs the CLI's warm-up (each method once on the first problem, nothing logged), and a
    stop during it ends it at the next event."""
    from engine.benchmarks.problems import Problem
    from engine.config import RunConfig
    from engine.runlog import RunLog
    from tests.tiny import make_model

    lm = make_model("qwen3", seed=2, init_scale=3.0)
    log = RunLog(tmp_path / "runs.db")
    seen: list[str] = []
    b = runner_mod.Bench({"target": lm}, ["ssr", "baseline"], RunConfig(max_think=12, max_answer=6, draft_start=3,
                                                                         max_draft=4), log=log,
                         watch=lambda label, ev: seen.append(label))
    problem = Problem("p", "hello world", None, "free")
    assert b.warm_up(problem) and {"p warm-up baseline", "p warm-up ssr"} <= set(seen) and log.runs() == []
    seen.clear()
    assert b.warm_up(problem, stop=lambda: True) is False and set(seen) == {"p warm-up baseline"}  # one event, then out
    assert log.runs() == []
