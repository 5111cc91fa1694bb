"""Studio builders and handlers as plain functions (no server): escaping, colours, errors, log."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import RunConfig
from engine.events import PhaseEvent, TokenEvent
from engine.methods.ssr.loop import decode_ssr
from engine.tools.synthetic import make_example
from ssr_ui import charts
from ssr_ui.handlers import compare_shows
from ssr_ui.render import TraceView, metrics_html
from tests.tiny import make_model

SMALL = dict(draft_start=2, max_think=10, max_draft=8, max_answer=10)


def test_token_text_and_titles_are_escaped():
    view = TraceView()
    view.apply(TokenEvent("answer", "generated", 5, "<script>alert(1)</script>", 0, 0.1))
    view.apply(TokenEvent("answer", "recovered", 6, '<img src=x onerror="alert(2)">', 1, 0.2, 0, "draft", 3))
    html = view.answer_html()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<img" not in html and "&lt;img src=x onerror=&quot;alert(2)&quot;&gt;" in html
    assert 'class="tok st-recovered"' in html and "from draft 0 (match 3)" in html


def test_draft_verdicts_recolour_the_draft_token():
    view = TraceView()
    view.apply(PhaseEvent("drafting", 0.0, draft=0, at_token=4))
    for i, text in enumerate(["a", "b", "c"]):
        view.apply(TokenEvent("draft", "generated", i, text, i, 0.1, draft=0))
    view.apply(TokenEvent("draft", "accepted", 0, "a", 0, 0.2, draft=0, source="draft"))
    view.apply(TokenEvent("draft", "rejected", 1, "b", 1, 0.2, draft=0))
    html = view.draft_html()
    assert html.count("st-accepted") == 1 and html.count("st-rejected") == 1 and html.count("st-generated") == 1
    assert "forked after 4 reasoning tokens" in html
    assert view.counts()["rejected"] == 1


def test_fork_marker_sits_in_the_reasoning():
    view = TraceView()
    for i in range(3):
        view.apply(TokenEvent("reasoning", "generated", i, f"r{i}", i, 0.0))
    view.apply(PhaseEvent("drafting", 0.0, draft=0, at_token=2))
    html = view.reasoning_html()
    assert html.index("r1") < html.index("▼ draft 0") < html.index("r2")


def test_run_streams_logs_and_compares(studio):
    baseline = list(studio.run("hello <b>world</b>", "Baseline", "tiny", **SMALL))
    frames = list(studio.run("hello <b>world</b>", "SSR", "tiny", **SMALL))
    assert len(frames) >= 2
    assert "same as baseline" in frames[-1].metrics and "✔ identical" in frames[-1].metrics  # token by token
    assert "vs baseline" in frames[-1].metrics
    assert "<b>" not in frames[-1].answer
    rows = studio.history()
    assert [r["method"] for r in rows] == ["ssr", "baseline"] and all(r["status"] == "ok" for r in rows)
    replay = studio.replay(rows[0]["id"])
    assert replay.answer == frames[-1].answer
    assert baseline[-1].metrics.count("vs baseline") == 0


def test_compare_mode_runs_all_four_and_charts(studio):
    frames = list(studio.run("hello", "Compare", "tiny", "tiny-draft", "tiny-prm", **SMALL))
    assert frames[-1].chart is not None and list(frames[-1].chart.data[0].x) == ["Baseline", "SSR lookups alone", "SSR", "SSR early exit", "RSD"]
    assert list(frames[-1].chart.data[0].marker.color)[3] == charts.METHOD_COLORS["ssr-exit"]  # its own colour
    # the ablation: SSR's strip says what its drafts added against the comparison's own lookups-alone run
    alone, ssr = frames[-1].runs["SSR lookups alone"].view.done, frames[-1].runs["SSR"].view.done
    assert f"{ssr.stats.wall_s / alone.stats.wall_s:.2f}x the latency of SSR's lookups alone" in frames[-1].runs["SSR"].metrics
    assert alone.stats.drafts == 0 and "forks no draft" in frames[-1].runs["SSR lookups alone"].draft
    assert [r["method"] for r in studio.history()] == ["rsd", "ssr-exit", "ssr", "ssr-lookups", "baseline"]
    # the finished comparison shows SSR's panes and keeps every run's own final frame to switch to
    runs = frames[-1].runs
    assert list(runs) == ["Baseline", "SSR lookups alone", "SSR", "SSR early exit", "RSD"]
    # the early exit is measured against the Compare's own baseline run, like the others
    assert "own baseline run, just before" in runs["SSR early exit"].metrics
    assert "(lossy)" in runs["SSR early exit"].metrics and "tokens saved" in runs["SSR early exit"].metrics
    assert frames[-1].answer == runs["SSR"].answer and "SSR" in frames[-1].metrics
    assert runs["RSD"].view.steps and not runs["Baseline"].view.drafts and runs["SSR"].view.drafts
    assert "vs baseline" in runs["SSR"].metrics and "vs baseline" not in runs["Baseline"].metrics


@pytest.mark.parametrize("prompt, method, settings, message", [
    ("", "SSR", {}, "type a prompt first"),
    ("hi", "Warp", {}, "unknown method"),
    ("hi", "SSR", {"max_think": 0}, "Max think (max_think) must be a whole number in 1..1000000; got 0"),
    ("hi", "SSR", {"draft_start": 50, "max_think": 10}, "Draft start (draft_start) must be a whole number in 0..9 (below Max think 10); got 50"),
])
def test_bad_input_is_a_message_not_a_crash(studio, prompt, method, settings, message):
    frames = list(studio.run(prompt, method, "tiny", **settings))
    assert "error" in frames[-1].metrics and message in frames[-1].metrics
    assert studio.history() == []  # nothing half-logged


def test_missing_model_is_a_message(studio, tmp_path):
    frames = list(studio.run("hi", "SSR", str(tmp_path / "nope"), **SMALL))
    assert "does not exist" in frames[-1].metrics
    assert "SSR" in list(studio.run("hi", "SSR", "tiny", **SMALL))[-1].metrics  # still works after


def test_chart_builders(studio):
    list(studio.run("hello", "Compare", "tiny", "tiny-draft", "tiny-prm", **SMALL))
    rows = studio.history()
    assert len(charts.latency_by_method(rows).data) == 5  # the five methods of a Compare
    assert [t.name for t in charts.token_composition(rows).data] == ["accepted", "recovered", "lookups", "generated"]
    assert len(charts.speedup_vs_draft_start(rows).data[0].x) == 1
    rsd = charts.rsd_by_threshold(rows)
    # one RSD run at the default threshold beside a baseline of the same prompt, no reference answers:
    # FLOPs as a ratio to the target writing alone, and a sentence saying why there is no accuracy
    assert [t.name for t in rsd.data] == ["RSD FLOPs / target"] and list(rsd.data[0].x) == [0.7] and rsd.data[0].y[0] > 0
    assert "needs runs with a reference" in rsd.layout.title.text and not rsd.layout.annotations  # never over a point
    bars = charts.latency_bars({"Baseline": 1.0, "SSR": 0.5})
    assert list(bars.data[0].y) == [1.0, 0.5]


def test_metrics_strip_counts():
    view = TraceView()
    lm = make_model("qwen3", init_scale=3.0)
    for ev in decode_ssr(lm, "hi", RunConfig(**SMALL)):
        view.apply(ev)
    html = metrics_html(view, "SSR")
    assert "phase" in html and "done" in html and f">{len(view.answer)}<" in html
    assert "KV cache" in html and "B<" in html and ">eager<" in html  # on the CPU, auto runs the eager static path
    view.stats.step_mode, view.stats.compile_s = "compiled", 12.34
    assert "compiled (compiling took 12.3 s before the run)" in metrics_html(view, "SSR")
    compiling = TraceView()
    compiling.apply(PhaseEvent("compiling", 0.0))
    assert "compiling steps for this device" in metrics_html(compiling, "SSR")


def test_the_studio_passes_the_compile_choice_and_refuses_a_bad_one(studio):
    assert studio.config("tiny").compile == "auto" and studio.config("tiny", compile="off").compile == "off"
    with pytest.raises(ValueError, match="Compiled steps \\(compile\\) must be one of auto, on, off; got 'fast'"):
        studio.config("tiny", compile="fast")


def test_exports_and_import_round_trip(studio, tmp_path):
    import csv
    import json
    from pathlib import Path

    list(studio.run("hello <script>x</script>", "SSR", "tiny", **SMALL))
    rid = studio.history()[0]["id"]
    doc = json.loads(Path(studio.export(rid, "json")).read_text(encoding="utf-8"))
    assert doc["run"]["config"]["draft_start"] == 2 and doc["events"]
    page = Path(studio.export(rid, "html")).read_text(encoding="utf-8")
    assert page.startswith("<!doctype html>") and "<style>" in page and "st-" in page
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    rows = list(csv.DictReader(Path(studio.export(None, "csv")).read_text(encoding="utf-8").splitlines()))
    assert rows[0]["id"] == str(rid) and "tokens_per_s" in rows[0]
    imported = studio.import_trace(studio.export(rid, "json"))
    assert imported.answer == studio.replay(rid).answer


@pytest.mark.parametrize("content, message", [
    ("not json", "not a JSON file"),
    ('{"format": "other"}', "not an SSR Studio trace"),
    ('{"format": "ssr-studio-trace/1", "events": [{"kind": "alien"}]}', "event 0 has an unknown kind"),
    ('{"format": "ssr-studio-trace/1", "events": [{"kind": "token", "bogus": 1}]}', "event 0 is malformed"),
])
def test_bad_imports_say_why(studio, tmp_path, content, message):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        studio.import_trace(str(path))


def test_export_needs_a_run(studio):
    with pytest.raises(ValueError, match="enter a run id"):
        studio.export(None, "json")
    with pytest.raises(ValueError, match="no run with id 5"):
        studio.export(5, "json")


def test_draft_start_sweep(studio):
    out = list(studio.sweep("hello", "tiny", 0, 6, 3, max_think=10, max_draft=6, max_answer=8))
    assert sum("points done" in status for status, _ in out) == 3 and "sweep done: best draft start" in out[-1][0]
    fig = out[-1][1]
    assert list(fig.data[0].x) == [0, 3, 6] and all(y > 0 for y in fig.data[0].y)
    assert [r["method"] for r in studio.history()].count("ssr") == 3
    bad = list(studio.sweep("hello", "tiny", 5, 2, 1))
    assert "is empty" in bad[-1][0] and bad[-1][1] is None


def test_rsd_mode_shows_steps_scores_and_rejections(studio):
    settings = dict(max_think=20, max_answer=6, max_step_tokens=4, max_steps=6, threshold=0.5)
    frames = list(studio.run("Start with 7", "RSD", "tiny", "tiny-draft", "tiny-prm", **settings))
    last = frames[-1]
    assert "steps kept" in last.metrics and "FLOPs" in last.metrics
    assert 'class="step step-' in last.reasoning + last.answer
    row = studio.history()[0]
    assert row["method"] == "rsd" and row["draft_model"] == "tiny-draft" and row["prm"] == "tiny-prm"
    assert row["steps_accepted"] + row["steps_rejected"] > 0
    if row["steps_rejected"]:
        assert "rewritten by the target" in last.draft and "st-rejected" in last.draft


def test_rsd_with_incompatible_draft_is_a_message(studio):
    other = make_model("qwen2")
    other.tokenizer.add_tokens(["<extra>"])
    studio.add_model("odd", other)
    frames = list(studio.run("hi", "RSD", "tiny", "odd", "target-likelihood", max_think=10))
    assert "do not share a tokenizer" in frames[-1].metrics


def test_compare_skips_rsd_on_a_model_whose_tokenizer_the_draft_lacks_and_runs_the_rest(studio):
    """Compare runs what it can: an RSD pair that does not fit the model is skipped with the reason
    and how to set it, in its own cell; Baseline, SSR and the early exit run and are logged; the
    skipped run's panes say it did not run (never a claim about a run that did not happen)."""
    other = make_model("qwen2")
    other.tokenizer.add_tokens(["<extra>"])
    studio.add_model("odd-target", other)
    before = {r["id"] for r in studio.history()}
    frames = list(studio.run("hello", "Compare", "odd-target", "tiny-draft", "target-likelihood", **SMALL))
    final = frames[-1]
    assert list(final.runs) == ["Baseline", "SSR lookups alone", "SSR", "SSR early exit", "RSD"] and compare_shows(final.runs) == "SSR"
    assert final.answer == final.runs["SSR"].answer
    new = [r for r in studio.history() if r["id"] not in before]
    assert sorted(r["method"] for r in new) == ["baseline", "ssr", "ssr-exit", "ssr-lookups"]
    assert all(r["status"] == "ok" for r in new)
    strip = _plain(final.metrics)
    assert "RSD: not run" in strip and "do not share a tokenizer" in strip and "set Draft model (RSD settings" in strip
    assert list(final.chart.data[0].x) == ["Baseline", "SSR lookups alone", "SSR", "SSR early exit"]
    assert "not run: RSD" in final.chart.layout.title.text
    rsd = final.runs["RSD"]
    assert "not run" in _plain(rsd.metrics) and "do not share a tokenizer" in _plain(rsd.metrics)
    for pane in (rsd.reasoning, rsd.draft, rsd.answer):
        assert "Not run in this comparison" in pane
    assert "No draft was written" not in rsd.draft


