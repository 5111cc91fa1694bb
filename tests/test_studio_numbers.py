"""Issue 34, "the studio's numbers and settings, second pass": findings 1 (a Compare's ratio is
its own pair), 2 (noise flagged, pooled baselines steady and recent), 4 (one validation message
per setting, for the UI and the API alike, nothing clamped or defaulted) and 5 (a run cut by a
budget says so). Plain handlers on tiny models, no server; the browser halves are in
tests/test_studio_browser.py."""

from __future__ import annotations

import html
import json
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from engine.config import LABELS, RunConfig, rule
from engine.runlog.compare import POOL_WINDOW_S, SLOW_FACTOR, pool, slow_runs

SMALL = dict(draft_start=2, max_think=10, max_draft=8, max_answer=10)


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub("<[^>]+>", " ", fragment)).split())


def _slow_down(studio, run_id: int, factor: float) -> None:
    """Make a logged run look as if the machine had been busy during it."""
    with studio.log._db() as db:
        row = db["runs"].get(run_id)
        db["runs"].update(run_id, {"wall_s": row["wall_s"] * factor})


# ----------------------------------------------------------------------------- 1. a Compare's own pair

def test_a_compare_reports_the_ratio_of_the_pair_it_made(studio):
    for _ in range(2):
        list(studio.run("hello", "Baseline", "tiny", **SMALL))
    for run in studio.history("baseline"):
        _slow_down(studio, run["id"], 50.0)  # logged earlier, "under load": the pooled median would be 50x off
    final = list(studio.run("hello", "Compare", "tiny", "tiny-draft", "tiny-prm", **SMALL))[-1]
    base, ssr = final.runs["Baseline"].view.stats.wall_s, final.runs["SSR"].view.stats.wall_s
    strip = _text(final.runs["SSR"].metrics)
    assert f"{ssr / base:.2f}x latency: this comparison's own baseline run, just before" in strip
    assert list(final.chart.data[0].y) == pytest.approx([base, final.runs["SSR lookups alone"].view.stats.wall_s, ssr,
                                                         final.runs["SSR early exit"].view.stats.wall_s,
                                                         final.runs["RSD"].view.stats.wall_s])
    exit_strip = _text(final.runs["SSR early exit"].metrics)
    assert f"{final.runs['SSR early exit'].view.stats.wall_s / base:.2f}x latency: this comparison's own" in exit_strip
    [logged] = studio.history("ssr-exit")  # with too few drafts to ever agree, a Compare gives it the model's probes
    config = logged["config"] if isinstance(logged["config"], dict) else json.loads(logged["config"])
    assert SMALL.get("num_drafts", 1) < config["exit_k"] <= config["num_drafts"]
    assert f"a draft every {config['draft_interval']} tokens" in logged["exit_rule"]
    rsd = _text(final.runs["RSD"].metrics)
    assert f"{final.runs['RSD'].view.stats.wall_s / base:.2f}x latency: this comparison's own" in rsd


# ----------------------------------------------------------------------------- 2. noise flagged

def _row(rid, wall, forwards=10, minutes=0.0, method="baseline", **kw):
    when = datetime(2026, 12, 1, 12, tzinfo=timezone.utc) + timedelta(minutes=minutes)
    return {"id": rid, "method": method, "status": "ok", "model": "m", "dtype": "float32", "device": "cpu",
            "step_mode": "eager", "config": {"max_think": 10}, "wall_s": wall, "forward_calls": forwards,
            "created_at": when.isoformat(), "prompt_hash": "p", **kw}


def test_a_run_is_flagged_slow_against_its_own_kind_only():
    rows = [_row(1, 1.0), _row(2, 1.1), _row(3, 0.9), _row(4, 5.0), _row(5, 50.0, forwards=500),
            _row(6, 9.0, method="ssr"), _row(7, 1.0, method="ssr")]
    flagged = slow_runs(rows)
    assert set(flagged) == {4}  # 5 s for 10 forwards; 50 s for 500 forwards is its kind's pace
    assert flagged[4].startswith("slow: 5.0x the median time per forward of 5 baseline runs of m")
    assert slow_runs(rows[:2] + rows[3:4]) == {4: slow_runs(rows[:2] + rows[3:4])[4]}  # three are enough to judge
    assert slow_runs(rows[:1] + rows[3:4]) == {}  # two are not: nothing to judge by
    assert SLOW_FACTOR == 2.0


