"""The peers a user could pick instead: ``transformers`` ``generate()``: plain, prompt-lookup, static, assisted.

Methods ``hf`` (greedy or sampled ``generate()`` on the same templated input), ``hf-pld`` (the same
with ``prompt_lookup_num_tokens=10``), ``hf-static`` (the same with the static cache,
``cache_implementation="static"``, which transformers compiles by itself on a GPU: what a
transformers user picks for speed; the bench's warm-up run absorbs that compilation) and
``hf-assisted`` (the same with ``assistant_model``: transformers' assisted generation, a draft model
proposing tokens the target verifies; our own loop of it is ``sd``, ``engine.methods.sd``).

They keep baseline's budget (:class:`~engine.methods.budget.ThinkBudget`, the one rule), so that
under greedy decoding they write baseline's tokens exactly:

1. reasoning: one ``generate()`` of at most ``budget.picks`` tokens, stopped at the token that
   closes the reasoning (``ThinkMarkers.closes_at``, checked by a stopping criterion) or at an end
   of sequence; when the model did not close it, the marker and the template tail are forced
   (``budget.force()``), as baseline forces them;
2. answer: a second ``generate()`` of the answer budget left (``max_answer`` less the forced tail),
   on the first call's cache: only the tokens it has not seen (the last reasoning token, the
   forced marker and tail) are fed. ``hf-pld`` and ``hf-assisted`` re-prefill instead (see
   :meth:`_Calls.generate`).

A model without markers has no reasoning: one ``generate()`` of ``max_answer`` tokens. The events
are emitted after the calls return, each with the time its token was produced (recorded by a
streamer; a forced token at the moment it was forced), so latency, time to first answer token and
the phase seconds are measured as for our own loops, across both calls; the forwards of both calls
are counted (``hf-assisted``: the draft model's too, as the row "draft", which writes no stream: transformers
does not report its proposals).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from functools import partial

import torch
from transformers import StoppingCriteria, StoppingCriteriaList
from transformers.generation.streamers import BaseStreamer

from engine.config import RunConfig
from engine.events import Event, RowWork, RunStats, TokenEvent
from engine.methods.budget import ThinkBudget
from engine.methods.contract import Method
from engine.methods.recorder import Recorder, numerics_of
from engine.methods.sd import LOOKAHEAD
from engine.methods.seams import StepModel, check_pair
from engine.runtime.cached import Span
from engine.runtime.markers import ThinkMarkers

PLD_TOKENS = 10
# hf-assisted against sd like with like: sd's k, held constant (transformers' default schedule is "constant" from 20
# tokens, and its confidence threshold, 0.4, ends a proposal early where the draft doubts: off here, as sd has none)
ASSISTANT = dict(num_assistant_tokens=LOOKAHEAD, num_assistant_tokens_schedule="constant",
                 assistant_confidence_threshold=0.0)


class _Clock(BaseStreamer):
    """Records when each generated token arrives (the first ``put`` of a call is its input), and
    which forward produced it: every ``put`` follows the forward whose logits chose its tokens, so
    its count goes to the newest of ``spans`` (``Span.kept``: produced, until the emitted ones are known)."""

    def __init__(self, spans: list[Span]) -> None:
        self.times: list[float] = []
        self.spans = spans
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.extend([time.perf_counter()] * value.numel())
        if self.spans:
            self.spans[-1].kept += value.numel()

    def end(self) -> None:
        pass


class _Closes(StoppingCriteria):
    """Stops ``generate()`` at the token that closes the reasoning (``ThinkMarkers.closes_at``: the
    one rule, on the tokens generated after ``start``; prompt lookup may add several per step)."""

    def __init__(self, markers: ThinkMarkers, start: int) -> None:
        self.markers, self.start = markers, start
        self.reasoning: list[int] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs) -> torch.BoolTensor:
        seen = len(self.reasoning)
        self.reasoning += input_ids[0, self.start + seen :].tolist()
        closed = any(self.markers.closes_at(self.reasoning, i) for i in range(seen, len(self.reasoning)))
        return torch.full((input_ids.shape[0],), closed, dtype=torch.bool, device=input_ids.device)


class _Calls:
    """One run's ``generate()`` calls, one after another, on one cache where transformers lets us."""

    def __init__(self, lm: StepModel, cfg: RunConfig, capacity: int, prompt_lookup: bool, static: bool,
                 assistant: StepModel | None = None) -> None:
        self.lm = lm
        self.assistant = assistant
        self.kwargs: dict = dict(eos_token_id=sorted(lm.eos_ids), pad_token_id=lm.tokenizer.pad_token_id or min(lm.eos_ids),
                                 return_dict_in_generate=True)
        if cfg.greedy:
            self.kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        else:
            self.kwargs.update(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)
        if prompt_lookup:
            self.kwargs["prompt_lookup_num_tokens"] = PLD_TOKENS
        if assistant is not None:  # (batch size 1, as assisted generation requires)
            self.kwargs.update(assistant_model=assistant.model, **ASSISTANT)
        # the static cache is sized once for the whole run (max_cache_len), so the answer's call reuses it
        self.first: dict = dict(cache_implementation="static", max_cache_len=capacity) if static else {}
        self.reprefill = prompt_lookup or assistant is not None  # assisted decoding (see generate)
        self.cache = None
        self.spans: list[Span] = []  # the model's forwards in the current call (the hooks in forwards() fill it)
        self.drafts: list[Span] = []  # the assistant's, over the run (when it is another module than the target)

    @contextmanager
    def forwards(self) -> Iterator[None]:
        """Time every forward of the model (its start and, device synchronised, its end) and its width; and
        the assistant's, where it is another module (a model assisting itself shows every forward as its own)."""
        with ExitStack() as stack:
            stack.enter_context(_timed(self.lm.model, lambda: self.spans))
            if self.assistant is not None and self.assistant.model is not self.lm.model:
                stack.enter_context(_timed(self.assistant.model, lambda: self.drafts))
            stack.enter_context(_assisting(self.assistant))
            yield

    def generate(self, ids: list[int], max_new: int,
                 stop: StoppingCriteria | None = None) -> tuple[list[int], list[float], list[Span]]:
        """Up to ``max_new`` tokens after ``ids`` (an end of sequence included, if one came; with prompt
        lookup maybe tokens past ``stop``), the ``perf_counter`` time each one arrived, and the call's
        forwards (each with the tokens it produced)."""
        self.spans = []
        clock = _Clock(self.spans)
        kwargs = {**self.kwargs, "max_new_tokens": max_new, "streamer": clock}
        if stop is not None:
            kwargs["stopping_criteria"] = StoppingCriteriaList([stop])
        kwargs.update({"cache": self.cache} if self.cache is not None else self.first)
        out = self.lm.model.generate(torch.tensor([ids], device=self.lm.device), **kwargs)
        # The next call feeds only what this cache has not seen. Not with prompt lookup or an assistant: assisted decoding
        # (transformers 5.24) feeds its whole input on its first step whatever the cache holds (wrong tokens on a filled
        # cache), and its accepted tokens may run past the close; so hf-pld and hf-assisted re-prefill their answer's call
        # (counted: the hook sees it).
        self.cache = None if self.reprefill else out.cache
        new = out.sequences[0, len(ids) :].tolist()
        assert len(clock.times) >= len(new), f"the streamer saw {len(clock.times)} of {len(new)} generated tokens"
        return new, clock.times[: len(new)], self.spans