def test_a_refused_run_says_nothing_ran_in_every_pane(studio):
    final = list(studio.run("hello", "SSR", "tiny", max_think=10, max_answer=10, draft_start=50))[-1]
    assert 'class="metrics error"' in final.metrics
    for pane in (final.reasoning, final.draft, final.answer):
        assert "Nothing ran" in pane and "No draft was written" not in pane


def test_step_badges_sit_where_each_step_begins():
    from engine.events import StepEvent

    view = TraceView()
    for i, text in enumerate(["Start with 7.", "\n\n"]):
        view.apply(TokenEvent("reasoning", "accepted", i, text, i, 0.0, source="draft"))
    view.apply(StepEvent(0, "Start with 7.\n\n", "draft", 0.93, True, 0.1))
    view.apply(TokenEvent("reasoning", "generated", 2, "7 plus 5 is 12.", 2, 0.2))
    view.apply(StepEvent(1, "7 plus 5 is 12.", "target", None, None, 0.3))
    html = view.reasoning_html()
    assert html.index("draft 0.93") < html.index("Start with 7.") < html.index(">target<") < html.index("7 plus 5")


def test_a_5000_token_trace_stays_cheap_to_update(monkeypatch):
    """Each token's span is rendered once and reused: an update of a 5,000-token trace renders only
    the few spans that show other text (the answer's first token without its leading blank), not
    every token again. (Counted, not timed: a loaded machine must not fail it.)"""
    from ssr_ui.handlers import _interval
    from ssr_ui.render import Tok

    view = TraceView()
    for i in range(5000):
        view.apply(TokenEvent("reasoning" if i < 3000 else "answer", "accepted" if i % 3 else "generated", i,
                              f"t{i} ", i, i / 100))
    view.reasoning_html(), view.answer_html()  # first render fills each token's cached span
    rendered = []
    real = Tok._render
    monkeypatch.setattr(Tok, "_render", lambda tok, text: rendered.append(tok.token_id) or real(tok, text))
    for _ in range(5):
        view.reasoning_html(), view.answer_html(), metrics_html(view, "SSR")
    assert len(rendered) <= 5, f"{len(rendered)} spans rendered again in 5 updates"
    view.apply(TokenEvent("answer", "generated", 5000, "new ", 5000, 50.0))
    rendered.clear()
    view.answer_html()
    assert rendered.count(5000) == 1 and len(rendered) <= 2  # a new token is rendered once, the rest reused
    assert _interval(view) == pytest.approx(5001 / 20_000)  # about 4 updates a second at 5,000 tokens
    assert _interval(TraceView()) == pytest.approx(1 / 12)