def test_pooled_baselines_leave_out_slow_and_distant_runs_and_say_so():
    at = datetime(2026, 12, 1, 13, tzinfo=timezone.utc)
    rows = [_row(1, 1.0, minutes=55), _row(2, 1.2, minutes=50), _row(3, 9.0, minutes=45), _row(4, 1.1, minutes=0)]
    kept, info = pool(rows, {3: "slow"}, at)
    assert [r["id"] for r in kept] == [1, 2]  # 3 flagged slow; 4 an hour before the run
    assert info == {"n": 2, "spread": (1.0, 1.2), "ages": (300.0, 600.0), "left_slow": 1, "left_old": 1}
    kept, info = pool(rows[3:], {}, at)  # only a distant one: it alone (one run mixes nothing), its age said
    assert [r["id"] for r in kept] == [4] and info["ages"] == (3600.0, 3600.0) and POOL_WINDOW_S == 1800


def test_the_strip_and_history_leave_out_a_slow_baseline(studio):
    for _ in range(3):
        list(studio.run("hello", "Baseline", "tiny", **SMALL))
    slow = studio.history("baseline")[0]["id"]
    _slow_down(studio, slow, 20.0)
    rows = {r["id"]: r for r in studio.history()}
    assert rows[slow]["flag"].startswith("slow: ") and all(not r["flag"] for i, r in rows.items() if i != slow)
    strip = _text(list(studio.run("hello", "SSR", "tiny", **SMALL))[-1].metrics)
    assert re.search(r"\(median of 2 baseline runs, [\d.]+-[\d.]+ s, \d+ s (old to \d+ s )?old\); left out 1 flagged "
                     r"slow", strip), strip


# ----------------------------------------------------------------------------- 4. one message per setting

NUMERIC = [f for f in RunConfig.field_names() if type(getattr(RunConfig, f)) in (int, float)]


@pytest.mark.parametrize("field", NUMERIC)
def test_every_numeric_setting_refuses_junk_and_out_of_range_values_by_name(studio, field):
    cfg = studio.config("tiny")
    context = {**cfg.to_dict(), "num_drafts": 2} if field == "draft_interval" else cfg.to_dict()
    too_big = {"seed": 2**63, "temperature": 5, "top_p": 1.5, "threshold": 5, "draft_confidence": 1.5}.get(field, 10**7)
    for value in ("abc", "", None, -1, too_big, float("nan")):
        if field in ("spec_factor",) and value == too_big:
            continue  # no upper bound: any finite factor
        if field == "weight_param" and value in (-1, too_big):
            continue  # the binary rule takes any finite parameter (it does not read it)
        with pytest.raises(ValueError) as err:
            studio.config("tiny", **{field: value, **({"num_drafts": 2} if field == "draft_interval" else {})})
        message = str(err.value)
        assert message.startswith(f"{LABELS[field]} ({field}) ")
        assert rule(field, context) in message, message
        if isinstance(value, (int, float)):
            assert message.endswith((f"got {value!r}", f"got {float(value)!r}")), message
        elif value == "abc":
            assert message.endswith("got 'abc'"), message


def test_a_number_too_big_for_a_float_is_refused_by_name(studio):
    with pytest.raises(ValueError, match=r"^Seed \(seed\) must be a whole number in 0..9223372036854775807; got 1000"):
        studio.config("tiny", seed="1" + "0" * 400)  # before: OverflowError from math.isfinite


@pytest.mark.parametrize("field, value", [("threshold", -1), ("threshold", 5), ("temperature", 5),
                                          ("temperature", -1), ("temperature", "1e400"), ("draft_start", "")])
def test_nothing_is_clamped_or_defaulted(studio, field, value):
    """The issue's cases: before, -1 and 5 ran as thresholds, a temperature box turned 5 into 2,
    -1 into 0 and 1e400 into 0, and an empty draft start ran with 20."""
    metrics = _text(list(studio.run("hello", "SSR", "tiny", **{**SMALL, field: value}))[-1].metrics)
    assert metrics.startswith(f"⚠ {LABELS[field]} ({field}) ") and rule(field, {"max_think": 10}) in metrics
    assert studio.history() == []


