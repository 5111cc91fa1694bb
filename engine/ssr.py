"""SSR, method ``ssr``: self-speculation from a partial chain of thought, with suffix recovery.

Valluri, Nguyen, Grover, "Self-Speculation for Faster Reasoning Models" (arXiv 2608.20359).

Phase A, reasoning with batched drafters. At reasoning token ``draft_start`` (and, for iterative
SSR, every ``draft_interval`` tokens after, up to ``num_drafts``) a draft row forks from the main
row: it copies the main row's KV cache (the prefix is reused, never recomputed), is fed the
end-of-thinking marker and the template tail, and writes a draft answer. Every step is one
forward over all live rows, one token per row: since a fork copies the main row's cache, every
row always has the same length and the same positions, so no padding or mask is needed. A
finished row (end of sequence, ``max_draft`` tokens) leaves the batch.

Phase B, answer by verification. Proposers are asked in order (draft prefix, suffix match in the
drafts, suffix match in prompt/reasoning/answer); the first proposal is verified in one forward
together with the not-yet-fed token; the cache is cropped back to what was accepted.

Decision (documented in docs/SSR.md): a draft still being written when the reasoning ends is
kept with the tokens it has and is not extended. Extending it would cost one forward per token,
the same as writing the answer itself, so on one sequence it cannot pay.

Exactness: under greedy decoding the reasoning and the answer equal ``baseline``'s token for token;
under sampling the main row draws from the same seeded generator as ``baseline`` (drafts draw
from another), and verification is the speculative-sampling rule (see ``engine.sampling``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from engine.config import RunConfig
from engine.events import Event
from engine.model import LoadedModel, crop
from engine.proposers import Draft, DraftPrefixProposer, SuffixProposer
from engine.recorder import Recorder
from engine.sampling import Chooser
from engine.suffix_index import SuffixIndex


def decode_ssr(lm: LoadedModel, prompt: str, cfg: RunConfig) -> Iterator[Event]:
    """Yield the events of an SSR run of ``prompt`` (the user message, templated here)."""
    markers = lm.require_markers()
    cfg.check_ssr()
    prompt_ids = lm.prompt_ids(prompt)
    rec = Recorder(lm.tokenizer, "ssr", len(prompt_ids), lm.device)
    index = SuffixIndex(cfg.min_match)
    index.extend("prompt", prompt_ids)
    state = _State(lm, cfg, rec, index, Chooser(cfg.temperature, cfg.top_p, cfg.seed),
                   Chooser(cfg.temperature, cfg.top_p, cfg.seed + 1))
    yield rec.phase("prefill")
    state.logits = lm.step_logits(prompt_ids, state.cache, 0)[-1:]  # [1, V]: the main row
    rec.forward()
    state.length = len(prompt_ids)
    yield from _reason_and_draft(state, markers)
    if not state.ended:
        yield from _answer(state)
    yield rec.phase("done")
    yield rec.done()


class _State:
    """What the two phases share: the model, one cache, its length, the drafts, the choosers."""

    def __init__(self, lm, cfg, rec, index, main, drafter) -> None:
        self.lm, self.cfg, self.rec, self.index = lm, cfg, rec, index
        self.main, self.drafter = main, drafter
        self.cache = lm.new_cache()
        self.length = 0  # tokens in every row of the cache
        self.logits: torch.Tensor | None = None  # [rows, V] from the last forward
        self.drafts: list[Draft] = []
        self.unfed: list[int] = []  # main-row tokens chosen but not yet in the cache
        self.answer: list[int] = []
        self.ended = False  # the model ended the sequence inside its reasoning


def _reason_and_draft(s: _State, markers) -> Iterator[Event]:
    cfg, rec, lm = s.cfg, s.rec, s.lm
    yield rec.phase("reasoning")
    rows: list[Draft] = []  # live drafts, in batch order after the main row
    n, forced = 0, []
    step_times: dict[bool, list[float]] = {False: [], True: []}  # per reasoning step, without / with drafts
    while True:
        t_step = time.perf_counter()
        # 1. fork: a new row copies the main row and will be fed the end-of-thinking marker
        if len(s.drafts) < cfg.num_drafts and n == cfg.draft_start + len(s.drafts) * cfg.draft_interval:
            d = Draft(len(s.drafts), n, list(markers.close_ids))
            s.drafts.append(d)
            rows.append(d)
            rec.stats.drafts += 1
            s.cache.reorder_cache(torch.tensor([*range(len(rows)), 0], device=lm.device))
            yield rec.phase("drafting", draft=d.index, at_token=n)
        # 2. the main row picks its reasoning token (budget forcing at max_think)
        if n == cfg.max_think:
            tok, forced = markers.close_id, list(markers.close_ids[1:])
        else:
            tok = s.main.pick(s.logits[0])
        n += 1
        if tok in lm.eos_ids:  # the model ended without closing its thoughts: no answer
            s.ended = True
            break
        yield rec.token("reasoning", tok)
        s.index.extend("reasoning", [tok])
        if tok == markers.close_id:
            break
        # 3. every live draft row takes a forced token or picks its next draft token
        inputs, keep = [tok], [0]
        for i, d in enumerate(rows):
            if d.pending:  # the marker first (not part of the draft), then the template tail
                t, q = d.pending.pop(0), None
            else:
                t, q = s.drafter.pick_with_probs(s.logits[1 + i])
                if t in lm.eos_ids:
                    d.finished = True
                    continue
            if d.marker_fed:
                d.tokens.append(t)
                d.probs.append(q)
                s.index.extend(d.name, [t])
                yield rec.token("draft", t, draft=d.index)
            d.marker_fed = True
            if len(d.tokens) >= cfg.max_draft:
                d.finished = True
                continue
            inputs.append(t)
            keep.append(1 + i)
        # 4. drop finished rows, then one forward advances every row by one token
        if len(keep) < 1 + len(rows):
            s.cache.batch_select_indices(torch.tensor(keep, device=lm.device))
            rows = [rows[i - 1] for i in keep[1:]]
        s.logits = lm.forward(torch.tensor(inputs, device=lm.device)[:, None], s.cache, s.length)[:, -1]  # [rows, V]
        rec.forward()
        s.length += 1
        step_times[bool(rows)].append(time.perf_counter() - t_step)
    rec.stats.step_s_alone = _mean(step_times[False])
    rec.stats.step_s_drafting = _mean(step_times[True])
    # 5. reasoning over: live drafts are frozen as they are; the main row goes on alone
    if rows:
        s.cache.batch_select_indices(torch.tensor([0], device=lm.device))
    if s.ended:
        return
    s.unfed = [tok, *forced]
    s.answer = list(forced)
    s.index.extend("answer", forced)
    yield rec.phase("answer")
    for t in forced:
        yield rec.token("answer", t)


def _answer(s: _State) -> Iterator[Event]:
    cfg, rec, lm = s.cfg, s.rec, s.lm
    stop = lm.eos_ids
    proposers = [DraftPrefixProposer(s.drafts[-1] if s.drafts else None)]
    if cfg.suffix_recovery and s.drafts:
        proposers.append(SuffixProposer(s.index, [d.name for d in reversed(s.drafts)], stop, cfg.spec_factor))
    if cfg.context_lookup:
        proposers.append(SuffixProposer(s.index, ["reasoning", "prompt", "answer"], stop, cfg.spec_factor))
    while len(s.answer) < cfg.max_answer:
        # 1. propose
        room = min(cfg.max_spec, cfg.max_answer - len(s.answer))
        prop, who = None, None
        for who in proposers:
            prop = who.propose(s.answer, room)
            if prop is not None:
                break
        proposed = prop.tokens if prop else []
        # 2. verify: the unfed token(s) and the proposal in one forward
        logits = lm.step_logits(s.unfed + proposed, s.cache, s.length)[len(s.unfed) - 1 :]  # [k + 1, V]
        rec.forward()
        accepted, nxt = s.main.verify(logits, proposed, prop.probs if prop else None)
        # 3. accept: roll the cache back to the accepted tokens
        s.length += len(s.unfed) + accepted
        crop(s.cache, s.length)
        for j, t in enumerate(proposed[:accepted]):
            yield rec.token("answer", t, prop.status, prop.draft, prop.source, prop.match_len)
            if prop.draft is not None:
                yield rec.draft_status(prop.draft, prop.start + j, prop.status, prop.source, prop.match_len)
        # 4. record what was proposed and not taken
        if prop is not None:
            for j in range(accepted, len(proposed)):
                if prop.draft is None:
                    rec.rejected_lookup(1)
                elif (ev := rec.draft_status(prop.draft, prop.start + j, "rejected")) is not None:
                    yield ev
            who.observe(prop, accepted)
        s.answer += proposed[:accepted]
        s.index.extend("answer", proposed[:accepted])
        if len(s.answer) >= cfg.max_answer or nxt in stop:
            break
        # 5. the verifier's own token
        yield rec.token("answer", nxt)
        s.answer.append(nxt)
        s.index.extend("answer", [nxt])
        s.unfed = [nxt]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
