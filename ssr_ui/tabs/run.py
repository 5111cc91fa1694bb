"""The Run tab: the prompt and its conversation, the method, model and runtime, the panes a run
streams into (reasoning, draft, answer, the strip, the comparison chart, the timeline), the
examples, the settings (``ssr_ui.tabs.settings``); and its jobs: a run (``api_name="run"``) and a
draft-start sweep (``api_name="sweep"``)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import gradio as gr

from engine.config import LABELS, RunConfig
from engine.llamacpp import lib as llama_lib
from engine.presets import BUNDLED, PRESETS
from engine.registry import method_of
from engine.runtime.gguf import REGISTRY as GGUF_REGISTRY
from engine.runtime.gguf import installed
from engine.tools.synthetic import EVAL_SEED_BASE, make_example
from engine.wiring import RUNTIMES
from ssr_ui.frame import where_time_goes
from ssr_ui.handlers import COMPARE_RUNS, METHOD_NAMES, MODES, Studio, compare_shows, continued
from ssr_ui.render import LEGEND, TraceView, esc
from ssr_ui.tabs.common import PICKED, PRIVATE, as_sent, timeline_box, wire_timeline_axis
from ssr_ui.tabs.endpoints import api_signature, busy, job_of, model_jobs, stopper
from ssr_ui.tabs.settings import (
    MODEL_NAMES,
    RSD_ONLY,
    RUN_SETTINGS,
    SweepBox,
    draft_start_boxes,
    rsd_settings,
    ssr_settings,
    sweep_box,
)

REAL_EXAMPLES_MODEL = "smollm2-135m-instruct"  # the small real model the short-question examples suit
# the run's last API parameters, after RUN_SETTINGS (older callers are unaffected), and the defaults of
# those that are not RunConfig fields
RUN_EXTRAS = ("history", "thinking", "reproducible", "compare_repeats")
RUN_DEFAULTS = {**MODEL_NAMES, "history": "", "compare_repeats": 1}

# Run pressed with the strip out of view (a narrow window, a scrolled page): the strip comes to the top, the panes under it
SHOW_STRIP_JS = """() => {
    const strip = document.querySelector('#strip'), r = strip && strip.getBoundingClientRect();
    if (r && (r.top < 0 || r.top > window.innerHeight - 260)) strip.scrollIntoView({block: 'start'});
}"""


def examples() -> dict[str, tuple[str, str | None, list[str]]]:
    """Example prompts grouped by the model they suit: label -> (the method the group shows, the
    model it suits or None for "whichever is picked", its prompts). Picking an example sets Method,
    and Model when the group names one. The short questions for :data:`REAL_EXAMPLES_MODEL` (a
    135M chat model, run with prompted reasoning) are listed only when its package is installed."""
    groups = {
        "SSR on the bundled model (class-writing prompts)":
            ("SSR", BUNDLED[0], [make_example("classes", EVAL_SEED_BASE + i).prompt for i in range(3)]),
        "RSD on the bundled models (arithmetic prompts)":
            ("RSD", BUNDLED[0], [make_example("arithmetic", EVAL_SEED_BASE + i).prompt for i in range(2)]),
    }
    groups["Need a real model (e.g. qwen3-1.7b): the bundled one knows only the two tasks above"] = ("SSR", None, [
        "Write a Python class Stack with push, pop, peek and is_empty methods, with docstrings.",
        "Convert this list into a markdown table with columns name and age: Ann 31, Bo 45, Cy 27."])
    if installed(REAL_EXAMPLES_MODEL):
        groups[f"Short questions for {REAL_EXAMPLES_MODEL} (a small real chat model, prompted reasoning)"] = (
            "SSR", REAL_EXAMPLES_MODEL, ["What is the capital of France?", "How many legs does a spider have?",
                                         "Write a Python function that reverses a string.",
                                         "Give me three tips for staying healthy."])
    return groups


def model_choices(default_model: str) -> list[str]:
    """The Model dropdown's list: the studio's default (the bundled model unless the app was given
    another), the bundled model, the registry's real models whose package is installed (they run
    offline), then the presets (downloaded from the Hub on first use). Any other name, a local
    folder, a Hub id, a .gguf file or HUB_ID:FILE.gguf can be typed."""
    names = [default_model, BUNDLED[0], *(name for name in GGUF_REGISTRY if installed(name)), *PRESETS]
    return list(dict.fromkeys(names))


def runtime_choices() -> list[str]:
    """The runtimes the Runtime box offers: llama.cpp only where llama-cpp-python imports."""
    return list(RUNTIMES) if llama_lib.missing() is None else [RUNTIMES[0]]


def runtime_info() -> str:
    """The Runtime box's info: what each runtime runs, or how to install llama.cpp's."""
    if llama_lib.missing() is None:
        return ("transformers: torch, any model; llama.cpp: a GGUF file (a registry model, a .gguf path) on "
                "llama.cpp's own kernels (docs/BENCHMARKS.md 'llama.cpp as a runtime')")
    return (f"llama.cpp is not installed here: {llama_lib.INSTALL}; then reload this page (checked again on "
            "every page load: no restart needed)")


def recheck_runtimes(current: str) -> dict:
    """The Runtime box, checked again (on every page load): a llama-cpp-python installed while the
    studio runs is offered without a restart (the import system's caches and ``missing``'s are
    cleared first). ``current`` stays picked while it is offered."""
    importlib.invalidate_caches()
    llama_lib.missing.cache_clear()
    choices = runtime_choices()
    return gr.update(choices=choices, value=current if current in choices else choices[0], info=runtime_info())


@dataclass
class RunTab:
    """The Run tab's components that its events (and the other tabs') read or write."""

    prompt: gr.Textbox
    chat_on: gr.Checkbox
    chat_pane: gr.HTML
    history: gr.Textbox  # the chat's earlier turns, JSON (an API parameter; hidden)
    run_btn: gr.Button
    stop_btn: gr.Button
    draft_start: gr.Number
    slider: gr.Slider  # draft start's
    method: gr.Radio
    about: gr.HTML  # the method's summary, from its record
    model: gr.Dropdown
    runtime: gr.Radio
    thinking: gr.Checkbox
    metrics: gr.HTML  # the strip
    reasoning_pane: gr.HTML
    draft_pick: gr.Dropdown
    draft_pane: gr.HTML
    answer_pane: gr.HTML
    run_pick: gr.Radio
    chart: gr.Plot
    example_sets: list[tuple[gr.Examples, str, str | None]]  # (examples, the method they show, the model they suit)
    sweep: SweepBox
    options: dict[str, gr.Component]  # the SSR and RSD settings, by the run's parameter names
    timeline: gr.HTML
    tl_x: gr.Radio
    last_runs: gr.State  # the latest comparison's final frames, for the run picker
    last_view: gr.State  # this browser session's latest run, for the draft picker

    def controls(self, names) -> dict[str, gr.Component]:
        """The controls of the run's parameters ``names``, in that order."""
        every = {**self.options, "draft_start": self.draft_start, "runtime": self.runtime, "thinking": self.thinking,
                 "history": self.history}
        return {name: every[name] for name in names}

    @property
    def panes(self) -> list[gr.Component]:
        """What a run's frame writes first: reasoning, draft, answer, the strip."""
        return [self.reasoning_pane, self.draft_pane, self.answer_pane, self.metrics]


