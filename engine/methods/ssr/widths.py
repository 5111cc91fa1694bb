"""Cost-aware widths: the main row verifies as many proposed tokens as pay, in the reasoning (its
lookups) and in the answer (each proposer's proposals: a draft's prefix, a suffix in the drafts, a
lookup).

A lookup proposal of ``k`` tokens rides behind the main row's next token, so its forward computes
``k`` more tokens. On a GPU that is nearly free; on a CPU it is not (SmolLM2 in fp32 on 2 cores: a
forward of 4 tokens costs about 1.5x one of 1, 9 tokens 1.9x). The step takes its own token plus
the proposal's accepted prefix: verifying the first ``k`` tokens yields, in expectation,
``1 + p1 + p1 p2 + ... + p1 ... pk`` tokens, for ``cost(n + k) / cost(n)`` of a step that would
compute ``n`` tokens without them. :class:`Widths` verifies the ``k`` (0 .. what was proposed, at
most ``think_spec``) with the most expected tokens per unit of cost, so a lookup that would not
pay is not verified at all:

* ``p_i``: how often the proposals had their ``i``-th token accepted when the ``i - 1`` before it
  were, counted over this run's verifies (1/2 before any: a Beta(1, 1) prior), per phase and, in
  the answer, per proposer. A proposal not verified at all still says something: whether its
  first token is the one the model then chose (what its verify would have accepted), so a
  proposer that cannot pay on the prior (on llama.cpp's CPU kernels a token verified costs 0.35-0.75
  of a step: its first token must be right that often) is still learned about;
* ``cost(n + k) / cost(n)``: measured, and only ever relative within one run. Each run keeps
  the median seconds of its forwards that computed ``t`` tokens (every SSR forward's own timing,
  both phases, the last :data:`SAMPLES` per width: :class:`Timings`), so both widths of a ratio were
  timed close together, under the same load; a width timed under load is never priced against one
  timed idle. The ratio is the median of the runs' own ratios: the run under way's and those of the
  route's last :data:`KEPT_RUNS` warm runs not flagged slow, none older than :data:`MAX_AGE_S`
  (:class:`Costs`, in the model's evidence store, ``engine.methods.ssr.evidence``: a width costs
  what the model, the device and the route make it cost; the prompts do not change it). So a table
  learned under load is outvoted, then forgotten, and a width it shut opens again. Runs whose
  measured widths reach both ends are preferred; between measured widths a run's cost is
  interpolated; beyond its widest measured it is taken to be that width's (optimistic, so a
  proposal that long is verified, and measured, once). A reproducible run (``RunConfig.reproducible``)
  prices by the stored runs alone, read as it starts, and keeps none of its own timings.

Like the drafting policy (``engine.methods.ssr.policy``), nothing here changes a token of SSR: a
verify of fewer tokens takes what a wider one would have, up to where it stops. Also like it, only
plain SSR chooses by cost: a method built on the loop whose output depends on where its steps
fall (early exit) verifies every proposal whole (``Widths.by_cost``), so its output does not follow
the machine's timings. ``RunStats.lookups`` says in words what the run verified, what a wide forward
cost, and what evidence priced it (:meth:`RunCosts.evidence`).
"""

from __future__ import annotations

import bisect
import statistics
import time
from collections import deque
from dataclasses import dataclass, field

from engine.methods.ssr.evidence import Evidence, slow

SAMPLES = 16  # forward timings a run keeps per width (their median is the run's cost of that width)
KEPT_RUNS = 8  # a route's cost table keeps the timings of its last KEPT_RUNS warm runs
MAX_AGE_S = 900.0  # and prices by none older than this (a quarter of an hour on, the machine may be loaded otherwise)


@dataclass
class Timings:
    """One run's forwards, by the tokens they computed: per width, the median of its last :data:`SAMPLES`."""

    seconds: dict[int, deque] = field(default_factory=dict)
    medians: dict[int, float] = field(default_factory=dict)  # per width, kept as its timings come
    widths: list[int] = field(default_factory=list)  # the widths measured, in order

    def record(self, tokens: int, seconds: float) -> None:
        if tokens > 0 and seconds > 0:
            if tokens not in self.seconds:
                bisect.insort(self.widths, tokens)
            kept = self.seconds.setdefault(tokens, deque(maxlen=SAMPLES))
            kept.append(seconds)
            self.medians[tokens] = statistics.median(kept)

    def of(self, tokens: int) -> float | None:
        """The cost of a forward of ``tokens``: measured, interpolated, or (past the widest measured)
        that width's; None before any forward was measured."""
        if not self.widths:
            return None
        widths, med = self.widths, self.medians
        if tokens in med:
            return med[tokens]
        i = bisect.bisect_left(widths, tokens)
        if i == 0:
            return med[widths[0]]
        if i == len(widths):
            return med[widths[-1]]
        lo, hi = widths[i - 1], widths[i]
        return med[lo] + (med[hi] - med[lo]) * (tokens - lo) / (hi - lo)

    def spans(self, lo: int, hi: int) -> bool:
        """Whether widths were measured at or below ``lo`` and at or above ``hi`` (no guess past either)."""
        return bool(self.widths) and self.widths[0] <= lo and self.widths[-1] >= hi


