"""Plain decoding, method ``baseline``: the reference decoder every speculative path must match.

Two phases on one KV cache: reasoning up to ``max_think`` tokens (on reaching the budget the
end-of-thinking marker and the template's tail are appended: budget forcing), then the answer up
to ``max_answer`` tokens or an end-of-sequence token. With thinking off (``RunConfig.thinking``) the
prompt asks for the answer alone and the run is its answer phase. One forward per token, nothing clever; the
cache is a :class:`CachedModel`, which re-encodes a longrope model where ``generate()`` does.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

from engine.config import RunConfig
from engine.events import Event, RowWork
from engine.methods.budget import ThinkBudget
from engine.methods.contract import STUDIO, Method
from engine.methods.recorder import Recorder
from engine.methods.sampling import Chooser
from engine.methods.seams import StepModel
from engine.runtime.cache import cache_mb
from engine.runtime.cached import CachedModel
from engine.runtime.probe import require


def decode_baseline(lm: StepModel, prompt: str, cfg: RunConfig) -> Iterator[Event]:
    """Yield the events of a plain run of ``prompt`` (the user message, templated here)."""
    prompt_ids = lm.prompt_ids(prompt, cfg.thinking)
    budget = ThinkBudget.of(lm.markers, cfg)
    new_tokens = budget.new_tokens(cfg.max_answer)
    lm.check_fits(len(prompt_ids), new_tokens)
    require(lm, "plain decoding", rollbacks=False)  # the probe may route later multi-token forwards one by one
    lm.begin_run(cfg.exact_mode, cfg.compile)
    rec = Recorder(lm.tokenizer, "baseline", len(prompt_ids), lm.device)
    yield from rec.compiling(lm.prepare_steps(len(prompt_ids) + new_tokens))  # before the clock starts
    rec.start_clock(lm.step_mode)
    chooser = Chooser(cfg.temperature, cfg.top_p, cfg.seed)
    markers = budget.markers
    seq = CachedModel(lm, len(prompt_ids) + new_tokens)

    # 1. prefill. A forward is yielded when its logits are read (its pick, or the budget forcing
    #    instead), before the tokens it chose: ``fed`` holds the last forward's timing until then
    yield rec.phase("prefill")
    t0 = rec.now()
    logits = seq.feed(prompt_ids)  # [V]
    fed = (t0, rec.clock(), len(prompt_ids), "prefill")

    def forward(kept: int, forced: int = 0):
        start, end, width, phase = fed
        return rec.forward(start, [RowWork("main", width, kept, forced)], end=end, phase=phase)

    # 2. reasoning (skipped for models without think markers, and with thinking off: everything is the answer)
    ended = False  # the model ended the sequence inside its reasoning: no answer
    if markers is not None:
        yield rec.phase("reasoning")
        reasoning: list[int] = []
        while True:
            tok = None if budget.spent(len(reasoning)) else chooser.pick(logits)  # nothing is drawn at the budget
            if budget.ends_run(tok, lm.eos_ids):
                ended = True
                yield forward(0)
                break
            forced = tok is None or tok in lm.eos_ids  # the budget, or a prompted model's end of turn, closes it
            toks = budget.force() if forced else [tok]
            yield forward(0 if forced else 1, len(toks) + len(budget.forced) if forced else 0)
            for tok in toks:
                yield rec.token("reasoning", tok)
            reasoning += toks
            t0 = rec.now()
            logits = seq.feed([*toks, *budget.forced])  # the forced tail rides with the marker
            fed = (t0, rec.clock(), len(toks) + len(budget.forced), "reasoning")
            if forced or markers.closes_at(reasoning, len(reasoning) - 1):
                break

    # 3. answer, opened by the tail budget forcing put after the marker (if it did)
    yield from budget.open_answer(rec)
    answered = len(budget.forced)
    while not ended and answered < cfg.max_answer:
        tok = chooser.pick(logits)
        if tok in lm.eos_ids:
            yield forward(0)
            fed = None
            break
        yield forward(1)
        yield rec.token("answer", tok)
        answered += 1
        fed = None
        if answered == cfg.max_answer:
            break
        t0 = rec.now()
        logits = seq.feed([tok])
        fed = (t0, rec.clock(), 1, "answer")
    if fed is not None and not ended:  # logits no one read: the answer's budget was spent before it
        yield forward(0)
    rec.stats.flops = rec.stats.target_flops = seq.flops  # 2 x parameters x tokens, as RSD counts its models
    rec.stats.target_tokens = seq.prefill_tokens + seq.decode_tokens
    rec.stats.cache_mb = cache_mb(seq.cache)
    yield rec.phase("done")
    yield rec.done()


METHOD = Method("baseline", "Baseline", "plain decoding: one forward per token, the reference every other method is "
                "measured against", start=lambda m: partial(decode_baseline, m.target), server="", studio=STUDIO,
                color="#6b7280")
