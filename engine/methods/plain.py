"""Plain decoding's rules, as a text that grows pick by pick: the one walker of them that plain decoding
(``engine.methods.baseline``) and classic speculative decoding (``engine.methods.sd``) share, so a
method that verifies several picks at once writes the text a one-token loop writes, budgets included.

The rules, in the order they are applied to each pick: in the reasoning, at its budget nothing is drawn
and the end-of-thinking marker is forced (then the template's tail, which opens the answer); an end of
sequence the model writes ends the run where the budget says it does (``ThinkBudget.ends_run``), and a
prompted model's end of turn closes its reasoning (forced marker); the model's own close opens the
answer. In the answer, an end of sequence or ``max_answer`` ends the run.

>>> text = PlainText(prompt_ids, ThinkBudget.of(lm.markers, cfg), lm.eos_ids, cfg.max_answer)
>>> taken = text.take([pick])  # or one verify's picks: joined up to the first a rule stops at
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.methods.budget import ThinkBudget


@dataclass(frozen=True)
class Taken:
    """What one call's picks (a verify's, or plain decoding's one) did to the text."""

    stream: str  # where the kept picks went: "reasoning" or "answer"
    kept: int  # picks that joined the text, in order (those after them are dropped)
    forced: list[int] = field(default_factory=list)  # the end-of-thinking marker forced after them...
    tail: list[int] = field(default_factory=list)  # ...and the template's tail after it, which opens the answer
    opened: bool = False  # the reasoning closed here (by the model or the budget): the answer opens


class PlainText:
    """The run's text as plain decoding writes it, pick by pick, for picks that come one at a time
    (``decode_baseline``) or several (one verify's accepted tokens and the target's own: ``sd``)."""

    def __init__(self, ids: list[int], budget: ThinkBudget, eos_ids: frozenset[int], max_answer: int) -> None:
        self.ids = ids  # the prompt, then every token of the run
        self.budget, self.eos_ids, self.max_answer = budget, eos_ids, max_answer
        self.reasoning: list[int] = []
        self.answered = 0  # answer tokens, the forced tail included
        self.stream = "reasoning" if budget.markers is not None else "answer"
        self.ended = False  # an end of sequence, or the answer's budget spent: nothing more to write

    @property
    def room(self) -> int:
        """Picks the model may still make in the current stream before a rule decides instead."""
        if self.stream == "reasoning":
            return self.budget.picks - len(self.reasoning)
        return self.max_answer - self.answered

    def take(self, picks: list[int], ahead: bool = True) -> Taken:
        """Add the target's ``picks`` in order, each by the rule plain decoding applies to it, up to the
        first a rule stops at (a close, a forced marker, an end of sequence, a budget). ``ahead``: picks
        that spend the reasoning's budget force the marker now (a verify's picks: the marker needs no
        further pick); False forces it at the next call, with no pick (a one-token loop reads the last
        pick's logits first, as plain decoding always has)."""
        stream = self.stream
        for n, tok in enumerate(picks):
            if stream == "answer":
                if tok in self.eos_ids:
                    self.ended = True
                    return Taken(stream, n)
                self.ids.append(tok)
                self.answered += 1
                if self.answered == self.max_answer:
                    self.ended = True
                    return Taken(stream, n + 1)
                continue
            if self.budget.spent(len(self.reasoning)):  # the budget's last tokens are the marker: this pick is not drawn
                return self._force(n)
            if self.budget.ends_run(tok, self.eos_ids):
                self.ended = True
                return Taken(stream, n)
            if tok in self.eos_ids:  # a prompted model's end of turn closes its reasoning
                return self._force(n)
            self.ids.append(tok)
            self.reasoning.append(tok)
            if self.budget.markers.closes_at(self.reasoning, len(self.reasoning) - 1):
                self._open()
                return Taken(stream, n + 1, opened=True)
        if stream == "reasoning" and (ahead or not picks) and self.budget.spent(len(self.reasoning)):  # the marker
            return self._force(len(picks))
        return Taken(stream, len(picks))

    def _force(self, kept: int) -> Taken:
        marker = self.budget.force()
        self.ids += [*marker, *self.budget.forced]
        self.reasoning += marker
        self._open()
        return Taken("reasoning", kept, marker, list(self.budget.forced), opened=True)

    def _open(self) -> None:
        self.stream = "answer"
        self.answered = len(self.budget.forced)
        self.ended = self.answered >= self.max_answer
