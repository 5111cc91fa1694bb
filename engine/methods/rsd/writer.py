"""RSD's step writers: one model writing one reasoning step at a time, behind :class:`StepWriter`.

The loop (``engine.methods.rsd.loop``) asks a writer for a step after the shared text and never
asks how the writer runs. Two writers fit the seam: :class:`LocalWriter` (an in-process model, its
KV cache and its sampler) and ``engine.remote.steps.RemoteWriter`` (a model on a vLLM server);
the composition root (``engine.registry``) picks one per model. Both end a step by one rule,
:func:`read_step`, written here once.

>>> step = read_step(iter([(5, 0.9), (6, 0.4)]), tokenizer, eos_ids={2}, max_step_tokens=2, budget=10)
>>> step.tokens, step.ended, step.confidence  # max_step_tokens reached: not the end of the sequence
([5, 6], False, 0.4)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from engine.config import RunConfig
from engine.methods.sampling import Chooser
from engine.methods.seams import StepModel
from engine.runtime.cached import CachedModel, Span
from engine.runtime.probe import require

STEP_DELIMITER = "\n\n"


@dataclass(frozen=True)
class Step:
    """One step a model wrote after the shared text."""

    tokens: list[int]  # up to and including the delimiter; an end-of-sequence token is not among them
    ended: bool  # the sequence ends with this step (an end of sequence, or the token budget spent)
    confidence: float  # the writer's probability of its least likely pick: its own doubt (beyond the paper)


class Usage(NamedTuple):
    """What one model cost a run."""

    tokens: int  # processed in process; returned, on a server
    flops: float  # 0 on a server: its size is not known here
    seconds: float  # computing, or waiting for the server
    forwards: int  # forward calls, or requests


class StepWriter(Protocol):
    """What the RSD loop needs of a model that writes steps (in process or on a server)."""

    @property
    def cache(self) -> Any:
        """The writer's KV cache, for the run's memory figure (None where a server holds it)."""
        ...

    def write_step(self, seq: list[int], max_step_tokens: int, budget: int) -> Step:
        """One step after ``seq``, ended by :func:`read_step` (``budget``: tokens the run has left)."""
        ...

    def rollback(self, length: int) -> None:
        """Forget everything after the first ``length`` tokens (a rejected step)."""
        ...

    def token_probs(self, seq: list[int], tokens: list[int]) -> list[float]:
        """The model's probability of each of ``tokens`` following ``seq`` (the target-likelihood reward)."""
        ...

    def usage(self) -> Usage: ...

    @property
    def spans(self) -> list[Span]:
        """Every forward (request, on a server) so far, in order, with the tokens each chose that
        joined the step (``Span.kept``)."""
        ...


# (model, cfg, capacity, role) -> its writer; ``role``: "target" or "draft" (the FLOP accounting's name)
WriterFactory = Callable[[Any, RunConfig, int, str], StepWriter]


def read_step(proposals: Iterable[tuple[int, float]], tokenizer, eos_ids, max_step_tokens: int, budget: int) -> Step:
    """RSD's step-end rule over a model's picks as they come, ``(token, its probability)``: a step
    ends at the delimiter ``"\\n\\n"`` once it has non-blank text, at ``max_step_tokens``, at an end
    of sequence (which ends the run and is not part of the step) or when ``budget`` tokens are
    written (which also ends the run). Reads no pick past the step's end, so a lazy source is never
    asked for one more (the in-process writer's forward, a server's stream)."""
    step: list[int] = []
    confidence = 1.0
    for token, prob in proposals:
        confidence = min(confidence, prob)
        if token in eos_ids:
            return Step(step, True, confidence)
        step.append(token)
        if len(step) >= budget:
            return Step(step, True, confidence)
        text = tokenizer.decode(step)  # the whole step: a delimiter may span tokens
        if len(step) >= max_step_tokens or (text.endswith(STEP_DELIMITER) and text.strip()):
            return Step(step, False, confidence)
    return Step(step, False, confidence)  # the source ran dry first (a server that stopped by itself)


class LocalWriter:
    """An in-process model writing RSD's steps: its cache (:class:`CachedModel`) and its choices.
    Fits :class:`StepWriter` and :data:`WriterFactory`."""

    def __init__(self, lm: StepModel, cfg: RunConfig, capacity: int, role: str) -> None:
        if not isinstance(lm, StepModel):  # say so here, not as a failed forward mid-run
            raise TypeError(f"the {role} {getattr(lm, 'model_id', lm)!r} is not an in-process model: run it through "
                            "engine.registry.decoder, which gives each model its writer (or pass decode_rsd a writer)")
        require(lm, f"RSD (its {role})", identical=False)  # its steps are rolled back: measured before the run, else refused
        self.model = CachedModel(lm, capacity, role=role)
        self.chooser = Chooser(cfg.temperature, cfg.top_p, cfg.seed)

    @property
    def cache(self):
        return self.model.cache

    @property
    def spans(self) -> list[Span]:
        return self.model.spans

    def write_step(self, seq: list[int], max_step_tokens: int, budget: int) -> Step:
        """The step's last token is not fed: whoever writes next feeds it along with any other
        tokens it has not seen, in one forward."""
        picks = self._picks(seq)
        try:
            return read_step(picks, self.model.lm.tokenizer, self.model.lm.eos_ids, max_step_tokens, budget)
        finally:
            picks.close()

    def _picks(self, seq: list[int]) -> Iterator[tuple[int, float]]:
        logits = self.model.sync(seq)  # catch up on the shared text in one forward
        while True:
            t = self.chooser.pick(logits)
            if t not in self.model.lm.eos_ids:  # read_step keeps every pick but an end of sequence
                self.model.spans[-1].kept += 1
            # the confidence is read from logits computed anyway
            yield t, float(torch.softmax(logits.float(), dim=-1)[t])
            logits = self.model.feed([t])  # only when the step goes on

    def rollback(self, length: int) -> None:
        self.model.rollback(length)

    def token_probs(self, seq: list[int], tokens: list[int]) -> list[float]:
        return self.model.token_probs(seq, tokens)

    def usage(self) -> Usage:
        m = self.model
        return Usage(m.prefill_tokens + m.decode_tokens, m.flops, m.seconds, m.calls)
