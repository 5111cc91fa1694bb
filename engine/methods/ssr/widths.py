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
* ``cost(t)``: the median seconds of this model's forwards that computed ``t`` tokens (every SSR
  forward's own timing, both phases, the last :data:`SAMPLES` per width), kept on the loaded
  model per numerics route as the drafting ledger is (a width costs what the model, the device and
  the route make it cost; the prompts do not change it). Between measured widths the cost is
  interpolated; beyond the widest measured it is taken to be that width's (optimistic, so a
  proposal that long is verified, and measured, once).

Like the drafting policy (``engine.methods.ssr.policy``), nothing here changes a token of SSR: a
verify of fewer tokens takes what a wider one would have, up to where it stops. Also like it, only
plain SSR chooses by cost: a method built on the loop whose output depends on where its steps
fall (early exit) verifies every proposal whole (``Widths.by_cost``), so its output does not follow
the machine's timings. ``RunStats.lookups``
says in words what the run verified and what a wide forward cost.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from dataclasses import dataclass, field

SAMPLES = 16  # forward timings kept per width


@dataclass
class Costs:
    """Measured seconds of this model's forwards, by the tokens they computed."""

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


def costs(lm, cfg) -> Costs:
    """``lm``'s forward costs for ``cfg``'s numerics route (exact mode's route, compiled steps)."""
    book = lm.__dict__.setdefault("_forward_costs", {})
    return book.setdefault((cfg.exact_mode, cfg.compile), Costs())


@dataclass
class Widths:
    """The main row's widths in one run, for one phase and (in the answer) one proposer (see the
    module's rule)."""

    costs: Costs
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
        base = self.costs.of(others) if self.by_cost else None
        best, best_rate = proposed, 0.0
        if base is not None:
            best, best_rate = 0, 1.0  # verifying nothing: one token for the step's own cost
            expected, reach = 1.0, 1.0
            for k in range(1, proposed + 1):
                reach *= self.p(k - 1)
                expected += reach
                rate = expected / (self.costs.of(others + k) / base)
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
        one = self.costs.of(1)
        wide = self.costs.widths[-1] if self.costs.widths else 1
        cost = f"; a {wide}-token forward cost {self.costs.of(wide) / one:.2f}x a 1-token one here" \
            if with_cost and one and wide > 1 else ""
        right = f", their first token right {self.unverified_right} of {self.unverified} times" if self.unverified else ""
        return (f"verified {self.verified} of {self.proposed} {self.what} tokens proposed in the {self.phase} "
                f"({self.skipped} proposals not at all: no width paid{right}){cost}")


def said(widths: list[Widths]) -> str:
    """Several :class:`Widths` in words (the reasoning's, then the answer's proposers')."""
    spoken = [w for w in widths if w.proposed]
    return "; ".join(w.said(with_cost=w is spoken[-1]) for w in spoken)