def test_spaces_gpu_wraps_the_runs_only_when_spaces_is_installed(studio, monkeypatch):
    import importlib
    import sys
    import types

    from ssr_ui import layout

    wrapped = []
    fake = types.ModuleType("spaces")
    fake.GPU = lambda duration: (lambda fn: wrapped.append(fn.__name__) or fn)
    monkeypatch.setitem(sys.modules, "spaces", fake)
    importlib.reload(layout).build_app(studio)
    assert wrapped == ["run", "sweep", "benchmark"]
    monkeypatch.delitem(sys.modules, "spaces")
    wrapped.clear()
    importlib.reload(layout).build_app(studio)  # without the package: nothing wraps, nothing breaks
    assert wrapped == []


def test_every_plain_method_says_it_writes_no_draft():
    """The Draft pane's message follows the registry: hf-static (once missing from a hand-kept
    list, so it showed SSR's "no draft yet") says what every plain method says."""
    from engine.registry import METHODS, methods

    PLAIN = [m.name for m in methods() if m.plain]

    assert "hf-static" in PLAIN and "ssr" not in PLAIN and set(PLAIN) < set(METHODS)
    for method in PLAIN:
        assert "Plain decoding writes no draft." in TraceView(method=method).draft_html(), method
    assert "Plain decoding" not in TraceView(method="ssr").draft_html()


