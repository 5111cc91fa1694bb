"""The page's logic (``ssr_ui.tabs``), called directly, without a browser or a server: what a
setting's change moves (and says), what a run's, a benchmark's and History's events show, the
jobs' API signatures and buttons. Studios are stand-ins unless a test needs the run log."""

from __future__ import annotations

import inspect
import types

import pytest

from engine.config import LABELS, RunConfig
from engine.runlog import RunLog, RunLogError
from engine.runlog.store import RunMeta
from ssr_ui.frame import Frame, where_time_goes
from ssr_ui.render import TraceView
from ssr_ui.tabs import benchmark, common, endpoints, history, run, settings


def _is_noop(update) -> bool:
    """A ``gr.update()`` that changes nothing."""
    return isinstance(update, dict) and set(update) == {"__type__"}


def _view_with_drafts(*drafts: int) -> TraceView:
    return TraceView(drafts={d: [] for d in drafts})


# ----------------------------------------------------------------------------- common

@pytest.mark.parametrize("value, expected", [
    ("12", 12), (12.0, 12), (7, 7),
    ("1.5", None),  # tempting: 1 (int("1.5") fails, int(1.5) truncates): not a whole number, the run says so
    ("", None), ("abc", None), (None, None),
])
def test_whole_reads_a_box_as_a_whole_number_or_none(value, expected):
    assert common.whole(value) == expected


def test_a_timeline_without_a_run_is_the_empty_one():
    assert common.redraw_timeline(None, "time") == where_time_goes(TraceView(), "time")
    assert common.redraw_timeline(None, "forward") == where_time_goes(TraceView(), "forward")


# ----------------------------------------------------------------------------- settings: what a change moves

def test_typing_max_think_moves_the_stated_range_never_the_value():
    update = settings.think_typed("1")  # the first key of "1200": the range follows, the value stays
    assert update["info"] == settings.draft_start_info(1) and "value" not in update
    assert _is_noop(settings.think_typed("abc")) and _is_noop(settings.think_typed(0))


def test_max_think_done_moves_an_out_of_range_draft_start_and_says_so(capsys):
    kept = settings.think_changed(300, 100)
    assert kept["info"] == settings.draft_start_info(300) and "value" not in kept
    assert capsys.readouterr().out == ""  # nothing moved: nothing said
    moved = settings.think_changed("300", 300)  # tempting: 300 stays (it must stay below Max think)
    assert moved["value"] == 299 and moved["info"] == settings.draft_start_info(300)
    assert "Draft start 300 -> 299: it must stay below Max think (300)" in capsys.readouterr().out
    assert settings.think_changed(300, -5)["value"] == 299
    assert _is_noop(settings.think_changed("abc", 100))  # the run names the bad Max think
    assert "value" not in settings.think_changed(300, "x")  # a bad draft start is the run's to name


def test_the_slider_range_follows_a_whole_max_think():
    assert settings.draft_range(300)["maximum"] == 299
    assert _is_noop(settings.draft_range(1)) and _is_noop(settings.draft_range("1.5"))


def _budget_studio(**budgets):
    cfg = RunConfig(**budgets)

    def config(name):
        if name == "refused":
            raise ValueError("not on this studio's list")
        return cfg
    return types.SimpleNamespace(config=config)


def test_another_model_brings_its_budgets_and_names_what_changed(capsys):
    studio = _budget_studio(max_think=900, max_draft=64, max_answer=200, draft_start=150)
    shown = (900, "32", 200, 100)  # as the boxes hold them (a typed box sends text)
    *budgets, start = settings.recommended_budgets(studio, "some-model", *shown)
    assert budgets == [900, 64, 200] and start["value"] == 150 and start["info"] == settings.draft_start_info(900)
    said = capsys.readouterr().out
    assert said.startswith("some-model's recommended settings: ")
    assert f"{LABELS['max_draft']} 32 -> 64" in said and f"{LABELS['draft_start']} 100 -> 150" in said
    assert LABELS["max_think"] not in said  # unchanged budgets are not listed
    settings.recommended_budgets(studio, "some-model", 900, 64, 200, 150)
    assert capsys.readouterr().out == ""  # nothing changed: nothing said


