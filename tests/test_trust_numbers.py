"""Issue 22, "numbers you can trust": findings 2 (vs baseline compares like with like), 3 (a
stopped run gets no verdict), 8 (inputs that lie) and 10 (replays and exports as the live view).
Each test failed on the code before the fix; plain handlers on tiny models, no server."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from engine.config import MAX_SEED, MAX_TEMPERATURE, RunConfig, rule
from engine.runlog import RunMeta
from engine.runlog.compare import match_key, matching_baselines
from ssr_ui import charts

SMALL = dict(draft_start=2, max_think=10, max_draft=8, max_answer=10)


def _strip(studio, method, **settings) -> str:
    return list(studio.run("hello", method, "tiny", **{**SMALL, **settings}))[-1].metrics


# ----------------------------------------------------------------------------- 3. stopped runs get no verdict

def test_trust_a_cancelled_run_gets_no_ratio_and_no_verdict_in_history(studio):
    _strip(studio, "Baseline")
    _strip(studio, "SSR")
    ssr = studio.history("ssr")[0]
    meta = RunMeta("ssr", ssr["model"], ssr["prompt"], RunConfig(**SMALL).to_dict(), device=ssr["device"],
                   dtype=ssr.get("dtype"), think_end=ssr.get("think_end"))
    stopped = studio.log.save(meta, studio.log.events(ssr["id"])[:12], "cancelled")
    metrics = studio.replay(stopped).metrics
    # the tempting wrong answer: the replay compares its partial latency with the baseline (0.41x) and its
    # partial answer with the baseline's ("same answer ✘ differs"), as the live strip never would
    assert "x latency" not in metrics and "same answer" not in metrics
    assert "none: a run that was stopped is not compared" in metrics
    assert "(1 baseline run, " in studio.replay(ssr["id"]).metrics  # the finished one still is


def test_trust_a_cancelled_baseline_is_no_baseline(studio):
    _strip(studio, "Baseline")
    base = studio.history("baseline")[0]
    for status in ("cancelled", "error"):
        studio.log.save(RunMeta("baseline", base["model"], base["prompt"], RunConfig(**SMALL).to_dict(),
                                device=base["device"], dtype=base.get("dtype")), studio.log.events(base["id"])[:3], status)
    assert "x latency (1 baseline run, " in _strip(studio, "SSR")  # the one that finished, not three
    rows = studio.history()
    assert [b["id"] for b in matching_baselines(rows[0], rows)] == [base["id"]]
    assert matching_baselines({**rows[0], "status": "cancelled"}, rows) == []


# ----------------------------------------------------------------------------- 2. like with like

def test_trust_vs_baseline_needs_a_baseline_with_the_same_settings(studio):
    _strip(studio, "Baseline")
    # before: "0.28x latency" against a baseline of other numerics; now: none matches
    assert "no baseline run with these settings yet: run Baseline with them" in _strip(studio, "SSR", exact=True)
    assert "no baseline run with these settings" in _strip(studio, "SSR", max_answer=9)
    _strip(studio, "Baseline", exact=True)
    strip = _strip(studio, "SSR", exact=True, seed=7)  # greedy: the seed changes nothing, so it is not matched
    assert re.search(r"x latency \(1 baseline run, \d+ s old\): same model, settings \(greedy: any seed\)", strip)
    assert "same as baseline" in strip


def test_trust_sampled_runs_match_on_temperature_top_p_and_seed(studio):
    sampled = dict(temperature=0.8, top_p=0.9)
    for _ in range(2):
        _strip(studio, "Baseline", **sampled, seed=1)
    _strip(studio, "Baseline", temperature=1.5, seed=1)
    assert "no baseline run with these settings" in _strip(studio, "SSR", **sampled, seed=2)
    assert "(median of 2 baseline runs, " in _strip(studio, "SSR", **sampled,
                                                                                             seed=1)


BASE_ROW = {"method": "baseline", "status": "ok", "prompt_hash": "p", "model": "m", "dtype": "float32", "device": "cpu",
            "step_mode": "eager: off", "config": {**RunConfig().to_dict(), "temperature": 0.7, "seed": 3}}


@pytest.mark.parametrize("change, same", [
    ({"step_mode": "eager: auto compiles on CUDA only"}, True),  # eager for another reason: the same speed
    ({"config": {**BASE_ROW["config"], "draft_start": 9, "compile": "auto"}}, True),  # SSR's own settings
    ({"dtype": "bfloat16"}, False), ({"device": "cuda:0"}, False), ({"step_mode": "compiled"}, False),
    ({"model": "other"}, False), ({"prompt_hash": "q"}, False),
    ({"config": {**BASE_ROW["config"], "seed": 4}}, False),  # sampled: the seed is part of the output
    ({"config": {**BASE_ROW["config"], "temperature": 0.0, "seed": 4}}, False),
    ({"config": {**BASE_ROW["config"], "top_p": 0.5}}, False),
    ({"config": {**BASE_ROW["config"], "max_think": 7}}, False),
    ({"config": {**BASE_ROW["config"], "max_answer": 7}}, False),
    ({"config": {**BASE_ROW["config"], "exact": True}}, False),
    ({"config": {**BASE_ROW["config"], "thinking": False}}, False),  # the answer alone is another request
    ({"config": {k: v for k, v in BASE_ROW["config"].items() if k != "thinking"}}, True),  # logged before it: on
])
def test_trust_the_match_key(change, same):
    assert (match_key({**BASE_ROW, **change}) == match_key(BASE_ROW)) is same


def test_trust_greedy_runs_match_across_seeds():
    greedy = {**BASE_ROW, "config": {**BASE_ROW["config"], "temperature": 0.0}}
    assert match_key(greedy) == match_key({**greedy, "config": {**greedy["config"], "seed": 99}})


def test_trust_the_history_chart_uses_matching_baselines_only(studio):
    _strip(studio, "Baseline")
    _strip(studio, "SSR", exact=True)
    assert not charts.speedup_vs_draft_start(studio.history()).data[0].x  # before: one point, vs a non-exact baseline
    _strip(studio, "SSR")
    assert len(charts.speedup_vs_draft_start(studio.history()).data[0].x) == 1


# ----------------------------------------------------------------------------- 8. inputs that lie

def test_trust_the_largest_seed_reaches_the_run_exactly(studio):
    # before: float("9223372036854775807") -> 9223372036854775808 -> "must be in 0..2**63-1"
    assert studio.config("tiny", seed=str(MAX_SEED)).seed == MAX_SEED
    assert studio.config("tiny", seed=" 42 ").seed == 42 and studio.config("tiny", seed="1e3").seed == 1000
    _strip(studio, "Baseline", temperature=0.5, seed=str(MAX_SEED))
    assert studio.log.runs(limit=1)[0]["config"].count(f'"seed": {MAX_SEED}') == 1
    with pytest.raises(ValueError, match=r"Seed \(seed\) must be a whole number in 0..9223372036854775807; got 9223372036854775808"):
        studio.config("tiny", seed=str(MAX_SEED + 1))


@pytest.mark.parametrize("value, message", [
    # one message shape whatever is wrong (issue 34: "-1" and "600" used to get two different ranges)
    ("700", "Draft start (draft_start) must be a whole number in 0..599 (below Max think 600); got 700"),
    ("-5", "Draft start (draft_start) must be a whole number in 0..599 (below Max think 600); got -5"),
    ("1e3", "Draft start (draft_start) must be a whole number in 0..599 (below Max think 600); got 1000"),
    ("2.5", "Draft start (draft_start) must be a whole number in 0..599 (below Max think 600); got '2.5'"),
    ("", "Draft start (draft_start) is empty: it must be a whole number in 0..599 (below Max think 600)"),
    (None, "Draft start (draft_start) is empty: it must be a whole number in 0..599 (below Max think 600)"),
])
def test_trust_typed_draft_starts_are_refused_by_name(studio, value, message):
    import html

    assert message in html.unescape(list(studio.run("hello", "SSR", "tiny", max_think=600, draft_start=value))[-1].metrics)


def test_trust_the_ui_sends_typed_numbers_as_typed_and_shares_the_api_ranges(studio):
    """A slider clamps what is typed into it before sending (700 shown, 599 run); a browser number
    holds no 19-digit seed. The draft start, the temperature and the threshold are number boxes
    (a slider's box clamped 5 to 2), the seed a text box; each box states the API's range."""
    import gradio as gr

    from ssr_ui.layout import build_app

    demo = build_app(studio)
    by_label = {getattr(b, "label", None): b for b in demo.blocks.values()}
    draft_start = by_label["Draft start (reasoning tokens)"]
    assert isinstance(draft_start, gr.Number) and f"0..{studio.config('tiny').max_think - 1}" in draft_start.info
    assert draft_start.preprocess(700) == 700  # reaches RunConfig as sent
    assert isinstance(by_label["Seed"], gr.Textbox)
    for label, field in (("Temperature", "temperature"), ("Threshold", "threshold")):
        assert isinstance(by_label[label], gr.Number) and rule(field) in by_label[label].info
        assert by_label[label].preprocess(5) == 5  # sent as typed: the run refuses it by name, nothing clamps
    RunConfig(temperature=MAX_TEMPERATURE)
    with pytest.raises(ValueError, match=r"Temperature \(temperature\) must be a number in 0..2 \(0: greedy\); got 50.0"):
        studio.config("tiny", temperature=50)


@pytest.mark.parametrize("method", ["Baseline", "SSR"])
def test_trust_reasoning_never_exceeds_max_think(studio, method):
    """Finding 8: 600 -> 601 reasoning tokens; the forced marker is now the budget's last token."""
    frame = list(studio.run("hello", method, "tiny", **SMALL))[-1]
    assert frame.view.stats.reasoning_tokens == SMALL["max_think"]  # the tiny random model never stops by itself


# ----------------------------------------------------------------------------- 10. replays and exports

def test_trust_replay_and_export_render_as_the_live_view(studio):
    live = list(studio.run("hello", "SSR", "tiny", **SMALL))[-1]
    assert 'class="think-end cut"' in live.reasoning  # the budget closed it (issue 34)
    rid = studio.history()[0]["id"]
    assert studio.replay(rid).reasoning == live.reasoning  # before: a raw </think> span
    page = Path(studio.export(rid, "html")).read_text(encoding="utf-8")
    assert live.reasoning in page and "&lt;/think&gt;" not in page
    for raw in ("wall_s", "rejected_lookup", "ttft_s", "reasoning_tokens"):  # the strip's labels, not field names
        assert f">{raw}<" not in page
    assert ">elapsed<" in page and ">vs baseline<" in page
    assert ">FLOPs<" in page and live.view.stats.flops > 0  # before: "flops 0" for SSR, which counted none


def test_trust_exports_name_every_model_and_show_measured_flops(studio):
    list(studio.run("hello", "Baseline", "tiny", **SMALL))
    page = Path(studio.export(studio.history()[0]["id"], "html")).read_text(encoding="utf-8")
    assert ">FLOPs<" in page  # plain decoding counts its FLOPs: shown as the live strip shows them
    list(studio.run("hello", "RSD", "tiny", "tiny-draft", "tiny-prm", max_think=20, max_answer=6, max_step_tokens=4))
    page = Path(studio.export(studio.history()[0]["id"], "html")).read_text(encoding="utf-8")
    assert "<th>draft model</th><td>tiny-draft</td>" in page and "<th>process reward model</th><td>tiny-prm</td>" in page


def test_trust_the_csv_export_honours_the_method_filter(studio):
    list(studio.run("hello", "Compare", "tiny", "tiny-draft", "tiny-prm", **SMALL))
    text = Path(studio.export(None, "csv", "ssr")).read_text(encoding="utf-8")
    assert [r["method"] for r in csv.DictReader(text.splitlines())] == ["ssr"]
    text = Path(studio.export(None, "csv", "all")).read_text(encoding="utf-8")
    assert sorted(r["method"] for r in csv.DictReader(text.splitlines())) == ["baseline", "rsd", "ssr", "ssr-exit", "ssr-lookups"]


# ----------------------------------------------------------------------------- 9. memory and uploads

def test_trust_a_run_whose_cache_would_not_fit_is_refused_with_the_estimate(tmp_path, monkeypatch):
    """1,000 drafts once ran with a 5 GB cache; now the estimate (bytes per slot and row, measured
    on the model's own cache by the probe) is checked against the operator's --max-cache-gb and the
    memory available, before the run: a message, nothing logged, the studio still runs."""
    from ssr_ui.handlers import Studio
    from tests.tiny import make_model

    studio = Studio("tiny", db=str(tmp_path / "runs.db"), max_cache_gb=0.001)
    lm = make_model("llama", init_scale=3.0)
    studio.add_model("tiny", lm)
    many = {**SMALL, "num_drafts": 400, "draft_interval": 1, "max_think": 420}
    lm.share_forks = False  # every draft a copy of the prefix: 401 rows
    strip = list(studio.run("hello", "SSR", "tiny", **many))[-1].metrics
    assert "KV cache would take" in strip and "401 rows" in strip and "--max-cache-gb (0.00 GB)" in strip
    assert studio.history() == []
    lm.share_forks = True  # shared forks: the prefix once, and only the drafts live at once
    strip = list(studio.run("hello", "SSR", "tiny", **many))[-1].metrics
    assert "KV cache would take" not in strip and "shared prefix" in strip, strip
    assert studio.history()[0]["status"] == "ok"
    list(studio.run("hello", "SSR", "tiny", **SMALL))  # a run that fits still runs
    assert studio.history()[0]["status"] == "ok"
    monkeypatch.setattr("engine.runtime.model.available_bytes", lambda device: 1024)
    strip = list(studio.run("hello", "Baseline", "tiny", **SMALL))[-1].metrics
    assert "beyond the cpu memory available now" in strip


def test_trust_an_oversized_trace_is_refused_before_it_is_read(studio, tmp_path, monkeypatch):
    monkeypatch.setattr("ssr_ui.export.MAX_TRACE_BYTES", 1000)
    big = tmp_path / "big.json"
    big.write_text("x" * 5000)
    with pytest.raises(ValueError, match=r"big.json is 0.0 MB: a trace import reads at most"):
        studio.import_trace(str(big))


# ----------------------------------------------------------------------------- 11. layout

def test_trust_the_fork_marker_never_splits_a_word_or_a_number():
    """Finding 11: "108" was drawn "1▼ draft 0 08"; the marker moves on to the next word boundary."""
    from ssr_ui.render import Tok, TraceView

    view = TraceView()
    view.reasoning = [Tok(i, text, "generated", 0.0) for i, text in enumerate(["amber", " has", " 1", "08", " apples"])]
    view.draft_forks = {0: 3}  # forked after " 1": between the two halves of 108
    page = view.reasoning_html()
    assert page.index("▼ draft 0") > page.index("08") and page.index("▼ draft 0") < page.index(" apples")
    assert "forked after 3 reasoning tokens" in page
    view.draft_forks = {0: 1}  # at a boundary: drawn where it forked
    page = view.reasoning_html()
    assert page.index("amber") < page.index("▼ draft 0") < page.index(" has")


def test_trust_a_stopped_compare_charts_the_runs_it_finished(studio):
    """Finding 11: a Compare stopped midway showed no chart for the runs it had finished."""
    from ssr_ui.jobs import Job

    job = Job(None, None)
    frames = []
    for frame in studio.run("hello", "Compare", "tiny", "tiny-draft", "tiny-prm", job=job, **SMALL):
        frames.append(frame)
        if frame.view and frame.view.method == "ssr" and not job.cancelled:
            job.request_cancel()  # Baseline and the lookups-alone run finished; SSR is running
    last = frames[-1]
    assert last.chart is not None and "stopped: 2 of 5 finished" in last.chart.layout.title.text
    assert list(last.chart.data[0].x) == ["Baseline", "SSR lookups alone"]


def test_trust_charts_and_strip_read_without_guessing():
    """Finding 11: the sweep's latency axis starts at 0; the token chart's legend is off its slanted
    labels; the strip's terms explain themselves; a long cell (RSD's rule) wraps inside the strip."""
    from ssr_ui.render import TERMS, TraceView, metrics_html

    sweep = charts.sweep_chart([{"draft_start": 10, "ratio": 0.8, "accepted": 3, "recovered": 2},
                                {"draft_start": 20, "ratio": 0.7, "accepted": 5, "recovered": 1}])
    assert sweep.layout.yaxis.rangemode == "tozero"
    rows = [{"id": 1, "method": "ssr", "status": "ok", "accepted": 1, "recovered": 2, "generated": 3}]
    tokens = charts.token_composition(rows)
    assert tokens.layout.legend.orientation == "h" and list(tokens.data[0].x) == [1]  # numeric ids: plotly thins the ticks
    strip = metrics_html(TraceView(method="rsd", rule="PRM score >= 0.7 (calibrated on seeds 4,000,000-4,000,199)"), "RSD")
    assert '<div class="metric"><div class="k" title="' in strip  # every cell wraps (assets/studio.css)
    for term in ("lookup misses", "KV cache", "FLOPs", "rejected"):
        assert TERMS.get(term)


# ----------------------------------------------------------------------------- 12. defaults that fit

def test_trust_default_budgets_fit_the_model_loaded(tmp_path, capsys):
    """Finding 12: the bench on the bundled draft model (context 2048) refused every prompt with
    its own default budgets (2000 + 1024); the budgets nobody set now fit the model's context."""
    from engine.tools import bench
    from engine.wiring import run_config

    cfg = run_config("tiny-reasoner-draft", {})
    assert cfg.max_think + cfg.max_answer <= 2048 - 512 and cfg.draft_start < cfg.max_think
    assert run_config("tiny-reasoner-draft", {"max_think": 900}).max_think == 900  # what the user sets is kept
    assert run_config("tiny-reasoner", {}).max_think == 600  # a model's tuned budgets are its own
    assert bench.main(["--model", "assets/models/tiny-reasoner-draft", "--methods", "baseline", "--dataset",
                       "bundled-arithmetic", "--limit", "1", "--warmup", "0", "--out", str(tmp_path / "o.json")]) == 0, \
        capsys.readouterr().err


# ----------------------------------------------------------------------------- 1. cold runs

def test_trust_the_first_run_of_a_kind_is_warmed_untimed_and_never_logged(studio, monkeypatch):
    """Finding 1: the first run after a start counted as a normal run. The studio now runs each
    kind of run once on short budgets before its first timed run (as the bench warms up): the
    warm-up is neither logged nor shown; later runs of that kind start at once."""
    from ssr_ui import handlers

    calls = []
    real = handlers.decoder

    def counting(method, *args):
        decode = real(method, *args)
        return lambda prompt, cfg: (calls.append((method, prompt)), decode(prompt, cfg))[1]

    monkeypatch.setattr(handlers, "decoder", counting)
    import engine.registry

    monkeypatch.setattr(engine.registry, "decoder", counting)
    frames = list(studio.run("hello", "SSR", "tiny", **SMALL))
    assert calls == [("ssr", "warm up"), ("ssr", "hello")]
    assert any("warming up SSR" in f.metrics for f in frames)
    list(studio.run("hello again", "SSR", "tiny", **SMALL))
    assert calls[-1] == ("ssr", "hello again") and len(calls) == 3  # warm already
    assert [r["prompt"] for r in studio.history()] == ["hello again", "hello"]  # the warm-up is not logged
    list(studio.run("hello", "SSR", "tiny", **{**SMALL, "exact": True}))
    assert ("ssr", "warm up") in calls[3:]  # exact mode is another kind of run: warmed on its own
