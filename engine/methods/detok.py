"""Incremental detokenization: text pieces that concatenate exactly to the decoded text.

A piece is released only once it no longer ends in an incomplete character (U+FFFD), so a
multi-byte character split over several byte-level tokens arrives whole, in one piece. The
window trick (decode from the previous piece's start, subtract its prefix) is the one vLLM uses,
so each push costs a few tokens of decoding, not the whole sequence.

>>> # d = IncrementalDetokenizer(tok); "".join(d.push(t) for t in ids) + d.flush() == tok.decode(ids)
"""

from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # start of the window re-decoded for context
        self._read = 0  # end of what has been released
        self._released: list[str] = []

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the newly complete text (possibly empty)."""
        self.ids.append(token_id)
        before = self._decode(self.ids[self._prefix : self._read])
        after = self._decode(self.ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            piece = after[len(before) :]
            self._prefix, self._read = self._read, len(self.ids)
            self._released.append(piece)
            return piece
        return ""

    def flush(self) -> str:
        """Whatever text is still held back (an incomplete character at the very end)."""
        released = "".join(self._released)
        full = self._decode(self.ids)
        rest = full[len(released) :] if full.startswith(released) else ""
        if rest:
            self._released.append(rest)
            self._read = self._prefix = len(self.ids)
        return rest

    @property
    def text(self) -> str:
        return "".join(self._released)