def test_a_missing_path_or_a_refused_name_keeps_the_budgets(tmp_path):
    studio = _budget_studio()
    with pytest.warns(UserWarning, match="no such file or folder here: the settings on screen are kept"):
        kept = settings.recommended_budgets(studio, str(tmp_path / "nope.gguf"), 1, 2, 3, 4)
    assert len(kept) == 4 and all(_is_noop(u) for u in kept)
    assert all(_is_noop(u) for u in settings.recommended_budgets(studio, "refused", 1, 2, 3, 4))


def test_a_missing_path_is_a_local_name_that_names_nothing(tmp_path):
    assert settings.missing_path("./no/such/folder") == "./no/such/folder: no such file or folder here"
    (tmp_path / "there.gguf").write_bytes(b"")
    for name in (str(tmp_path / "there.gguf"), "Qwen/Qwen3-1.7B", "org/repo:m.Q4_K_M.gguf", "tiny-reasoner", "", None):
        assert settings.missing_path(name) is None, name


def _vetting_studio(refuse: bool = False):
    def vet(name):
        if refuse:
            raise ValueError("off the list")
        return name
    return types.SimpleNamespace(vet=vet, default_model="tiny-reasoner")


def test_picking_early_exit_sets_enough_drafts_and_says_so(capsys):
    expected = settings.exit_mode_probes("SSR early exit", "tiny-reasoner", 600, 20, 1, 16, 3)
    got = settings.probes_on_screen(_vetting_studio(), "SSR early exit", "", 600, 20, 1, 16, 3)  # "": the default
    assert got == (expected["num_drafts"], expected["draft_interval"]) and got[0] >= 3
    assert expected["notice"] in capsys.readouterr().out


def test_other_methods_and_refused_names_leave_the_drafts_alone(capsys):
    for studio, mode in ((_vetting_studio(), "SSR"), (_vetting_studio(refuse=True), "SSR early exit")):
        assert all(_is_noop(u) for u in settings.probes_on_screen(studio, mode, "x", 600, 20, 1, 16, 3))
    assert capsys.readouterr().out == ""


def test_the_api_orders_are_written_once():
    assert len(set(settings.RUN_SETTINGS)) == len(settings.RUN_SETTINGS)
    assert set(settings.MODEL_NAMES) <= set(settings.RUN_SETTINGS) and set(settings.RSD_ONLY) <= set(settings.RUN_SETTINGS)
    assert set(settings.BUDGETS) <= set(settings.RUN_SETTINGS)
    assert not set(run.RUN_EXTRAS) & set(settings.RUN_SETTINGS)


# ----------------------------------------------------------------------------- run: what its events show

def test_switching_the_conversation_off_drops_it():
    assert run.chat_toggled(False) == ("", "")
    assert all(u["__type__"] == "update" and len(u) == 1 for u in run.chat_toggled(True))  # gr.skip(): kept


def test_a_finished_run_redraws_its_timeline_on_the_axis_picked():
    view = TraceView()
    assert run.timeline_after_run(view, "forward") == where_time_goes(view, "forward")
    for kept in (run.timeline_after_run(view, "time"), run.timeline_after_run(None, "forward")):
        assert kept["__type__"] == "update" and len(kept) == 1  # drawn live by time already, or no run


def test_the_draft_picker_shows_only_for_several_drafts():
    many = run.draft_picker(Frame("", "", "", "", view=_view_with_drafts(2, 0, 1)))
    assert many["visible"] and many["value"] == 2 and many["choices"] == [("draft 0", 0), ("draft 1", 1), ("draft 2", 2)]
    one = run.draft_picker(Frame("", "", "", "", view=_view_with_drafts(0)))
    assert not one["visible"] and one["value"] == 0
    none = run.draft_picker(Frame("", "", "", ""))
    assert not none["visible"] and none["value"] is None and none["choices"] == []
    assert run.draft_shown(None, 1) == ""