# ----------------------------------------------------------------------------- SSR early exit (ssr-exit)

EXIT_PROMPT = make_example("arithmetic", 1_500_006).prompt  # the bundled model's drafts 1 and 2 agree (on a wrong 17)
EXIT_SETTINGS = dict(num_drafts=12, draft_interval=8, exit_k=2, exit_confidence=0, draft_start=20)


def _plain(markup: str) -> str:
    import html as html_lib
    import re

    return html_lib.unescape(re.sub(r"<[^>]+>", " ", markup))


def test_an_early_exit_is_marked_where_it_stopped_live_replayed_and_exported(tmp_path):
    """A real ssr-exit run on the bundled model: the badge sits after the exit_at-th reasoning token,
    the agreeing drafts are marked, the timeline labels the exit, the strip says lossy, where and why,
    and (no baseline yet) the budget left, never a made-up saving; a replay and the HTML export show
    the same mark; once a baseline of the prompt is logged, the replay's strip counts the tokens saved."""
    from pathlib import Path

    from ssr_ui.handlers import Studio

    studio = Studio("tiny-reasoner", db=str(tmp_path / "runs.db"))
    final = list(studio.run(EXIT_PROMPT, "SSR early exit", **EXIT_SETTINGS))[-1]
    view, s = final.view, final.view.stats
    assert s.exit.at is not None and view.exit is not None and view.exit.at_token == s.exit.at
    agreed = [int(d) for d in s.exit.drafts.split(",")]
    assert len(agreed) == 2 and view.exit_drafts() == agreed
    before = final.reasoning.split('class="exit-mark"')[0]
    assert before.count('class="tok ') == s.exit.at  # the badge follows the exit_at-th reasoning token
    words = f"drafts {', '.join(map(str, agreed))} agreed"
    assert f"■ early exit: {words}" in final.reasoning
    assert "■ agreed" in view.draft_html(agreed[-1])
    others = [d for d in view.drafts if d not in agreed]
    assert others and all("■ agreed" not in view.draft_html(d) for d in others)
    assert f"early exit · token {s.exit.at}" in final.timeline and "#dc2626" in final.timeline
    strip = _plain(final.metrics)
    assert "SSR early exit (lossy)" in strip and f"exited at reasoning token {s.exit.at}" in strip
    assert s.exit.rule and "2 consecutive drafts agree" in strip and words in strip
    assert f"budget left: {600 - s.reasoning_tokens} of Max think 600" in strip  # no baseline: nothing invented
    assert "identical" not in strip and "lossless" not in strip and "same answer" not in strip
    rid = studio.history()[0]["id"]
    replay = studio.replay(rid)
    assert replay.reasoning.count('class="exit-mark"') == 1 and f"early exit · token {s.exit.at}" in replay.timeline
    assert "run Compare to see tokens saved" in _plain(replay.metrics)
    page = Path(studio.export(rid, "html")).read_text(encoding="utf-8")
    assert page.count('class="exit-mark"') == 1 and ".exit-mark" in page  # the badge and its style
    base = list(studio.run(EXIT_PROMPT, "Baseline", **EXIT_SETTINGS))[-1].view.stats.reasoning_tokens
    strip = _plain(studio.replay(rid).metrics)
    saved = f"{base - s.reasoning_tokens} reasoning tokens ({s.reasoning_tokens} vs baseline's {base}" if \
        base > s.reasoning_tokens else f"none: {s.reasoning_tokens} reasoning tokens, baseline's {base}"
    assert saved in strip and "same answer" in strip  # the answer compared, never assumed


