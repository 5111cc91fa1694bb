"""One UI update of the studio: the three panes, the metrics strip and what the page keeps of it."""

from __future__ import annotations

from dataclasses import dataclass

from ssr_ui.render import TraceView, html_note
from ssr_ui.timeline import stats_html, timeline_html


@dataclass
class Frame:
    """One UI update: the three panes, the metrics strip and (after Compare) a chart plus every
    compared run's own final frame, so the UI can switch the panes between them."""

    reasoning: str
    draft: str
    answer: str
    metrics: str
    chart: object = None
    view: TraceView | None = None  # the run as folded so far (lets the UI re-render one draft)
    runs: dict[str, Frame] | None = None  # after Compare: each run's final frame, by mode name
    prompt: str = ""  # a past run's prompt (History)
    timeline: str | None = None  # the timeline and the acceptance statistics; None: unchanged since the last frame

    @classmethod
    def of(cls, view: TraceView, metrics: str, chart=None, timeline: bool = True) -> Frame:
        """The frame of ``view``; ``timeline``: draw the timeline too (a stream draws it less often)."""
        return cls(view.reasoning_html(), view.draft_html(), view.answer_html(), metrics, chart, view,
                   timeline=where_time_goes(view) if timeline else None)

    @classmethod
    def note(cls, message: str) -> Frame:
        """Empty panes and a status line (loading, waiting)."""
        return cls.of(TraceView(), html_note(message))

    def as_tuple(self):
        return self.reasoning, self.draft, self.answer, self.metrics, self.chart


def where_time_goes(view: TraceView, x: str = "time") -> str:
    """The timeline (x: "time" or "forward") and, under it, the time split and acceptance statistics."""
    return timeline_html(view, x) + stats_html(view)