def test_a_runs_frame_fills_its_outputs_in_order():
    plain = Frame("r", "d", "a", "m", view=TraceView(), timeline="tl")
    out = run.run_outputs(plain)
    assert out[:4] == ("r", "d", "a", "m") and out[4] == {"__type__": "update", "value": None, "visible": False}
    assert out[5] is plain.view and out[7] is None and out[8]["visible"] is False and out[9] == "tl"
    assert len(run.run_outputs(Frame("r", "d", "a", "m"))[9]) == 1  # no timeline in the frame: left as drawn


def test_a_comparison_offers_its_runs_and_shows_the_one_picked():
    runs = {"Baseline": Frame("rb", "db", "ab", "mb", view=TraceView()),
            "SSR": Frame("rs", "ds", "as", "ms", view=_view_with_drafts(0, 1))}
    out = run.run_outputs(Frame("r", "d", "a", "m", chart="fig", view=TraceView(), runs=runs))
    assert out[4] == {"__type__": "update", "value": "fig", "visible": True} and out[7] is runs
    assert out[8]["choices"] == ["Baseline", "SSR"] and out[8]["visible"] and out[8]["value"] in runs
    shown = run.show_run(runs, "SSR", "forward")
    assert shown[:4] == ("rs", "ds", "as", "ms") and shown[4] is runs["SSR"].view
    assert shown[5]["visible"] and shown[6] == where_time_goes(runs["SSR"].view, "forward")


def test_a_sweep_clears_the_panes_and_says_where_its_runs_are():
    reasoning, draft, answer, note, chart, timeline, view = run.panes_for_sweep()
    empty = TraceView()
    assert (reasoning, draft, answer) == (empty.reasoning_html(), empty.draft_html(), empty.answer_html())
    assert "sweep section" in note and chart["visible"] is False and "History" in timeline and view is None


def test_the_examples_name_a_method_and_suit_a_model_or_any():
    groups = run.examples()
    assert all(shows in ("SSR", "RSD") and prompts for shows, _, prompts in groups.values())
    assert any(suits is None for _, suits, _ in groups.values())


# ----------------------------------------------------------------------------- endpoints

def test_busy_and_idle_turn_the_same_buttons_opposite_ways():
    busy, idle = endpoints.busy(), endpoints.idle()
    assert len(busy) == len(idle) == 5
    assert [u["interactive"] for u in busy] == [True, False, False, True, False]  # Stop on, starts off
    assert all(b["interactive"] != i["interactive"] for b, i in zip(busy, idle, strict=True))


def test_the_api_signature_lists_the_settings_and_hands_them_on_by_name():
    cfg = RunConfig()
    got = []

    def fn(request, prompt: str, method: str = "SSR", **settings):
        got.append((request, prompt, method, settings))
        yield "frame"

    call = endpoints.api_signature(cfg, {"max_think": None, "draft_model": None, "seed": None}, {"draft_model": ""})(fn)
    params = inspect.signature(call).parameters
    assert list(params) == ["request", "prompt", "method", "max_think", "draft_model", "seed"]
    assert params["max_think"].default == cfg.max_think and params["draft_model"].default == ""
    assert list(call("req", "hi", "RSD", 700)) == ["frame"]  # Gradio calls positionally; the rest defaulted
    assert got[-1] == ("req", "hi", "RSD", {"max_think": 700, "draft_model": "", "seed": cfg.seed})
    list(call("req", "hi", seed="9"))  # a client may name them
    assert got[-1][3] == {"max_think": cfg.max_think, "draft_model": "", "seed": "9"}


def test_the_model_jobs_concurrency_follows_public_mode():
    def studio(on):
        return types.SimpleNamespace(public=types.SimpleNamespace(on=on, max_jobs=3))
    assert endpoints.model_jobs(studio(False)) == {"concurrency_limit": endpoints.RUN_CONCURRENCY}
    assert endpoints.model_jobs(studio(True)) == {"concurrency_limit": 3, "concurrency_id": "model"}


