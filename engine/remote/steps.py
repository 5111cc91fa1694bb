"""RSD's step writer on a vLLM server: the same methods as ``engine.methods.rsd.loop.LocalWriter``.

A step is one streamed request with ``logprobs: 1`` (the confidence is the probability of the
step's least likely token, as in process, from the model's own log-probabilities); the step
delimiter is found here, on the decoded text, and the request is aborted there. A target-likelihood
reward asks for ``prompt_logprobs`` of the step's tokens. A sampled step uses the server's sampler,
seeded per step (RSD is not lossless anyway; its steps are not the in-process sampler's).
"""

from __future__ import annotations

import math
import time

from engine.config import RunConfig
from engine.remote.model import RemoteModel
from engine.methods.rsd.loop import STEP_DELIMITER


class RemoteWriter:
    cache = None  # the server holds it

    def __init__(self, rm: RemoteModel, cfg: RunConfig) -> None:
        self.rm, self.cfg = rm, cfg
        self.tokens, self.seconds, self.calls = 0, 0.0, 0

    def write_step(self, seq: list[int], max_step_tokens: int, budget: int) -> tuple[list[int], bool, float]:
        """One step after ``seq``: (tokens up to and including the delimiter, whether the sequence
        ended, the probability of its least likely token)."""
        start, cfg, tok = time.perf_counter(), self.cfg, self.rm.tokenizer
        stream = self.rm.client.stream(seq, min(max_step_tokens, budget), self.rm.eos_ids, cfg.temperature, cfg.top_p,
                                       cfg.seed + len(seq), logprobs=True)
        step: list[int] = []
        confidence, ended = 1.0, False
        try:
            for t, logprob in stream:
                confidence = min(confidence, math.exp(logprob))
                if t in self.rm.eos_ids:
                    ended = True
                    break
                step.append(t)
                if len(step) >= budget:
                    ended = True
                    break
                text = tok.decode(step)
                if len(step) >= max_step_tokens or (text.endswith(STEP_DELIMITER) and text.strip()):
                    break
        finally:
            stream.close()  # a step that ended here aborts the rest of the request
        self.tokens += len(step)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return step, ended, confidence

    def rollback(self, length: int) -> None:
        """Nothing to undo: every request carries its whole prefix (the server's cache shares it)."""

    def token_probs(self, seq: list[int], tokens: list[int]) -> list[float]:
        start = time.perf_counter()
        probs = [math.exp(lp) for lp in self.rm.client.token_logprobs(seq, tokens)]
        self.seconds += time.perf_counter() - start
        self.calls += 1
        return probs

    def usage(self) -> tuple[int, float, float, int]:
        """(tokens returned, FLOPs: 0, not known here, seconds waited, requests)."""
        return self.tokens, 0.0, self.seconds, self.calls
