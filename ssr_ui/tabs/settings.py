"""The Run tab's settings: draft start (a box and a slider), the draft-start sweep, the SSR and RSD
settings accordions; the order the run's API takes them in; and what happens on screen when one
of them (or the model, or the method) changes: budgets follow the model, draft start stays below
Max think, SSR early exit gets enough drafts. Every change says what it moved."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from engine.config import DRAFTING, LABELS, RunConfig, rule
from engine.methods.rsd.acceptance import WEIGHTINGS
from engine.presets import BUNDLED, PRESETS, with_exit_probes
from engine.runtime.compiled import COMPILE_MODES
from engine.runtime.fixed import ROUTES as EXACT_ROUTES
from engine.runtime.fixed import SHAPE as FIXED_SHAPE
from engine.runtime.gguf import REGISTRY as GGUF_REGISTRY
from ssr_ui.handlers import EXIT_MODE, MAX_REPEATS, Studio
from ssr_ui.tabs.common import PRIVATE, as_sent, whole

# The run's settings in the order of its API parameters (after prompt, method, model): written once,
# the inputs the run reads and the parameters a client passes both come from it.
RUN_SETTINGS = ("draft_start", "max_think", "max_draft", "max_answer", "num_drafts", "draft_interval",
                "suffix_recovery", "context_lookup", "temperature", "seed", "draft_model", "prm", "threshold",
                "weighting", "weight_param", "think_spec", "exact", "exact_route", "draft_confidence", "compile",
                "exit_k", "exit_min_think", "exit_confidence", "drafting", "runtime")
# not RunConfig fields: "" means the studio's default (the runtime's: transformers)
MODEL_NAMES = {"draft_model": "", "prm": "", "runtime": ""}
RSD_ONLY = ("threshold", "weighting", "weight_param", "draft_confidence")  # settings only RSD reads
BUDGETS = ("max_think", "max_draft", "max_answer", "draft_start")  # what a model's presets recommend


@dataclass
class SweepBox:
    """The draft-start sweep's controls: its range, its button, its status and chart."""

    start: gr.Number
    stop: gr.Number
    step: gr.Number
    button: gr.Button
    status: gr.HTML
    plot: gr.Plot


# ----------------------------------------------------------------------------- builders

def draft_start_boxes(cfg: RunConfig) -> tuple[gr.Number, gr.Slider]:
    """Draft start's two controls, side by side: the number box the run reads (a typed value is sent
    as typed and refused by name when out of range) and a slider over its range (0..max think - 1)
    that moves the box. The slider's own number box is hidden (styles: ``#draft-slider``): it clamps
    what is typed when it loses focus, silently."""
    with gr.Row(elem_classes="draft-start-row"):
        box = as_sent(gr.Number(value=cfg.draft_start, precision=0, label="Draft start (reasoning tokens)",
                                elem_id="draft-start", info=draft_start_info(cfg.max_think), scale=3, min_width=160))
        slider = gr.Slider(0, max(1, cfg.max_think - 1), value=cfg.draft_start, step=1, label="Draft start slider",
                           elem_id="draft-slider", scale=2, min_width=160, buttons=[], show_label=False)
    # dragging sets the box (in the browser, no round trip); the box sets the slider, drawn at its end when out of range
    slider.input(None, [slider], [box], js="(v) => Math.round(v)", **PRIVATE)
    box.change(None, [box], [slider], js="(v) => v", **PRIVATE)
    return box, slider