@dataclass
class Costs:
    """One route's forward costs on one model, across runs: the :class:`Timings` of its last
    :data:`KEPT_RUNS` warm runs, each with its pace (seconds per lone step: ``policy.slow`` judges
    it against ``paces``, the route's recent runs', as a run reads the table). A run reads them
    through :meth:`view`."""

    paces: deque = field(default_factory=deque)  # the route's recent warm runs' paces (shared with its ledger)
    runs: deque = field(default_factory=lambda: deque(maxlen=KEPT_RUNS))  # (monotonic time, pace, Timings)
    cold: int = 0  # cold runs whose timings were left out (engine.methods.ssr.evidence)

    def commit(self, timings: Timings | None, pace: float | None, at: float | None = None) -> None:
        """A warm run's timings (None: it kept none), taken with its pace ``pace`` (None: not judged) at
        ``at`` (default: now)."""
        if timings is not None and timings.widths:
            self.runs.append((time.monotonic() if at is None else at, pace, timings))

    def view(self, learn: bool = True, now: float | None = None) -> RunCosts:
        """What a run starting ``now`` (default: now) prices its widths by: the kept runs not flagged
        slow and not older than :data:`MAX_AGE_S`, read once; ``learn``: and its own timings as they
        come (False: frozen, a reproducible run)."""
        now = time.monotonic() if now is None else now
        young = [(at, pace, t) for at, pace, t in self.runs if now - at <= MAX_AGE_S]
        steady = [(at, t) for at, pace, t in young if pace is None or not slow(pace, self.paces)]
        return RunCosts([t for _, t in steady], Timings() if learn else None, ages=[now - at for at, _ in steady],
                        left_slow=len(young) - len(steady), left_old=len(self.runs) - len(young), left_cold=self.cold)


@dataclass
class RunCosts:
    """What one run's widths are priced by: ``stored``, the route's runs read as it started (oldest
    first), and ``own``, its own forwards as they come (None: frozen, nothing learned during the run)."""

    stored: list[Timings] = field(default_factory=list)
    own: Timings | None = field(default_factory=Timings)
    ages: list[float] = field(default_factory=list)  # seconds between each stored run and this run's start
    left_slow: int = 0  # stored runs left out, flagged slow
    left_old: int = 0  # stored runs left out, older than MAX_AGE_S
    left_cold: int = 0  # cold runs never stored

    def record(self, tokens: int, seconds: float) -> None:
        """A forward of this run computed ``tokens`` in ``seconds`` (kept unless frozen)."""
        if self.own is not None:
            self.own.record(tokens, seconds)

    def _tables(self) -> list[Timings]:
        return [t for t in (*self.stored, self.own) if t is not None and t.widths]

    def measured(self) -> bool:
        """Whether any forward was measured (before one, every proposal is verified whole, and measured)."""
        return bool(self._tables())

    def ratio(self, tokens: int, base: int) -> float | None:
        """cost(``tokens``) / cost(``base``): the median of each run's own ratio, over the runs whose
        measured widths reach both (else over every run); None before any forward was measured."""
        tables = self._tables()
        pool = [t for t in tables if t.spans(min(tokens, base), max(tokens, base))] or tables
        return statistics.median(t.of(tokens) / t.of(base) for t in pool) if pool else None

    def widest(self) -> int:
        """The widest forward measured (1 before any)."""
        return max((t.widths[-1] for t in self._tables()), default=1)

    def evidence(self) -> str:
        """The runs these costs came from, in words: how many, how old, how many left out and why."""
        n = len(self.stored)
        stored = "no stored run" if not n else f"{n} stored run{'s' if n != 1 else ''}" + (
            f" ({self.ages[-1]:.0f}-{self.ages[0]:.0f} s old)" if n > 1 else f" ({self.ages[0]:.0f} s old)")
        reasons = (self.left_slow, "flagged slow"), (self.left_old, f"over {MAX_AGE_S:.0f} s old"), (self.left_cold, "cold")
        left = [f"{k} {why}" for k, why in reasons if k]
        left_out = f"; left out: {', '.join(left)}" if left else ""
        if self.own is None:
            return f"reproducible: widths frozen from {stored}{left_out}"
        return f"widths priced by {stored} and this run's own forwards{left_out}"


