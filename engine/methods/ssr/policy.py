"""Cost-aware drafting: SSR forks its drafts where they have paid on the loaded model, and says why.

A draft rides in the reasoning's batch, and every forward it rides in costs more than a lone step
(``RunStats.drafting_s``: each forward that carried drafts, less the run's median lone reasoning
forward, from the forwards' own timings). It pays back in the answer phase: each token a draft's
proposal got accepted that the context lookup would not have proposed at that step is one forward
fewer (``RunStats.draft_saved``), worth one lone step (``RunStats.step_s_alone``). Neither is
known before the run: SSR learns them on the model, as transformers' assisted generation keeps
its draft-length schedule on the assistant model between calls.

The :class:`Ledger` (one per loaded model and numerics route, kept on the model object across its
runs, as the capability probe's results are; a shared studio keeps one per visitor:
:func:`kept_apart`) holds the last :data:`WINDOW` SSR runs that drafted: what their drafts cost
and saved, in seconds. Before a run, :func:`plan` decides (``drafting``
``"auto"``):

* no run with drafts on this model yet: fork as planned (this run measures);
* the drafts saved at least what they cost, summed over the window: fork as planned;
* they cost more: fork none (SSR runs on its lookups alone, the ``ssr-lookups`` ablation's
  loop), and say so with the numbers; every :data:`RECHECK` runs, fork as planned again, to
  measure anew (the prompts change what drafts are worth).

``drafting="always"`` forks as planned whatever the ledger holds. Which drafts are forked never
changes a token of the reasoning or the answer (the main row decodes as plain decoding does):
only the time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from engine.config import RunConfig
from engine.events import RunStats

WINDOW = 8  # drafted runs the ledger weighs
RECHECK = 8  # after drafts were turned off, every RECHECK-th SSR run drafts again to measure


@dataclass(frozen=True)
class DraftPlan:
    drafts: int  # the drafts this run forks
    why: str  # the decision in words, with its numbers ("" when drafting is "always")


@dataclass
class Ledger:
    """What drafts cost and saved in the last :data:`WINDOW` drafted SSR runs of one model and route."""

    runs: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # (cost s, saved s, forwards saved)
    undrafted: int = 0  # SSR runs since the last one that drafted

    def record(self, stats: RunStats, planned: int) -> None:
        """A finished SSR run: a drafted one joins the window, an undrafted one is counted."""
        if planned and stats.drafts:
            step = stats.step_s_alone or (stats.answer_s / stats.answer_forwards if stats.answer_forwards else 0.0)
            self.runs.append((stats.drafting_s, stats.draft_saved * step, stats.draft_saved))
            self.undrafted = 0
        else:
            self.undrafted += 1

    def totals(self) -> tuple[float, float, int]:
        """(cost s, saved s, forwards saved) over the window."""
        return (sum(r[0] for r in self.runs), sum(r[1] for r in self.runs), sum(r[2] for r in self.runs))


def ledger(lm, cfg: RunConfig) -> Ledger:
    """``lm``'s ledger for ``cfg``'s numerics route (exact mode's route, compiled steps: they change
    what a row costs)."""
    ledgers = lm.__dict__.setdefault("_draft_ledgers", {})
    return ledgers.setdefault((cfg.exact_mode, cfg.compile), Ledger())


@contextmanager
def kept_apart(lm, ledgers: dict) -> Iterator[None]:
    """Runs of ``lm`` inside read and write ``ledgers`` (route -> :class:`Ledger`) instead of the
    model's own: a shared studio keeps one set per visitor, so no visitor's runs decide, or show up
    in the numbers of, another's. The caller holds the model for the whole block (no other run of
    ``lm`` may interleave)."""
    saved = lm.__dict__.get("_draft_ledgers")
    lm._draft_ledgers = ledgers
    try:
        yield
    finally:
        if saved is None:
            del lm._draft_ledgers
        else:
            lm._draft_ledgers = saved


def plan(book: Ledger, cfg: RunConfig) -> DraftPlan:
    """The drafts an SSR run with ``cfg`` forks, and why (see the module's rules)."""
    planned = cfg.num_drafts
    if cfg.drafting == "always":
        return DraftPlan(planned, "")
    if not book.runs:
        return DraftPlan(planned, "as planned: no run with drafts on this model yet, so this one measures them")
    cost, saved, forwards = book.totals()
    n = len(book.runs)
    said = (f"in the last {n} run{'s' if n != 1 else ''} with drafts on this model they cost {cost:.2f} s beyond "
            f"lone reasoning steps and saved {saved:.2f} s ({forwards} answer forward{'s' if forwards != 1 else ''} "
            "no lookup would have saved)")
    if saved >= cost:
        return DraftPlan(planned, f"as planned: {said}")
    if book.undrafted + 1 >= RECHECK:
        return DraftPlan(planned, f"as planned, to measure again ({RECHECK - 1} runs without): {said}")
    left = RECHECK - 1 - book.undrafted
    return DraftPlan(0, f"none of {planned}: {said}; so this run used lookups alone (drafts measured again in "
                        f"{left} run{'s' if left != 1 else ''}; Drafting: always forks them)")