def test_a_visitor_is_known_by_the_client_address():
    from ssr_ui.jobs import visitor_address

    request = types.SimpleNamespace(client=types.SimpleNamespace(host="127.0.0.1"),
                                    headers={"x-forwarded-for": "81.2.69.160"})
    assert endpoints.visitor_of(request) == visitor_address("127.0.0.1", "81.2.69.160")
    assert endpoints.visitor_of(types.SimpleNamespace()) == visitor_address(None, None)  # nothing known: no crash


# ----------------------------------------------------------------------------- benchmark

def test_a_benchmark_frame_leaves_what_it_did_not_change():
    frame = types.SimpleNamespace(as_tuple=lambda: ("status", "summary", "runs"), unchanged=(False, True, False))
    status, summary, runs = benchmark.bench_outputs(frame)
    assert status == "status" and _is_noop(summary) and runs == "runs"


def test_the_benchmark_tab_states_a_shared_studios_bounds():
    def studio(on):
        return types.SimpleNamespace(public=types.SimpleNamespace(on=on, max_benchmark_runs=40))
    assert "at most 40 runs" in benchmark.intro(studio(True)) and "at most" not in benchmark.intro(studio(False))


# ----------------------------------------------------------------------------- history

@pytest.mark.parametrize("column, value, shown", [
    ("flag", "slow: 3.1x the median of its kind", "slow: 3.1x"), ("flag", None, ""),
    ("correct", 1, "✓"), ("correct", 0, "✗"), ("correct", None, ""),  # tempting: 0 shown as "" (falsy)
    ("created_at", "2026-11-30T18:32:36.123+00:00", "2026-11-30 18:32:36"),
    ("wall_s", 1.23456, 1.235), ("accepted", 7, 7), ("prompt", "hi", "hi"),
])
def test_history_cells(column, value, shown):
    assert history.history_cell(column, value) == shown


def test_the_slow_note_counts_and_says_where_they_went():
    assert history.slow_note(0, True) == "no run flagged slow"
    assert history.slow_note(1, True) == "1 run flagged slow left out of the table and the charts"
    assert history.slow_note(2, False) == "2 runs flagged slow shown (marked in the flag column)"


class _LoggedStudio:
    """History over a real run log, each run's slow flag as given (``flags``, by run id)."""

    def __init__(self, log: RunLog, flags: dict[int, str] | None = None):
        self.log, self.flags = log, flags or {}

    def history(self, method, dataset="all", visitor=None, model="all"):
        equals = {k: v for k, v in (("dataset", dataset), ("model", model)) if v != "all"}
        return [{**r, "flag": self.flags.get(r["id"], "")} for r in self.log.runs(**equals)]


def _log(tmp_path) -> RunLog:
    log = RunLog(tmp_path / "runs.db")
    for model, dataset in (("tiny", "arith"), ("tiny", None), ("other", "gsm8k")):
        log.save(RunMeta("baseline", model, "What is 2 + 3?", dataset=dataset), [], "cancelled")
    return log


def test_history_shows_the_log_and_leaves_out_slow_runs(tmp_path):
    log = _log(tmp_path)
    studio = _LoggedStudio(log, flags={1: "slow: 3.0x the median"})
    out = history.history_view(studio, None, "all")
    assert len(out) == len(history.CHARTS) + 4
    table, *_, datasets, models, note = out
    assert [row[0] for row in table] == [3, 2]  # run 1 is flagged: left out
    assert datasets == {"__type__": "update", "choices": ["all", "gsm8k", "arith"], "value": "all"}
    assert models["choices"] == ["all", "other", "tiny"] and "1 run flagged slow left out" in note
    shown = history.history_view(studio, None, "all", "arith", False, "tiny")
    assert [row[0] for row in shown[0]] == [1] and shown[0][0][-2] == "slow: 3.0x"  # flag column, marked
    assert shown[-3]["value"] == "arith" and shown[-2]["value"] == "tiny" and "shown (marked" in shown[-1]