def test_an_ssr_exit_run_that_never_exits_says_it_ran_as_ssr():
    from engine.events import DoneEvent, ExitStats, RunStats

    view = TraceView(method="ssr-exit", budgets=(100, 20))
    view.apply(TokenEvent("reasoning", "generated", 1, "a", 0, 0.1))
    view.apply(DoneEvent(RunStats(wall_s=0.2, reasoning_tokens=1, exit=ExitStats(rule="3 consecutive drafts agree")), "a", "x"))
    strip = _plain(metrics_html(view, "SSR early exit"))
    assert "no exit: the rule never held in" in strip and "ran as SSR" in strip and "exited" not in strip
    assert "exit-mark" not in view.reasoning_html()
    strip = _plain(metrics_html(view, "SSR early exit", {"baselines": 1, "pair": True, "matched_on": "pair",
                                                         "ratio": 1.0, "identical": False, "base_reasoning": 40}))
    assert "39 reasoning tokens (1 vs baseline's 40: 2%)" in strip and "✘ differs" in strip


def test_picking_early_exit_with_too_few_drafts_sets_the_probes():
    from engine.presets import exit_probes
    from ssr_ui.layout import exit_mode_probes

    probes = exit_probes("tiny-reasoner", 600, 20)
    got = exit_mode_probes("SSR early exit", "tiny-reasoner", 600, 20, 1, 16, 3)
    assert (got["num_drafts"], got["draft_interval"]) == (max(probes["num_drafts"], 3), probes["draft_interval"])
    assert "Number of drafts 1 -> " in got["notice"] and "recommended probes" in got["notice"]
    assert exit_mode_probes("SSR early exit", "tiny-reasoner", 600, 20, 12, 8, 2) is None  # enough: untouched
    assert exit_mode_probes("SSR", "tiny-reasoner", 600, 20, 1, 16, 3) is None  # another mode: untouched
    assert exit_mode_probes("SSR early exit", "tiny-reasoner", 600, 20, "abc", 16, 3) is None  # the run names it
    assert exit_mode_probes("SSR early exit", "tiny-reasoner", 600, 20, 2, 16, 9)["num_drafts"] >= 9