def test_the_prm_field_is_named_when_its_model_is_missing(studio):
    metrics = _text(list(studio.run("hello", "RSD", "tiny", "tiny-draft", "nope", **SMALL))[-1].metrics)
    assert "Process reward model" in metrics and "'nope'" in metrics


# ----------------------------------------------------------------------------- 5. cut by a budget

def test_a_run_cut_by_its_budgets_says_so_everywhere(studio):
    final = list(studio.run("hello", "SSR", "tiny", **SMALL))[-1]  # random weights: they never stop by themselves
    assert final.view.stats.cut == "reasoning, answer"
    assert "cut at Max think" in final.reasoning and "end of thinking</span>" not in final.reasoning
    assert "cut at Max answer" in final.answer
    assert "cut by budget the reasoning at Max think and the answer at Max answer" in _text(final.metrics)
    row = studio.history()[0]
    assert row["cut"] == "reasoning, answer"
    replay = studio.replay(row["id"])
    assert "cut at Max think" in replay.reasoning and "cut at Max answer" in replay.answer
    page = Path(studio.export(row["id"], "html")).read_text(encoding="utf-8")
    assert "cut at Max think" in page and "cut at Max answer" in page
    assert json.loads(Path(studio.export(row["id"], "json")).read_text(encoding="utf-8"))["run"]["cut"] == \
        "reasoning, answer"


def test_a_run_that_ends_by_itself_is_not_cut(studio):
    from engine.methods.budget import budget_cut

    assert budget_cut(9, 4, 10, 10) == ""
    assert budget_cut(10, 4, 10, 10) == "reasoning"
    assert budget_cut(0, 10, 10, 10) == "answer"  # a model without think markers: all its output is answer
    assert budget_cut(12, 8, 10, 10, rsd=True) == "response"
    assert budget_cut(12, 7, 10, 10, rsd=True) == ""


# ----------------------------------------------------------------------------- 8. states named as they are

def test_an_unreachable_hub_is_said_attempt_by_attempt(studio, monkeypatch):
    from tests.apps import free_port

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    endpoint = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)  # nothing listens: refused at once
    frames = [_text(f.status) for f in studio.benchmark("someone/some-set", None, ["baseline"], 2, model_name="tiny",
                                                        **SMALL)]
    assert frames[:3] == [f"reaching the Hub ({endpoint}): attempt {k} of 3…" for k in (1, 2, 3)]
    assert frames[-1].startswith("⚠ the Hub (") and "did not answer 3 attempts" in frames[-1]
    assert "upload the dataset as a file" in frames[-1] and not any("reading" in f for f in frames)


def test_the_benchmark_says_what_it_is_doing_before_its_first_run(studio):
    frames = [_text(f.status) for f in studio.benchmark("bundled-classes", None, ["baseline", "ssr"], 1,
                                                        model_name="tiny", **SMALL)]
    assert frames[0].startswith("reading bundled-classes")
    assert any(f.startswith("classes.jsonl: 1 problems read; loading tiny") for f in frames)
    warming = [i for i, f in enumerate(frames) if "warming up" in f]
    in_flight = frames.index("run 1 of 2 in flight (classes.jsonl; timed)…")
    assert warming and warming[0] < in_flight and frames[-1].startswith("done: 2 runs")


def test_a_sweep_names_each_state_and_sums_up(studio):
    frames = list(studio.sweep("hello", "tiny", 2, 4, 2, **{k: v for k, v in SMALL.items() if k != "draft_start"}))
    states = [_text(status) for status, _ in frames]
    assert states[0] == "sweep of 2 draft starts: loading tiny…"
    assert "sweep: warming up baseline and SSR once (untimed, not logged)…" in states
    order = [states.index(s) for s in ("sweep: the baseline run (1 of 3 runs)…",
                                       "sweep: point 1 of 2 (draft start 2) running; 0 done…",
                                       "sweep: 1 of 2 points done",
                                       "sweep: point 2 of 2 (draft start 4) running; 1 done…")]
    assert order == sorted(order)
    assert re.fullmatch(r"sweep done: best draft start [24]: [\d.]+x baseline's latency \((no )?faster than baseline\); "
                        r"the 2 points ranged [\d.]+-[\d.]+x, one run each .*", states[-1]), states[-1]