# ----------------------------------------------------------------------------- builders

def build(studio: Studio, cfg: RunConfig, empty: TraceView) -> RunTab:
    """The Run tab, in the page's order (inside the caller's Blocks)."""
    with gr.Tab("Run"):
        with gr.Row():
            with gr.Column(scale=3):
                ask = _ask_column(cfg)
            with gr.Column(scale=2):
                pick = _model_column(studio, cfg)
        panes = _panes(empty)
        with gr.Row(elem_classes="examples"):
            example_sets = [(gr.Examples([[p] for p in prompts], inputs=[ask["prompt"]], label=label), shows, suits)
                            for label, (shows, suits, prompts) in examples().items()]
        sweep = sweep_box(cfg)
        options = {**ssr_settings(cfg), **rsd_settings(studio, cfg)}
        gr.Markdown(f"Limits: a run stops after {studio.max_run_s:.0f} s; a model load gives up after "
                    f"{studio.load_timeout:.0f} s; the prompt plus the budgets must fit the model's context.",
                    elem_classes="limits")
        timeline, tl_x = timeline_box(empty, "timeline")
        last_runs, last_view = gr.State(None), gr.State(None)
    return RunTab(**ask, **pick, **panes, example_sets=example_sets, sweep=sweep, options=options, timeline=timeline,
                  tl_x=tl_x, last_runs=last_runs, last_view=last_view)