def test_bad_early_exit_settings_are_a_message(studio):
    frames = list(studio.run("hi", "SSR early exit", "tiny", exit_k=0, **SMALL))
    assert "error" in frames[-1].metrics and "Agreeing drafts (exit_k)" in frames[-1].metrics
    frames = list(studio.run("hi", "SSR early exit", "tiny", exit_confidence=1.5, **SMALL))
    assert "Exit confidence (exit_confidence)" in frames[-1].metrics
    assert studio.history() == []


def test_the_early_exit_chart_groups_by_k_and_interval():
    import json

    def row(rid, method, prompt, reasoning, correct, k=None, interval=8):
        config = {"exit_k": k, "draft_interval": interval} if k else {}
        return {"id": rid, "method": method, "status": "ok", "prompt_hash": prompt, "model": "m",
                "reasoning_tokens": reasoning, "correct": correct, "config": json.dumps(config)}

    rows = [row(1, "baseline", "p", 100, 1), row(2, "baseline", "q", 50, 1), row(3, "ssr", "p", 100, 1),
            row(4, "ssr-exit", "p", 50, 1, k=2), row(5, "ssr-exit", "q", 25, 0, k=2),
            row(6, "ssr-exit", "p", 80, 1, k=3), row(7, "ssr-exit", "p", 90, 1, k=3, interval=16)]
    fig = charts.exit_by_k(rows)
    names = [t.name for t in fig.data]
    assert names == ["accuracy, a draft every 8", "reasoning / baseline, every 8", "accuracy, a draft every 16",
                     "reasoning / baseline, every 16", "baseline, same prompts", "SSR, same prompts"]
    acc, thought = fig.data[0], fig.data[1]
    assert list(acc.x) == [2, 3] and list(acc.y) == [0.5, 1.0]
    assert acc.error_y.array[0] > 0 and acc.error_y.arrayminus[0] > 0  # the Wilson interval around 1 of 2
    assert list(thought.y) == pytest.approx([0.5, 0.8])  # each run against its own prompt's baseline
    assert "accuracy and reasoning tokens by k" in fig.layout.title.text
    assert "No SSR early exit runs" in charts.exit_by_k(rows[:3]).layout.annotations[0].text
    alone = charts.exit_by_k([row(8, "ssr-exit", "z", 30, None, k=2)])  # no baseline, no grade: absolute tokens
    assert list(alone.data[0].y) == [30] and "accuracy needs graded runs" in alone.layout.title.text


