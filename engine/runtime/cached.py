"""A model with its own KV cache over a growing token sequence, and its compute accounting.

Plain decoding runs one of these; RSD runs three over one shared text, each catching up on the
tokens it has not seen in one parallel forward, so nothing re-encodes the whole prefix per step.
It keeps the token ids it holds, which is what makes every rollback possible: attention layers
crop, recurrent states (hybrid models) restore the checkpoint taken at the last :meth:`sync` and
re-read the kept tokens, and a longrope model re-encodes the whole sequence where ``generate()``
does (see ``engine.runtime.rope``).

Every forward is counted: tokens processed (prefill vs decode) and wall time, so FLOPs are
``2 x parameters x tokens processed`` per model (the standard forward-pass estimate, attention's
context-length term ignored; stated once here and in docs/RSD.md). Re-read tokens count too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from engine.runtime.cache import checkpoint, crop
from engine.runtime.model import LoadedModel


@dataclass
class Span:
    """One forward of a model: when it ran (``perf_counter`` seconds; the end once the device is
    done), how many tokens it was fed, and how many tokens its logits chose that its user kept
    (set by whoever reads the logits: RSD's writers)."""

    start: float
    end: float
    fed: int
    kept: int = 0


class CachedModel:
    """One sequence's cache on ``lm``: a ``LoadedModel``, or any in-process model that gives the
    same calls (``engine.llamacpp.model.LlamaModel``: ``new_cache``, ``step_logits``, ``rewind``)."""

    def __init__(self, lm: LoadedModel, capacity: int = 256, role: str = "") -> None:
        self.lm = lm
        self.capacity = capacity  # tokens the run may hold (its budgets): the cache is preallocated for them
        self.role = role  # two sequences of one model in one run (RSD's target and draft) need two roles
        self._empty()
        self._last_logits: torch.Tensor | None = None  # logits after the cache's last token
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.seconds = 0.0
        self.calls = 0
        self.spans: list[Span] = []  # every forward, in order (RSD's timeline reads them)

    def _empty(self) -> None:
        self.cache = self.lm.new_cache(self.capacity, role=self.role)
        self.ids: list[int] = []  # the tokens the cache holds
        self._mark = checkpoint(self.cache, 0)  # where a recurrent rollback restarts from

    @property
    def length(self) -> int:
        return len(self.ids)

    @property
    def flops(self) -> float:
        return 2.0 * self.lm.num_parameters * (self.prefill_tokens + self.decode_tokens)

    def feed(self, tokens: list[int], all_logits: bool = False) -> torch.Tensor:
        """Append ``tokens`` to the cache; logits ``[V]`` after the last one (``[T, V]`` with
        ``all_logits``)."""
        assert tokens, "feed needs at least one token"
        start = time.perf_counter()
        fed, at, ids = tokens, self.length, self.ids
        if self.lm.rope.crosses(self.length, self.length + len(tokens)):  # re-encode all, as generate() does
            fed, at = self.ids + tokens, 0
            self._empty()
        logits = self.lm.step_logits(fed, self.cache, at, last_only=not all_logits)  # [T, V], or [1, V]
        logits = logits[len(fed) - len(tokens):] if all_logits else logits
        if logits.device.type == "cuda":  # the forward's end, not its launch
            torch.cuda.synchronize(logits.device)
        end = time.perf_counter()
        self.seconds += end - start
        self.spans.append(Span(start, end, len(fed)))
        self.calls += 1
        if at == 0 or len(fed) > 1:
            self.prefill_tokens += len(fed)
        else:
            self.decode_tokens += 1
        self.ids = ids  # the list before any re-encode (which empties the cache's own)
        self.ids.extend(tokens)
        self._last_logits = logits[-1]
        return logits if all_logits else logits[-1]

    def sync(self, seq: list[int]) -> torch.Tensor:
        """Catch up on ``seq`` (which extends what the cache holds) and return the logits after
        its last token. A later :meth:`rollback` to ``len(seq)`` or beyond is cheap."""
        assert self.ids == seq[: self.length], "the cache holds tokens that are not a prefix of seq"
        if self.length == len(seq) and self._last_logits is None:  # logits were discarded: re-feed the last token
            self.rollback(len(seq) - 1)
        logits = self._last_logits if self.length == len(seq) else self.feed(seq[self.length :])
        self.mark()
        return logits

    def mark(self) -> None:
        """Where the cache ends now, mark a recurrent state (nothing to do for attention caches): a later
        :meth:`rollback` to here or beyond re-reads only the tokens after it. A loop that rolls back
        every round marks what it keeps, so its re-reads stay one round's, not the run's."""
        if self.lm.layout.recurrent:
            self._mark = checkpoint(self.cache, self.length)

    def token_probs(self, seq: list[int], tokens: list[int]) -> list[float]:
        """The model's probability of each of ``tokens`` after ``seq`` (and the ones before it);
        the cache is left holding ``seq``."""
        logits = self.sync(seq)
        rest = self.feed(tokens, all_logits=True)  # [k, V]
        preds = torch.cat([logits[None], rest[:-1]]).float()  # [k, V]: predictions of each token
        probs = torch.softmax(preds, dim=-1)[torch.arange(len(tokens)), tokens]
        self.rollback(len(seq))
        return probs.tolist()

    def rollback(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens."""
        if length >= self.length:
            return
        kept = self.ids[:length]
        self._last_logits = None
        if not self.lm.layout.recurrent:
            crop(self.cache, length)
            self.ids = kept
            return
        if self._mark.length > length:  # before the last mark (a sync, or mark()): re-read from the start
            self._empty()
        self.lm.rewind(self.cache, self._mark, [])  # the state at the mark...
        self.ids = kept[: self._mark.length]
        if length > self.length:  # ...then re-read the kept tokens after it
            self.feed(kept[self.length :])
