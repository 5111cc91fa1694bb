"""What SSR's decisions have learned on one loaded model, in one object passed to the loop (DESIGN.md
convention 15): per numerics route (exact mode's route, compiled steps: they change what a row or
a width costs), the drafting ledger (``engine.methods.ssr.policy``), the forward costs
(``engine.methods.ssr.widths``), how many runs of each kind have finished and the route's recent runs' pace.

Which runs teach:

* **warm ones only.** The first :data:`COLD_RUNS` SSR run(s) of each kind on a model (:meth:`Evidence.kind`:
  route, method, iterative drafts or not, reasoning lookups or not: the kinds the studio warms, one
  untimed run each, ``ssr_ui.shelf.ModelShelf.warm``; the bench warms each method) pay for first
  shapes, lazy setup and first allocations: their evidence is left out, and counted (``cold``). So
  a warm-up (on short budgets, Drafting "always") never teaches;
* **not flagged slow.** A warm run's evidence is kept with its *pace* (:func:`pace`: seconds per
  lone step, whatever it drafted or verified) and judged each time a decision reads it, by the run
  log's rule (``engine.runlog.compare``: more than ``SLOW_FACTOR`` times the median) against the
  route's other recent runs (:func:`slow`): a run slowed from outside (a busy machine, a cold
  start the warm-up did not cover) is left out, and counted, once a faster one shows it up;
* **not reproducible ones.** A run with ``RunConfig.reproducible`` reads the evidence once as it
  starts (its drafting plan and widths' costs) and keeps nothing of its own, so two such runs of a
  prompt make the same decisions.

A decision says what evidence it used: ``DraftPlan.why`` and ``RunStats.lookups`` name how many
runs, how old, and how many were left out and why.

>>> store = Evidence.of(lm)  # the model's own store (a shared studio passes a visitor's: store.apart(their_ledgers))
>>> events = list(decode_ssr(lm, prompt, cfg, evidence=store))  # decode_ssr's default reads the same store
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import weakref
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.config import RunConfig
from engine.events import RunStats
from engine.runlog.compare import SLOW_FACTOR

COLD_RUNS = 1  # a route's first SSR runs on a model that teach nothing (their first shapes, setup, allocations)
PACES = 16  # recent warm runs' paces kept per route: the slow rule's peers

_STORES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loaded model -> its Evidence


def pace(stats: RunStats) -> float | None:
    """A run's seconds per lone reasoning step (one token, no draft riding), else per answer forward:
    the work per forward that is the same in every SSR run of a route (None: neither was timed)."""
    return stats.step_s_alone or (stats.answer_s / stats.answer_forwards if stats.answer_forwards else None)


def slow(run_pace: float, paces: Iterable[float]) -> bool:
    """Whether a run of pace ``run_pace`` is flagged slow among ``paces`` (the route's recent runs', its
    own among them): the run log's rule and factor (``engine.runlog.compare.SLOW_FACTOR``), against the
    median of the *other* runs (so one other run is enough to judge by: the log counts a run in its own
    median, which needs three)."""
    others = list(paces)
    if run_pace in others:
        others.remove(run_pace)
    return bool(others) and run_pace > SLOW_FACTOR * statistics.median(others)


@dataclass
class Evidence:
    """One model's SSR evidence, by route (``RunConfig.exact_mode``, ``RunConfig.compile``): ``ledgers``
    (``policy.Ledger``, made by ``policy.ledger``), ``costs`` (``widths.Costs``, made by ``widths.costs``),
    ``paces`` (recent warm runs' :func:`pace`, shared by the route's ledger and costs) and ``seen``
    (SSR runs finished per :meth:`kind`, warm-ups included)."""

    ledgers: dict = field(default_factory=dict)
    costs: dict = field(default_factory=dict)
    paces: dict = field(default_factory=dict)
    seen: dict = field(default_factory=dict)

    @staticmethod
    def of(lm) -> Evidence:
        """``lm``'s own store, made on first use and gone with the model."""
        if lm not in _STORES:
            _STORES[lm] = Evidence()
        return _STORES[lm]

    def apart(self, ledgers: dict) -> Evidence:
        """This store with ``ledgers`` (route -> ``policy.Ledger``) for its own: the forward costs, paces and
        counts of finished runs stay this store's (they are the machine's), the drafting decisions are
        the ledgers' owner's. A shared studio passes one per visitor to each of their runs, so no
        visitor's runs decide, or show up in the numbers of, another's."""
        return dataclasses.replace(self, ledgers=ledgers)

    @staticmethod
    def route(cfg: RunConfig) -> tuple:
        return cfg.exact_mode, cfg.compile

    def paces_of(self, cfg: RunConfig) -> deque:
        """The route's recent warm runs' paces (at most :data:`PACES`), oldest first."""
        return self.paces.setdefault(self.route(cfg), deque(maxlen=PACES))

    @staticmethod
    def kind(cfg: RunConfig, method: str) -> tuple:
        """The runs whose first is cold: same route and method, drafts iterative or not, lookups or not."""
        return cfg.exact_mode, cfg.compile, method, cfg.num_drafts > 1, cfg.think_spec > 0

    def begin(self, cfg: RunConfig, method: str) -> bool:
        """An SSR run (method ``method``) with ``cfg`` begins: whether it is warm (its evidence may
        teach), i.e. :data:`COLD_RUNS` runs of its kind have finished before it. A run refused before
        its first forward, or stopped, is not counted (:meth:`finished`): it may not have met the
        kind's shapes, and the warm-up after it must still be the cold one."""
        return self.seen.get(self.kind(cfg, method), 0) >= COLD_RUNS

    def finished(self, cfg: RunConfig, method: str) -> None:
        """An SSR run of this kind ran to its end (a reproducible one too: it met the shapes)."""
        kind = self.kind(cfg, method)
        self.seen[kind] = self.seen.get(kind, 0) + 1

    def learn(self, cfg: RunConfig, stats: RunStats, warm: bool, book, planned: int, costs, timings) -> None:
        """A finished run teaches: a warm one's pace joins the route's, ``book`` (its ``policy.Ledger``,
        None: a run that does not decide drafting) records what its ``planned`` drafts cost and saved,
        and ``costs`` (its route's ``widths.Costs``) keep its ``timings``; a cold one is counted as left
        out. Never called for a reproducible run."""
        if not warm:
            costs.cold += 1
            if book is not None:
                book.cold += 1
            return
        run_pace, at = pace(stats), time.monotonic()
        if run_pace is not None:
            self.paces_of(cfg).append(run_pace)
        if book is not None:
            book.record(stats, planned, at)
        costs.commit(timings, run_pace, at)
