"""Proposers: where SSR's answer phase gets the tokens it verifies.

All share one small interface, :class:`Proposer`: ``propose(answer, max_tokens) -> Proposal | None``
and ``observe(proposal, accepted)``; the answer loop asks them in order and verifies the first
proposal it gets.

* :class:`DraftPrefixProposer`: the newest draft, read from where the answer is, for as long as
  the answer is still a prefix of it (the paper's prefix verification).
* :class:`SuffixProposer` over the drafts: after the first mismatch, the longest answer suffix
  found in any draft proposes what followed it there (the paper's suffix decoding).
* :class:`SuffixProposer` over the context: the same over the prompt, the reasoning and the answer
  itself (prompt-lookup style; beyond the paper).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.events import proposer
from engine.methods.ssr.suffix_index import SuffixIndex


@dataclass
class Draft:
    """One draft answer, written by a forked row from the partial reasoning."""

    index: int
    forked_at: int  # reasoning tokens the draft saw
    tokens: list[int] = field(default_factory=list)  # the draft answer, template tail included
    probs: list[torch.Tensor | None] = field(default_factory=list)  # q per token (None: one-hot)
    finished: bool = False
    end: int | None = None  # the end-of-sequence token the draft sampled after its last token
    end_probs: torch.Tensor | None = None  # q it was drawn from (None: greedy)

    @property
    def name(self) -> str:
        return f"draft:{self.index}"


@dataclass(frozen=True)
class Proposal:
    tokens: list[int]
    status: str  # what the answer tokens become when taken: "accepted" or "recovered"
    source: str  # "draft", "prompt", "reasoning" or "answer"
    draft: int | None  # which draft, for draft sources
    start: int  # index in the source of tokens[0]
    match_len: int | None = None
    probs: torch.Tensor | None = None  # [k, V] draft distributions; None = deterministic proposal

    @property
    def label(self) -> str:
        """Who proposed, as the forward records, the acceptance statistics and the answer's counts name it
        (``engine.events.proposer``, the one naming): "draft prefix", "suffix in drafts" or "lookup in prompt"
        (reasoning, answer)."""
        who = proposer(self.status, self.source)
        assert who is not None, f"a proposal names its proposer: {self.status} from {self.source}"
        return who


class Proposer(Protocol):
    """Where the answer loop gets tokens to verify: asked in order, the first proposal is verified."""

    def propose(self, answer: list[int], max_tokens: int) -> Proposal | None:
        """Up to ``max_tokens`` tokens to follow ``answer``, or None when it has nothing to offer."""
        ...

    def observe(self, proposal: Proposal, accepted: int) -> None:
        """How many of ``proposal``'s tokens the verifier accepted (a proposer may stop or move on)."""
        ...


class DraftPrefixProposer:
    """Proposes the newest draft's continuation while the answer is a prefix of it. A draft that
    ended by sampling end-of-sequence proposes that end as its last token, with its ``q``: dropping
    it would make the verifier never test the draft's end, which is not exact under sampling."""

    def __init__(self, draft: Draft | None) -> None:
        self.draft = draft
        self.active = draft is not None

    def propose(self, answer: list[int], max_tokens: int) -> Proposal | None:
        if not self.active:
            return None
        d, n = self.draft, len(answer)
        full = d.tokens if d.end is None else [*d.tokens, d.end]
        if full[:n] != answer or n >= len(full):
            self.active = False
            return None
        tokens = full[n : n + max_tokens]
        q = [*d.probs, d.end_probs][n : n + len(tokens)]
        probs = None
        if any(p is not None for p in q):
            vocab = next(p for p in q if p is not None).shape[-1]
            probs = torch.stack([p if p is not None else _one_hot(t, vocab) for p, t in zip(q, tokens, strict=True)])
        return Proposal(tokens, "accepted", "draft", d.index, n, None, probs)

    def observe(self, proposal: Proposal, accepted: int) -> None:
        pass  # the prefix test in propose() notices a mismatch by itself


class SuffixProposer:
    """Proposes what followed the answer's longest suffix in the given sources; a proposal stops
    before any ``stop`` token, and after the first ``cut(answer, tokens)`` of its tokens where a
    ``cut`` is given (the main reasoning's: before the end-of-thinking marker, however split)."""

    def __init__(self, index: SuffixIndex, names: list[str], stop: frozenset[int], spec_factor: float = 0.0,
                 cut: Callable[[list[int], list[int]], int] | None = None) -> None:
        self.index, self.names, self.stop, self.spec_factor, self.cut = index, names, stop, spec_factor, cut

    def propose(self, answer: list[int], max_tokens: int) -> Proposal | None:
        m = self.index.lookup(answer, self.names, max_tokens, self.stop)
        if m is None:
            return None
        if self.spec_factor > 0:  # SuffixDecoding's cap: trust a proposal in proportion to its match
            m = dataclasses.replace(m, tokens=m.tokens[: max(1, int(self.spec_factor * m.length))])
        if self.cut is not None:
            m = dataclasses.replace(m, tokens=m.tokens[: self.cut(answer, m.tokens)])
            if not m.tokens:
                return None
        kind, _, num = m.source.partition(":")
        return Proposal(m.tokens, "recovered", kind, int(num) if num else None, m.start, m.length)

    def observe(self, proposal: Proposal, accepted: int) -> None:
        name = proposal.source if proposal.draft is None else f"draft:{proposal.draft}"
        if accepted:
            self.index.advance(name, proposal.start + accepted)


def _one_hot(token: int, vocab: int) -> torch.Tensor:
    v = torch.zeros(vocab)
    v[token] = 1.0
    return v