def sweep_box(cfg: RunConfig) -> SweepBox:
    """The "Draft-start sweep" accordion: From, To, Step (from the model's draft start), its button,
    status and chart."""
    with gr.Accordion("Draft-start sweep", open=False):
        gr.Markdown("One baseline run, then SSR at each draft start, with every SSR setting and the numerics "
                    "set below (drafts, interval, lookups, suffix recovery, exact, compiled steps).")
        with gr.Row():
            start = as_sent(gr.Number(value=0, precision=0, label="From"))
            stop = as_sent(gr.Number(value=min(cfg.max_think - 1, 4 * cfg.draft_start or 200), precision=0, label="To"))
            step = as_sent(gr.Number(value=max(1, cfg.draft_start // 2 or 20), precision=0, label="Step"))
            button = gr.Button("Sweep draft start")
        status = gr.HTML(label="sweep status")
        plot = gr.Plot(label="Sweep", show_label=False)
    return SweepBox(start, stop, step, button, status, plot)


def ssr_settings(cfg: RunConfig) -> dict[str, gr.Component]:
    """The "SSR settings" accordion: budgets and Compare repeats, drafts and lookups, numerics, early
    exit; keyed by the run's parameter names."""
    with gr.Accordion("SSR settings", open=False):
        with gr.Row():
            shown = {"compare_repeats": as_sent(gr.Number(
                value=1, precision=0, label="Compare repeats", elem_id="compare-repeats",
                info=f"Compare: its runs this many times (1..{MAX_REPEATS}), each run's ratio to baseline the "
                     "median of its rounds, their spread shown"))}
            shown["max_think"] = as_sent(gr.Number(value=cfg.max_think, precision=0, label="Max think",
                                                   elem_id="max-think"))
            shown["max_draft"] = as_sent(gr.Number(value=cfg.max_draft, precision=0, label="Max draft"))
            shown["max_answer"] = as_sent(gr.Number(value=cfg.max_answer, precision=0, label="Max answer"))
        shown |= _drafts_row(cfg)
        shown |= _numerics_row(cfg)
        shown |= _exit_row(cfg)
    return shown


def _drafts_row(cfg: RunConfig) -> dict[str, gr.Component]:
    with gr.Row():
        return {
            "num_drafts": as_sent(gr.Number(value=cfg.num_drafts, precision=0, label="Number of drafts",
                                            elem_id="num-drafts")),
            "draft_interval": as_sent(gr.Number(value=cfg.draft_interval, precision=0, label="Draft interval",
                                                elem_id="draft-interval")),
            "suffix_recovery": gr.Checkbox(value=cfg.suffix_recovery, label="Suffix recovery"),
            "context_lookup": gr.Checkbox(value=cfg.context_lookup, label="Context lookup"),
            "think_spec": as_sent(gr.Number(
                value=cfg.think_spec, precision=0, label="Reasoning lookup",
                info="most lookup tokens a row verifies per reasoning step (the main row: as many as pay on this "
                     "model, by their acceptance and what a wider forward costs; 0: one token per step, as in "
                     "the paper)")),
            "drafting": gr.Radio(list(DRAFTING), value=cfg.drafting, label=LABELS["drafting"], elem_id="drafting",
                                 info="auto: SSR forks its drafts only where they have paid on this model "
                                      "(their batch cost against the forwards they saved); always: as planned"),
        }


def _numerics_row(cfg: RunConfig) -> dict[str, gr.Component]:
    with gr.Row():
        return {
            # number boxes, not sliders: a slider's box clamps what is typed (5 became 2)
            "temperature": as_sent(gr.Number(value=cfg.temperature, label="Temperature", info=rule("temperature"),
                                             elem_id="temperature")),
            # a text box: a browser's number holds 2**53 exactly at most, a seed goes to 2**63 - 1
            "seed": as_sent(gr.Textbox(value=str(cfg.seed), label="Seed", max_lines=1, info=rule("seed"))),
            "exact": gr.Checkbox(value=cfg.exact, label="Exact mode",
                                 info="batch- and width-invariant forwards: bitwise the same answer, slower"),
            # the run's last API parameters (after thinking): older callers are unaffected
            "reproducible": gr.Checkbox(value=cfg.reproducible, label=LABELS["reproducible"], elem_id="reproducible",
                                        info="SSR's widths and drafting fixed from the model's stored evidence "
                                             "as the run starts: two runs give the same tokens and counts"),
            "exact_route": gr.Radio(list(EXACT_ROUTES), value=cfg.exact_route, label="Exact route",
                                    info=f"rows: the per-row reference; fixed: every step one padded "
                                         f"{FIXED_SHAPE} shape (for GPUs: a CPU pays for every padded "
                                         "token); auto: fixed on CUDA"),
            "compile": gr.Radio(list(COMPILE_MODES), value=cfg.compile, label="Compiled steps",
                                info="fixed-shape steps through torch.compile (auto: on CUDA); "
                                     "compiled once per model and shape, before the run"),
        }


def _exit_row(cfg: RunConfig) -> dict[str, gr.Component]:
    with gr.Row():  # SSR early exit (lossy): its probes are the drafts set above
        return {
            "exit_k": as_sent(gr.Number(
                value=cfg.exit_k, precision=0, label=LABELS["exit_k"], elem_id="exit-k",
                info=f"SSR early exit: stop reasoning once this many consecutive finished drafts agree on "
                     f"the answer; {rule('exit_k')}")),
            "exit_min_think": as_sent(gr.Number(
                value=cfg.exit_min_think, precision=0, label=LABELS["exit_min_think"], elem_id="exit-min-think",
                info=f"SSR early exit: never stop before this many reasoning tokens; {rule('exit_min_think')}")),
            "exit_confidence": as_sent(gr.Number(
                value=cfg.exit_confidence, label=LABELS["exit_confidence"], elem_id="exit-confidence",
                info=f"SSR early exit: and only when the agreeing drafts' mean token probability reaches "
                     f"this; {rule('exit_confidence')}")),
        }


def rsd_settings(studio: Studio, cfg: RunConfig) -> dict[str, gr.Component]:
    """The "RSD settings" accordion: the draft and reward models, the acceptance rule; keyed by the
    run's parameter names."""
    with gr.Accordion("RSD settings", open=False):
        with gr.Row():
            shown = {"draft_model": gr.Textbox(value=studio.default_draft, label="Draft model"),
                     "prm": gr.Textbox(value=studio.default_prm, label="Process reward model",
                                       info="math-shepherd format, or 'target-likelihood' (no PRM)")}
        with gr.Row():
            shown["threshold"] = as_sent(gr.Number(value=cfg.threshold, label="Threshold", elem_id="threshold",
                                                   info=f"binary rule: keep a draft step scored at least this; "
                                                        f"{rule('threshold')}"))
            shown["weighting"] = gr.Dropdown(list(WEIGHTINGS), value=cfg.weighting, label="Weighting")
            shown["weight_param"] = as_sent(gr.Number(value=cfg.weight_param,
                                                      label="Weight parameter (constant p, logistic a)"))
            shown["draft_confidence"] = as_sent(gr.Number(
                value=cfg.draft_confidence, label="Draft doubt",
                info="also rewrite a step whose least likely draft token is below this (0: off, the paper's rule)"))
    return shown


# ----------------------------------------------------------------------------- what a change moves

def draft_start_info(max_think: int) -> str:
    """The draft-start box's range, in the words of the run's own check (``engine.config.rule``).
    A typed value is sent as typed and checked by the run, never clamped: a slider would send 599
    while showing 700."""
    return f"where the draft forks: {rule('draft_start', {'max_think': max_think})}"


def draft_range(think) -> dict:
    """The draft-start slider's range for a Max think value: 0..max think - 1 (unchanged while Max
    think is not a whole number of at least 2: the run names the bad value)."""
    think = whole(think)
    return gr.update(maximum=think - 1) if think is not None and think >= 2 else gr.update()


def think_typed(think) -> dict:
    """While Max think is typed, key by key: the draft-start box's stated range follows it,
    its value never moves ("1", the first key of "1200", is not Max think yet)."""
    think = whole(think)
    return gr.update(info=draft_start_info(think)) if think is not None and think >= 1 else gr.update()


def think_changed(think, start) -> dict:
    """Max think moved: the draft-start box's range follows it; its value stays unless it
    falls out of range, and then a notice says what it became (nothing changes silently)."""
    think, start = whole(think), whole(start)
    if think is None or think < 1:
        return gr.update()  # the run names the bad Max think
    info = draft_start_info(think)
    if start is not None and not 0 <= start < think:
        gr.Info(f"Draft start {start} -> {think - 1}: it must stay below Max think ({think})")
        return gr.update(value=think - 1, info=info)
    return gr.update(info=info)


def missing_path(name: str) -> str | None:
    """Why a typed model name names nothing here: a local path (starting with /, ./, ../ or ~, or a
    .gguf file not in the HUB_ID:FILE.gguf form) that does not exist; None for anything else (a known
    name, a Hub id: the run loads it and says what went wrong)."""
    name = (name or "").strip()
    if not name or name in GGUF_REGISTRY or name in PRESETS or name in BUNDLED:
        return None
    local = name.startswith(("/", "./", "../", "~")) or (name.lower().endswith(".gguf") and ":" not in name)
    return f"{name}: no such file or folder here" if local and not Path(name).expanduser().exists() else None


def recommended_budgets(studio: Studio, name: str, *shown) -> tuple:
    """Another model picked: its recommended budgets and draft start (``BUDGETS``: its presets,
    fitted to its context, from ``studio.config``) replace ``shown``, and a notice lists what
    changed. A path that does not exist changes nothing (a warning says so), nor does a name the
    studio refuses."""
    if why := missing_path(name):
        gr.Warning(f"{why}: the settings on screen are kept")
        return tuple(gr.update() for _ in shown)
    try:
        c = studio.config(name)
    except ValueError:
        return tuple(gr.update() for _ in shown)
    new = [getattr(c, f) for f in BUDGETS]
    changed = [f"{LABELS[f]} {whole(old)} -> {value}" for f, old, value in zip(BUDGETS, shown, new, strict=True)
               if whole(old) != value]
    if changed:
        gr.Info(f"{name}'s recommended settings: " + ", ".join(changed))
    return (*new[:3], gr.update(value=new[3], info=draft_start_info(c.max_think)))


def exit_mode_probes(mode: str, name: str, think, start, drafts, interval, k) -> dict | None:
    """SSR early exit picked with fewer drafts than must agree (it could never exit): the model's
    probes (``engine.presets.with_exit_probes``, the bench's and a Compare's rule) for Number of
    drafts and Draft interval, with the notice that says so; None when nothing is to change
    (another mode, enough drafts, or a box the run will name as bad). Nothing else the user set moves."""
    if mode != EXIT_MODE:
        return None
    try:
        cfg = RunConfig(max_think=whole(think), draft_start=whole(start), num_drafts=whole(drafts),
                        draft_interval=whole(interval), exit_k=whole(k))
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


def probes_on_screen(studio: Studio, mode: str, name: str, think, start, drafts, interval, k) -> tuple:
    """Method changed: Number of drafts and Draft interval as :func:`exit_mode_probes` sets them
    (a notice says so), or both unchanged; a shared studio's vet refuses a name off its list before
    it reaches a path (nothing changes)."""
    try:
        studio.vet(name)
    except ValueError:
        return gr.update(), gr.update()
    probes = exit_mode_probes(mode, name or studio.default_model, think, start, drafts, interval, k)
    if probes is None:
        return gr.update(), gr.update()
    gr.Info(probes["notice"])
    return probes["num_drafts"], probes["draft_interval"]


# ----------------------------------------------------------------------------- wiring

def wire(studio: Studio, method: gr.Radio, model: gr.Dropdown, settings: dict, slider: gr.Slider) -> None:
    """Method, Model and Max think changed: what the settings on screen follow (``settings``: the
    run's controls by parameter name; ``slider``: draft start's)."""
    def mode_probes(mode, name, think, start, drafts, interval, k):
        return probes_on_screen(studio, mode, name, think, start, drafts, interval, k)

    def model_budgets(name, *shown):
        return recommended_budgets(studio, name, *shown)

    s = settings
    method.change(mode_probes, [method, model, s["max_think"], s["draft_start"], s["num_drafts"], s["draft_interval"],
                                s["exit_k"]], [s["num_drafts"], s["draft_interval"]], **PRIVATE)
    budget_boxes = [s[name] for name in BUDGETS]
    model.change(model_budgets, [model, *budget_boxes], budget_boxes, **PRIVATE)
    max_think, draft_start = s["max_think"], s["draft_start"]
    max_think.input(think_typed, [max_think], [draft_start], **PRIVATE)
    max_think.change(draft_range, [max_think], [slider], **PRIVATE)  # typed or set by a model's budgets
    for done_typing in (max_think.submit, max_think.blur):  # typing done: an out-of-range value moves, said
        done_typing(think_changed, [max_think, draft_start], [draft_start], **PRIVATE)
