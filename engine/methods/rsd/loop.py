"""RSD, methods ``rsd``, ``target`` and ``draft``: reward-guided speculative decoding, step by step.

Liao et al., "Reward-Guided Speculative Decoding for Efficient LLM Reasoning" (ICML 2025,
arXiv 2501.19324). A small draft model writes one step (text up to the step delimiter ``"\\n\\n"``,
an end of sequence, or ``max_step_tokens``); a process reward model scores it given the question
and the steps so far; the acceptance rule (``engine.methods.rsd.acceptance``) keeps it or the target model
writes that step instead, and the target's step is not scored again. Deliberately biased towards
high-reward steps, not lossless. ``target`` and ``draft`` run the same step loop with one model
writing every step: the comparison baselines.

Deviations from the released code (flagged): every model keeps its KV cache and catches up on
unseen tokens in one parallel forward, where the reference re-encodes the whole prefix with the
PRM at every step; and we count FLOPs per model (``engine.runtime.cached``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import torch

from engine.methods.rsd.acceptance import accept
from engine.runtime.cached import CachedModel
from engine.config import RunConfig
from engine.events import Event, StepEvent
from engine.runtime.model import LoadedModel
from engine.methods.rsd.prm import TargetLikelihoodScorer
from engine.methods.recorder import Recorder
from engine.runtime.cache import cache_mb
from engine.methods.sampling import Chooser

STEP_DELIMITER = "\n\n"
RSD_METHODS = ("rsd", "target", "draft")


def check_pair(target: LoadedModel, draft: LoadedModel) -> None:
    """Draft and target must share a tokenizer: same vocabulary, same ids."""
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ValueError(f"draft model {draft.model_id} and target model {target.model_id} do not share a "
                         "tokenizer: RSD needs identical vocabularies")


def decode_rsd(target: LoadedModel, draft: LoadedModel | None, scorer, prompt: str, cfg: RunConfig,
               mode: str = "rsd") -> Iterator[Event]:
    """Yield the events of a step-wise run. ``mode``: "rsd" (draft, PRM, target on rejection),
    "target" or "draft" (that model writes every step)."""
    if mode not in RSD_METHODS:
        raise ValueError(f"unknown RSD mode {mode!r}; choose one of {', '.join(RSD_METHODS)}")
    if mode != "target":
        if draft is None:
            raise ValueError(f"method {mode!r} needs a draft model")
        check_pair(target, draft)
    prompt_ids = target.prompt_ids(prompt)
    capacity = len(prompt_ids) + cfg.max_tokens  # a step stops at the budget
    rec = Recorder(target.tokenizer, mode, len(prompt_ids), target.device)
    for lm in (draft, target) if mode != "target" else (target,):
        lm.check_fits(len(prompt_ids), cfg.max_tokens)
        lm.begin_run(cfg.exact, cfg.compile)
        yield from rec.compile_steps(lm, capacity)  # before the clock starts (the target's step mode is reported)
    T = _writer(target, cfg, capacity, "target")
    D = _writer(draft, cfg, capacity, "draft") if mode != "target" else None
    writers = {"target": T, "draft": D}
    coin = random.Random(cfg.seed)  # the soft rules' acceptance draws
    if mode == "rsd":
        if scorer is None:
            raise ValueError("method 'rsd' needs a process reward model (or the 'target-likelihood' scorer)")
        if scorer == "target-likelihood":
            scorer = TargetLikelihoodScorer(T)
        scorer.start(prompt)
    close_id = target.markers.close_id if target.markers else None
    stream = "reasoning" if close_id is not None else "answer"
    seq, rewards = list(prompt_ids), {True: [], False: []}
    yield rec.phase("prefill")
    yield rec.phase(stream)
    for index in range(cfg.max_steps):
        budget = cfg.max_tokens - (len(seq) - len(prompt_ids))
        if budget <= 0:
            break
        # 1. propose: the draft (or, in "target" mode, the target) writes one step
        source = "target" if mode == "target" else "draft"
        step, ended, confidence = writers[source].write_step(seq, cfg.max_step_tokens, budget)
        reward, kept = None, None
        # 2. score and decide (the paper's rule; with draft_confidence, the draft's doubt too)
        if mode == "rsd":
            text = target.tokenizer.decode(step)
            reward = scorer.score(text, seq, step)
            kept = _accept(cfg, reward, coin) and confidence >= cfg.draft_confidence
            rewards[kept].append(reward)
            if not kept:
                for i, tok in enumerate(step):
                    yield rec.token("draft", tok, draft=index)
                    yield rec.draft_status(index, i, "rejected")
                yield StepEvent(index, text, "draft", reward, False, rec.now(), confidence)
                D.rollback(len(seq))
                source = "target"
                step, ended, _ = T.write_step(seq, cfg.max_step_tokens, budget)
        # 3. accept: the step joins the shared text; each model catches up when it next writes
        status = "accepted" if mode == "rsd" and source == "draft" else "generated"
        for tok in step:
            yield rec.token(stream, tok, status, source="draft" if status == "accepted" else None)
            if tok == close_id and stream == "reasoning":
                stream = "answer"
                yield rec.phase("answer")
        text = target.tokenizer.decode(step)
        drafted = source == "draft" and mode != "draft"
        yield StepEvent(index, text, source, reward if drafted else None, kept if drafted else None, rec.now(),
                        confidence if source == "draft" else None)
        rec.stats.steps_accepted += mode == "rsd" and source == "draft"
        rec.stats.steps_rejected += mode == "rsd" and source == "target"
        if mode == "rsd":
            scorer.commit(text)
        seq += step
        if ended:
            break
    _account(rec, T, D, scorer if mode == "rsd" else None, rewards)
    yield rec.phase("done")
    rec.stats.cache_mb = cache_mb(T.cache, *(D.cache,) if D else ()) or None
    yield rec.done()


class LocalWriter:
    """An in-process model writing RSD's steps: its cache (:class:`CachedModel`) and its choices.
    (On a vLLM server: ``engine.remote.steps.RemoteWriter``, the same methods.)"""

    def __init__(self, lm: LoadedModel, cfg: RunConfig, capacity: int, role: str) -> None:
        self.model = CachedModel(lm, capacity, role=role)
        self.chooser = Chooser(cfg.temperature, cfg.top_p, cfg.seed)

    @property
    def cache(self):
        return self.model.cache

    def write_step(self, seq: list[int], max_step_tokens: int, budget: int) -> tuple[list[int], bool, float]:
        return _write_step(self.model, self.chooser, seq, max_step_tokens, budget)

    def rollback(self, length: int) -> None:
        self.model.rollback(length)

    def token_probs(self, seq: list[int], tokens: list[int]) -> list[float]:
        return self.model.token_probs(seq, tokens)

    def usage(self) -> tuple[int, float, float, int]:
        """(tokens processed, FLOPs, seconds, forwards)."""
        m = self.model
        return m.prefill_tokens + m.decode_tokens, m.flops, m.seconds, m.calls


def _writer(lm, cfg: RunConfig, capacity: int, role: str):
    from engine.remote.model import RemoteModel  # noqa: PLC0415 (engine.remote imports this module)
    from engine.remote.steps import RemoteWriter  # noqa: PLC0415

    return RemoteWriter(lm, cfg) if isinstance(lm, RemoteModel) else LocalWriter(lm, cfg, capacity, role)


def _write_step(model: CachedModel, chooser: Chooser, seq: list[int], max_step_tokens: int,
                budget: int) -> tuple[list[int], bool, float]:
    """One step by ``model`` after ``seq``: tokens up to and including the delimiter. Returns
    (tokens, whether the sequence ended, the model's probability of its least likely token there:
    its own doubt, read from logits it computed anyway). The last token is not fed: whoever writes
    next feeds it along with any other tokens it has not seen, in one forward."""
    tok = model.lm.tokenizer
    logits = model.sync(seq)
    step: list[int] = []
    confidence = 1.0
    while True:
        t = chooser.pick(logits)
        confidence = min(confidence, float(torch.softmax(logits.float(), dim=-1)[t]))
        if t in model.lm.eos_ids:
            return step, True, confidence
        step.append(t)
        if len(step) >= budget:
            return step, True, confidence
        text = tok.decode(step)
        if len(step) >= max_step_tokens or (text.endswith(STEP_DELIMITER) and text.strip()):
            return step, False, confidence
        logits = model.feed([t])


def _accept(cfg: RunConfig, reward: float, coin: random.Random) -> bool:
    return accept(cfg.weighting, reward, coin.random(), cfg.threshold, cfg.weight_param)


def _account(rec: Recorder, T, D, scorer, rewards) -> None:
    """Tokens, FLOPs, seconds and forwards per model (a model on a server: tokens it returned and
    seconds waited, no FLOPs: its size is not known here)."""
    s = rec.stats
    s.target_tokens, s.target_flops, s.target_s, calls = T.usage()
    if D is not None:
        s.draft_model_tokens, s.draft_flops, s.draft_s, draft_calls = D.usage()
        calls += draft_calls
    prm = getattr(scorer, "model", None)
    if isinstance(prm, CachedModel):
        s.prm_tokens, s.prm_flops, s.prm_s = prm.prefill_tokens + prm.decode_tokens, prm.flops, prm.seconds
        calls += prm.calls
    s.flops = s.target_flops + s.draft_flops + s.prm_flops
    s.forward_calls = calls
    s.mean_reward_accepted = sum(rewards[True]) / len(rewards[True]) if rewards[True] else None
    s.mean_reward_rejected = sum(rewards[False]) / len(rewards[False]) if rewards[False] else None
