"""Cost-aware drafting: SSR forks its drafts where they have paid on the loaded model, and says why.

A draft rides in the reasoning's batch, and every forward it rides in costs more than a lone step
(``RunStats.drafting_s``: each forward that carried drafts, less the run's median lone reasoning
forward, from the forwards' own timings). It pays back in the answer phase: each token a draft's
proposal got accepted that the context lookup would not have proposed at that step is one forward
fewer (``RunStats.draft_saved``), worth one lone step (``RunStats.step_s_alone``). Neither is
known before the run: SSR learns them on the model, as transformers' assisted generation keeps
its draft-length schedule on the assistant model between calls.

The :class:`Ledger` (one per loaded model and numerics route, in the model's evidence store,
``engine.methods.ssr.evidence``; a shared studio passes a store with each visitor's own: ``Evidence.apart``) holds
the last :data:`WINDOW` warm SSR runs that drafted, whatever their ``drafting``: what their drafts
cost and saved, in seconds, and each run's pace. A cold run (its kind's first) is never entered; a
run flagged slow against the route's other recent runs (``evidence.slow``: the run log's rule) is
left out of each decision that reads the window while it stands flagged. Before a run, :func:`plan`
decides (``drafting`` ``"auto"``), from the window's runs not left out:

* none: fork as planned (this run measures);
* the drafts saved at least what they cost, summed over them: fork as planned;
* they cost more: fork none (SSR runs on its lookups alone, the ``ssr-lookups`` ablation's
  loop), and say so with the numbers; every :data:`RECHECK` runs, fork as planned again, to
  measure anew (the prompts change what drafts are worth).

``drafting="always"`` forks as planned whatever the ledger holds (and its runs feed it). The words
(``DraftPlan.why``) say what evidence decided: how many runs, how old, how many left out and why. A
reproducible run (``RunConfig.reproducible``) plans once from the ledger as it stands and feeds it
nothing. Which drafts are forked never changes a token of the reasoning or the answer (the main
row decodes as plain decoding does): only the time.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

from engine.config import RunConfig
from engine.events import RunStats
from engine.methods.ssr.evidence import Evidence, pace, slow

WINDOW = 8  # drafted runs the ledger weighs
RECHECK = 8  # after drafts were turned off, every RECHECK-th SSR run drafts again to measure


@dataclass(frozen=True)
class DraftPlan:
    drafts: int  # the drafts this run forks
    why: str  # the decision in words, with its numbers ("" when drafting is "always")


class Drafted(NamedTuple):
    """A warm SSR run that drafted, as the ledger keeps it."""

    cost: float  # seconds its drafts cost beyond lone reasoning steps (RunStats.drafting_s)
    saved: float  # seconds they saved: forwards saved, each worth a lone step
    forwards: int  # answer forwards they saved that no lookup would have (RunStats.draft_saved)
    pace: float | None  # the run's seconds per lone step (evidence.pace), for the slow rule
    at: float  # when it ended (time.monotonic())


@dataclass
class Ledger:
    """What drafts cost and saved in the last :data:`WINDOW` warm drafted SSR runs of one model and route."""

    runs: deque = field(default_factory=lambda: deque(maxlen=WINDOW))  # Drafted, oldest first
    undrafted: int = 0  # warm SSR runs since the last one that drafted
    paces: deque = field(default_factory=deque)  # the route's recent warm runs' paces (shared with its costs)
    cold: int = 0  # cold runs left out (never entered)

    def record(self, stats: RunStats, planned: int, at: float | None = None) -> None:
        """A finished warm SSR run, ended at ``at`` (default: now): a drafted one joins the window,
        an undrafted one is counted."""
        if planned and stats.drafts:
            step = pace(stats)
            self.runs.append(Drafted(stats.drafting_s, stats.draft_saved * (step or 0.0), stats.draft_saved, step,
                                     time.monotonic() if at is None else at))
            self.undrafted = 0
        else:
            self.undrafted += 1

    def steady(self) -> list[Drafted]:
        """The window's runs not flagged slow against the route's recent paces (``evidence.slow``)."""
        return [r for r in self.runs if r.pace is None or not slow(r.pace, self.paces)]

    def totals(self) -> tuple[float, float, int]:
        """(cost s, saved s, forwards saved) over the window's runs not flagged slow."""
        runs = self.steady()
        return (sum(r.cost for r in runs), sum(r.saved for r in runs), sum(r.forwards for r in runs))


def ledger(store: Evidence, cfg: RunConfig) -> Ledger:
    """``store``'s ledger for ``cfg``'s numerics route (exact mode's route, compiled steps: they change
    what a row costs), made on first use (sharing the route's paces)."""
    route = store.route(cfg)
    if route not in store.ledgers:
        store.ledgers[route] = Ledger(paces=store.paces_of(cfg))
    return store.ledgers[route]


def plan(book: Ledger, cfg: RunConfig) -> DraftPlan:
    """The drafts an SSR run with ``cfg`` forks, and why (see the module's rules)."""
    planned = cfg.num_drafts
    if cfg.drafting == "always":
        return DraftPlan(planned, "")
    runs = book.steady()
    left = [f"{k} {why}" for k, why in ((len(book.runs) - len(runs), "flagged slow"), (book.cold, "cold")) if k]
    left_out = f"left out: {', '.join(left)}" if left else ""
    frozen = "; reproducible: read once, this run adds nothing" if cfg.reproducible else ""
    if not runs:
        return DraftPlan(planned, "as planned: no run with drafts on this model yet, so this one measures them" +
                         (f" ({left_out})" if left else "") + frozen)
    cost, saved, forwards = book.totals()
    n, now = len(runs), time.monotonic()
    ages = f"{now - runs[-1].at:.0f}-{now - runs[0].at:.0f}" if n > 1 else f"{now - runs[0].at:.0f}"
    said = (f"in the last {n} run{'s' if n != 1 else ''} with drafts on this model they cost {cost:.2f} s beyond "
            f"lone reasoning steps and saved {saved:.2f} s ({forwards} answer forward{'s' if forwards != 1 else ''} "
            f"no lookup would have saved), warm runs {ages} s old{f' ({left_out})' if left else ''}{frozen}")
    if saved >= cost:
        return DraftPlan(planned, f"as planned: {said}")
    if book.undrafted + 1 >= RECHECK:
        return DraftPlan(planned, f"as planned, to measure again ({RECHECK - 1} runs without): {said}")
    wait = RECHECK - 1 - book.undrafted
    return DraftPlan(0, f"none of {planned}: {said}; so this run used lookups alone (drafts measured again in "
                        f"{wait} run{'s' if wait != 1 else ''}; Drafting: always forks them)")