def costs(store: Evidence, cfg) -> Costs:
    """``store``'s forward costs for ``cfg``'s numerics route, made on first use (sharing the route's paces)."""
    route = store.route(cfg)
    if route not in store.costs:
        store.costs[route] = Costs(store.paces_of(cfg))
    return store.costs[route]


@dataclass
class Widths:
    """The main row's widths in one run, for one phase and (in the answer) one proposer (see the
    module's rule)."""

    costs: RunCosts
    # False: every proposal is verified whole (up to think_spec), whatever it costs. For a method whose output
    # depends on where its steps fall (early exit checks its drafts at step ends): widths chosen by measured
    # timings would make its lossy output differ from one run of the same prompt to the next
    by_cost: bool = True
    tries: list[int] = field(default_factory=list)  # per position: verifies that reached it
    hits: list[int] = field(default_factory=list)  # per position: verifies that accepted it
    proposed: int = 0  # tokens proposed to the main row
    verified: int = 0  # of them, verified
    skipped: int = 0  # proposals not verified at all (no width paid)
    unverified: int = 0  # proposals not verified whose first token was compared with the model's
    unverified_right: int = 0  # of them, right
    phase: str = "reasoning"  # where these proposals are verified, for :meth:`said`
    what: str = "lookup"  # who proposes them, for :meth:`said`

    def p(self, i: int) -> float:
        """P(the ``i``-th token (0-based) is accepted | the ones before it were)."""
        tries = self.tries[i] if i < len(self.tries) else 0
        hits = self.hits[i] if i < len(self.hits) else 0
        return (hits + 1) / (tries + 2)

    def choose(self, proposed: int, others: int) -> int:
        """How many of ``proposed`` tokens to verify in a forward that computes ``others`` tokens
        without them (the main row's own, and the drafts' riding). For deterministic proposals only
        (lookups): a sampled draft's length says whether it drew its end, and a width that depended
        on it would verify its tokens conditioned on what it drew, which speculative sampling's
        exactness rules out."""
        self.proposed += proposed
        best, best_rate = proposed, 0.0
        if self.by_cost and self.costs.measured():
            best, best_rate = 0, 1.0  # verifying nothing: one token for the step's own cost
            expected, reach = 1.0, 1.0
            for k in range(1, proposed + 1):
                reach *= self.p(k - 1)
                expected += reach
                rate = expected / self.costs.ratio(others + k, others)
                if rate > best_rate:
                    best, best_rate = k, rate
        self.verified += best
        self.skipped += best == 0
        return best

    def observe(self, proposed: int, accepted: int) -> None:
        """A verify of ``proposed`` tokens accepted the first ``accepted``."""
        for i in range(min(proposed, accepted + 1)):
            self._count(i, i < accepted)

    def observe_unverified(self, first_right: bool) -> None:
        """A proposal not verified at all: whether its first token is the one the model chose (what
        its verify, of a deterministic proposal, would have accepted)."""
        self._count(0, first_right)
        self.unverified += 1
        self.unverified_right += first_right

    def _count(self, i: int, hit: bool) -> None:
        if i == len(self.tries):
            self.tries.append(0)
            self.hits.append(0)
        self.tries[i] += 1
        self.hits[i] += hit

    def said(self, with_cost: bool = True) -> str:
        """The run's widths in words, with what a wide forward cost on this model (``with_cost``)."""
        if not self.proposed:
            return ""
        wide = self.costs.widest()
        cost = f"; a {wide}-token forward cost {self.costs.ratio(wide, 1):.2f}x a 1-token one here" \
            if with_cost and wide > 1 else ""
        right = f", their first token right {self.unverified_right} of {self.unverified} times" if self.unverified else ""
        return (f"verified {self.verified} of {self.proposed} {self.what} tokens proposed in the {self.phase} "
                f"({self.skipped} proposals not at all: no width paid{right}){cost}")


def said(widths: list[Widths]) -> str:
    """Several :class:`Widths` (sharing one :class:`RunCosts`) in words: the reasoning's, then the
    answer's proposers', then the evidence that priced them (where they chose by cost)."""
    spoken = [w for w in widths if w.proposed]
    evidence = [w.costs.evidence() for w in spoken[-1:] if w.by_cost]
    return "; ".join([*(w.said(with_cost=w is spoken[-1]) for w in spoken), *evidence])
