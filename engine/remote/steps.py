"""RSD's step writer on a vLLM server: ``engine.methods.rsd.writer.StepWriter``, as ``LocalWriter`` is in process.

A step is one streamed request with ``logprobs: 1`` (the confidence is the probability of the
step's least likely token, as in process, from the model's own log-probabilities); the step ends by
RSD's one rule (``engine.methods.rsd.writer.read_step``), applied here to the streamed tokens, and
the request is aborted there. A target-likelihood reward asks for ``prompt_logprobs`` of the step's
tokens. A sampled step uses the server's sampler, seeded per step (RSD is not lossless anyway; its
steps are not the in-process sampler's).
"""

from __future__ import annotations

import math
import time

from engine.config import RunConfig
from engine.methods.rsd.writer import Span, Step, Usage, read_step
from engine.remote.model import RemoteModel


class RemoteWriter:
    cache = None  # the server holds it

    def __init__(self, rm: RemoteModel, cfg: RunConfig) -> None:
        self.rm, self.cfg = rm, cfg
        self.tokens, self.seconds, self.calls = 0, 0.0, 0
        self.spans: list[Span] = []  # one per request

    def write_step(self, seq: list[int], max_step_tokens: int, budget: int) -> Step:
        """One step after ``seq``: one request, streamed until the step ends (:func:`read_step`)."""
        start, cfg = time.perf_counter(), self.cfg
        stream = self.rm.client.stream(seq, min(max_step_tokens, budget), self.rm.eos_ids, cfg.temperature, cfg.top_p,
                                       cfg.seed + len(seq), logprobs=True)
        try:
            picks = ((t, math.exp(logprob)) for t, logprob in stream)
            step = read_step(picks, self.rm.tokenizer, self.rm.eos_ids, max_step_tokens, budget)
        finally:
            stream.close()  # a step that ended here aborts the rest of the request
        self.tokens += len(step.tokens)
        end = time.perf_counter()
        self.seconds += end - start
        self.calls += 1
        self.spans.append(Span(start, end, len(seq), len(step.tokens)))
        return step

    def rollback(self, length: int) -> None:
        """Nothing to undo: every request carries its whole prefix (the server's cache shares it)."""

    def token_probs(self, seq: list[int], tokens: list[int]) -> list[float]:
        start = time.perf_counter()
        probs = [math.exp(lp) for lp in self.rm.client.token_logprobs(seq, tokens)]
        end = time.perf_counter()
        self.seconds += end - start
        self.calls += 1
        self.spans.append(Span(start, end, len(seq) + len(tokens)))
        return probs

    def usage(self) -> Usage:
        """Tokens returned, FLOPs 0 (not known here), seconds waited, requests."""
        return Usage(self.tokens, 0.0, self.seconds, self.calls)