def test_a_filter_on_a_name_no_longer_used_falls_back_to_all(tmp_path):
    out = history.history_view(_LoggedStudio(_log(tmp_path)), None, "all", "gone", True, "gone-too")
    assert out[0] == [] and out[-3]["value"] == "all" and out[-2]["value"] == "all"


def test_an_unreadable_log_keeps_what_history_shows():
    def broken(*a, **k):
        raise RunLogError("runs.db: disk I/O error")

    with pytest.warns(UserWarning, match="History not refreshed: runs.db: disk I/O error"):
        out = history.history_view(types.SimpleNamespace(history=broken), None, "all")
    assert len(out) == len(history.CHARTS) + 4 and all(_is_noop(u) for u in out)


def test_a_past_run_shows_again_or_says_why_not():
    def refused():
        raise ValueError("no run 99 here")

    prompt, strip, *panes, timeline, view = history.past_run(refused)
    assert prompt == "" and "no run 99 here" in strip and panes == ["", "", ""] and view is None
    assert timeline == where_time_goes(TraceView())
    frame = Frame("r", "d", "a", "m", view=TraceView(), prompt="What is 2 + 3?")
    shown = history.past_run(lambda: frame, "forward")
    assert "What is 2 + 3?" in shown[0] and shown[1:5] == ("m", "r", "d", "a")
    assert shown[5] == where_time_goes(frame.view, "forward") and shown[6] is frame.view
    assert history.no_past_run()[:5] == ("", "", "", "", "") and history.no_past_run()[6] is None


def test_an_export_gives_the_file_or_the_reason():
    def export(rid, kind, method, dataset, visitor, model):
        if rid is None:
            raise ValueError("give a run id")
        return f"/tmp/run{rid}.{kind}"

    studio = types.SimpleNamespace(export=export)
    assert history.export_run(studio, "json", None, 4, "all", "all", "all") == ("/tmp/run4.json", "")
    path, why = history.export_run(studio, "html", None, None, "all", "all", "all")
    assert path is None and "give a run id" in why


# ----------------------------------------------------------------------------- the page put together

def test_the_page_keeps_its_api(studio):
    """The endpoints' names and parameter order, as built from the tabs (clients call them by position)."""
    from ssr_ui.layout import build_app

    api = build_app(studio).get_api_info()["named_endpoints"]
    assert set(api) == {"/run", "/sweep", "/benchmark", "/history", "/replay"}

    def names(endpoint):
        return [p["parameter_name"] for p in api[endpoint]["parameters"]]
    assert names("/run") == ["prompt", "method", "model", *settings.RUN_SETTINGS, *run.RUN_EXTRAS]
    swept = [n for n in settings.RUN_SETTINGS if n not in (*settings.RSD_ONLY, *settings.MODEL_NAMES, "draft_start")]
    assert names("/sweep") == ["prompt", "model", "start", "stop", "step", *swept]
    assert names("/benchmark") == ["dataset", "upload", "methods", "limit", "repeat", "sample_seed", "task",
                                   "question_field", "answer_field", "model", *settings.RUN_SETTINGS]
    assert names("/history") == ["method_name", "dataset_name", "leave_out_slow", "model_name"]
    assert names("/replay") == ["rid", "x"]


def test_picking_a_method_shows_its_summary_and_draft_start_where_it_forks():
    from engine.registry import method_of
    from ssr_ui.handlers import METHOD_NAMES, MODES
    from ssr_ui.tabs.run import method_shown

    for label in MODES:
        about, box, slider = method_shown(label)
        forks = label == "Compare" or method_of(METHOD_NAMES[label]).ssr_loop
        assert box["visible"] is slider["visible"] is forks, label
        assert about.startswith('<p class="method-about">') and len(about) > 40, label
    assert method_of("sd").summary.split(":")[0] in method_shown("Speculative decoding")[0]
    assert not method_shown("Speculative decoding")[1]["visible"] and method_shown("SSR")[1]["visible"]