@pytest.mark.parametrize("model", ["tiny-reasoner", "tiny-reasoner-draft", "tiny-prm", "path"])
def test_compare_runs_what_it_can_on_every_bundled_model_and_one_picked_by_path(tmp_path, model):
    """Whatever the model, Baseline runs; every other run either ran to the end or says why not."""
    from engine.presets import BUNDLED_DIR
    from ssr_ui.handlers import Studio

    name = str(BUNDLED_DIR / "tiny-reasoner") if model == "path" else model
    studio = Studio(db=str(tmp_path / "runs.db"))
    final = list(studio.run("What is 3 plus 4?", "Compare", name, max_think=40, max_answer=20))[-1]
    assert list(final.runs) == ["Baseline", "SSR lookups alone", "SSR", "SSR early exit", "RSD"]
    assert final.runs["Baseline"].view.phase == "done"
    for run in final.runs.values():
        assert run.view.phase == "done" or (run.view.phase == "skipped" and "not run" in run.metrics)
    logged = {r["method"] for r in studio.history()}
    assert logged == {name_ for name_, run in zip(("baseline", "ssr-lookups", "ssr", "ssr-exit", "rsd"), final.runs.values(),
                                                  strict=True) if run.view.phase == "done"}


def test_budgets_beyond_the_context_by_themselves_say_so_not_shorten_the_prompt(tmp_path):
    """Max think 100000 on a 2,048-position model: the budgets alone pass the context, so the message
    says to lower them (never "shorten the prompt to 0 tokens")."""
    from ssr_ui.handlers import Studio

    studio = Studio(db=str(tmp_path / "runs.db"))
    strip = _plain(list(studio.run("What is 3 plus 4?", "Baseline", "tiny-reasoner", max_think=100000))[-1].metrics)
    assert "beyond tiny-reasoner's context of" in strip and "before any prompt: lower max_think / max_answer" in strip
    assert "shorten the prompt" not in strip and "at most 0 tokens" not in strip
    assert studio.history() == []
    long = "word " * 1500  # a prompt that does not fit with the budgets still gets the prompt's advice
    assert "shorten the prompt" in _plain(list(studio.run(long, "Baseline", "tiny-reasoner", max_think=1000))[-1].metrics)


def test_a_replay_an_import_and_the_html_export_keep_the_token_level_check(tmp_path):
    """The live strip said "same as baseline ✔ identical"; a History replay, a JSON import and the
    HTML export say the same (not the weaker "same answer ✔"), in a fresh studio where the model is
    not even loaded; a run whose tokens differ says where, without inventing a margin."""
    from ssr_ui.handlers import Studio

    def flat(markup: str) -> str:
        return " ".join(_plain(markup).split())

    db = str(tmp_path / "runs.db")
    live = Studio(db=db)
    prompt = "What is 3 plus 4?"
    list(live.run(prompt, "Baseline", "tiny-reasoner", max_think=40, max_answer=20))
    strip = flat(list(live.run(prompt, "SSR", "tiny-reasoner", max_think=40, max_answer=20))[-1].metrics)
    assert "same as baseline ✔ identical" in strip
    fresh = Studio(db=db)  # nothing loaded
    ssr = fresh.history("ssr")[0]["id"]
    assert "same as baseline ✔ identical" in flat(fresh.replay(ssr).metrics)
    assert "same as baseline ✔ identical" in flat(fresh.import_trace(fresh.export(ssr, "json")).metrics)
    page = Path(fresh.export(ssr, "html")).read_text(encoding="utf-8")
    assert "same as baseline" in page and "✔ identical" in page and "same answer" not in page
    from engine.benchmarks.agreement import agreement

    assert str(agreement(None, prompt, [1, 2, 3], [1, 2, 4])) == (
        "diverged at token 2 (its top-2 logit margin is measured where the model is loaded)")


