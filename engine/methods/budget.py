"""Budget forcing, written once for every loop that reasons (in process and over a server).

The reasoning gets ``max_think`` tokens, the end-of-thinking marker included (the studio's and
the run log's reasoning count): the model picks at most ``max_think - 1`` (:attr:`ThinkBudget.picks`),
and the token after them is not the model's: it is the marker, and the template's tail after the
marker (``ThinkMarkers.close_ids[1:]``, e.g. the blank line before the answer) is forced in with it
and opens the answer. A model that closes its thoughts by itself within the budget forces nothing.

Example (``max_think`` 3; the model would think on)::

    budget = ThinkBudget(markers, 3)
    budget.spent(1)   # False: the model picks reasoning token 2
    budget.spent(2)   # True: reasoning token 3, the last of the budget, is the forced marker
    budget.force()    # markers.close_id; budget.forced == list(markers.close_ids[1:])
    yield from budget.open_answer(rec)  # the "answer" phase, then the forced tail as answer tokens
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.events import Event
from engine.methods.recorder import Recorder
from engine.runtime.model import ThinkMarkers


@dataclass
class ThinkBudget:
    """One run's reasoning budget: when to force the end of thinking, and what it forced."""

    markers: ThinkMarkers | None  # None: a model without think markers (its whole output is the answer)
    max_think: int
    forced: list[int] = field(default_factory=list)  # the tail forced after the marker, once force() ran

    @property
    def picks(self) -> int:
        """Reasoning tokens the model may pick itself: the budget's last token is the marker."""
        return max(self.max_think - 1, 0)

    def spent(self, thought: int) -> bool:
        """Whether ``thought`` reasoning tokens use the model's share up, so that the next one (the
        ``max_think``-th at most) is the forced marker."""
        return thought >= self.picks

    def force(self) -> int:
        """The end-of-thinking marker, in place of the model's own token; the template tail after
        it is kept in :attr:`forced`, to be fed with the marker and to open the answer."""
        assert self.markers is not None, "budget forcing needs think markers"
        self.forced = list(self.markers.close_ids[1:])
        return self.markers.close_id

    def open_answer(self, rec: Recorder) -> Iterator[Event]:
        """The answer phase, opened with the forced tail (no tokens when nothing was forced)."""
        yield rec.phase("answer")
        for t in self.forced:
            yield rec.token("answer", t)
