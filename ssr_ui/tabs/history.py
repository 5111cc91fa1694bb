"""The History tab: the run log's runs (filtered by method, dataset and model, the runs flagged
slow left out or marked), its charts, one past run shown again with its timeline
(``api_name="replay"``), exports and an imported trace. The table's refresh has
``api_name="history"``."""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.registry import METHODS
from engine.runlog import RunLogError
from engine.runlog.compare import SLOW_FACTOR
from ssr_ui import charts
from ssr_ui.frame import where_time_goes
from ssr_ui.handlers import Studio
from ssr_ui.render import TraceView, error_html, esc, prompt_html
from ssr_ui.tabs.common import PRIVATE, timeline_box, wire_timeline_axis

HISTORY_COLUMNS = {"id": "id", "created_at": "when (UTC)", "method": "method", "model": "model", "status": "status",
                   "wall_s": "latency s", "ttft_s": "first answer s", "reasoning_tokens": "reasoning",
                   "answer_tokens": "answer", "accepted": "accepted", "recovered": "recovered",
                   "generated": "generated", "rejected": "rejected", "tokens_per_s": "tokens/s", "dataset": "dataset", "correct": "correct",
                   "flag": "flag", "prompt": "prompt"}
CHARTS = (charts.latency_by_method, charts.token_composition, charts.speedup_vs_draft_start, charts.rsd_by_threshold,
          charts.accuracy_by_method, charts.acceptance_by_method, charts.exit_by_k)  # in the charts' order on the tab
EXPORTS = (("Export JSON", "json"), ("Export HTML", "html"), ("Export runs CSV", "csv"))  # (button, kind)


@dataclass
class HistoryTab:
    """The History tab's components: the filters (the refresh's inputs, in the API's order), what a
    refresh writes, and the past run shown."""

    tab: gr.Tab
    inputs: list[gr.Component]  # method, dataset, leave out slow, model
    outputs: list[gr.Component]  # the table, the charts, the dataset and model filters, the note
    refresh: gr.Button
    run_id: gr.Textbox
    show: gr.Button
    exports: list[tuple[gr.Button, str]]  # (button, kind)
    exported: gr.File
    imported: gr.File
    past: list[gr.Component]  # the past run's prompt, strip, reasoning, draft, answer, timeline, view
    tl_x: gr.Radio


# ----------------------------------------------------------------------------- builders

def build() -> HistoryTab:
    """The History tab, in the page's order (inside the caller's Blocks)."""
    with gr.Tab("History") as tab:
        with gr.Row():
            method_filter = gr.Dropdown(["all", *METHODS], value="all", label="Method")
            dataset_filter = gr.Dropdown(["all"], value="all", label="Dataset", allow_custom_value=True,
                                         info="runs of one benchmark's dataset")
            model_filter = gr.Dropdown(["all"], value="all", label="Model", allow_custom_value=True,
                                       elem_id="history-model", info="runs of one model (all: charts split by model)")
            hide_slow = gr.Checkbox(value=True, label="Leave out runs flagged slow", elem_id="hide-slow",
                                    info=f"a run over {SLOW_FACTOR:g}x its kind's median time per forward "
                                         "(busy machine, cold start): out of the table, the charts and the "
                                         "pooled baselines")
            refresh = gr.Button("Refresh")
        note = gr.HTML("", elem_id="history-note")
        table = gr.Dataframe(headers=list(HISTORY_COLUMNS.values()), interactive=False, wrap=False,
                             elem_classes="history-table", label="runs")
        with gr.Row():
            run_id = gr.Textbox(label="Run id", placeholder="a run id from the table", max_lines=1)
            show = gr.Button("Show this run")
            exports = [(gr.Button(label), kind) for label, kind in EXPORTS]
        with gr.Row():
            exported = gr.File(label="Exported file", interactive=False)
            imported = gr.File(label="Import a JSON trace", file_types=[".json"], type="filepath")
        past, tl_x = _past_run()
        plots = _charts()
    return HistoryTab(tab, [method_filter, dataset_filter, hide_slow, model_filter],
                      [table, *plots, dataset_filter, model_filter, note], refresh, run_id, show, exports, exported,
                      imported, past, tl_x)


def _past_run() -> tuple[list[gr.Component], gr.Radio]:
    """The past run shown: its prompt, strip, panes, timeline (and its x axis) and view."""
    shown = [gr.HTML(label="prompt"), gr.HTML(label="metrics")]
    with gr.Row(equal_height=False):
        for title, label in (("Reasoning", "reasoning"), ("Draft", "draft"), ("Final answer", "answer")):
            with gr.Column():
                gr.Markdown(f"**{title}**")
                shown.append(gr.HTML(label=label))
    timeline, tl_x = timeline_box(TraceView(), "history-timeline")
    view = gr.State(None)  # the past run shown, for the timeline's x axis
    return [*shown, timeline, view], tl_x


def _charts() -> list[gr.Plot]:
    """The run log's charts, two to a row (each keeps a readable width: on a narrow screen they stack)."""
    pairs = (("latency by method", "answer tokens"), ("SSR vs draft start", "RSD vs threshold"),
             ("accuracy by method", "acceptance by method"))
    plots = []
    for pair in pairs:
        with gr.Row(equal_height=False):
            for label in pair:
                with gr.Column(min_width=480):
                    plots.append(gr.Plot(label=label, show_label=False))
    return [*plots, gr.Plot(label="early exit by k", show_label=False)]


# ----------------------------------------------------------------------------- what the events show

