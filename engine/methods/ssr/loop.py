"""SSR, method ``ssr``: self-speculation from a partial chain of thought, with suffix recovery.

Valluri, Nguyen, Grover, "Self-Speculation for Faster Reasoning Models" (arXiv 2608.20359).

Phase A, reasoning with batched drafters. At reasoning token ``draft_start`` (and, for iterative
SSR, every ``draft_interval`` tokens after, up to ``num_drafts``) a draft row forks from the main
row: it copies the main row's KV cache (the prefix is reused, never recomputed), is fed the
end-of-thinking marker and the template tail, and writes a draft answer. Every step is one
forward over all live rows. Beyond the paper, each row may also verify a lookup proposal in that
forward (``think_spec`` tokens at most: the main row's from the prompt and its reasoning, a
draft's from itself, the reasoning and the prompt), so rows take different numbers of tokens per
step; the slots a row rejected stay in the shared cache as *holes* that the row's attention mask
hides, and each row carries its own positions. When only the main row is left its holes are
compacted away. A finished row (end of sequence, ``max_draft`` tokens) leaves the batch. Models
whose cache cannot hold holes (sliding windows, recurrent states: ``engine.runtime.cache``) feed
one token per row per step while drafts ride, as the paper does; a lone main row still speculates.

Phase B, answer by verification. Proposers are asked in order (draft prefix, suffix match in the
drafts, suffix match in prompt/reasoning/answer); the first proposal is verified in one forward
together with the not-yet-fed token; the cache is rolled back to what was accepted (a crop, or
for recurrent states a restore and re-read). A draft that ended by sampling end-of-sequence
proposes that end too, with its probability, so an accepted end ends the answer.

Decision (documented in docs/SSR.md): a draft still being written when the reasoning ends is
kept with the tokens it has and is not extended. Extending it would cost one forward per token,
the same as writing the answer itself, so on one sequence it cannot pay.

Exactness: under greedy decoding the reasoning and the answer equal ``baseline``'s token for token;
under sampling the main row draws from the same seeded generator as ``baseline`` (drafts draw
from another), and verification is the speculative-sampling rule (see ``engine.methods.sampling``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from engine.config import RunConfig
from engine.events import Event
from engine.runtime.model import LoadedModel
from engine.runtime.cache import cache_mb, checkpoint, compact, crop, take_rows
from engine.methods.ssr.proposers import Draft, DraftPrefixProposer, SuffixProposer
from engine.methods.recorder import Recorder
from engine.methods.sampling import Chooser
from engine.methods.ssr.suffix_index import SuffixIndex


def decode_ssr(lm: LoadedModel, prompt: str, cfg: RunConfig) -> Iterator[Event]:
    """Yield the events of an SSR run of ``prompt`` (the user message, templated here)."""
    markers = lm.require_markers()
    cfg.check_ssr()
    prompt_ids = lm.prompt_ids(prompt)
    last_fork = min(cfg.draft_start + (cfg.num_drafts - 1) * cfg.draft_interval, cfg.max_think)
    new_tokens = len(markers.close_ids) + max(cfg.max_think + cfg.max_answer, last_fork + cfg.max_draft)
    lm.check_fits(len(prompt_ids), new_tokens)
    lm.rope.check_speculation(len(prompt_ids) + new_tokens, lm.model_id)
    lm.begin_run(cfg.exact, cfg.compile)
    capacity = len(prompt_ids) + new_tokens + max(cfg.max_spec, cfg.think_spec) + 1  # room for a verify past the end
    rec = Recorder(lm.tokenizer, "ssr", len(prompt_ids), lm.device)
    # before the clock starts: every shape (rows x width) the run can meet
    yield from rec.compile_steps(lm, capacity, 1 + cfg.num_drafts, max(cfg.think_spec, len(markers.close_ids)) + 1)
    index = SuffixIndex(cfg.min_match)
    index.extend("prompt", prompt_ids)
    state = _State(lm, cfg, rec, index, Chooser(cfg.temperature, cfg.top_p, cfg.seed),
                   Chooser(cfg.temperature, cfg.top_p, cfg.seed + 1), capacity)
    yield rec.phase("prefill")
    if len(prompt_ids) > 1:  # the last prompt token is the main row's first input in phase A
        lm.step_logits(prompt_ids[:-1], state.cache, 0)
        rec.forward()
    state.length = len(prompt_ids) - 1
    yield from _reason_and_draft(state, markers, prompt_ids[-1])
    if not state.ended:
        state.index.reset_cursors()  # the answer reads every source afresh
        yield from _answer(state)
    rec.stats.cache_mb = cache_mb(state.cache)
    yield rec.phase("done")
    yield rec.done()


class _State:
    """What the two phases share: the model, one cache, its length, the drafts, the choosers."""

    def __init__(self, lm, cfg, rec, index, main, drafter, capacity: int) -> None:
        self.lm, self.cfg, self.rec, self.index = lm, cfg, rec, index
        self.main, self.drafter = main, drafter
        self.cache = lm.new_cache(capacity, rows=1 + cfg.num_drafts)
        self.length = 0  # tokens in every row of the cache
        self.drafts: list[Draft] = []
        self.unfed: list[int] = []  # main-row tokens chosen but not yet in the cache
        self.answer: list[int] = []
        self.ended = False  # the model ended the sequence inside its reasoning

    def verify(self, proposed: list[int], probs) -> tuple[int, int]:
        """Feed the unfed token(s) and ``proposed`` in one forward; keep what the verifier
        accepts in the cache. (Accepted count, the verifier's next token.)"""
        fed = self.unfed + proposed
        ckpt = checkpoint(self.cache, self.length)
        logits = self.lm.step_logits(fed, self.cache, self.length)[len(self.unfed) - 1 :]  # [k + 1, V]
        self.rec.forward()
        accepted, nxt = self.main.verify(logits, proposed, probs)
        self.lm.rewind(self.cache, ckpt, fed[: len(self.unfed) + accepted])
        self.length += len(self.unfed) + accepted
        return accepted, nxt


def _reason_and_draft(s: _State, markers, first_input: int) -> Iterator[Event]:
    cfg, rec, lm = s.cfg, s.rec, s.lm
    yield rec.phase("reasoning")
    rows: list[Draft] = []  # live drafts, in batch order after the main row
    unfed = [first_input]  # the main row's tokens not yet in the cache
    n = 0  # reasoning tokens so far
    batch = _Batch(lm, s.cache, s.length)
    think_stop = lm.eos_ids | {markers.close_id}
    main_lookup = SuffixProposer(s.index, ["prompt", "reasoning"], think_stop, cfg.spec_factor)
    draft_lookups: dict[int, SuffixProposer] = {}  # by draft index: itself, then the reasoning and the prompt
    step_times: dict[bool, list[float]] = {False: [], True: []}  # one-token steps, without / with drafts
    while True:
        t_step = time.perf_counter()
        # 1. fork: a new row copies the main row; it is fed what the main row has not fed yet,
        #    then the end-of-thinking marker and the template tail (the tail opens the draft)
        if len(s.drafts) < cfg.num_drafts and n == _fork_at(cfg, len(s.drafts)):
            tail = list(markers.close_ids[1:])
            d = Draft(len(s.drafts), n, [*unfed, *markers.close_ids], tokens=tail, probs=[None] * len(tail))
            s.drafts.append(d)
            rows.append(d)
            draft_lookups[d.index] = SuffixProposer(s.index, [d.name, "reasoning", "prompt"], lm.eos_ids,
                                                    cfg.spec_factor)
            rec.stats.drafts += 1
            batch.fork(len(rows))
            yield rec.phase("drafting", draft=d.index, at_token=n)
            s.index.extend(d.name, tail)
            for t in tail:
                yield rec.token("draft", t, draft=d.index)
        # 2. what each row feeds: its unfed tokens, then a lookup proposal (when its row may hold
        #    holes; a cache that cannot feeds one token per row per step, as the paper does)
        spec = cfg.think_spec if (not rows or lm.layout.holes_ok) else 0
        room = min(spec, cfg.max_think - n)
        if len(s.drafts) < cfg.num_drafts:  # land exactly on the next fork
            room = min(room, _fork_at(cfg, len(s.drafts)) - n - 1)
        feeds = [_feed(unfed, main_lookup, s.index.sources.get("reasoning", []), room, spec)]
        for d in rows:
            feeds.append(_feed(d.unfed, draft_lookups[d.index], d.tokens, min(spec, cfg.max_draft - len(d.tokens) - 1),
                               spec))
        # 3. one forward over every row
        logits = batch.forward([f for f, _, _ in feeds])  # [rows, K, V]
        rec.forward()
        # 4. each row verifies its proposal; the batch keeps what each row took
        taken = []
        for r, (fed, prop, _) in enumerate(feeds):
            row_unfed = unfed if r == 0 else rows[r - 1].unfed
            m = len(fed) - (len(prop.tokens) if prop else 0)  # unfed tokens fed now
            del row_unfed[:m]
            if row_unfed:  # forced tokens are still queued: nothing to choose yet
                taken.append((m, 0, None, logits[r]))
                continue
            chooser = s.main if r == 0 else s.drafter
            a, nxt = chooser.verify(logits[r, m - 1 : len(fed)], prop.tokens if prop else [], None)
            taken.append((m, a, nxt, logits[r, m - 1 :]))
        batch.keep([m + a for m, a, _, _ in taken])
        # 5. drafts record what they took
        for d, (_, prop, look), (_, a, nxt, row_logits) in zip(rows, feeds[1:], taken[1:]):
            if nxt is not None:
                yield from _draft_takes(s, d, [*(prop.tokens[:a] if prop else []), nxt], row_logits)
                if prop is not None:
                    look.observe(prop, a)
        # 6. the main row: accepted lookup tokens, then its own (budget forcing at max_think)
        _, a, nxt, _ = taken[0]
        prop = feeds[0][1]
        done = False
        if nxt is not None:
            for t in prop.tokens[:a] if prop else []:
                yield rec.token("reasoning", t, "recovered", source=prop.source, match_len=prop.match_len)
                s.index.extend("reasoning", [t])
            if prop is not None:
                main_lookup.observe(prop, a)
            n += a + 1
            forced = []
            if n == cfg.max_think + 1:
                nxt, forced = markers.close_id, list(markers.close_ids[1:])
            s.ended = done = nxt in lm.eos_ids  # the model ended without closing its thoughts: no answer
            if not s.ended:
                yield rec.token("reasoning", nxt)
                s.index.extend("reasoning", [nxt])
                unfed = [nxt, *forced]
                done = nxt == markers.close_id
        # 7. drop finished rows; alone again, the main row sheds its holes
        live = [i for i, d in enumerate(rows) if not d.finished]
        if len(live) < len(rows):
            batch.select([0, *(1 + i for i in live)])
            rows = [rows[i] for i in live]
        if all(len(f) == 1 for f, _, _ in feeds):
            step_times[bool(rows)].append(time.perf_counter() - t_step)
        if done:
            break
    rec.stats.step_s_alone = _mean(step_times[False])
    rec.stats.step_s_drafting = _mean(step_times[True])
    # reasoning over: live drafts are frozen as they are; the main row goes on alone
    if rows:
        batch.select([0])
    s.length = batch.length
    if s.ended:
        return
    forced = unfed[1:]
    s.unfed = unfed
    s.answer = list(forced)
    s.index.extend("answer", forced)
    yield rec.phase("answer")
    for t in forced:
        yield rec.token("answer", t)


def _draft_takes(s: _State, d: Draft, tokens: list[int], row_logits: torch.Tensor) -> Iterator[Event]:
    """Draft ``d`` takes ``tokens`` (verified lookup tokens, then its own); ``row_logits[j]`` is
    the distribution token ``j`` was drawn from. It finishes at end of sequence (kept as its end,
    with the probability it was drawn with) or at ``max_draft`` tokens."""
    for j, t in enumerate(tokens):
        ev = take_draft_token(s, d, t, None if s.drafter.greedy else s.drafter.probs(row_logits[j]))
        if ev is not None:
            yield ev
        if d.finished:
            break
    d.unfed = [] if d.finished else tokens[-1:]


def take_draft_token(s, d: Draft, t: int, q) -> Event | None:
    """Draft ``d`` takes token ``t`` (drawn with ``q``): an end of sequence finishes it, kept as its
    end; any other token joins it (its event is returned), and at ``max_draft`` tokens it finishes."""
    if t in s.lm.eos_ids:
        d.finished, d.end, d.end_probs = True, t, q
        return None
    d.tokens.append(t)
    d.probs.append(q)
    s.index.extend(d.name, [t])
    d.finished = len(d.tokens) >= s.cfg.max_draft
    return s.rec.token("draft", t, draft=d.index)


def _fork_at(cfg: RunConfig, drafts_so_far: int) -> int:
    return cfg.draft_start + drafts_so_far * cfg.draft_interval


def _feed(unfed: list[int], lookup: SuffixProposer, context: list[int], room: int, spec: int):
    """What a row feeds this step: ``(tokens, proposal, proposer)``. All its unfed tokens and, once
    nothing forced is queued, a lookup proposal of at most ``room`` tokens; with ``spec`` 0 (one
    token per row per step) just its next unfed token."""
    if spec == 0:
        return unfed[:1], None, lookup
    prop = lookup.propose(context, room) if room > 0 and len(unfed) == 1 else None
    return [*unfed, *(prop.tokens if prop else [])], prop, lookup


class _Batch:
    """The rows of phase A in one cache: a row may hold holes (slots it rejected), hidden from it
    by its attention mask; each row has its own positions."""

    def __init__(self, lm: LoadedModel, cache, length: int) -> None:
        self.lm, self.cache, self.device = lm, cache, lm.device
        self.length = length  # slots in the cache, holes included
        self.valid: torch.Tensor | None = None  # [rows, length] visible slots; None: no holes anywhere
        self.positions = [length]  # per row: tokens it holds (its next position)
        self._fed: list[list[int]] = []  # the last forward's rows, and its checkpoint (recurrent states)
        self._ckpt = None

    def fork(self, rows_after: int) -> None:
        """Append a copy of the main row (there are ``rows_after`` drafts once it is added)."""
        take_rows(self.cache, [*range(rows_after), 0])
        if self.valid is not None:
            self.valid = torch.cat([self.valid, self.valid[:1]])
        self.positions.append(self.positions[0])

    def forward(self, feeds: list[list[int]]) -> torch.Tensor:
        """Logits ``[rows, K, V]`` for each row's feed, padded to the longest (K). A row's padding
        sits after its real tokens, so causality already hides it in this forward; ``keep`` turns
        it into holes for the next ones."""
        width = max(len(f) for f in feeds)
        self._fed = feeds
        self._ckpt = checkpoint(self.cache, self.length) if self.lm.layout.recurrent and width > 1 else None
        ids = torch.tensor([f + [f[-1]] * (width - len(f)) for f in feeds], device=self.device)
        pos = torch.tensor(self.positions, device=self.device)[:, None] + torch.arange(width, device=self.device)
        mask = None
        if self.valid is not None:
            mask = torch.cat([self.valid, torch.ones(len(feeds), width, dtype=torch.bool)], dim=1).long()
            mask = mask.to(self.device)
        return self.lm.forward(ids, self.cache, self.length, positions=pos, attention_mask=mask)

    def keep(self, kept: list[int]) -> None:
        """Row ``r`` keeps the first ``kept[r]`` slots it was just fed; the rest become its holes.
        Slots no row kept are rolled back off the end."""
        top = max(kept)
        if self._ckpt is not None:  # recurrent states: only a lone row feeds several tokens (no holes)
            assert len(kept) == 1, "rows with recurrent states cannot hold holes"
            self.lm.rewind(self.cache, self._ckpt, self._fed[0][:top])
        else:
            crop(self.cache, self.length + top)
        if self.valid is not None or any(k < top for k in kept):
            block = torch.arange(top)[None, :] < torch.tensor(kept)[:, None]
            valid = self.valid if self.valid is not None else torch.ones(len(kept), self.length, dtype=torch.bool)
            self.valid = torch.cat([valid, block], dim=1)
        self.length += top
        self.positions = [p + k for p, k in zip(self.positions, kept)]

    def select(self, keep: list[int]) -> None:
        """Keep these rows; a lone main row sheds its holes."""
        take_rows(self.cache, keep)
        self.positions = [self.positions[i] for i in keep]
        if self.valid is not None:
            self.valid = self.valid[keep]
            if len(keep) == 1:
                slots = self.valid[0].nonzero().flatten()
                compact(self.cache, slots.to(self.device))
                self.length, self.valid = len(slots), None


def _answer(s) -> Iterator[Event]:
    """Phase B over any state with ``verify`` (in-process: :class:`_State`; a server:
    ``engine.remote.decode.RemoteState``)."""
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
        # 2. verify: the unfed token(s) and the proposal in one forward; the state keeps what is accepted
        accepted, nxt = s.verify(proposed, prop.probs if prop else None)
        # 3. accept; a draft's end, accepted, ends the answer
        taken = proposed[:accepted]
        ended = bool(taken) and taken[-1] in stop
        if ended:
            taken.pop()
        for j, t in enumerate(taken):
            yield rec.token("answer", t, prop.status, prop.draft, prop.source, prop.match_len)
            if prop.draft is not None:
                yield rec.draft_status(prop.draft, prop.start + j, prop.status, prop.source, prop.match_len)
        # 4. record what was proposed and not taken (a draft's end is no token of its pane)
        if prop is not None:
            for j in range(accepted, len(proposed)):
                if prop.draft is None:
                    rec.rejected_lookup(1)
                elif prop.start + j < len(s.drafts[prop.draft].tokens) and \
                        (ev := rec.draft_status(prop.draft, prop.start + j, "rejected")) is not None:
                    yield ev
            who.observe(prop, accepted)
        s.answer += taken
        s.index.extend("answer", taken)
        if ended or len(s.answer) >= cfg.max_answer or nxt in stop:
            break
        # 5. the verifier's own token
        yield rec.token("answer", nxt)
        s.answer.append(nxt)
        s.index.extend("answer", [nxt])
        s.unfed = [nxt]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