def _ask_column(cfg: RunConfig) -> dict:
    prompt = gr.Textbox(label="Prompt", lines=4, placeholder="Ask the reasoning model something")
    # a chat: while on, each finished run's question and answer become the next run's earlier turns
    chat_on = gr.Checkbox(False, label="Continue the conversation", elem_id="continue",
                          info="the next run follows this one's question and answer, as the model's "
                               "chat template writes a conversation (docs/TEMPLATES.md)")
    chat_pane = gr.HTML("", elem_id="conversation")
    # the run's last API parameter: the chat's earlier turns, JSON [{"role", "content"}, ...] ("": none;
    # Studio.run validates it), so a caller continues a conversation and older callers are unaffected
    history = gr.Textbox(value="", visible=False, label="history")
    with gr.Row(elem_classes="run-row"):
        run_btn = gr.Button("Run", variant="primary", elem_id="run")
        stop_btn = gr.Button("Stop", variant="stop", interactive=False, elem_id="stop")
    draft_start, slider = draft_start_boxes(cfg)
    return dict(prompt=prompt, chat_on=chat_on, chat_pane=chat_pane, history=history, run_btn=run_btn,
                stop_btn=stop_btn, draft_start=draft_start, slider=slider)


def method_shown(label: str) -> tuple:
    """The method picked (a label of the Run tab's, or "Compare"): its summary (the record's words) and
    whether Draft start shows (the methods on SSR's loop fork drafts from the reasoning; the others have
    nothing to start)."""
    if label == "Compare":
        summary, forks = (f"{', '.join(COMPARE_RUNS)}, one after another on the same prompt and settings, each "
                          "timed against the baseline run"), True
    else:
        method = method_of(METHOD_NAMES[label])
        summary, forks = method.summary, method.ssr_loop
    return f'<p class="method-about">{esc(summary)}</p>', gr.update(visible=forks), gr.update(visible=forks)


def _model_column(studio: Studio, cfg: RunConfig) -> dict:
    method = gr.Radio(list(MODES), value="SSR", label="Method", elem_id="method")
    about = gr.HTML(method_shown("SSR")[0], elem_id="method-about")
    public = studio.public.on  # a shared studio's vet names the models it offers
    model = as_sent(gr.Dropdown(studio.public.choices(model_choices(studio.default_model)),
                                value=studio.default_model, label="Model", elem_id="model",
                                allow_custom_value=not public,
                                info="the models this shared studio offers" if public else
                                     "bundled, an installed real model, a preset, or type a local folder, "
                                     "a Hub id, a .gguf file or HUB_ID:FILE.gguf"))
    runtime = gr.Radio(runtime_choices(), value=studio.runtime or RUNTIMES[0], label="Runtime", elem_id="runtime",
                       info=runtime_info())
    # an API parameter after history (reproducible and compare_repeats follow): older callers are unaffected
    thinking = gr.Checkbox(value=cfg.thinking, label=LABELS["thinking"], elem_id="thinking",
                           info="off: the answer alone, where the model's chat template has a "
                                "thinking switch (Qwen3's enable_thinking); SSR then has no reasoning "
                                "to draft from (docs/TEMPLATES.md)")
    return dict(method=method, about=about, model=model, runtime=runtime, thinking=thinking)


