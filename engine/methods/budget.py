"""Budget forcing, written once for every loop that reasons (in process and over a server).

The reasoning gets ``max_think`` tokens, the end-of-thinking marker included (the studio's and
the run log's reasoning count): the model picks at most ``max_think - k`` (:attr:`ThinkBudget.picks`,
``k`` the marker's tokens: 1 for a marker token, 3 for ``</think>`` as text on SmolLM2), and the
tokens after them are not the model's: they are the marker, and the template's tail after it
(``ThinkMarkers.tail_ids``, e.g. the blank line before the answer) is forced in with it and opens
the answer. A model that closes its thoughts by itself within the budget forces nothing. A prompted model
(``ThinkMarkers.prompted``) that ends its turn inside its reasoning has the end of thinking forced
there too (:meth:`ThinkBudget.ends_run`), so that it answers.

Example (``max_think`` 3, a one-token marker; the model would think on)::

    budget = ThinkBudget(markers, 3)
    budget.spent(1)   # False: the model picks reasoning token 2
    budget.spent(2)   # True: reasoning token 3, the last of the budget, is the forced marker
    budget.force()    # list(markers.marker_ids); budget.forced == list(markers.tail_ids)
    yield from budget.open_answer(rec)  # the "answer" phase, then the forced tail as answer tokens
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from engine.config import RunConfig
from engine.events import Event
from engine.methods.recorder import Recorder
from engine.runtime.model import ThinkMarkers


def budget_cut(reasoning: int, answer: int, max_think: int, max_answer: int, rsd: bool = False) -> str:
    """Which budget cut a run of ``reasoning`` and ``answer`` tokens (``RunStats.cut``; the studio
    asks it of a run still streaming too): "" (it ended by itself), "reasoning" (the end of
    thinking forced at ``max_think``), "answer" (stopped at ``max_answer`` before its end of
    sequence), "reasoning, answer", or for the RSD family (one budget for the whole response)
    "response". Exact, not a guess: the model picks at most ``max_think - k`` reasoning tokens
    (:attr:`ThinkBudget.picks`), so a reasoning of ``max_think`` tokens always ends in a forced
    marker (and a model without think markers writes no reasoning); an answer stops at
    ``max_answer`` without drawing its end of sequence."""
    if rsd:
        return "response" if reasoning + answer >= max_think + max_answer else ""
    return ", ".join(part for part, hit in (("reasoning", reasoning >= max_think), ("answer", answer >= max_answer))
                     if hit)


def cut_parts(cut: str | None) -> list[str]:
    """:func:`budget_cut`'s words read back: its parts ("reasoning", "answer", "response"; none when nothing was
    cut)."""
    return [p.strip() for p in (cut or "").split(",") if p.strip()]


@dataclass
class ThinkBudget:
    """One run's reasoning budget: when to force the end of thinking, and what it forced."""

    markers: ThinkMarkers | None  # None: a model without think markers (its whole output is the answer)
    max_think: int
    forced: list[int] = field(default_factory=list)  # the tail forced after the marker, once force() ran

    @classmethod
    def of(cls, markers: ThinkMarkers | None, cfg: RunConfig) -> ThinkBudget:
        """A run's budget: ``cfg.max_think`` with the model's ``markers``; with thinking off (``cfg.thinking``
        False: the prompt asked for the answer alone, ``chat_prompt_ids``) no reasoning: no markers, no
        reasoning tokens, so a loop goes from the prompt straight to the answer."""
        return cls(markers, cfg.max_think) if cfg.thinking else cls(None, 0)

    def __post_init__(self) -> None:
        if self.markers is not None and self.max_think < len(self.markers.marker_ids):
            raise ValueError(f"max_think={self.max_think} must be at least {len(self.markers.marker_ids)} on this model: "
                             f"its end-of-thinking marker is {len(self.markers.marker_ids)} tokens")

    def new_tokens(self, max_answer: int) -> int:
        """The most tokens a run writes after its prompt: the reasoning, the forced marker's tail
        and ``max_answer`` answer tokens (the cache and context-window room every loop asks for)."""
        return self.max_think + max_answer + (len(self.markers.close_ids) if self.markers else 0)

    @property
    def picks(self) -> int:
        """Reasoning tokens the model may pick itself: the budget's last tokens are the marker."""
        return max(self.max_think - (len(self.markers.marker_ids) if self.markers else 1), 0)

    def spent(self, thought: int) -> bool:
        """Whether ``thought`` reasoning tokens use the model's share up, so that the next one (the
        ``max_think``-th at most) is the forced marker."""
        return thought >= self.picks

    def ends_run(self, tok: int | None, eos_ids: frozenset[int]) -> bool:
        """Whether the model's reasoning token ``tok`` ends the run with no answer: an end of
        sequence, except on a prompted model (``ThinkMarkers.prompted``), whose end of turn inside
        its reasoning is taken as its end of thinking: :meth:`force` feeds the marker and the tail
        in its place and the model answers (a chat model asked to reason often ends its turn
        without writing ``</think>``). One rule, for every method that reasons."""
        return tok in eos_ids and not self.markers.prompted

    def force(self) -> list[int]:
        """The end-of-thinking marker's tokens, in place of the model's own; the template tail after
        it is kept in :attr:`forced`, to be fed with the marker and to open the answer."""
        assert self.markers is not None, "budget forcing needs think markers"
        self.forced = list(self.markers.tail_ids)
        return list(self.markers.marker_ids)

    def open_answer(self, rec: Recorder) -> Iterator[Event]:
        """The answer phase, opened with the forced tail (no tokens when nothing was forced)."""
        yield rec.phase("answer")
        for t in self.forced:
            yield rec.token("answer", t)
