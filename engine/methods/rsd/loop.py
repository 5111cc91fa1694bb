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

The loop knows nothing of how a model runs: it asks :class:`~engine.methods.rsd.writer.StepWriter` s
for steps (built by ``writer``: in process by default; ``engine.registry`` hands it the factory that
puts a model on its vLLM server) and reads what sets the three methods apart from their
:class:`~engine.methods.rsd.roles.Roles` (``engine.methods.rsd.roles``), never from their names.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from functools import partial

from engine.config import RunConfig
from engine.events import Event, ForwardEvent, RowWork, StepEvent
from engine.methods.contract import Method, Models
from engine.methods.recorder import Recorder
from engine.methods.rsd.roles import PLANS, RSD_METHODS, UNJUDGED, Judge, Verdict, cast
from engine.methods.rsd.writer import LocalWriter, Step, StepWriter, WriterFactory
from engine.methods.seams import ThinkMarkers, check_pair
from engine.runtime.cache import cache_mb
from engine.runtime.cached import CachedModel, Span


def decode_rsd(target, draft, scorer, prompt: str, cfg: RunConfig, mode: str = "rsd",
               writer: WriterFactory = LocalWriter) -> Iterator[Event]:
    """Yield the events of a step-wise run. ``mode``: "rsd" (draft, PRM, target on rejection),
    "target" or "draft" (that model writes every step). ``target``, ``draft``: models (in process,
    or what ``writer`` makes a writer of); ``scorer``: a ``StepScorer`` or "target-likelihood".
    ValueError, before any step, for an unknown mode, a missing or mismatched draft, or no scorer."""
    if mode not in RSD_METHODS:
        raise ValueError(f"unknown RSD mode {mode!r}; choose one of {', '.join(RSD_METHODS)}")
    plan = PLANS[mode]
    if "draft" in plan.models:
        if draft is None:
            raise ValueError(f"method {mode!r} needs a draft model")
        check_pair(target, draft)
    prompt_ids = target.prompt_ids(prompt)
    capacity = len(prompt_ids) + cfg.max_tokens  # a step stops at the budget
    rec = Recorder(target.tokenizer, mode, len(prompt_ids), target.device)
    models = {"draft": draft, "target": target}
    for name in plan.models:
        models[name].check_fits(len(prompt_ids), cfg.max_tokens)
        models[name].begin_run(cfg.exact_mode, cfg.compile)
        yield from rec.compiling(models[name].prepare_steps(capacity))  # before the clock starts
    rec.start_clock(target)
    writers = {name: writer(models[name], cfg, capacity, name) for name in ("target", "draft") if name in plan.models}
    roles = cast(plan, writers, scorer, cfg, prompt)
    markers = target.markers
    stream = "reasoning" if markers is not None else "answer"
    reasoning: list[int] = []  # the kept steps' reasoning tokens, where its end is looked for
    lanes = _Lanes(rec, writers, roles.judge)
    seq = list(prompt_ids)
    yield rec.phase("prefill")
    yield rec.phase(stream)
    for index in range(cfg.max_steps):
        budget = cfg.max_tokens - (len(seq) - len(prompt_ids))
        if budget <= 0:
            break
        # 1. propose: the author (the draft; the target in "target" mode) writes one step
        author = roles.author
        step = author.writer.write_step(seq, cfg.max_step_tokens, budget)
        text = target.tokenizer.decode(step.tokens)
        # 2. score and decide (the paper's rule; with draft_confidence, the draft's doubt too)
        verdict = roles.judge.decide(step, text, seq)
        yield from lanes.forwards(index, verdict)
        # 3. rewrite a rejected step: it shows as rejected draft tokens; the target writes the step instead
        if verdict.kept is False:
            yield from _rejected(rec, index, step, text, verdict)
            author.writer.rollback(len(seq))
            author = roles.rewriter
            step = author.writer.write_step(seq, cfg.max_step_tokens, budget)
            text = target.tokenizer.decode(step.tokens)
            yield from lanes.forwards(index, UNJUDGED)
        # 4. accept: the step joins the shared text; each model catches up when it next writes
        stream = yield from _tokens(rec, stream, step.tokens, author.status, markers, reasoning)
        shown = verdict if verdict.kept else UNJUDGED  # a rewritten step is not scored again
        yield StepEvent(index, text, author.source, shown.reward, shown.kept, rec.now(),
                        step.confidence if author.shows_confidence else None)
        # 5. record
        rec.stats.rsd.steps_accepted += verdict.kept is True
        rec.stats.rsd.steps_rejected += verdict.kept is False
        roles.judge.commit(text)
        seq += step.tokens
        if step.ended:
            break
    _account(rec, writers, roles.judge)
    yield rec.phase("done")
    rec.stats.cache_mb = cache_mb(*(w.cache for w in writers.values())) or None
    yield rec.done()