def _panes(empty: TraceView) -> dict:
    # the strip and the panes right under Run: in view when it is pressed (the settings follow them)
    metrics = gr.HTML('<div class="metrics status">ready</div>', label="metrics", elem_id="strip")
    with gr.Row(equal_height=False):
        with gr.Column():
            gr.Markdown("**Reasoning**")
            reasoning_pane = gr.HTML(empty.reasoning_html(), label="reasoning", elem_id="reasoning-pane")
        with gr.Column():
            gr.Markdown("**Draft**")
            draft_pick = gr.Dropdown([], label="Show draft", visible=False, info="iterative SSR writes several drafts")
            draft_pane = gr.HTML(empty.draft_html(), label="draft", elem_id="draft-pane")
        with gr.Column():
            gr.Markdown("**Final answer**")
            answer_pane = gr.HTML(empty.answer_html(), label="answer", elem_id="answer-pane")
    with gr.Row():
        run_pick = gr.Radio([], label="Show run", visible=False, elem_classes="run-pick",
                            info="a comparison ran each of these: switch the panes between them")
    chart = gr.Plot(label="compare chart", show_label=False, visible=False)
    gr.HTML(LEGEND)
    return dict(metrics=metrics, reasoning_pane=reasoning_pane, draft_pick=draft_pick, draft_pane=draft_pane,
                answer_pane=answer_pane, run_pick=run_pick, chart=chart)


# ----------------------------------------------------------------------------- what the events show

def draft_picker(frame) -> dict:
    """The draft picker for a frame: shown when iterative SSR wrote several drafts."""
    drafts = sorted(frame.view.drafts) if frame.view and not frame.view.steps else []
    return gr.update(choices=[(f"draft {d}", d) for d in drafts], value=drafts[-1] if drafts else None,
                     visible=len(drafts) > 1)


def run_outputs(frame) -> tuple:
    """A run's frame as the run's outputs: the panes and the strip, the comparison chart (shown when
    there is one), the view, the draft picker, a comparison's runs and their picker, the timeline
    (left as drawn when the frame has none)."""
    *panes, fig = frame.as_tuple()
    runs = gr.update(visible=False)
    if frame.runs:
        runs = gr.update(choices=list(frame.runs), value=compare_shows(frame.runs), visible=True)
    return (*panes, gr.update(value=fig, visible=fig is not None), frame.view, draft_picker(frame),
            frame.runs, runs, gr.skip() if frame.timeline is None else frame.timeline)


def show_run(runs: dict, which: str, x: str) -> tuple:
    """One of a comparison's runs picked: its panes, strip, view, draft picker and timeline (on x axis ``x``)."""
    frame = runs[which]
    return (*frame.as_tuple()[:4], frame.view, draft_picker(frame), where_time_goes(frame.view, x))


def chat_toggled(on: bool) -> tuple:
    """"Continue the conversation" switched: off drops the conversation (its turns and its pane)."""
    return ("", "") if not on else (gr.skip(), gr.skip())


def timeline_after_run(view: TraceView | None, x: str):
    """A live run draws its timeline by time; once it ends, the x axis picked is honoured."""
    return gr.skip() if x == "time" or view is None else where_time_goes(view, x)


def draft_shown(view: TraceView | None, which) -> str:
    """The draft pane for the draft picked (iterative SSR)."""
    return view.draft_html(which) if view else ""


def panes_for_sweep() -> tuple:
    """A sweep starts: the panes would show an older run beside the sweep's chart: cleared, and said why."""
    empty = TraceView()
    note = ('<div class="metrics status">the draft-start sweep runs above: its chart and status are in the '
            'sweep section, each of its runs in History (Run shows a single run here)</div>')
    return (empty.reasoning_html(), empty.draft_html(), empty.answer_html(), note, gr.update(visible=False),
            '<div class="timeline empty">the sweep\'s runs are in History, each with its timeline</div>', None)


# ----------------------------------------------------------------------------- wiring

