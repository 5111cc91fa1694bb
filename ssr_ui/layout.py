"""The studio's Gradio page: its tabs (``ssr_ui.tabs``, one module each: components, the logic
their events run, their wiring) put together, and the wiring that crosses tabs. No model loads
here: models load on the first run.

Pure builders live in ``render`` and ``charts``, handlers in ``handlers``; imports go one way:
layout -> tabs -> handlers -> render. The streaming run has ``api_name="run"`` with parameters
``prompt`` and ``method`` ("Baseline", "SSR", "SSR early exit", "RSD", "Compare") first and the rest
defaulted, so it can be driven by ``gradio_client``; its outputs are named ``reasoning``, ``draft``,
``answer``, ``metrics``. Every numeric input reaches the handler as sent and is validated there
(``RunConfig.coerce``), so an API client sending "abc", NaN or 10**30 gets a message naming the
field, not Gradio's generic error.
"""

from __future__ import annotations

import gradio as gr

from ssr_ui.handlers import Studio
from ssr_ui.jobs import Bounds
from ssr_ui.render import TraceView
from ssr_ui.tabs import benchmark, history, run, settings
from ssr_ui.tabs.common import PRIVATE
from ssr_ui.tabs.endpoints import RUN_CONCURRENCY, idle
from ssr_ui.tabs.history import HISTORY_COLUMNS
from ssr_ui.tabs.run import REAL_EXAMPLES_MODEL, examples, model_choices, recheck_runtimes, runtime_choices
from ssr_ui.tabs.settings import RUN_SETTINGS, draft_range, exit_mode_probes, missing_path

__all__ = ["HISTORY_COLUMNS", "PRIVATE", "REAL_EXAMPLES_MODEL", "RUN_CONCURRENCY", "build_app", "draft_range",
           "examples", "exit_mode_probes", "missing_path", "model_choices", "on_gpu", "recheck_runtimes",
           "runtime_choices"]

try:  # on a ZeroGPU Space, each run borrows a GPU; elsewhere nothing changes
    import spaces

    on_gpu = spaces.GPU(duration=120)
except ImportError:
    def on_gpu(fn):
        return fn


def build_app(studio: Studio) -> gr.Blocks:
    """The studio's page over ``studio``: the Run, Benchmark and History tabs, their jobs (a run, a
    sweep and a benchmark take turns for the model, each turning the start and Stop buttons of both
    tabs), History refreshed when one ends; a shared studio's bounds on those jobs."""
    cfg = studio.config(studio.default_model)
    empty = TraceView()
    with gr.Blocks(title="SSR Studio", delete_cache=studio.DELETE_CACHE) as demo:
        gr.Markdown("## SSR Studio: self-speculation for reasoning models, shown token by token")
        run_tab = run.build(studio, cfg, empty)
        bench_tab = benchmark.build(studio)
        history_tab = history.build()

        # the order endpoints.busy and endpoints.idle turn them on and off
        buttons = [run_tab.stop_btn, run_tab.run_btn, run_tab.sweep.button, bench_tab.stop_btn, bench_tab.run_btn]
        run_event = run.wire_run(studio, cfg, run_tab, buttons, on_gpu)
        run.wire_picks(studio, run_tab)
        sweep_event = run.wire_sweep(studio, cfg, run_tab, buttons, on_gpu)
        bench_event = benchmark.wire(studio, cfg, bench_tab, run_tab.model, run_tab.controls(RUN_SETTINGS), buttons,
                                     on_gpu)
        settings.wire(studio, run_tab.method, run_tab.model, run_tab.controls(RUN_SETTINGS), run_tab.slider)

        load_history = history.wire(studio, demo, history_tab)
        demo.load(recheck_runtimes, [run_tab.runtime], [run_tab.runtime], **PRIVATE)
        for event in (run_event, sweep_event, bench_event):  # a job ended: its buttons back, its runs in History
            event.then(idle, None, buttons, queue=False, **PRIVATE).then(
                load_history, history_tab.inputs, history_tab.outputs, **PRIVATE)
        history.wire_past_runs(studio, history_tab)
        if studio.public.on:  # a visitor who leaves (tab closed, client gone: Gradio's heartbeat ends) leaves the line
            def gone(request: gr.Request):
                studio.jobs.cancel_session(request.session_hash)

            demo.unload(gone)
    if studio.public.on:  # one job per visitor, max_jobs in all, refused when they join (ssr_ui.jobs.CancelRoute)
        fns = frozenset(i for i, fn in demo.fns.items() if fn.api_name in ("run", "sweep", "benchmark"))
        studio.jobs.bounds = Bounds(fns, studio.public.max_jobs, studio.line.eta)
    return demo
