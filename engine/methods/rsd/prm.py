"""Process reward models behind one interface: score a candidate step given the steps so far.

``scorer.score(question, steps, candidate) -> float in [0, 1]`` and ``scorer.commit(step)`` (the
step was kept, by whoever wrote it). Scorers keep their own KV cache over their own input format
and score incrementally: the question and the committed steps are encoded once; a candidate is
appended, read, and rolled back if it is not committed.

* :class:`MathShepherdScorer`: math-shepherd's format (``question step1 ки\\nstep2 ки ...``);
  the score is softmax over the ``+`` / ``-`` token logits at each tag, ``+`` taken. Our bundled
  ``tiny-prm`` uses the same format, so one code path serves both.
* :class:`QwenMathPRMScorer`: Qwen2.5-Math-PRM's format (steps joined by ``<extra_0>``, a
  two-class head, class 1 taken). Its modelling code needs ``trust_remote_code``, which is only
  passed when the user explicitly allows it.
* :class:`TargetLikelihoodScorer`: no PRM at all: the mean probability the target gives the
  step's tokens (its FLOPs count as the target's).
"""

from __future__ import annotations

import torch

from engine.runtime.cached import CachedModel
from engine.runtime.model import LoadedModel, load_model

STEP_TAG = "ки"


def _clean(step: str) -> str:
    """A step as a PRM reads it: without think markers and surrounding blank lines."""
    return step.replace("<think>", "").replace("</think>", "").strip()


class MathShepherdScorer:
    name = "math-shepherd"

    def __init__(self, lm: LoadedModel) -> None:
        tok = lm.tokenizer
        self.tag = _single_token(tok, STEP_TAG, lm.model_id)
        self.plus = _single_token(tok, "+", lm.model_id, allow_prefix=True)
        self.minus = _single_token(tok, "-", lm.model_id, allow_prefix=True)
        self.lm = lm
        self.model = CachedModel(lm)
        self.tokens: list[int] = []  # committed PRM input
        self._started = False

    def _encode(self, text: str) -> list[int]:
        return self.lm.tokenizer.encode(text, add_special_tokens=False)

    def _piece(self, step: str) -> list[int]:
        # pieces start at whitespace, where byte-level pre-tokenizers split anyway, so encoding
        # piece by piece gives the same tokens as encoding math-shepherd's whole input at once
        sep = "\n" if self._started else " "
        return self._encode(f"{sep}{_clean(step)} {STEP_TAG}")

    def start(self, question: str) -> None:
        """A new run: a fresh cache, the question encoded once."""
        self.lm.begin_run()
        self.model = CachedModel(self.lm)
        # the tokenizer's own start token, if it has one (math-shepherd's Mistral tokenizer adds <s>)
        self.tokens = self.lm.tokenizer.encode(question, add_special_tokens=True)
        self._started = False

    @torch.inference_mode()
    def score_all(self, question: str, steps: list[str]) -> list[float]:
        """Every step's score in one forward over the whole input (evaluation; no cache kept)."""
        self.start(question)
        for step in steps:
            self.commit(step)
        ids = torch.tensor([self.tokens], device=self.lm.device)
        logits = self.lm.model(input_ids=ids).logits[0]  # [T, V]
        tags = (ids[0] == self.tag).nonzero().flatten()
        return torch.softmax(logits[tags][:, [self.plus, self.minus]].float(), dim=-1)[:, 0].tolist()

    def score(self, candidate: str, seq: list[int] | None = None, step_tokens: list[int] | None = None) -> float:
        piece = self._piece(candidate)
        self.model.sync(self.tokens)  # catch up on committed steps (e.g. a target's step)
        logits = self.model.feed(piece, all_logits=True)  # [T, V]
        tag_logits = logits[-1] if piece[-1] == self.tag else logits[max(i for i, t in enumerate(piece) if t == self.tag)]
        probs = torch.softmax(tag_logits[[self.plus, self.minus]].float(), dim=-1)
        self.model.rollback(len(self.tokens))
        return float(probs[0])

    def commit(self, step: str) -> None:
        self.tokens = self.tokens + self._piece(step)
        self._started = True


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
        from transformers import AutoModel, AutoTokenizer  # noqa: PLC0415

        self.tokenizer = AutoTokenizer.from_pretrained(model_id, trust_remote_code=True)
        self.model = AutoModel.from_pretrained(model_id, trust_remote_code=True).eval()
        self.sep = _single_token(self.tokenizer, "<extra_0>", model_id)
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


def _single_token(tokenizer, text: str, model_id: str, allow_prefix: bool = False) -> int:
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        if allow_prefix and ids:
            return ids[-1]
        raise ValueError(f"{model_id} does not fit the {text!r} step format: {text!r} is not a single token")
    return ids[0]


def make_scorer(spec: str | None, device: str | None = None, trust_remote_code: bool = False):
    """A scorer from a PRM name: "target-likelihood" (resolved by the RSD loop, which owns the
    target's cache), a Qwen2.5-Math-PRM id, or any model in the math-shepherd format (the bundled
    ``tiny-prm`` by default). ValueError when the model fits no format."""
    spec = spec or "tiny-prm"
    if spec == "target-likelihood":
        return spec
    if "qwen2.5-math-prm" in spec.lower():
        return QwenMathPRMScorer(spec, trust_remote_code, device)
    return MathShepherdScorer(load_model(spec, device=device))