def wire_run(studio: Studio, cfg: RunConfig, tab: RunTab, buttons: list, gpu):
    """Run pressed: the run (``api_name="run"``, wrapped by ``gpu``), then the conversation and the
    timeline's x axis; returns the run's event (``buttons``: ``endpoints.busy``'s)."""
    inputs = tab.controls((*RUN_SETTINGS, *RUN_EXTRAS))

    @gpu
    @api_signature(cfg, inputs, RUN_DEFAULTS)
    def run(request: gr.Request, prompt: str, method: str = "SSR", model: str = "", **settings):
        roles = {name: settings.pop(name) for name in RUN_DEFAULTS}
        with job_of(studio, request) as job:
            if job is None:  # Gradio restarting a job that already ran: never run it twice
                return
            for frame in studio.run(prompt, method, model, roles["draft_model"], roles["prm"], job=job,
                                    history=roles["history"], runtime=roles["runtime"],
                                    repeats=roles["compare_repeats"], **settings):
                yield run_outputs(frame)

    tab.run_btn.click(None, None, None, js=SHOW_STRIP_JS, queue=False, **PRIVATE)
    run_event = tab.run_btn.click(busy, None, buttons, queue=False, **PRIVATE).then(
        run, [tab.prompt, tab.method, tab.model, *inputs.values()],
        [*tab.panes, tab.chart, tab.last_view, tab.draft_pick, tab.last_runs, tab.run_pick, tab.timeline],
        api_name="run", **model_jobs(studio), show_progress="minimal", show_progress_on=[tab.metrics])
    # the conversation: a finished run's turn joins it while "Continue the conversation" is on; off, it is dropped
    run_event.then(continued, [tab.chat_on, tab.history, tab.prompt, tab.last_view], [tab.history, tab.chat_pane],
                   **PRIVATE)
    tab.chat_on.change(chat_toggled, [tab.chat_on], [tab.history, tab.chat_pane], **PRIVATE)
    run_event.then(timeline_after_run, [tab.last_view, tab.tl_x], [tab.timeline], **PRIVATE)
    return run_event


def wire_picks(studio: Studio, tab: RunTab) -> None:
    """The examples (each sets the method it shows, and the model it suits), the run and draft
    pickers, the timeline's x axis, Stop."""
    for example_set, shows, suits in tab.example_sets:
        if suits is None:
            example_set.dataset.click(lambda shows=shows: shows, None, [tab.method], **PRIVATE)
        else:
            example_set.dataset.click(lambda shows=shows, suits=suits: (shows, suits), None, [tab.method, tab.model],
                                      **PRIVATE)
    tab.method.change(method_shown, [tab.method], [tab.about, tab.draft_start, tab.slider], **PRIVATE)
    tab.run_pick.input(show_run, [tab.last_runs, tab.run_pick, tab.tl_x],
                       [*tab.panes, tab.last_view, tab.draft_pick, tab.timeline], **PICKED)
    wire_timeline_axis(tab.timeline, tab.tl_x, tab.last_view)
    tab.draft_pick.input(draft_shown, [tab.last_view, tab.draft_pick], [tab.draft_pane], **PICKED)
    tab.stop_btn.click(stopper(studio), None, None, queue=False, **PRIVATE)


def wire_sweep(studio: Studio, cfg: RunConfig, tab: RunTab, buttons: list, gpu):
    """Sweep pressed: the panes cleared, then the sweep (``api_name="sweep"``, wrapped by ``gpu``)
    with every SSR and numerics setting on screen (draft start is what it varies); returns its event."""
    settings = tab.controls(n for n in RUN_SETTINGS if n not in (*RSD_ONLY, *MODEL_NAMES, "draft_start"))

    @gpu
    @api_signature(cfg, settings, {})
    def sweep(request: gr.Request, prompt: str, model: str = "", start=0, stop=200, step=20, **settings):
        with job_of(studio, request) as job:
            if job is not None:
                yield from studio.sweep(prompt, model, start, stop, step, job=job, **settings)

    box = tab.sweep
    box.button.click(panes_for_sweep, None, [*tab.panes, tab.chart, tab.timeline, tab.last_view],
                     queue=False, **PRIVATE)
    return box.button.click(busy, None, buttons, queue=False, **PRIVATE).then(
        sweep, [tab.prompt, tab.model, box.start, box.stop, box.step, *settings.values()],
        [box.status, box.plot], api_name="sweep", **model_jobs(studio),
        show_progress="minimal", show_progress_on=[box.status])
