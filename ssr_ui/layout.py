"""The studio's Gradio layout and wiring. No model loads here: models load on the first run.

Pure builders live in ``render`` and ``charts``, handlers in ``handlers``; this module only lays
out components and connects them. The streaming run has ``api_name="run"`` with parameters
``prompt`` and ``method`` ("Baseline", "SSR", "Compare") first and the rest defaulted, so it can
be driven by ``gradio_client``.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import gradio as gr

from engine.config import RunConfig
from engine.methods import METHODS
from engine.synthetic import EVAL_SEED_BASE, make_example
from ssr_ui import charts
from engine.acceptance import WEIGHTINGS
from engine.presets import BUNDLED, PRESETS
from ssr_ui.handlers import COMPARE_SHOWS, MODES, Studio
from ssr_ui.jobs import current_event_id
from ssr_ui.render import LEGEND, TraceView, error_html

CSS = (Path(__file__).resolve().parents[1] / "assets" / "studio.css").read_text()

try:  # on a ZeroGPU Space, each run borrows a GPU; elsewhere nothing changes
    import spaces

    on_gpu = spaces.GPU(duration=120)
except ImportError:
    def on_gpu(fn):
        return fn
HISTORY_COLUMNS = ["id", "created_at", "method", "model", "status", "wall_s", "ttft_s", "reasoning_tokens",
                   "answer_tokens", "accepted", "recovered", "generated", "rejected", "tokens_per_s", "prompt"]


def examples() -> list[list[str]]:
    bundled = [make_example("classes", EVAL_SEED_BASE + i).prompt for i in range(3)]
    bundled += [make_example("arithmetic", EVAL_SEED_BASE + i).prompt for i in range(2)]
    real = ["Write a Python class Stack with push, pop, peek and is_empty methods, with docstrings.",
            "Convert this list into a markdown table with columns name and age: Ann 31, Bo 45, Cy 27."]
    return [[p] for p in bundled + real]


def build_app(studio: Studio) -> gr.Blocks:
    cfg = studio.config(studio.default_model)
    empty = TraceView()
    with gr.Blocks(title="SSR Studio") as demo:
        gr.Markdown("## SSR Studio: self-speculation for reasoning models, shown token by token")
        with gr.Tab("Run"):
            with gr.Row():
                with gr.Column(scale=3):
                    prompt = gr.Textbox(label="Prompt", lines=4, placeholder="Ask the reasoning model something")
                with gr.Column(scale=2):
                    method = gr.Radio(list(MODES), value="SSR", label="Method", elem_id="method")
                    model = gr.Dropdown([studio.default_model, *[m for m in (*BUNDLED[:1], *PRESETS)
                                                                  if m != studio.default_model]],
                                        value=studio.default_model, label="Model", allow_custom_value=True,
                                        info="bundled, a preset, or type any local folder or Hub id")
                    with gr.Row():
                        run_btn = gr.Button("Run", variant="primary")
                        stop_btn = gr.Button("Stop", variant="stop")
            gr.Examples(examples(), inputs=[prompt], label="Examples")
            draft_start = gr.Slider(0, 2000, value=cfg.draft_start, step=1, label="Draft start (reasoning tokens)")
            with gr.Accordion("Draft-start sweep", open=False):
                with gr.Row():
                    sweep_from = gr.Number(value=0, precision=0, label="From")
                    sweep_to = gr.Number(value=min(cfg.max_think - 1, 4 * cfg.draft_start or 200), precision=0, label="To")
                    sweep_step = gr.Number(value=max(1, cfg.draft_start // 2 or 20), precision=0, label="Step")
                    sweep_btn = gr.Button("Sweep draft start")
                sweep_status = gr.HTML()
                sweep_plot = gr.Plot(label="Sweep")
            with gr.Accordion("SSR settings", open=False):
                with gr.Row():
                    max_think = gr.Number(value=cfg.max_think, precision=0, label="Max think")
                    max_draft = gr.Number(value=cfg.max_draft, precision=0, label="Max draft")
                    max_answer = gr.Number(value=cfg.max_answer, precision=0, label="Max answer")
                with gr.Row():
                    num_drafts = gr.Number(value=cfg.num_drafts, precision=0, label="Number of drafts")
                    draft_interval = gr.Number(value=cfg.draft_interval, precision=0, label="Draft interval")
                    suffix = gr.Checkbox(value=cfg.suffix_recovery, label="Suffix recovery")
                    lookup = gr.Checkbox(value=cfg.context_lookup, label="Context lookup")
                    think_spec = gr.Number(value=cfg.think_spec, precision=0, label="Reasoning lookup",
                                           info="lookup tokens each row may verify per reasoning step (0: one token per step, as in the paper)")
                with gr.Row():
                    temperature = gr.Slider(0, 2, value=cfg.temperature, step=0.05, label="Temperature (0 = greedy)")
                    seed = gr.Number(value=cfg.seed, precision=0, label="Seed")
            with gr.Accordion("RSD settings", open=False):
                with gr.Row():
                    draft_model = gr.Textbox(value=studio.default_draft, label="Draft model")
                    prm = gr.Textbox(value=studio.default_prm, label="Process reward model",
                                     info="math-shepherd format, or 'target-likelihood' (no PRM)")
                with gr.Row():
                    threshold = gr.Slider(0, 1.05, value=cfg.threshold, step=0.05, label="Threshold (binary rule)")
                    weighting = gr.Dropdown(list(WEIGHTINGS), value=cfg.weighting, label="Weighting")
                    weight_param = gr.Number(value=cfg.weight_param, label="Weight parameter (constant p, logistic a)")
            gr.HTML(LEGEND)
            metrics = gr.HTML('<div class="metrics">ready</div>')
            with gr.Row(equal_height=False):
                with gr.Column():
                    gr.Markdown("**Reasoning**")
                    reasoning_pane = gr.HTML(empty.reasoning_html())
                with gr.Column():
                    gr.Markdown("**Draft**")
                    draft_pick = gr.Dropdown([], label="Show draft", visible=False,
                                             info="iterative SSR writes several drafts")
                    draft_pane = gr.HTML(empty.draft_html())
                with gr.Column():
                    gr.Markdown("**Final answer**")
                    answer_pane = gr.HTML(empty.answer_html())
            with gr.Row():
                run_pick = gr.Radio([], label="Show run", visible=False, elem_classes="run-pick",
                                    info="a comparison ran all three: switch the panes between them")
            chart = gr.Plot(label="Compare", visible=False)
            last_runs = gr.State(None)  # the latest comparison's final frames, for the run picker
            last_view = gr.State(None)  # this browser session's latest run, for the draft picker

        with gr.Tab("History"):
            with gr.Row():
                method_filter = gr.Dropdown(["all", *METHODS], value="all", label="Method")
                refresh = gr.Button("Refresh")
            table = gr.Dataframe(headers=HISTORY_COLUMNS, interactive=False, wrap=True)
            with gr.Row():
                run_id = gr.Number(label="Run id", precision=0)
                show = gr.Button("Show this run")
                export_json = gr.Button("Export JSON")
                export_html = gr.Button("Export HTML")
                export_csv = gr.Button("Export runs CSV")
            with gr.Row():
                exported = gr.File(label="Exported file", interactive=False)
                imported = gr.File(label="Import a JSON trace", file_types=[".json"], type="filepath")
            with gr.Row():
                h_reasoning, h_draft, h_answer = gr.HTML(), gr.HTML(), gr.HTML()
            h_metrics = gr.HTML()
            with gr.Row():
                c_latency, c_tokens = gr.Plot(), gr.Plot()
            with gr.Row():
                c_speedup, c_rsd = gr.Plot(), gr.Plot()

        # ------------------------------------------------------------------ wiring
        @on_gpu
        def run(request: gr.Request, prompt: str, method: str = "SSR", model: str = "", draft_start: int = cfg.draft_start,
                max_think: int = cfg.max_think, max_draft: int = cfg.max_draft, max_answer: int = cfg.max_answer,
                num_drafts: int = cfg.num_drafts, draft_interval: int = cfg.draft_interval,
                suffix_recovery: bool = cfg.suffix_recovery, context_lookup: bool = cfg.context_lookup,
                temperature: float = cfg.temperature, seed: int = cfg.seed, draft_model: str = "",
                prm: str = "", threshold: float = cfg.threshold, weighting: str = cfg.weighting,
                weight_param: float = cfg.weight_param, think_spec: int = cfg.think_spec):
            settings = dict(draft_start=draft_start, max_think=max_think, max_draft=max_draft, max_answer=max_answer,
                            num_drafts=num_drafts, draft_interval=draft_interval, suffix_recovery=suffix_recovery,
                            context_lookup=context_lookup, temperature=temperature, seed=seed, threshold=threshold,
                            weighting=weighting, weight_param=weight_param, think_spec=think_spec)
            settings = {k: _coerce(k, v) for k, v in settings.items() if v is not None}
            with studio.jobs.running(current_event_id(), request.session_hash) as job:
                if job is None:  # Gradio restarting a job that already ran: never run it twice
                    return
                yield from _run_updates(studio.run(prompt, method, model, draft_model, prm, job=job, **settings))

        def _run_updates(frames):
            for frame in frames:
                *panes, fig = frame.as_tuple()
                shown = COMPARE_SHOWS if frame.runs and COMPARE_SHOWS in frame.runs else list(frame.runs or [""])[-1]
                runs = gr.update(choices=list(frame.runs), value=shown, visible=True) if frame.runs \
                    else gr.update(visible=False)
                yield (*panes, gr.update(value=fig, visible=fig is not None), frame.view, _draft_picker(frame),
                       frame.runs, runs)

        run_event = run_btn.click(
            run, [prompt, method, model, draft_start, max_think, max_draft, max_answer, num_drafts, draft_interval,
                  suffix, lookup, temperature, seed, draft_model, prm, threshold, weighting, weight_param, think_spec],
            [reasoning_pane, draft_pane, answer_pane, metrics, chart, last_view, draft_pick, last_runs, run_pick],
            api_name="run", concurrency_limit=1)

        def show_run(runs, which):
            frame = runs[which]
            return (*frame.as_tuple()[:4], frame.view, _draft_picker(frame))

        run_pick.input(show_run, [last_runs, run_pick],
                       [reasoning_pane, draft_pane, answer_pane, metrics, last_view, draft_pick])
        draft_pick.input(lambda view, which: view.draft_html(which) if view else "", [last_view, draft_pick],
                         [draft_pane])
        def stop(request: gr.Request):
            studio.jobs.cancel_session(request.session_hash)

        stop_btn.click(stop, None, None, queue=False, api_visibility="private")

        @on_gpu
        def sweep(request: gr.Request, prompt, model, start, stop, step, max_think, max_draft, max_answer, temperature,
                  seed):
            settings = {k: _coerce(k, v) for k, v in dict(max_think=max_think, max_draft=max_draft,
                        max_answer=max_answer, temperature=temperature, seed=seed).items() if v is not None}
            with studio.jobs.running(current_event_id(), request.session_hash) as job:
                if job is not None:
                    yield from studio.sweep(prompt, model, int(start or 0), int(stop or 0), int(step or 1), job=job,
                                            **settings)

        sweep_event = sweep_btn.click(sweep, [prompt, model, sweep_from, sweep_to, sweep_step, max_think, max_draft,
                                              max_answer, temperature, seed], [sweep_status, sweep_plot],
                                      api_name="sweep", concurrency_limit=1)

        def load_history(method_name):
            rows = studio.history(method_name)
            table_rows = [[round(v, 3) if isinstance(v, float) else v for v in (r.get(c) for c in HISTORY_COLUMNS)]
                          for r in rows]
            return (table_rows, charts.latency_by_method(rows), charts.token_composition(rows),
                    charts.speedup_vs_draft_start(rows), charts.rsd_by_threshold(rows))

        history_outputs = [table, c_latency, c_tokens, c_speedup, c_rsd]
        refresh.click(load_history, [method_filter], history_outputs, api_name="history")
        method_filter.change(load_history, [method_filter], history_outputs)

        def show_run(rid):
            if rid is None:
                return "", "", "", error_html("enter a run id from the table")
            try:
                return studio.replay(int(rid)).as_tuple()[:4]
            except ValueError as err:
                return "", "", "", error_html(str(err))

        show.click(show_run, [run_id], [h_reasoning, h_draft, h_answer, h_metrics], api_name="replay")

        def do_export(rid, kind):
            try:
                return studio.export(rid, kind), ""
            except ValueError as err:
                return None, error_html(str(err))

        for button, kind in ((export_json, "json"), (export_html, "html"), (export_csv, "csv")):
            button.click(partial(do_export, kind=kind), [run_id], [exported, h_metrics])

        def do_import(path):
            if not path:
                return "", "", "", ""
            try:
                return studio.import_trace(path).as_tuple()[:4]
            except ValueError as err:
                return "", "", "", error_html(str(err))

        imported.change(do_import, [imported], [h_reasoning, h_draft, h_answer, h_metrics])
    return demo


def _draft_picker(frame):
    """The draft picker for a frame: shown when iterative SSR wrote several drafts."""
    drafts = sorted(frame.view.drafts) if frame.view and not frame.view.steps else []
    return gr.update(choices=[(f"draft {d}", d) for d in drafts], value=drafts[-1] if drafts else None,
                     visible=len(drafts) > 1)


def _coerce(name: str, value):
    kind = type(getattr(RunConfig(), name))
    if kind is str:
        return str(value)
    if kind is bool:
        return bool(value)
    if kind is int:
        return int(value)
    return float(value)
