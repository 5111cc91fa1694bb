"""The rows of SSR's phase A: the main reasoning and the drafts, one :class:`Row` type for both.

Every step, each row is fed what it owes the cache (its ``unfed`` tokens) and, when it may, a
lookup proposal behind them (:meth:`Row.feed`); after the batch's one forward it verifies that
proposal against its own logits and says what it took (:meth:`Row.take`, a :class:`RowStep`).
What a row's tokens *mean* (reasoning, or a draft's answer) is the loop's business.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from engine.methods.sampling import Chooser
from engine.methods.ssr.proposers import Draft, Proposal, Proposer


@dataclass(frozen=True)
class RowStep:
    """What one row took in one step."""

    kept: int  # slots it keeps of what it was fed: the unfed tokens fed now, then the accepted proposal
    accepted: int  # proposal tokens accepted
    tokens: list[int]  # taken: the accepted proposal tokens, then the verifier's own; [] while forced tokens queue
    logits: torch.Tensor  # [K - m + 1, V], from the last unfed token fed (m) on: logits[j] chose tokens[j]
    proposal: Proposal | None  # what was verified (None: nothing)


@dataclass
class Row:
    """One row of phase A's batch: the main reasoning (``draft`` None) or a draft writing its answer.

    ``unfed`` are the tokens chosen (or forced: for a new draft, the main row's pending token, the
    end-of-thinking marker and the template tail) that the next forward feeds; ``context`` is the
    row's own stream, which its ``lookup`` continues (the reasoning, or the draft's answer).
    """

    unfed: list[int]
    context: list[int]  # a live view: the stream grows as the loop records what the row took
    lookup: Proposer
    chooser: Chooser
    draft: Draft | None = None
    fed: list[int] = field(default_factory=list)  # this step's feed: unfed tokens, then the proposal
    proposal: Proposal | None = None  # this step's lookup proposal
    unverified: int | None = None  # the first token of a proposal this step verifies none of (trim(0))
    opening: int = 0  # tokens put on its stream at the fork (a draft's template tail): its first forward's forced

    @property
    def is_main(self) -> bool:
        return self.draft is None

    def feed(self, room: int, one_token: bool) -> list[int]:
        """Choose this step's feed: all unfed tokens and, once nothing forced is queued, a lookup
        proposal of at most ``room`` tokens; with ``one_token`` (a cache that cannot hold holes,
        drafts riding) just the next unfed token, as the paper's batch does."""
        if one_token:
            self.proposal = None
            self.fed = self.unfed[:1]
        else:
            self._propose(self.lookup.propose(self.context, room) if room > 0 and len(self.unfed) == 1 else None)
        return self.fed

    def trim(self, k: int) -> None:
        """Verify only the first ``k`` tokens of this step's proposal (0: none of it)."""
        if self.proposal is not None and k < len(self.proposal.tokens):
            p = self.proposal
            self._propose(dataclasses.replace(p, tokens=p.tokens[:k], probs=None if p.probs is None else p.probs[:k])
                          if k else None)
            self.unverified = None if k else p.tokens[0]

    def _propose(self, proposal: Proposal | None) -> None:
        """This step's proposal, fed after the unfed tokens."""
        self.proposal, self.unverified = proposal, None
        self.fed = [*self.unfed, *(proposal.tokens if proposal else [])]

    def take(self, logits: torch.Tensor) -> RowStep:
        """Verify this step's proposal against the row's ``logits`` ``[K, V]`` (its feed, then
        padding) and tell the lookup how it went. The unfed tokens fed now are no longer owed."""
        proposed = self.proposal.tokens if self.proposal else []
        m = len(self.fed) - len(proposed)  # unfed tokens fed now
        del self.unfed[:m]
        if self.unfed:  # forced tokens are still queued: nothing to choose yet
            return RowStep(m, 0, [], logits, None)
        accepted, nxt = self.chooser.verify(logits[m - 1 : len(self.fed)], proposed, None)  # [k + 1, V]
        if self.proposal is not None:
            self.lookup.observe(self.proposal, accepted)
        return RowStep(m + accepted, accepted, [*proposed[:accepted], nxt], logits[m - 1 :], self.proposal)
