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
from engine.methods.plain import PlainText
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
    rec.start_clock(lm)
    chooser = Chooser(cfg.temperature, cfg.top_p, cfg.seed)
    seq = CachedModel(lm, len(prompt_ids) + new_tokens)

    text = PlainText(list(prompt_ids), budget, lm.eos_ids, cfg.max_answer)  # the rules, pick by pick

    # 1. prefill. A forward is yielded when its logits are read (its pick, or the budget forcing
    #    instead), before the tokens it chose: ``fed`` holds the last forward's timing until then
    yield rec.phase("prefill")
    t0 = rec.now()
    logits = seq.feed(prompt_ids)  # [V]
    fed = (t0, rec.clock(), len(prompt_ids), "prefill")

    def forward(kept: int, forced: int = 0):
        start, end, width, phase = fed
        return rec.forward(start, [RowWork("main", width, kept, forced)], end=end, phase=phase)

    if text.stream == "reasoning":  # 2. reasoning, then the answer (thinking off, no markers: the answer alone)
        yield rec.phase("reasoning")
    else:
        yield from budget.open_answer(rec)
    while not text.ended:
        # 3. one pick (none at the reasoning's budget: the marker is forced), joined by plain decoding's rules
        tok = chooser.pick(logits) if text.room > 0 else None
        taken = text.take([] if tok is None else [tok], ahead=False)
        yield forward(taken.kept, len(taken.forced) + len(taken.tail))
        fed = None
        if taken.kept:
            yield rec.token(taken.stream, tok)
        for forced in taken.forced:  # the end-of-thinking marker (the tail opens the answer)
            yield rec.token("reasoning", forced)
        if text.ended and not taken.opened:  # an end of sequence, or the answer's budget spent on a pick
            break
        # 4. read what joined the text (a pick, or the marker and its tail) for the next pick's logits
        t0, owed = rec.now(), text.ids[seq.length:]
        logits = seq.feed(owed)
        fed = (t0, rec.clock(), len(owed), taken.stream)
        if taken.opened:  # then the answer opens, with the tail budget forcing put after the marker (if it did)
            yield from budget.open_answer(rec)
    if text.stream == "reasoning":  # the model ended the sequence inside its reasoning: an empty answer phase
        yield from budget.open_answer(rec)
    if fed is not None:  # logits no one read: the tail budget forcing put after the marker spent the answer's budget
        yield forward(0)
    rec.stats.flops = rec.stats.target_flops = seq.flops  # 2 x parameters x tokens, as RSD counts its models
    rec.stats.target_tokens = seq.prefill_tokens + seq.decode_tokens
    rec.stats.cache_mb = cache_mb(seq.cache)
    yield rec.phase("done")
    yield rec.done()


METHOD = Method("baseline", "Baseline", "plain decoding: one forward per token, the reference every other method is "
                "measured against", start=lambda m: partial(decode_baseline, m.target), server="", studio=STUDIO,
                color="#6b7280")
