"""Suffix matching of the answer so far against growing token sources.

A :class:`SuffixIndex` holds named token lists (drafts, the prompt, the reasoning, the answer)
and answers one question: what is the longest suffix of the context, at least ``min_match`` tokens
long, that occurs in a source with at least one token after it, and what follows it there?

Rules (each one is a row in ``tests/test_suffix_index.py``):

* the longest match wins across all sources given to one :meth:`lookup`;
* ties go to the source listed first (callers list the newest draft first);
* within a source, ties go to the earliest occurrence at or after that source's cursor (where
  the last taken proposal from it ended), else to the earliest occurrence: reading a draft
  forwards is how the answer usually walks through it;
* an occurrence is only a match if a token follows it (a match at the very end proposes nothing);
* the proposal is at most ``max_tokens`` tokens and stops before any ``stop`` token; a source
  may be the context itself (the answer), whose earlier occurrences then count.

Occurrences of every ``min_match``-gram are indexed incrementally as sources grow, so a lookup
costs the number of candidate positions times the match length, not the source length.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Match:
    source: str  # the source's name
    start: int  # index in the source of the first proposed token
    length: int  # tokens of context suffix matched
    tokens: list[int]  # the proposal


class SuffixIndex:
    def __init__(self, min_match: int = 2, max_match: int = 64) -> None:
        if min_match < 1:
            raise ValueError(f"min_match={min_match} must be >= 1")
        self.min_match = min_match
        self.max_match = max_match
        self.sources: dict[str, list[int]] = {}
        self.cursors: dict[str, int] = {}
        self._grams: dict[str, dict[tuple[int, ...], list[int]]] = {}

    def extend(self, name: str, tokens: list[int]) -> None:
        """Append ``tokens`` to source ``name`` (created on first use) and index new n-grams."""
        seq = self.sources.setdefault(name, [])
        grams = self._grams.setdefault(name, {})
        self.cursors.setdefault(name, 0)
        n = self.min_match
        old = len(seq)
        seq.extend(tokens)
        for end in range(max(n, old + 1), len(seq) + 1):  # end: index just past the gram
            grams.setdefault(tuple(seq[end - n : end]), []).append(end)

    def advance(self, name: str, position: int) -> None:
        """Move ``name``'s cursor to ``position`` (the end of a taken proposal)."""
        self.cursors[name] = max(self.cursors.get(name, 0), position)

    def reset_cursors(self) -> None:
        """Forget where earlier proposals ended (a new phase reads every source afresh)."""
        self.cursors = dict.fromkeys(self.cursors, 0)

    def lookup(self, context: list[int], names: list[str], max_tokens: int, stop: frozenset[int] = frozenset()) -> Match | None:
        """The best match of ``context``'s suffix in the sources ``names`` (see the module rules)."""
        n = self.min_match
        if len(context) < n or max_tokens < 1:
            return None
        key = tuple(context[-n:])
        best: Match | None = None
        for name in names:
            seq = self.sources.get(name)
            if not seq:
                continue
            ends = self._grams[name].get(key, ())
            cursor = self.cursors.get(name, 0)
            cands = []
            for end in ends:
                if end >= len(seq):  # nothing follows it
                    continue
                length = n
                while (length < self.max_match and length < len(context) and end - length > 0
                       and seq[end - length - 1] == context[-length - 1]):
                    length += 1
                cands.append((-length, end < cursor, end))
            if not cands:
                continue
            neg_len, _, end = min(cands)
            if best is None or -neg_len > best.length:
                proposal = []
                for tok in seq[end : end + max_tokens]:
                    if tok in stop:
                        break
                    proposal.append(tok)
                if proposal:
                    best = Match(name, end, -neg_len, proposal)
        return best