def test_history_filters_by_model_and_its_latency_chart_never_pools_models(tmp_path):
    """History's Model filter keeps one model's runs (table, charts, CSV export); with every model shown,
    "Latency by method" has one box per method and model."""
    from ssr_ui.handlers import Studio

    studio = Studio(db=str(tmp_path / "runs.db"))
    for model in ("tiny-reasoner", "tiny-reasoner-draft"):
        for method in ("Baseline", "SSR"):
            list(studio.run("What is 3 plus 4?", method, model, max_think=30, max_answer=10))
    assert studio.log.used("model") == ["tiny-reasoner-draft", "tiny-reasoner"]
    mine = studio.history(model="tiny-reasoner")
    assert len(mine) == 2 and {r["model"] for r in mine} == {"tiny-reasoner"}
    split = charts.latency_by_method(studio.history())
    assert sorted(t.name for t in split.data) == ["baseline · tiny-reasoner", "baseline · tiny-reasoner-draft",
                                                  "ssr · tiny-reasoner", "ssr · tiny-reasoner-draft"]
    assert [t.name for t in charts.latency_by_method(mine).data] == ["baseline", "ssr"]
    csv_text = Path(studio.export(None, "csv", model="tiny-reasoner")).read_text(encoding="utf-8")
    assert csv_text.count("tiny-reasoner-draft") == 0 and csv_text.count("tiny-reasoner") >= 2
    with pytest.raises(ValueError, match="by dataset or model"):
        studio.log.used("prompt")


def test_every_sped_up_token_is_marked_by_the_proposer_that_won_it_live_replayed_and_exported(tmp_path):
    """Issue 41's attribution: a token won by a lookup (prompt, reasoning, answer) is marked apart from
    one won by a draft (prefix or suffix), with the proposer in its tooltip; per proposer, the tokens
    marked equal the forwards the strip says it saved; a replay, an import and the HTML export agree."""
    import re

    from ssr_ui.handlers import Studio
    from ssr_ui.render import Tok, proposer

    assert [proposer(*a) for a in (("accepted", "draft"), ("recovered", "draft"), ("recovered", "reasoning"),
                                   ("recovered", "prompt"), ("generated", None), ("rejected", "draft"))] == [
        "draft prefix", "suffix in drafts", "lookup in reasoning", "lookup in prompt", None, None]
    tok = Tok(7, "x", "recovered", 0.5, source="answer", match_len=3).span()
    assert 'class="tok st-recovered src-lookup"' in tok and "won by the lookup in answer" in tok
    assert "src-lookup" not in Tok(7, "x", "recovered", 0.5, draft=0, source="draft").span()

    def marks(pane_html: str) -> dict[str, int]:
        won = re.findall(r'title="[^"]*won by the ([a-z ]+?)(?: ·|")', pane_html)
        return {who: won.count(who) for who in set(won)}

    studio = Studio(db=str(tmp_path / "runs.db"))
    prompt = make_example("classes", 1500004).prompt
    live = list(studio.run(prompt, "SSR", "tiny-reasoner"))[-1]
    saved = live.view.saved_by()
    assert {"draft prefix", "suffix in drafts"} <= set(saved)
    assert marks(live.reasoning + live.answer) == saved
    assert "forwards saved" in live.metrics and " · ".join(f"{w} {n}" for w, n in saved.items()) in live.metrics
    rid = studio.history("ssr")[0]["id"]
    replay = studio.replay(rid)
    imported = studio.import_trace(studio.export(rid, "json"))
    for frame in (replay, imported):
        assert marks(frame.reasoning + frame.answer) == saved and "forwards saved" in frame.metrics
    page = Path(studio.export(rid, "html")).read_text(encoding="utf-8")
    panes = (page.split("<h2>Reasoning</h2>")[1].split("<h2>Draft</h2>")[0]
             + page.split("<h2>Final answer</h2>")[1].split("<h2>Timeline")[0])  # (the Draft pane: the drafts' side)
    assert marks(panes) == saved and "forwards saved" in page
