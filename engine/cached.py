"""A model with its own KV cache over a growing token sequence, and its compute accounting.

RSD runs three models over one shared text; each keeps its own cache and catches up on the
tokens it has not seen in one parallel forward, so nothing re-encodes the whole prefix per step.
Every forward is counted: tokens processed (prefill vs decode) and wall time, so FLOPs are
``2 x parameters x tokens processed`` per model (the standard forward-pass estimate, attention's
context-length term ignored; stated once here and in docs/RSD.md).
"""

from __future__ import annotations

import time

import torch

from engine.model import LoadedModel, crop


class CachedModel:
    def __init__(self, lm: LoadedModel) -> None:
        self.lm = lm
        self.cache = lm.new_cache()
        self.length = 0  # tokens in the cache
        self._last_logits: torch.Tensor | None = None  # logits after the cache's last token
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.seconds = 0.0
        self.calls = 0

    @property
    def flops(self) -> float:
        return 2.0 * self.lm.num_parameters * (self.prefill_tokens + self.decode_tokens)

    def feed(self, tokens: list[int], all_logits: bool = False) -> torch.Tensor:
        """Append ``tokens`` to the cache; logits ``[V]`` after the last one (``[T, V]`` with
        ``all_logits``)."""
        assert tokens, "feed needs at least one token"
        start = time.perf_counter()
        logits = self.lm.step_logits(tokens, self.cache, self.length)  # [T, V]
        self.seconds += time.perf_counter() - start
        self.calls += 1
        if self.length == 0 or len(tokens) > 1:
            self.prefill_tokens += len(tokens)
        else:
            self.decode_tokens += 1
        self.length += len(tokens)
        self._last_logits = logits[-1]
        return logits if all_logits else logits[-1]

    def sync(self, seq: list[int]) -> torch.Tensor:
        """Catch up on ``seq`` (which extends what the cache holds) and return the logits after
        its last token."""
        if self.length == len(seq) and self._last_logits is not None:
            return self._last_logits
        if self.length == len(seq):  # logits were discarded: re-feed the last token
            self.rollback(len(seq) - 1)
        return self.feed(seq[self.length :])

    def rollback(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens."""
        if length < self.length:
            crop(self.cache, length)
            self.length = length
            self._last_logits = None