def history_cell(column: str, value):
    """A run log value as the table shows it in ``column``."""
    if column == "flag":
        return str(value or "").split(" the median")[0]  # "slow: 3.1x" (the whole reason: compare.slow_runs)
    if column == "correct":
        return {1: "✓", 0: "✗"}.get(value, "")
    if column == "created_at" and isinstance(value, str):
        return value[:19].replace("T", " ")  # 2026-11-30 18:32:36
    return round(value, 3) if isinstance(value, float) else value


def slow_note(flagged: int, leave_out_slow: bool) -> str:
    """What the table says of the runs flagged slow: how many, and whether they are left out."""
    if not flagged:
        return "no run flagged slow"
    return (f"{flagged} run{'s' if flagged != 1 else ''} flagged slow "
            f"{'left out of the table and the charts' if leave_out_slow else 'shown (marked in the flag column)'}")


def history_view(studio: Studio, visitor: str | None, method_name: str, dataset_name: str = "all",
                 leave_out_slow: bool = True, model_name: str = "all") -> tuple:
    """A refresh's outputs (``HistoryTab.outputs``) for ``visitor``'s runs (None: everyone's) of
    ``method_name``, ``dataset_name`` and ``model_name`` ("all": any): the table, the charts, the
    dataset and model filters (their choices the names used; a name no longer used falls back to
    "all") and the note on slow runs. A log that cannot be read keeps what is shown (a warning says why)."""
    try:
        rows = studio.history(method_name, dataset=dataset_name, visitor=visitor, model=model_name)
        names, models = studio.log.used("dataset", visitor), studio.log.used("model", visitor)
    except RunLogError as err:
        gr.Warning(f"History not refreshed: {err}")
        return tuple(gr.update() for _ in range(len(CHARTS) + 4))
    flagged = sum(bool(r["flag"]) for r in rows)
    if leave_out_slow:
        rows = [r for r in rows if not r["flag"]]
    table_rows = [[history_cell(c, r.get(c)) for c in HISTORY_COLUMNS] for r in rows]
    picked = dataset_name if dataset_name in names else "all"
    model_picked = model_name if model_name in models else "all"
    return (table_rows, *(chart(rows) for chart in CHARTS),
            gr.update(choices=["all", *names], value=picked), gr.update(choices=["all", *models], value=model_picked),
            f'<div class="metrics status">{esc(slow_note(flagged, leave_out_slow))}</div>')


def past_run(get, x: str = "time") -> tuple:
    """The past run ``get()`` returns (a stored or imported frame) as ``HistoryTab.past``: its
    prompt, strip, panes, timeline on x axis ``x`` and view; its ValueError's message in the strip."""
    try:
        frame = get()
    except ValueError as err:
        return "", error_html(str(err)), "", "", "", where_time_goes(TraceView()), None
    return (prompt_html(frame.prompt), frame.metrics, frame.reasoning, frame.draft, frame.answer,
            where_time_goes(frame.view, x), frame.view)


def no_past_run() -> tuple:
    """``HistoryTab.past`` cleared (an imported file removed)."""
    return "", "", "", "", "", where_time_goes(TraceView()), None


def export_run(studio: Studio, kind: str, visitor: str | None, rid, method_name, dataset_name, model_name) -> tuple:
    """An export (``kind``: json, html or csv) as (the file, ""), or (None, the reason in the strip)."""
    try:
        return studio.export(rid, kind, method_name, dataset_name, visitor, model_name), ""
    except ValueError as err:
        return None, error_html(str(err))


# ----------------------------------------------------------------------------- wiring

def wire(studio: Studio, demo: gr.Blocks, tab: HistoryTab):
    """The refresh (``api_name="history"``) on Refresh, a filter changed, the tab picked, the page
    loaded; returns its handler, for the jobs that log runs to refresh History when they end."""
    def load_history(request: gr.Request, method_name, dataset_name="all", leave_out_slow=True, model_name="all"):
        # a shared studio: this visitor's runs alone
        return history_view(studio, studio.visitor(request.session_hash), method_name, dataset_name, leave_out_slow,
                            model_name)

    method_filter, dataset_filter, hide_slow, model_filter = tab.inputs
    tab.refresh.click(load_history, tab.inputs, tab.outputs, api_name="history")
    method_filter.change(load_history, tab.inputs, tab.outputs, **PRIVATE)
    for changed in (hide_slow.input, dataset_filter.input, model_filter.input, tab.tab.select, demo.load):
        changed(load_history, tab.inputs, tab.outputs, **PRIVATE)
    return load_history


def wire_past_runs(studio: Studio, tab: HistoryTab) -> None:
    """Show this run (``api_name="replay"``), the exports, an imported trace, the timeline's x axis."""
    def replay(request: gr.Request, rid, x="time"):
        return past_run(lambda: studio.replay(rid, studio.visitor(request.session_hash)), x)

    def exporter(kind):
        def do_export(request: gr.Request, rid, method_name, dataset_name, model_name):
            return export_run(studio, kind, studio.visitor(request.session_hash), rid, method_name, dataset_name,
                              model_name)
        return do_export

    def do_import(request: gr.Request, path, x):
        if not path:
            return no_past_run()
        return past_run(lambda: studio.import_trace(path, studio.visitor(request.session_hash)), x)

    method_filter, dataset_filter, _, model_filter = tab.inputs
    tab.show.click(replay, [tab.run_id, tab.tl_x], tab.past, api_name="replay")
    for button, kind in tab.exports:
        button.click(exporter(kind), [tab.run_id, method_filter, dataset_filter, model_filter],
                     [tab.exported, tab.past[1]], **PRIVATE)
    tab.imported.change(do_import, [tab.imported, tab.tl_x], tab.past, **PRIVATE)
    wire_timeline_axis(tab.past[5], tab.tl_x, tab.past[6])
