"""Process reward models behind one interface, :class:`StepScorer`: score a candidate step given the steps so far.

``scorer.score(candidate, seq, step_tokens) -> float in [0, 1]`` and ``scorer.commit(step)`` (the
step was kept, by whoever wrote it). Scorers keep their own KV cache over their own input format
and score incrementally: the question and the committed steps are encoded once; a candidate is
appended, read, and rolled back if it is not committed.

* :class:`MathShepherdScorer`: math-shepherd's format (:class:`MathShepherdFormat`:
  ``question step1 ки\\nstep2 ки ...``); the score is softmax over the ``+`` / ``-`` token logits
  at each tag, ``+`` taken. Our bundled ``tiny-prm`` uses the same format, so one code path serves
  both (and the same format serves such a PRM on a vLLM server: ``engine.remote.prm``).
* :class:`QwenMathPRMScorer`: Qwen2.5-Math-PRM's format (steps joined by ``<extra_0>``, a
  two-class head, class 1 taken). Its modelling code needs ``trust_remote_code``, which is only
  passed when the user explicitly allows it.
* :class:`TargetLikelihoodScorer`: no PRM at all: the mean probability the target gives the
  step's tokens (its FLOPs count as the target's).
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.methods.seams import StepModel
from engine.runtime.cached import CachedModel

STEP_TAG = "ки"


class StepScorer(Protocol):
    """What the RSD loop needs of a reward for a step."""

    def start(self, question: str) -> None:
        """A new run on ``question``: no steps yet."""
        ...

    def score(self, candidate: str, seq: list[int], step_tokens: list[int]) -> float:
        """The reward of ``candidate`` (its text; ``step_tokens``: its tokens after the shared
        ``seq``, for scorers that read the writers' tokens) after the committed steps."""
        ...

    def commit(self, step: str) -> None:
        """``step`` joins the text (kept, or rewritten by the target)."""
        ...


def _clean(step: str) -> str:
    """A step as a PRM reads it: without think markers and surrounding blank lines."""
    return step.replace("<think>", "").replace("</think>", "").strip()


class MathShepherdFormat:
    """math-shepherd's input, ``question step1 ки\\nstep2 ки ...``, built step by step: the committed
    input's tokens, and the step tag where each step's score is read. Shared by the PRM in process
    (:class:`MathShepherdScorer`) and on a server (``engine.remote.prm.ServedPRMScorer``)."""

    def __init__(self, tokenizer, model_id: str) -> None:
        self.tokenizer = tokenizer
        self.tag = single_token(tokenizer, STEP_TAG, model_id)
        self.tokens: list[int] = []  # the committed input: the question and the kept steps
        self._started = False

    def start(self, question: str) -> None:
        # the tokenizer's own start token, if it has one (math-shepherd's Mistral tokenizer adds <s>)
        self.tokens = self.tokenizer.encode(question, add_special_tokens=True)
        self._started = False

    def piece(self, step: str) -> list[int]:
        """The tokens ``step`` adds to the committed input, ending at its tag."""
        # pieces start at whitespace, where byte-level pre-tokenizers split anyway, so encoding
        # piece by piece gives the same tokens as encoding math-shepherd's whole input at once
        sep = "\n" if self._started else " "
        return self.tokenizer.encode(f"{sep}{_clean(step)} {STEP_TAG}", add_special_tokens=False)

    def commit(self, step: str) -> None:
        self.tokens = self.tokens + self.piece(step)
        self._started = True


class MathShepherdScorer:
    """A math-shepherd-format PRM in process: p(+) at each step's tag, from a cache over the
    committed input (a candidate is fed, read at its tag and rolled back)."""

    name = "math-shepherd"

    def __init__(self, lm: StepModel) -> None:
        self.format = MathShepherdFormat(lm.tokenizer, lm.model_id)
        self.plus = single_token(lm.tokenizer, "+", lm.model_id, allow_prefix=True)
        self.minus = single_token(lm.tokenizer, "-", lm.model_id, allow_prefix=True)
        self.lm = lm
        self.model = CachedModel(lm)

    @property
    def tag(self) -> int:
        """The step tag's id (where each step's score is read)."""
        return self.format.tag

    @property
    def tokens(self) -> list[int]:
        """The committed input: the question and the kept steps."""
        return self.format.tokens

    def start(self, question: str) -> None:
        """A new run: a fresh cache, the question encoded once."""
        self.lm.begin_run()
        self.model = CachedModel(self.lm)
        self.format.start(question)

    @torch.inference_mode()
    def score_all(self, question: str, steps: list[str]) -> list[float]:
        """Every step's score in one forward over the whole input (evaluation; no cache kept)."""
        self.start(question)
        for step in steps:
            self.commit(step)
        ids = torch.tensor([self.format.tokens], device=self.lm.device)
        logits = self.lm.model(input_ids=ids).logits[0]  # [T, V]
        tags = (ids[0] == self.format.tag).nonzero().flatten()
        return torch.softmax(logits[tags][:, [self.plus, self.minus]].float(), dim=-1)[:, 0].tolist()

    def score(self, candidate: str, seq: list[int] | None = None, step_tokens: list[int] | None = None) -> float:
        piece, tag = self.format.piece(candidate), self.format.tag
        committed = self.format.tokens
        self.model.sync(committed)  # catch up on committed steps (e.g. a target's step)
        logits = self.model.feed(piece, all_logits=True)  # [T, V]
        tag_logits = logits[-1] if piece[-1] == tag else logits[max(i for i, t in enumerate(piece) if t == tag)]
        probs = torch.softmax(tag_logits[[self.plus, self.minus]].float(), dim=-1)
        self.model.rollback(len(committed))
        return float(probs[0])

    def commit(self, step: str) -> None:
        self.format.commit(step)


class TargetLikelihoodScorer:
    """Mean token probability of the step under the target: a PRM-free reward in [0, 1]."""

    name = "target-likelihood"

    def __init__(self, target) -> None:
        self.target = target  # anything with token_probs: a CachedModel, RSD's writers (in process or on a server)

    def start(self, question: str) -> None:
        pass

    def score(self, candidate: str, seq: list[int], step_tokens: list[int]) -> float:
        probs = self.target.token_probs(seq, step_tokens)
        return sum(probs) / len(probs)

    def commit(self, step: str) -> None:
        pass


class QwenMathPRMScorer:
    """Qwen2.5-Math-PRM: steps joined by ``<extra_0>``; a two-class head per token, class 1 taken."""

    name = "qwen-math-prm"

    def __init__(self, model_id: str, trust_remote_code: bool, device: str | None = None) -> None:
        if not trust_remote_code:
            raise ValueError(f"{model_id} needs trust_remote_code to load its reward head; allow it explicitly "
                             "(--trust-remote-code) if you trust that repository's code")
        from transformers import AutoModel, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_id, trust_remote_code=True)
        self.model = AutoModel.from_pretrained(model_id, trust_remote_code=True).eval()
        self.sep = single_token(self.tokenizer, "<extra_0>", model_id)
        self.question, self.steps = "", []

    def start(self, question: str) -> None:
        self.question, self.steps = question, []

    @torch.inference_mode()
    def score(self, candidate: str, seq: list[int] | None = None, step_tokens: list[int] | None = None) -> float:
        steps = [*self.steps, _clean(candidate)]
        text = self.tokenizer.apply_chat_template(
            [{"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
             {"role": "user", "content": self.question},
             {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"}], tokenize=False)
        ids = self.tokenizer(text, return_tensors="pt").input_ids.to(self.model.device)
        logits = self.model(input_ids=ids)[0][0]  # [T, 2]
        pos = (ids[0] == self.sep).nonzero().flatten()[-1]
        return float(torch.softmax(logits[pos].float(), dim=-1)[1])

    def commit(self, step: str) -> None:
        self.steps.append(_clean(step))


def single_token(tokenizer, text: str, model_id: str, allow_prefix: bool = False) -> int:
    """The id of ``text`` as one token (with ``allow_prefix``: the last of its tokens, for a "+"
    some tokenizers prefix with a space marker). ValueError naming ``model_id`` otherwise."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        if allow_prefix and ids:
            return ids[-1]
        raise ValueError(f"{model_id} does not fit the {text!r} step format: {text!r} is not a single token")
    return ids[0]