@contextmanager
def _timed(model: torch.nn.Module, spans) -> Iterator[None]:
    """Each forward of ``model`` appended to ``spans()`` (the list current then) as a :class:`Span`: its
    start, its end (device synchronised) and its width."""

    def before(module, args, kwargs):
        spans().append(Span(time.perf_counter(), 0.0, 0))

    def after(module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is None:
            ids = kwargs.get("inputs_embeds")
        if output.logits.device.type == "cuda":
            torch.cuda.synchronize(output.logits.device)
        span = spans()[-1]
        span.end, span.fed = time.perf_counter(), int(ids.shape[1]) if ids is not None else 0

    hooks = [model.register_forward_pre_hook(before, with_kwargs=True),
             model.register_forward_hook(after, with_kwargs=True)]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


@contextmanager
def _assisting(assistant: StepModel | None) -> Iterator[None]:
    """The assistant's generation config set to :data:`ASSISTANT` for the run, then put back: transformers
    (5.25) reads the assistant's proposal length, schedule and confidence threshold from the assistant's
    own ``generation_config``, not from the target's ``generate()`` arguments."""
    config = assistant.model.generation_config if assistant is not None else None
    before = {key: getattr(config, key) for key in ASSISTANT} if config is not None else {}
    if config is not None:
        config.update(**ASSISTANT)
    try:
        yield
    finally:
        if config is not None:
            config.update(**before)


def decode_hf(lm: StepModel, prompt: str, cfg: RunConfig, prompt_lookup: bool = False,
              static: bool = False, assistant: StepModel | None = None) -> Iterator[Event]:
    """Yield the events of one run through ``generate()`` (``prompt_lookup``: with prompt-lookup
    decoding; ``static``: with the static cache; ``assistant``: assisted by that draft model, of the
    same tokenizer: ValueError otherwise, before any event), on baseline's budget."""
    if assistant is not None:
        check_pair(lm, assistant)
    prompt_ids = lm.prompt_ids(prompt, cfg.thinking)
    budget = ThinkBudget.of(lm.markers, cfg)
    markers = budget.markers
    new_tokens = budget.new_tokens(cfg.max_answer)
    lm.check_fits(len(prompt_ids), new_tokens)
    name = "hf-pld" if prompt_lookup else "hf-static" if static else "hf-assisted" if assistant is not None else "hf"
    rec = Recorder(lm.tokenizer, name, len(prompt_ids), lm.device)
    calls = _Calls(lm, cfg, len(prompt_ids) + new_tokens, prompt_lookup, static, assistant)
    for model in dict.fromkeys(m for m in (lm, assistant) if m is not None):
        model.begin_run("rows" if cfg.exact else False)  # generate() runs the model's own forward: only the per-row route
    if not cfg.greedy:
        torch.manual_seed(cfg.seed)
    reasoning, answer, ended = [], [], False
    stamps: list[float] = []  # when each reasoning token, then each answer token (forced tail first) came
    firsts: list[float] = []  # when each call produced its first token
    thinking: list[Span] = []  # the reasoning call's forwards, then the answer call's
    answering: list[Span] = []
    start = time.perf_counter()
    with torch.inference_mode(), ExitStack() as stack, calls.forwards():
        for model in dict.fromkeys(m for m in (lm, assistant) if m is not None):
            stack.enter_context(model.forwards())
        # 1. reasoning (skipped for models without think markers, and with thinking off: everything is the answer)
        if markers is not None and budget.picks:
            new, times, thinking = calls.generate(prompt_ids, budget.picks, _Closes(markers, len(prompt_ids)))
            firsts += times[:1]
            reasoning, stamps, ended = _reasoning(new, times, markers, budget, lm.eos_ids)
        picked = len(reasoning)
        if markers is not None and (budget.picks == 0 or _forced(reasoning, markers, ended)):
            reasoning += budget.force()  # the marker; the template tail, in budget.forced, opens the answer
            stamps += [time.perf_counter()] * (len(markers.marker_ids) + len(budget.forced))
        # 2. answer: what the forced tail left of its budget, on the reasoning's cache
        left = cfg.max_answer - len(budget.forced)
        if not ended and left > 0:
            new, times, answering = calls.generate(prompt_ids + reasoning + budget.forced, left)
            firsts += times[:1]
            cut = next((i for i, t in enumerate(new) if t in lm.eos_ids), len(new))
            answer, stamps = new[:cut], stamps + times[:cut]
    wall = time.perf_counter() - start
    rec.t0 = start
    rec.stats.numerics = numerics_of(lm)
    if cfg.exact:
        rec.stats.step_mode = lm.step_mode  # the route it ran on: matched so, like every exact run

    # 3. the events, each token at the time it came, each after the forward that chose it (the first forward of
    #    each call feeds its input: the prompt, or the reasoning's end, as baseline's forwards do)
    at = iter([t - start for t in stamps])
    answering = _emitted(answering, len(answer), "reasoning" if thinking else "prefill", "answer")
    thinking = _emitted(thinking, picked, "prefill", "reasoning")
    forced = len(reasoning) - picked + len(budget.forced)
    proposer = "lookup in prompt and output" if prompt_lookup else "draft model" if assistant is not None else None
    drafts = list(calls.drafts)  # the assistant's forwards, each recorded before the target's next
    yield rec.phase("prefill")
    if markers is not None:
        yield rec.phase("reasoning")
    picks = iter(reasoning)
    for i, (span, phase) in enumerate(thinking):
        yield from _drafts_until(rec, drafts, span.start, start, phase)
        yield rec.forward(span.start - start, [_work(span, i, proposer, forced if i == len(thinking) - 1 else 0)],
                          end=span.end - start, phase=phase)
        for _ in range(span.kept):
            yield replace(rec.token("reasoning", next(picks)), t=next(at))
    for tok in picks:  # the forced marker
        yield replace(rec.token("reasoning", tok), t=next(at))
    for ev in budget.open_answer(rec):  # the answer phase, opened by the forced tail (if any)
        yield replace(ev, t=next(at)) if isinstance(ev, TokenEvent) else ev
    picks = iter(answer)
    for i, (span, phase) in enumerate(answering):  # (no reasoning call, Max think all marker: forced before it)
        yield from _drafts_until(rec, drafts, span.start, start, phase)
        yield rec.forward(span.start - start, [_work(span, i, proposer, forced if i == 0 and not thinking else 0)],
                          end=span.end - start, phase=phase)
        for _ in range(span.kept):
            yield replace(rec.token("answer", next(picks)), t=next(at))
    yield from _drafts_until(rec, drafts, float("inf"), start, "answer")  # (none: every proposal is verified)
    yield rec.phase("done")
    _phase_seconds(rec.stats, [t - start for t in stamps], len(reasoning), min(firsts, default=start + wall) - start,
                   wall)
    yield rec.done(wall_s=wall)


def _emitted(spans: list[Span], emitted: int, first: str, rest: str) -> list[tuple[Span, str]]:
    """A call's forwards, each keeping of what it produced the tokens the run emitted (the reasoning
    stops at its close, the answer before its end of sequence), with its phase (``first`` for the
    forward that fed the call's input)."""
    out = []
    for i, span in enumerate(spans):
        span.kept = min(span.kept, emitted)
        emitted -= span.kept
        out.append((span, first if i == 0 else rest))
    return out


def _drafts_until(rec: Recorder, drafts: list[Span], until: float, start: float, phase: str) -> Iterator[Event]:
    """The assistant's forwards (``drafts``, taken off its front) that started before ``until``
    (``perf_counter``), in ``phase`` (the target's next forward's), as the row "draft": they write no
    stream (transformers does not report its proposals)."""
    while drafts and drafts[0].start < until:
        span = drafts.pop(0)
        yield rec.forward(span.start - start, [RowWork("draft", span.fed)], end=span.end - start, phase=phase)


def _work(span: Span, i: int, proposer: str | None, forced: int = 0) -> RowWork:
    """A generate() forward as a row's work; with prompt lookup or an assistant each forward after the first
    verifies the candidates it was fed after its last token (accepted: what it produced, less its own pick)."""
    verifies = proposer is not None and i > 0 and span.fed > 1
    return RowWork("main", span.fed, span.kept, forced, span.fed - 1 if verifies else 0,
                   max(span.kept - 1, 0) if verifies else 0, proposer if verifies else None)


def _reasoning(new: list[int], times: list[float], markers: ThinkMarkers, budget: ThinkBudget,
               eos_ids: frozenset[int]) -> tuple[list[int], list[float], bool]:
    """The reasoning tokens among the first call's ``new`` ones (and when each came), and whether
    the run ended inside it, read as baseline reads its picks: an end of sequence ends the run
    (``budget.ends_run``) or, on a prompted model, stops the reasoning for the forced close; the
    token that closes it (``markers.closes_at``) is the last (prompt lookup may have run past it)."""
    reasoning: list[int] = []
    for tok in new:
        if tok in eos_ids:
            return reasoning, times[: len(reasoning)], budget.ends_run(tok, eos_ids)
        reasoning.append(tok)
        if markers.closes_at(reasoning, len(reasoning) - 1):
            break
    return reasoning, times[: len(reasoning)], False


def _forced(reasoning: list[int], markers: ThinkMarkers, ended: bool) -> bool:
    """Whether the budget (or a prompted model's end of turn) must force the close after ``reasoning``,
    the model's picks: it did not close it itself and did not end the run."""
    return not ended and not (reasoning and markers.closes_at(reasoning, len(reasoning) - 1))


def _phase_seconds(s: RunStats, at: list[float], reasoning: int, first: float, wall: float) -> None:
    """Prefill (to the first token the model produced), reasoning (to its last token) and answer (the
    rest) seconds, which add up to ``wall``; the first answer token's time (``at``: each token's)."""
    s.ttft_s = at[reasoning] if len(at) > reasoning else None
    s.prefill_s = min(first, wall)
    end_of_reasoning = max(at[reasoning - 1], s.prefill_s) if reasoning else s.prefill_s
    s.reasoning_s = end_of_reasoning - s.prefill_s
    s.answer_s = wall - end_of_reasoning


NOT_ON_LLAMA = ("is transformers' own generate(), which the llama.cpp runtime does not run (a GGUF file there has no "
                "transformers module): run it on the transformers runtime; the bench compares with llama.cpp's own "
                "generation instead")
METHODS = (
    Method("hf", "transformers generate()", "transformers' own generate() on the same templated input and budget",
           start=lambda m: partial(decode_hf, m.target), llama=NOT_ON_LLAMA, color="#db2777"),
    Method("hf-pld", "transformers prompt lookup", f"generate() with prompt-lookup decoding ({PLD_TOKENS} tokens)",
           start=lambda m: partial(decode_hf, m.target, prompt_lookup=True), llama=NOT_ON_LLAMA, color="#65a30d"),
    Method("hf-static", "transformers static cache", "generate() with the static cache (compiled by transformers "
           "on a GPU)", start=lambda m: partial(decode_hf, m.target, static=True), llama=NOT_ON_LLAMA,
           color="#0891b2"),
)
# transformers' assisted generation, beside our sd (engine.methods.sd): registered by engine.registry with sd
ASSISTED = Method("hf-assisted", "transformers assisted generation", "generate() with a draft model "
                  f"(assistant_model, {LOOKAHEAD} tokens per verify)",
                  start=lambda m: partial(decode_hf, m.target, assistant=m.draft), uses=("draft",), llama=NOT_ON_LLAMA,
                  color="#a16207")