class _Lanes:
    """Each model's forwards (``Span`` s: its writer's, the PRM's), yielded as the run's
    :class:`ForwardEvent` s in the order they ran, after the step that caused them."""

    def __init__(self, rec: Recorder, writers: dict[str, StepWriter], judge: Judge) -> None:
        prm = getattr(judge.scorer, "model", None)  # a PRM in process (a served one reports no forwards)
        self.rec = rec
        self.sources: dict[str, list[Span]] = {name: w.spans for name, w in writers.items()}
        if isinstance(prm, CachedModel):
            self.sources["prm"] = prm.spans
        self.seen = dict.fromkeys(self.sources, 0)

    def forwards(self, index: int, verdict: Verdict) -> Iterator[ForwardEvent]:
        new = []
        for name, spans in self.sources.items():
            new += [(span, name) for span in spans[self.seen[name]:]]
            self.seen[name] = len(spans)
        t0 = self.rec.t0
        for span, name in sorted(new, key=lambda x: x[0].start):
            note = None
            if name == "prm" and verdict.reward is not None:
                note = f"step {index}: reward {verdict.reward:.3f}, {'kept' if verdict.kept else 'rejected'}"
            yield self.rec.forward(span.start - t0, [RowWork(name, span.fed, span.kept, note=note)], end=span.end - t0)


def _rejected(rec: Recorder, index: int, step: Step, text: str, verdict: Verdict) -> Iterator[Event]:
    """A draft step the judge rejected, on the draft stream (draft ``index``: the step's number)."""
    for i, tok in enumerate(step.tokens):
        yield rec.token("draft", tok, draft=index)
        yield rec.draft_status(index, i, "rejected")
    yield StepEvent(index, text, "draft", verdict.reward, False, rec.now(), step.confidence)


def _tokens(rec: Recorder, stream: str, tokens: list[int], status: str, markers: ThinkMarkers | None,
            reasoning: list[int]) -> Generator[Event, None, str]:
    """A kept step's tokens on ``stream``, switching to the answer where the reasoning closes
    (``reasoning``: its tokens so far, extended here); returns the stream the next step continues."""
    for tok in tokens:
        yield rec.token(stream, tok, status, source="draft" if status == "accepted" else None)
        if stream == "reasoning":
            reasoning.append(tok)
            if markers.closes_at(reasoning, len(reasoning) - 1):
                stream = "answer"
                yield rec.phase("answer")
    return stream


def _account(rec: Recorder, writers: dict[str, StepWriter], judge: Judge) -> None:
    """Tokens, FLOPs, seconds and forwards per model (a model on a server: tokens it returned and
    seconds waited, no FLOPs: its size is not known here)."""
    s = rec.stats
    s.target_tokens, s.target_flops, s.target_s, calls = writers["target"].usage()
    if "draft" in writers:
        s.draft_model_tokens, s.draft_flops, s.draft_s, draft_calls = writers["draft"].usage()
        calls += draft_calls
    prm = getattr(judge.scorer, "model", None)  # a PRM in process counts (a served one has no model here)
    if isinstance(prm, CachedModel):
        s.prm_tokens, s.prm_flops, s.prm_s = prm.prefill_tokens + prm.decode_tokens, prm.flops, prm.seconds
        calls += prm.calls
    s.flops = s.target_flops + s.draft_flops + s.prm_flops
    s.forward_calls = calls
    kept, rejected = judge.rewards[True], judge.rewards[False]
    s.rsd.mean_reward_accepted = sum(kept) / len(kept) if kept else None
    s.rsd.mean_reward_rejected = sum(rejected) / len(rejected) if rejected else None


def _method(mode: str, label: str, summary: str, studio: tuple[str, ...], color: str) -> Method:
    def start(m: Models):
        return partial(decode_rsd, m.target, m.draft, m.scorer, mode=mode, writer=m.writer or LocalWriter)

    plan = PLANS[mode]
    return Method(mode, label, summary, start, exact=False, drafts=plan.writer == "draft" and plan.judged, steps=True,
                  uses=("draft", "prm") if plan.judged else tuple(m for m in plan.models if m != "target"),
                  server="", thinking_off="runs with thinking on only (its draft model writes reasoning steps)",
                  studio=studio, color=color)


METHODS = (
    _method("rsd", "RSD", "reward-guided speculative decoding: a draft model writes each reasoning step, a PRM judges "
            "it, the target rewrites a rejected one (lossy by design)", ("run", "compare", "benchmark"), "#9333ea"),
    _method("target", "RSD target alone", "RSD's step loop with the target writing every step (its quality bar)",
            ("benchmark",), "#b45309"),
    _method("draft", "RSD draft alone", "RSD's step loop with the draft writing every step (its speed floor)", (), "#0d9488"),
)
