"""The studio's Gradio layout and wiring. No model loads here: models load on the first run.

Pure builders live in ``render`` and ``charts``, handlers in ``handlers``; this module only lays
out components and connects them (imports go one way: layout -> handlers -> render). The
streaming run has ``api_name="run"`` with parameters ``prompt`` and ``method`` ("Baseline",
"SSR", "SSR early exit", "RSD", "Compare") first and the rest defaulted, so it can be driven by ``gradio_client``;
its outputs are named ``reasoning``, ``draft``, ``answer``, ``metrics``. Every numeric input
reaches the handler as sent and is validated there (``RunConfig.coerce``), so an API client
sending "abc", NaN or 10**30 gets a message naming the field, not Gradio's generic error.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from pathlib import Path

import gradio as gr

from engine.benchmarks.problems import BUNDLED_SETS, TASKS
from engine.benchmarks.problems import PRESETS as DATASET_PRESETS
from engine.config import DRAFTING, LABELS, RunConfig, number, rule
from engine.llamacpp import lib as llama_lib
from engine.methods.rsd.acceptance import WEIGHTINGS
from engine.presets import BUNDLED, PRESETS, with_exit_probes
from engine.registry import METHODS
from engine.runlog import RunLogError
from engine.runlog.compare import SLOW_FACTOR
from engine.runtime.compiled import COMPILE_MODES
from engine.runtime.fixed import ROUTES as EXACT_ROUTES
from engine.runtime.fixed import SHAPE as FIXED_SHAPE
from engine.runtime.gguf import REGISTRY as GGUF_REGISTRY
from engine.runtime.gguf import installed
from engine.tools.synthetic import EVAL_SEED_BASE, make_example
from engine.wiring import RUNTIMES
from ssr_ui import charts
from ssr_ui.benchmark import BENCH_METHODS, RUN_COLUMNS
from ssr_ui.benchmark import MAX_ROWS as BENCH_MAX_ROWS
from ssr_ui.frame import where_time_goes
from ssr_ui.handlers import EXIT_MODE, MAX_REPEATS, MODES, Studio, compare_shows, continued
from ssr_ui.jobs import Bounds, Refused, current_event_id, visitor_address
from ssr_ui.render import LEGEND, TraceView, error_html, esc, prompt_html
from ssr_ui.timeline import TIMELINE_JS, X_MODES

try:  # on a ZeroGPU Space, each run borrows a GPU; elsewhere nothing changes
    import spaces

    on_gpu = spaces.GPU(duration=120)
except ImportError:
    def on_gpu(fn):
        return fn

RUN_CONCURRENCY = 4  # jobs inside the handler at once: one uses the model, the others load or wait (saying so)
HISTORY_COLUMNS = {"id": "id", "created_at": "when (UTC)", "method": "method", "model": "model", "status": "status",
                   "wall_s": "latency s", "ttft_s": "first answer s", "reasoning_tokens": "reasoning",
                   "answer_tokens": "answer", "accepted": "accepted", "recovered": "recovered",
                   "generated": "generated", "rejected": "rejected", "tokens_per_s": "tokens/s", "dataset": "dataset", "correct": "correct",
                   "flag": "flag", "prompt": "prompt"}
PRIVATE = dict(api_visibility="private")  # UI plumbing, not part of the API


REAL_EXAMPLES_MODEL = "smollm2-135m-instruct"  # the small real model the short-question examples suit


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
    if llama_lib.missing() is None:
        return ("transformers: torch, any model; llama.cpp: a GGUF file (a registry model, a .gguf path) on "
                "llama.cpp's own kernels (docs/BENCHMARKS.md 'llama.cpp')")
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


def missing_path(name: str) -> str | None:
    """Why a typed model name names nothing here: a local path (starting with /, ./, ../ or ~, or a
    .gguf file not in the HUB_ID:FILE.gguf form) that does not exist; None for anything else (a known
    name, a Hub id: the run loads it and says what went wrong)."""
    name = (name or "").strip()
    if not name or name in GGUF_REGISTRY or name in PRESETS or name in BUNDLED:
        return None
    local = name.startswith(("/", "./", "../", "~")) or (name.lower().endswith(".gguf") and ":" not in name)
    return f"{name}: no such file or folder here" if local and not Path(name).expanduser().exists() else None


def _api_signature(cfg, settings: dict, models: dict):
    """Give the generator ``fn(request, prompt, ..., **settings)`` the signature Gradio builds its
    API from: after ``fn``'s own parameters, one per entry of ``settings`` in its order, its default
    ``cfg``'s value (or ``models``' for the model names). Gradio calls it positionally, in the same
    order; the wrapper (a generator too, so Gradio streams it) hands the settings on by name."""
    import inspect

    names = list(settings)

    def decorate(fn):
        head = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
        tail = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  default=models[n] if n in models else getattr(cfg, n)) for n in names]

        @functools.wraps(fn)
        def call(*args, **named):
            values = args[len(head):]  # fewer values: the rest by name or default
            given = {**dict(zip(names, values, strict=False)), **{k: v for k, v in named.items() if k in settings}}
            own = {k: v for k, v in named.items() if k not in settings}
            yield from fn(*args[: len(head)], **own, **{n: given.get(n, p.default) for n, p in zip(names, tail, strict=True)})

        call.__signature__ = inspect.Signature([*head, *tail])
        return call
    return decorate


# Run pressed with the strip out of view (a narrow window, a scrolled page): the strip comes to the top, the panes under it
SHOW_STRIP_JS = """() => {
    const strip = document.querySelector('#strip'), r = strip && strip.getBoundingClientRect();
    if (r && (r.top < 0 || r.top > window.innerHeight - 260)) strip.scrollIntoView({block: 'start'});
}"""


RSD_ONLY = ("threshold", "weighting", "weight_param", "draft_confidence")  # settings only RSD reads


def _as_sent(component):
    """Hand the component's value to the handler unconverted: the handler validates every value
    with a message naming the field (Gradio's own conversion fails with a generic error)."""
    component.preprocess = lambda payload: payload
    return component


def build_app(studio: Studio) -> gr.Blocks:
    cfg = studio.config(studio.default_model)
    empty = TraceView()
    with gr.Blocks(title="SSR Studio", delete_cache=studio.DELETE_CACHE) as demo:
        gr.Markdown("## SSR Studio: self-speculation for reasoning models, shown token by token")
        with gr.Tab("Run"):
            with gr.Row():
                with gr.Column(scale=3):
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
                    draft_start, draft_slider = _draft_start_boxes(cfg)
                with gr.Column(scale=2):
                    method = gr.Radio(list(MODES), value="SSR", label="Method", elem_id="method")
                    model = _as_sent(gr.Dropdown(studio.public.choices(model_choices(studio.default_model)),
                                        value=studio.default_model, label="Model", elem_id="model",
                                        allow_custom_value=not studio.public.on,
                                        info="the models this shared studio offers" if studio.public.on else
                                             "bundled, an installed real model, a preset, or type a local folder, "
                                             "a Hub id, a .gguf file or HUB_ID:FILE.gguf"))  # a shared studio's vet names it
                    runtime = gr.Radio(runtime_choices(), value=studio.runtime or RUNTIMES[0], label="Runtime", elem_id="runtime",
                                       info=runtime_info())
                    # an API parameter after history (reproducible and compare_repeats follow): older callers are unaffected
                    thinking = gr.Checkbox(value=cfg.thinking, label=LABELS["thinking"], elem_id="thinking",
                                           info="off: the answer alone, where the model's chat template has a "
                                                "thinking switch (Qwen3's enable_thinking); SSR then has no reasoning "
                                                "to draft from (docs/TEMPLATES.md)")
            # the strip and the panes right under Run: in view when it is pressed (the settings follow them)
            metrics = gr.HTML('<div class="metrics status">ready</div>', label="metrics", elem_id="strip")
            with gr.Row(equal_height=False):
                with gr.Column():
                    gr.Markdown("**Reasoning**")
                    reasoning_pane = gr.HTML(empty.reasoning_html(), label="reasoning", elem_id="reasoning-pane")
                with gr.Column():
                    gr.Markdown("**Draft**")
                    draft_pick = gr.Dropdown([], label="Show draft", visible=False,
                                             info="iterative SSR writes several drafts")
                    draft_pane = gr.HTML(empty.draft_html(), label="draft", elem_id="draft-pane")
                with gr.Column():
                    gr.Markdown("**Final answer**")
                    answer_pane = gr.HTML(empty.answer_html(), label="answer", elem_id="answer-pane")
            with gr.Row():
                run_pick = gr.Radio([], label="Show run", visible=False, elem_classes="run-pick",
                                    info="a comparison ran each of these: switch the panes between them")
            chart = gr.Plot(label="compare chart", show_label=False, visible=False)
            gr.HTML(LEGEND)
            with gr.Row(elem_classes="examples"):
                example_sets = [(gr.Examples([[p] for p in prompts], inputs=[prompt], label=label), shows, suits)
                                for label, (shows, suits, prompts) in examples().items()]
            with gr.Accordion("Draft-start sweep", open=False):
                gr.Markdown("One baseline run, then SSR at each draft start, with every SSR setting and the numerics "
                            "set below (drafts, interval, lookups, suffix recovery, exact, compiled steps).")
                with gr.Row():
                    sweep_from = _as_sent(gr.Number(value=0, precision=0, label="From"))
                    sweep_to = _as_sent(gr.Number(value=min(cfg.max_think - 1, 4 * cfg.draft_start or 200),
                                                  precision=0, label="To"))
                    sweep_step = _as_sent(gr.Number(value=max(1, cfg.draft_start // 2 or 20), precision=0,
                                                    label="Step"))
                    sweep_btn = gr.Button("Sweep draft start")
                sweep_status = gr.HTML(label="sweep status")
                sweep_plot = gr.Plot(label="Sweep", show_label=False)
            with gr.Accordion("SSR settings", open=False):
                with gr.Row():
                    compare_repeats = _as_sent(gr.Number(
                        value=1, precision=0, label="Compare repeats", elem_id="compare-repeats",
                        info=f"Compare: its runs this many times (1..{MAX_REPEATS}), each run's ratio to baseline the "
                             "median of its rounds, their spread shown"))
                    max_think = _as_sent(gr.Number(value=cfg.max_think, precision=0, label="Max think", elem_id="max-think"))
                    max_draft = _as_sent(gr.Number(value=cfg.max_draft, precision=0, label="Max draft"))
                    max_answer = _as_sent(gr.Number(value=cfg.max_answer, precision=0, label="Max answer"))
                with gr.Row():
                    num_drafts = _as_sent(gr.Number(value=cfg.num_drafts, precision=0, label="Number of drafts",
                                                    elem_id="num-drafts"))
                    draft_interval = _as_sent(gr.Number(value=cfg.draft_interval, precision=0, label="Draft interval",
                                                        elem_id="draft-interval"))
                    suffix = gr.Checkbox(value=cfg.suffix_recovery, label="Suffix recovery")
                    lookup = gr.Checkbox(value=cfg.context_lookup, label="Context lookup")
                    think_spec = _as_sent(gr.Number(
                        value=cfg.think_spec, precision=0, label="Reasoning lookup",
                        info="most lookup tokens a row verifies per reasoning step (the main row: as many as pay on this "
                             "model, by their acceptance and what a wider forward costs; 0: one token per step, as in "
                             "the paper)"))
                    drafting = gr.Radio(list(DRAFTING), value=cfg.drafting, label=LABELS["drafting"], elem_id="drafting",
                                        info="auto: SSR forks its drafts only where they have paid on this model "
                                             "(their batch cost against the forwards they saved); always: as planned")
                with gr.Row():
                    # number boxes, not sliders: a slider's box clamps what is typed (5 became 2)
                    temperature = _as_sent(gr.Number(value=cfg.temperature, label="Temperature",
                                                     info=rule("temperature"), elem_id="temperature"))
                    # a text box: a browser's number holds 2**53 exactly at most, a seed goes to 2**63 - 1
                    seed = _as_sent(gr.Textbox(value=str(cfg.seed), label="Seed", max_lines=1,
                                               info=rule("seed")))
                    exact = gr.Checkbox(value=cfg.exact, label="Exact mode",
                                        info="batch- and width-invariant forwards: bitwise the same answer, slower")
                    # the run's last API parameters (after thinking): older callers are unaffected
                    reproducible = gr.Checkbox(value=cfg.reproducible, label=LABELS["reproducible"],
                                               elem_id="reproducible",
                                               info="SSR's widths and drafting fixed from the model's stored evidence "
                                                    "as the run starts: two runs give the same tokens and counts")
                    exact_route = gr.Radio(list(EXACT_ROUTES), value=cfg.exact_route, label="Exact route",
                                           info=f"rows: the per-row reference; fixed: every step one padded "
                                                f"{FIXED_SHAPE} shape (for GPUs: a CPU pays for every padded "
                                                "token); auto: fixed on CUDA")
                    compile_steps = gr.Radio(list(COMPILE_MODES), value=cfg.compile, label="Compiled steps",
                                             info="fixed-shape steps through torch.compile (auto: on CUDA); "
                                                  "compiled once per model and shape, before the run")
                with gr.Row():  # SSR early exit (lossy): its probes are the drafts set above
                    exit_k = _as_sent(gr.Number(
                        value=cfg.exit_k, precision=0, label=LABELS["exit_k"], elem_id="exit-k",
                        info=f"SSR early exit: stop reasoning once this many consecutive finished drafts agree on "
                             f"the answer; {rule('exit_k')}"))
                    exit_min_think = _as_sent(gr.Number(
                        value=cfg.exit_min_think, precision=0, label=LABELS["exit_min_think"], elem_id="exit-min-think",
                        info=f"SSR early exit: never stop before this many reasoning tokens; {rule('exit_min_think')}"))
                    exit_confidence = _as_sent(gr.Number(
                        value=cfg.exit_confidence, label=LABELS["exit_confidence"], elem_id="exit-confidence",
                        info=f"SSR early exit: and only when the agreeing drafts' mean token probability reaches "
                             f"this; {rule('exit_confidence')}"))
            with gr.Accordion("RSD settings", open=False):
                with gr.Row():
                    draft_model = gr.Textbox(value=studio.default_draft, label="Draft model")
                    prm = gr.Textbox(value=studio.default_prm, label="Process reward model",
                                     info="math-shepherd format, or 'target-likelihood' (no PRM)")
                with gr.Row():
                    threshold = _as_sent(gr.Number(value=cfg.threshold, label="Threshold", elem_id="threshold",
                                                   info=f"binary rule: keep a draft step scored at least this; "
                                                        f"{rule('threshold')}"))
                    weighting = gr.Dropdown(list(WEIGHTINGS), value=cfg.weighting, label="Weighting")
                    weight_param = _as_sent(gr.Number(value=cfg.weight_param,
                                                      label="Weight parameter (constant p, logistic a)"))
                    draft_confidence = _as_sent(gr.Number(
                        value=cfg.draft_confidence, label="Draft doubt",
                        info="also rewrite a step whose least likely draft token is below this (0: off, the paper's rule)"))
            gr.Markdown(f"Limits: a run stops after {studio.max_run_s:.0f} s; a model load gives up after "
                        f"{studio.load_timeout:.0f} s; the prompt plus the budgets must fit the model's context.",
                        elem_classes="limits")
            timeline, tl_x = _timeline_box(empty, "timeline")
            last_runs = gr.State(None)  # the latest comparison's final frames, for the run picker
            last_view = gr.State(None)  # this browser session's latest run, for the draft picker

        with gr.Tab("Benchmark"):
            gr.Markdown("Run the methods on a slice of a dataset, one problem after another (baseline first, after "
                        "an untimed warm-up), with the model and every setting of the Run tab; answers are graded "
                        "by task (math: math-verify; choice: the option letter; code and free text: agreement with "
                        "baseline) and every run is logged under the dataset's name. `python -m engine.tools.bench "
                        "--dataset ...` runs the same loop from a terminal."
                        + (f" On this shared studio a benchmark is at most {studio.public.max_benchmark_runs} runs "
                           "(problems x repeats x methods), and it takes turns for the model: between two of its "
                           "runs, other visitors' runs waiting go first." if studio.public.on else ""))
            with gr.Row():
                with gr.Column(scale=3):
                    b_upload = gr.File(label="Problems file (.jsonl, .json, .csv, .parquet; up to 20 MB)",
                                       file_types=[".jsonl", ".json", ".csv", ".parquet"], type="filepath",
                                       elem_id="bench-upload")
                    b_dataset = gr.Textbox(label="…or a dataset", max_lines=1, elem_id="bench-dataset",
                                           placeholder="bundled-arithmetic, gsm8k, HuggingFaceH4/MATH-500:test",
                                           info=f"{' / '.join(BUNDLED_SETS)} (bundled), a preset ({', '.join(DATASET_PRESETS)}) "
                                                "or NAME[:CONFIG][:SPLIT] from the Hub (streams only the rows it reads)")
                    gr.Examples([[name] for name in BUNDLED_SETS], inputs=[b_dataset], label="Bundled suites")
                with gr.Column(scale=2):
                    b_methods = gr.CheckboxGroup(list(BENCH_METHODS), value=["baseline", "ssr"], label="Methods",
                                                 info="target: RSD's target alone (RSD's ratios are to it); "
                                                      "ssr-exit: SSR early exit (lossy), graded like the others")
                    with gr.Row():
                        b_limit = _as_sent(gr.Number(value=10, precision=0, label="Problems",
                                                     info=f"the first N (1..{BENCH_MAX_ROWS})"))
                        b_repeat = _as_sent(gr.Number(value=1, precision=0, label="Repeats", info="per problem"))
                        b_sample = gr.Textbox(value="", label="Sample seed", max_lines=1,
                                              info="blank: the first rows; a number: a random sample")
                    with gr.Row():
                        b_task = gr.Dropdown(["auto", *TASKS], value="auto", label="Task",
                                             info="auto: the preset's, the row's suite, math with a reference")
                        b_qfield = gr.Textbox(label="Question field", max_lines=1, placeholder="auto")
                        b_afield = gr.Textbox(label="Answer field", max_lines=1, placeholder="auto")
                    with gr.Row():
                        bench_btn = gr.Button("Run benchmark", variant="primary", elem_id="bench-run")
                        bench_stop = gr.Button("Stop", variant="stop", interactive=False, elem_id="bench-stop")
            b_status = gr.HTML('<div class="metrics status">ready</div>', label="benchmark status",
                               elem_id="bench-status")
            b_summary = gr.Dataframe(headers=["method"], interactive=False, wrap=False, label="results by method",
                                     elem_id="bench-summary")
            with gr.Row(equal_height=False):  # each chart keeps a readable width: on a phone they stack
                with gr.Column(min_width=360):
                    b_accuracy = gr.Plot(label="accuracy", show_label=False)
                with gr.Column(min_width=360):
                    b_latency = gr.Plot(label="latency", show_label=False)
                with gr.Column(min_width=360):
                    b_tokens = gr.Plot(label="answer tokens", show_label=False)
            b_acceptance = gr.Plot(label="acceptance", show_label=False)
            b_exit = gr.Plot(label="early exit by k", show_label=False)
            b_runs = gr.Dataframe(headers=RUN_COLUMNS, interactive=False, wrap=False, label="runs",
                                  elem_id="bench-runs")

        with gr.Tab("History") as history_tab:
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
            history_note = gr.HTML("", elem_id="history-note")
            table = gr.Dataframe(headers=list(HISTORY_COLUMNS.values()), interactive=False, wrap=False,
                                 elem_classes="history-table", label="runs")
            with gr.Row():
                run_id = gr.Textbox(label="Run id", placeholder="a run id from the table", max_lines=1)
                show = gr.Button("Show this run")
                export_json = gr.Button("Export JSON")
                export_html = gr.Button("Export HTML")
                export_csv = gr.Button("Export runs CSV")
            with gr.Row():
                exported = gr.File(label="Exported file", interactive=False)
                imported = gr.File(label="Import a JSON trace", file_types=[".json"], type="filepath")
            h_prompt = gr.HTML(label="prompt")
            h_metrics = gr.HTML(label="metrics")
            with gr.Row(equal_height=False):
                with gr.Column():
                    gr.Markdown("**Reasoning**")
                    h_reasoning = gr.HTML(label="reasoning")
                with gr.Column():
                    gr.Markdown("**Draft**")
                    h_draft = gr.HTML(label="draft")
                with gr.Column():
                    gr.Markdown("**Final answer**")
                    h_answer = gr.HTML(label="answer")
            h_timeline, h_tl_x = _timeline_box(empty, "history-timeline")
            h_view = gr.State(None)  # the past run shown, for the timeline's x axis
            with gr.Row(equal_height=False):  # each chart keeps a readable width: on a narrow screen they stack
                with gr.Column(min_width=480):
                    c_latency = gr.Plot(label="latency by method", show_label=False)
                with gr.Column(min_width=480):
                    c_tokens = gr.Plot(label="answer tokens", show_label=False)
            with gr.Row(equal_height=False):
                with gr.Column(min_width=480):
                    c_speedup = gr.Plot(label="SSR vs draft start", show_label=False)
                with gr.Column(min_width=480):
                    c_rsd = gr.Plot(label="RSD vs threshold", show_label=False)
            with gr.Row(equal_height=False):
                with gr.Column(min_width=480):
                    c_accuracy = gr.Plot(label="accuracy by method", show_label=False)
                with gr.Column(min_width=480):
                    c_acceptance = gr.Plot(label="acceptance by method", show_label=False)
            c_exit = gr.Plot(label="early exit by k", show_label=False)

        # ------------------------------------------------------------------ wiring: runs
        # The run's settings, written once: the API's parameters (names, order, defaults) and the
        # inputs it reads come from this table; the handler receives them as keywords.
        run_settings = {"draft_start": draft_start, "max_think": max_think, "max_draft": max_draft,
                        "max_answer": max_answer, "num_drafts": num_drafts, "draft_interval": draft_interval,
                        "suffix_recovery": suffix, "context_lookup": lookup, "temperature": temperature, "seed": seed,
                        "draft_model": draft_model, "prm": prm, "threshold": threshold, "weighting": weighting,
                        "weight_param": weight_param, "think_spec": think_spec, "exact": exact,
                        "exact_route": exact_route, "draft_confidence": draft_confidence, "compile": compile_steps,
                        "exit_k": exit_k, "exit_min_think": exit_min_think, "exit_confidence": exit_confidence,
                        "drafting": drafting, "runtime": runtime}
        # not RunConfig fields: "" means the studio's default (the runtime's: transformers)
        models = {"draft_model": "", "prm": "", "runtime": ""}

        def visitor_of(request: gr.Request) -> str | None:
            """The client address a shared studio bounds this visitor by (ssr_ui.jobs.visitor_address)."""
            client, headers = getattr(request, "client", None), getattr(request, "headers", None) or {}
            return visitor_address(getattr(client, "host", None), headers.get("x-forwarded-for"))

        @contextlib.contextmanager
        def job_of(request: gr.Request):
            """The job this handler runs (ssr_ui.jobs); one over a shared studio's bounds is refused with the reason."""
            with contextlib.ExitStack() as stack:
                try:
                    job = stack.enter_context(studio.jobs.running(current_event_id(), request.session_hash,
                                                                  visitor_of(request)))
                except Refused as err:
                    raise gr.Error(str(err)) from None
                yield job
        # the jobs that use the model: on a shared studio every admitted one enters its handler at once, to be
        # told its place in the model's line (ssr_ui.waiting); the bounds refuse the rest when they join
        model_jobs = (dict(concurrency_limit=studio.public.max_jobs, concurrency_id="model") if studio.public.on
                      else dict(concurrency_limit=RUN_CONCURRENCY))

        run_inputs = {**run_settings, "history": history, "thinking": thinking, "reproducible": reproducible,
                      "compare_repeats": compare_repeats}
        run_models = {**models, "history": "", "compare_repeats": 1}

        @on_gpu
        @_api_signature(cfg, run_inputs, run_models)
        def run(request: gr.Request, prompt: str, method: str = "SSR", model: str = "", **settings):
            roles = {name: settings.pop(name) for name in run_models}
            with job_of(request) as job:
                if job is None:  # Gradio restarting a job that already ran: never run it twice
                    return
                for frame in studio.run(prompt, method, model, roles["draft_model"], roles["prm"], job=job,
                                        history=roles["history"], runtime=roles["runtime"],
                                        repeats=roles["compare_repeats"], **settings):
                    *panes, fig = frame.as_tuple()
                    runs = gr.update(visible=False)
                    if frame.runs:
                        runs = gr.update(choices=list(frame.runs), value=compare_shows(frame.runs), visible=True)
                    yield (*panes, gr.update(value=fig, visible=fig is not None), frame.view, _draft_picker(frame),
                           frame.runs, runs, gr.skip() if frame.timeline is None else frame.timeline)

        def busy():  # the Stop buttons on, the start buttons off
            on, off = gr.update(interactive=True), gr.update(interactive=False)
            return on, off, off, on, off

        def idle():
            on, off = gr.update(interactive=True), gr.update(interactive=False)
            return off, on, on, off, on

        buttons = [stop_btn, run_btn, sweep_btn, bench_stop, bench_btn]
        run_btn.click(None, None, None, js=SHOW_STRIP_JS, queue=False, **PRIVATE)
        run_event = run_btn.click(busy, None, buttons, queue=False, **PRIVATE).then(
            run, [prompt, method, model, *run_inputs.values()],
            [reasoning_pane, draft_pane, answer_pane, metrics, chart, last_view, draft_pick, last_runs, run_pick,
             timeline],
            api_name="run", **model_jobs, show_progress="minimal", show_progress_on=[metrics])
        # the conversation: a finished run's turn joins it while "Continue the conversation" is on; off, it is dropped
        run_event.then(continued, [chat_on, history, prompt, last_view], [history, chat_pane], **PRIVATE)
        chat_on.change(lambda on: ("", "") if not on else (gr.skip(), gr.skip()), [chat_on], [history, chat_pane],
                       **PRIVATE)
        # a live run draws its timeline by time; once it ends, the x axis picked is honoured
        run_event.then(lambda view, x: gr.skip() if x == "time" or view is None else where_time_goes(view, x),
                       [last_view, tl_x], [timeline], **PRIVATE)

        def show_run(runs, which, x):
            frame = runs[which]
            return (*frame.as_tuple()[:4], frame.view, _draft_picker(frame), where_time_goes(frame.view, x))

        for example_set, shows, suits in example_sets:  # picking an example sets the method it shows (and model)
            if suits is None:
                example_set.dataset.click(lambda shows=shows: shows, None, [method], **PRIVATE)
            else:
                example_set.dataset.click(lambda shows=shows, suits=suits: (shows, suits), None, [method, model],
                                          **PRIVATE)

        # picks: the last one clicked is what shows (gradio's default, "once", drops a click made while the
        # previous pick is still being drawn, leaving the radio on one run and the panes on another)
        picked = dict(PRIVATE, trigger_mode="always_last")
        run_pick.input(show_run, [last_runs, run_pick, tl_x],
                       [reasoning_pane, draft_pane, answer_pane, metrics, last_view, draft_pick, timeline], **picked)
        for box, x_axis, state in ((timeline, tl_x, last_view), (h_timeline, h_tl_x, h_view)):
            x_axis.input(lambda view, x: where_time_goes(view or empty, x), [state, x_axis], [box], **picked)
        draft_pick.input(lambda view, which: view.draft_html(which) if view else "", [last_view, draft_pick],
                         [draft_pane], **picked)

        def stop(request: gr.Request):
            studio.jobs.cancel_session(request.session_hash)

        stop_btn.click(stop, None, None, queue=False, **PRIVATE)

        # the sweep runs with every SSR and numerics setting on screen (draft start is what it varies)
        sweep_settings = {k: v for k, v in run_settings.items() if k not in (*RSD_ONLY, *models, "draft_start")}

        @on_gpu
        @_api_signature(cfg, sweep_settings, {})
        def sweep(request: gr.Request, prompt: str, model: str = "", start=0, stop=200, step=20, **settings):
            with job_of(request) as job:
                if job is not None:
                    yield from studio.sweep(prompt, model, start, stop, step, job=job, **settings)

        def panes_for_sweep():  # the panes would show an older run beside the sweep's chart: cleared, and said why
            note = ('<div class="metrics status">the draft-start sweep runs above: its chart and status are in the '
                    'sweep section, each of its runs in History (Run shows a single run here)</div>')
            return (empty.reasoning_html(), empty.draft_html(), empty.answer_html(), note, gr.update(visible=False),
                    '<div class="timeline empty">the sweep\'s runs are in History, each with its timeline</div>', None)

        sweep_btn.click(panes_for_sweep, None, [reasoning_pane, draft_pane, answer_pane, metrics, chart, timeline,
                                                last_view], queue=False, **PRIVATE)
        sweep_event = sweep_btn.click(busy, None, buttons, queue=False, **PRIVATE).then(
            sweep, [prompt, model, sweep_from, sweep_to, sweep_step, *sweep_settings.values()],
            [sweep_status, sweep_plot], api_name="sweep", **model_jobs,
            show_progress="minimal", show_progress_on=[sweep_status])

        @on_gpu
        @_api_signature(cfg, run_settings, models)
        def benchmark(request: gr.Request, dataset: str = "", upload: str | None = None, methods=("baseline", "ssr"),
                      limit=10, repeat=1, sample_seed="", task="auto", question_field="", answer_field="",
                      model: str = "", **settings):
            roles = {name: settings.pop(name) for name in models}
            with job_of(request) as job:
                if job is None:
                    return
                for frame in studio.benchmark(dataset, upload, methods, limit, repeat, sample_seed, question_field,
                                              answer_field, task, model, roles["draft_model"], roles["prm"], job=job,
                                              **settings):
                    yield tuple(gr.update() if keep else value
                                for value, keep in zip(frame.as_tuple(), frame.unchanged, strict=True))

        bench_event = bench_btn.click(busy, None, buttons, queue=False, **PRIVATE).then(
            benchmark, [b_dataset, b_upload, b_methods, b_limit, b_repeat, b_sample, b_task, b_qfield, b_afield, model,
                        *run_settings.values()],
            [b_status, b_summary, b_runs, b_accuracy, b_latency, b_tokens, b_acceptance, b_exit], api_name="benchmark",
            **model_jobs, show_progress="minimal", show_progress_on=[b_status])
        bench_stop.click(stop, None, None, queue=False, **PRIVATE)

        def think_changed(think, start):
            """Max think moved: the draft-start box's range follows it; its value stays unless it
            falls out of range, and then a notice says what it became (nothing changes silently)."""
            think, start = _whole(think), _whole(start)
            if think is None or think < 1:
                return gr.update()  # the run names the bad Max think
            info = _draft_start_info(think)
            if start is not None and not 0 <= start < think:
                gr.Info(f"Draft start {start} -> {think - 1}: it must stay below Max think ({think})")
                return gr.update(value=think - 1, info=info)
            return gr.update(info=info)

        def model_budgets(name, *shown):
            """Another model: its recommended budgets and draft start (its presets, fitted to its
            context) replace those on screen, and a notice lists what changed. A path that does not
            exist changes nothing (a warning says so)."""
            if why := missing_path(name):
                gr.Warning(f"{why}: the settings on screen are kept")
                return tuple(gr.update() for _ in shown)
            try:
                c = studio.config(name)
            except ValueError:
                return tuple(gr.update() for _ in shown)
            fields = ("max_think", "max_draft", "max_answer", "draft_start")
            new = [getattr(c, f) for f in fields]
            changed = [f"{LABELS[f]} {_whole(old)} -> {value}" for f, old, value in zip(fields, shown, new, strict=True)
                       if _whole(old) != value]
            if changed:
                gr.Info(f"{name}'s recommended settings: " + ", ".join(changed))
            return (*new[:3], gr.update(value=new[3], info=_draft_start_info(c.max_think)))

        def mode_probes(mode, name, think, start, drafts, interval, k):
            try:
                studio.vet(name)  # a shared studio: a name off its list never reaches a path
            except ValueError:
                return gr.update(), gr.update()
            probes = exit_mode_probes(mode, name or studio.default_model, think, start, drafts, interval, k)
            if probes is None:
                return gr.update(), gr.update()
            gr.Info(probes["notice"])
            return probes["num_drafts"], probes["draft_interval"]

        method.change(mode_probes, [method, model, max_think, draft_start, num_drafts, draft_interval, exit_k],
                      [num_drafts, draft_interval], **PRIVATE)

        budget_boxes = [max_think, max_draft, max_answer, draft_start]
        model.change(model_budgets, [model, *budget_boxes], budget_boxes, **PRIVATE)
        def think_typed(think):
            """While Max think is typed, key by key: the draft-start box's stated range follows it,
            its value never moves ("1", the first key of "1200", is not Max think yet)."""
            think = _whole(think)
            return gr.update(info=_draft_start_info(think)) if think is not None and think >= 1 else gr.update()

        max_think.input(think_typed, [max_think], [draft_start], **PRIVATE)
        max_think.change(draft_range, [max_think], [draft_slider], **PRIVATE)  # typed or set by a model's budgets
        for done_typing in (max_think.submit, max_think.blur):  # typing done: an out-of-range value moves, said
            done_typing(think_changed, [max_think, draft_start], [draft_start], **PRIVATE)

        # ------------------------------------------------------------------ wiring: history
        def load_history(request: gr.Request, method_name, dataset_name="all", leave_out_slow=True, model_name="all"):
            visitor = studio.visitor(request.session_hash)  # a shared studio: this visitor's runs alone
            try:
                rows = studio.history(method_name, dataset=dataset_name, visitor=visitor, model=model_name)
                names, models = studio.log.used("dataset", visitor), studio.log.used("model", visitor)
            except RunLogError as err:  # the log cannot be read now: keep what History shows, and say why
                gr.Warning(f"History not refreshed: {err}")
                return tuple(gr.update() for _ in history_outputs)
            flagged = sum(bool(r["flag"]) for r in rows)
            if leave_out_slow:
                rows = [r for r in rows if not r["flag"]]
            note = (f"{flagged} run{'s' if flagged != 1 else ''} flagged slow "
                    f"{'left out of the table and the charts' if leave_out_slow else 'shown (marked in the flag column)'}"
                    if flagged else "no run flagged slow")
            table_rows = [[_cell(c, r.get(c)) for c in HISTORY_COLUMNS] for r in rows]
            picked = dataset_name if dataset_name in names else "all"
            model_picked = model_name if model_name in models else "all"
            return (table_rows, charts.latency_by_method(rows), charts.token_composition(rows),
                    charts.speedup_vs_draft_start(rows), charts.rsd_by_threshold(rows), charts.accuracy_by_method(rows),
                    charts.acceptance_by_method(rows), charts.exit_by_k(rows),
                    gr.update(choices=["all", *names], value=picked), gr.update(choices=["all", *models], value=model_picked),
                    f'<div class="metrics status">{esc(note)}</div>')

        history_outputs = [table, c_latency, c_tokens, c_speedup, c_rsd, c_accuracy, c_acceptance, c_exit, dataset_filter,
                           model_filter, history_note]
        history_inputs = [method_filter, dataset_filter, hide_slow, model_filter]
        refresh.click(load_history, history_inputs, history_outputs, api_name="history")
        method_filter.change(load_history, history_inputs, history_outputs, **PRIVATE)
        hide_slow.input(load_history, history_inputs, history_outputs, **PRIVATE)
        dataset_filter.input(load_history, history_inputs, history_outputs, **PRIVATE)
        model_filter.input(load_history, history_inputs, history_outputs, **PRIVATE)
        history_tab.select(load_history, history_inputs, history_outputs, **PRIVATE)
        demo.load(load_history, history_inputs, history_outputs, **PRIVATE)
        demo.load(recheck_runtimes, [runtime], [runtime], **PRIVATE)
        for event in (run_event, sweep_event, bench_event):
            event.then(idle, None, buttons, queue=False, **PRIVATE).then(
                load_history, history_inputs, history_outputs, **PRIVATE)

        def past_run(get, x="time"):
            try:
                frame = get()
            except ValueError as err:
                return "", error_html(str(err)), "", "", "", where_time_goes(empty), None
            return (prompt_html(frame.prompt), frame.metrics, frame.reasoning, frame.draft, frame.answer,
                    where_time_goes(frame.view, x), frame.view)

        past_outputs = [h_prompt, h_metrics, h_reasoning, h_draft, h_answer, h_timeline, h_view]
        def replay(request: gr.Request, rid, x="time"):
            return past_run(lambda: studio.replay(rid, studio.visitor(request.session_hash)), x)

        show.click(replay, [run_id, h_tl_x], past_outputs, api_name="replay")

        def exporter(kind):
            def do_export(request: gr.Request, rid, method_name, dataset_name, model_name):
                try:
                    return studio.export(rid, kind, method_name, dataset_name, studio.visitor(request.session_hash),
                                         model_name), ""
                except ValueError as err:
                    return None, error_html(str(err))
            return do_export

        for button, kind in ((export_json, "json"), (export_html, "html"), (export_csv, "csv")):
            button.click(exporter(kind), [run_id, method_filter, dataset_filter, model_filter], [exported, h_metrics],
                         **PRIVATE)

        def do_import(request: gr.Request, path, x):
            if not path:
                return "", "", "", "", "", where_time_goes(empty), None
            return past_run(lambda: studio.import_trace(path, studio.visitor(request.session_hash)), x)

        imported.change(do_import, [imported, h_tl_x], past_outputs, **PRIVATE)
        if studio.public.on:  # a visitor who leaves (tab closed, client gone: Gradio's heartbeat ends) leaves the line
            def gone(request: gr.Request):
                studio.jobs.cancel_session(request.session_hash)

            demo.unload(gone)
    if studio.public.on:  # one job per visitor, max_jobs in all, refused when they join (ssr_ui.jobs.CancelRoute)
        fns = frozenset(i for i, fn in demo.fns.items() if fn.api_name in ("run", "sweep", "benchmark"))
        studio.jobs.bounds = Bounds(fns, studio.public.max_jobs, studio.line.eta)
    return demo


def exit_mode_probes(mode: str, name: str, think, start, drafts, interval, k) -> dict | None:
    """SSR early exit picked with fewer drafts than must agree (it could never exit): the model's
    probes (``engine.presets.with_exit_probes``, the bench's and a Compare's rule) for Number of
    drafts and Draft interval, with the notice that says so; None when nothing is to change
    (another mode, enough drafts, or a box the run will name as bad). Nothing else the user set moves."""
    if mode != EXIT_MODE:
        return None
    try:
        cfg = RunConfig(max_think=_whole(think), draft_start=_whole(start), num_drafts=_whole(drafts),
                        draft_interval=_whole(interval), exit_k=_whole(k))
    except (TypeError, ValueError):  # a box the run will name as bad
        return None
    probed = with_exit_probes(cfg, name)
    if probed is cfg:
        return None
    changed = [f"{LABELS['num_drafts']} {cfg.num_drafts} -> {probed.num_drafts}"]
    if cfg.draft_interval != probed.draft_interval:
        changed.append(f"{LABELS['draft_interval']} {cfg.draft_interval} -> {probed.draft_interval}")
    return {"num_drafts": probed.num_drafts, "draft_interval": probed.draft_interval,
            "notice": f"SSR early exit stops when {cfg.exit_k} drafts agree ({LABELS['exit_k']}), so it needs at "
                      f"least {cfg.exit_k} drafts: {name}'s recommended probes: " + ", ".join(changed)}


def _timeline_box(empty: TraceView, elem_id: str) -> tuple[gr.HTML, gr.Radio]:
    """The timeline under a run's panes (and its x axis): every forward, its rows, the acceptance statistics."""
    with gr.Accordion("Timeline: where the time goes", open=True):
        x_axis = gr.Radio(list(X_MODES), value="time", label="Timeline x axis", elem_id=f"{elem_id}-x",
                          info="time: each bar spans its forward; forward: one slot per forward (a live run draws by time)")
        box = gr.HTML(where_time_goes(empty), label="timeline", js_on_load=TIMELINE_JS, elem_id=elem_id)
    return box, x_axis


def _draft_start_boxes(cfg: RunConfig) -> tuple[gr.Number, gr.Slider]:
    """Draft start's two controls, side by side: the number box the run reads (a typed value is sent
    as typed and refused by name when out of range) and a slider over its range (0..max think - 1)
    that moves the box. The slider's own number box is hidden (styles: ``#draft-slider``): it clamps
    what is typed when it loses focus, silently."""
    with gr.Row(elem_classes="draft-start-row"):
        box = _as_sent(gr.Number(value=cfg.draft_start, precision=0, label="Draft start (reasoning tokens)",
                                 elem_id="draft-start", info=_draft_start_info(cfg.max_think), scale=3, min_width=160))
        slider = gr.Slider(0, max(1, cfg.max_think - 1), value=cfg.draft_start, step=1, label="Draft start slider",
                           elem_id="draft-slider", scale=2, min_width=160, buttons=[], show_label=False)
    # dragging sets the box (in the browser, no round trip); the box sets the slider, drawn at its end when out of range
    slider.input(None, [slider], [box], js="(v) => Math.round(v)", **PRIVATE)
    box.change(None, [box], [slider], js="(v) => v", **PRIVATE)
    return box, slider


def draft_range(think) -> dict:
    """The draft-start slider's range for a Max think value: 0..max think - 1 (unchanged while Max
    think is not a whole number of at least 2: the run names the bad value)."""
    think = _whole(think)
    return gr.update(maximum=think - 1) if think is not None and think >= 2 else gr.update()


def _draft_start_info(max_think: int) -> str:
    """The draft-start box's range, in the words of the run's own check (``engine.config.rule``).
    A typed value is sent as typed and checked by the run, never clamped: a slider would send 599
    while showing 700."""
    return f"where the draft forks: {rule('draft_start', {'max_think': max_think})}"


def _whole(value) -> int | None:
    """A box's value as a whole number, or None (empty, or not a whole number: the run says why)."""
    try:
        return int(number("value", value, whole=True))
    except ValueError:
        return None


def _cell(column: str, value):
    if column == "flag":
        return str(value or "").split(" the median")[0]  # "slow: 3.1x" (the whole reason: compare.slow_runs)
    if column == "correct":
        return {1: "✓", 0: "✗"}.get(value, "")
    if column == "created_at" and isinstance(value, str):
        return value[:19].replace("T", " ")  # 2026-11-30 18:32:36
    return round(value, 3) if isinstance(value, float) else value


def _draft_picker(frame):
    """The draft picker for a frame: shown when iterative SSR wrote several drafts."""
    drafts = sorted(frame.view.drafts) if frame.view and not frame.view.steps else []
    return gr.update(choices=[(f"draft {d}", d) for d in drafts], value=drafts[-1] if drafts else None,
                     visible=len(drafts) > 1)
