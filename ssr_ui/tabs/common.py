"""What every tab uses: the plumbing marker, inputs handed on as sent, whole numbers, the timeline box."""

from __future__ import annotations

import gradio as gr

from engine.config import number
from ssr_ui.frame import where_time_goes
from ssr_ui.render import TraceView
from ssr_ui.timeline import TIMELINE_JS, X_MODES

PRIVATE = dict(api_visibility="private")  # UI plumbing, not part of the API
# picks: the last one clicked is what shows (gradio's default, "once", drops a click made while the
# previous pick is still being drawn, leaving the radio on one run and the panes on another)
PICKED = dict(PRIVATE, trigger_mode="always_last")


def as_sent(component):
    """Hand the component's value to the handler unconverted: the handler validates every value
    with a message naming the field (Gradio's own conversion fails with a generic error)."""
    component.preprocess = lambda payload: payload
    return component


def whole(value) -> int | None:
    """A box's value as a whole number, or None (empty, or not a whole number: the run says why).

    >>> whole("12"), whole(12.0), whole("1.5"), whole("")
    (12, 12, None, None)
    """
    try:
        return int(number("value", value, whole=True))
    except ValueError:
        return None


def timeline_box(empty: TraceView, elem_id: str) -> tuple[gr.HTML, gr.Radio]:
    """The timeline under a run's panes (and its x axis): every forward, its rows, the acceptance statistics."""
    with gr.Accordion("Timeline: where the time goes", open=True):
        x_axis = gr.Radio(list(X_MODES), value="time", label="Timeline x axis", elem_id=f"{elem_id}-x",
                          info="time: each bar spans its forward; forward: one slot per forward (a live run draws by time)")
        box = gr.HTML(where_time_goes(empty), label="timeline", js_on_load=TIMELINE_JS, elem_id=elem_id)
    return box, x_axis


def redraw_timeline(view: TraceView | None, x: str) -> str:
    """The timeline of the run shown (``view``; None: none yet, the empty timeline) on x axis ``x``."""
    return where_time_goes(view or TraceView(), x)


def wire_timeline_axis(box: gr.HTML, x_axis: gr.Radio, view: gr.State) -> None:
    """Another x axis picked: the timeline of the run in ``view`` is drawn again on it."""
    x_axis.input(redraw_timeline, [view, x_axis], [box], **PICKED)
