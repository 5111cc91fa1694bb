"""SSR, method ``ssr``: self-speculation from a partial chain of thought, with suffix recovery.

Valluri, Nguyen, Grover, "Self-Speculation for Faster Reasoning Models" (arXiv 2608.20359).

Phase A, reasoning with batched drafters (:func:`_reason_and_draft`). At reasoning token
``draft_start`` (and, for iterative SSR, every ``draft_interval`` tokens after, up to
``num_drafts``) a draft row forks from the main row: it copies the main row's KV cache (the prefix
is reused, never recomputed), is fed the end-of-thinking marker and the template tail, and writes a
draft answer. Every step is one forward over all live rows (a ``RowBatch``). Beyond the paper,
each row may also verify a lookup proposal in that forward (``think_spec`` tokens at most: the main
row's from the prompt and its reasoning, a draft's from itself, the reasoning and the prompt), so
rows take different numbers of tokens per step; the slots a row rejected stay in the shared cache
as *holes* that the row's attention mask hides, and each row carries its own positions. When only
the main row is left its holes are compacted away. A finished row (end of sequence, ``max_draft``
tokens) leaves the batch. Runs whose rows cannot hold holes (sliding windows, recurrent states:
``engine.runtime.cache``; exact mode's fixed route: ``engine.runtime.fixed``) feed one token per
row per step while drafts ride, as the paper does; a lone main row still speculates. At
``max_think`` the end of thinking is forced (``ThinkBudget``). With thinking off
(``RunConfig.thinking``: the prompt asks for the answer alone) there is no phase A and no draft.

Phase B, answer by verification (:func:`answer_by_verification`). Proposers are asked in order
(draft prefix, suffix match in the drafts, suffix match in prompt/reasoning/answer); the first
proposal is verified in one forward together with the not-yet-fed token; the cache is rolled back
to what was accepted (a crop, or for recurrent states a restore and re-read). A draft that ended by
sampling end-of-sequence proposes that end too, with its probability, so an accepted end ends the
answer.

Shared with SSR over a server (``engine.remote.decode``), public here: phase B over any
:class:`SSRState`, and the draft bookkeeping (:func:`fork_point`, :func:`open_draft`,
:func:`take_draft_token`).

Decision (documented in docs/SSR.md): a draft still being written when the reasoning ends is
kept with the tokens it has and is not extended. Extending it would cost one forward per token,
the same as writing the answer itself, so on one sequence it cannot pay.

Exactness: under greedy decoding the reasoning and the answer equal ``baseline``'s token for token;
under sampling the main row draws from the same seeded generator as ``baseline`` (drafts draw
from another), and verification is the speculative-sampling rule (see ``engine.methods.sampling``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.config import RunConfig
from engine.events import Event, RowWork
from engine.methods.budget import ThinkBudget
from engine.methods.recorder import Recorder
from engine.methods.sampling import Chooser
from engine.methods.seams import StepModel
from engine.methods.ssr.evidence import Evidence
from engine.methods.ssr.policy import ledger, plan
from engine.methods.ssr.proposers import Draft, DraftPrefixProposer, Proposal, Proposer, SuffixProposer
from engine.methods.ssr.rows import Row, RowStep
from engine.methods.ssr.suffix_index import SuffixIndex
from engine.methods.ssr.widths import RunCosts, Widths, costs, said
from engine.runtime.batch import RowBatch
from engine.runtime.cache import cache_mb
from engine.runtime.probe import require


class SSRBudget(ThinkBudget):
    """The reasoning budget of an SSR run, and the declared hook for a method built on SSR's loop
    (``engine.methods.exit``): it sees every draft token as it is taken (:meth:`drafted`), may end
    the reasoning early (:meth:`ThinkBudget.spent`: the end of thinking is then forced, as at the
    budget) and names the draft that leads the answer (:meth:`lead`). Plain SSR: the budget alone,
    the newest draft leads."""

    def __init__(self, markers, cfg: RunConfig, state: SSRState) -> None:
        super().__init__(markers, cfg.max_think)

    def drafted(self, draft: Draft, token: int, logits: torch.Tensor) -> None:
        """Draft ``draft`` took ``token``, chosen from ``logits`` ``[V]``."""

    def lead(self, drafts: list[Draft]) -> Draft | None:
        """The draft whose prefix the answer phase verifies first."""
        return drafts[-1] if drafts else None


def decode_ssr(lm: StepModel, prompt: str, cfg: RunConfig, method: str = "ssr",
               budget_class: type[SSRBudget] = SSRBudget, drafts: bool = True,
               evidence: Evidence | None = None) -> Iterator[Event]:
    """Yield the events of an SSR run of ``prompt`` (the user message, templated here); ``method``
    names the run, ``budget_class`` is the hook a method built on this loop gives (:class:`SSRBudget`).
    ``drafts`` False: the ablation ``ssr-lookups``, SSR's loop with its lookups alone (no draft
    forks: what the drafts add is SSR's time against it). ``evidence``: what the drafting and widths
    decisions read and teach (``engine.methods.ssr.evidence``; default: the model's own store)."""
    markers = lm.require_markers()
    cfg.check_ssr()
    prompt_ids = lm.prompt_ids(prompt, cfg.thinking)
    drafts = drafts and cfg.thinking  # thinking off: no reasoning to draft from (the answer's lookups read the prompt)
    # plain SSR forks its drafts where they pay on this model (engine.methods.ssr.policy), and every plain SSR run feeds
    # the ledger, whatever its drafting; a method built on the loop (early exit) needs its drafts as probes, and the
    # ablation has none
    store = Evidence.of(lm) if evidence is None else evidence
    book = ledger(store, cfg) if drafts and budget_class is SSRBudget else None
    decision = plan(book, cfg) if book is not None and cfg.drafting == "auto" else None
    planned = 0 if not drafts else decision.drafts if decision is not None else cfg.num_drafts
    new_tokens = run_tokens(cfg, markers, planned)
    lm.check_fits(len(prompt_ids), new_tokens)
    lm.rope.check_speculation(len(prompt_ids) + new_tokens, lm.model_id, lm.layout.recurrent)  # past a RoPE switch
    caps = require(lm, "SSR", identical=not cfg.exact_mode)  # measured on this model once: refused here, never a crash or divergence mid-run
    lm.begin_run(cfg.exact_mode, cfg.compile)
    warm = store.begin(cfg, method)  # a kind's first run is cold: it teaches nothing (engine.methods.ssr.evidence)
    # the drafts read the main row's prefix from one buffer row where the model allows (engine.runtime.batch,
    # shared forks); else each holds a copy of it
    size = size_cache(cfg, markers, len(prompt_ids), planned, lm.unshared() if planned else None,
                      lm.learned_positions, lm.forks_stay, lm.context_length)
    rec = Recorder(lm.tokenizer, method, len(prompt_ids), lm.device)
    # before the clock starts: every shape (rows x width) the run can meet
    yield from rec.compiling(lm.prepare_steps(size.capacity, 1 + planned,
                                              max(cfg.think_spec, len(markers.close_ids)) + 1))
    rec.start_clock(lm)
    rec.stats.verify = caps.verify
    rec.stats.forks = "" if not planned else "shared prefix" if size.shared else f"copied prefix: {size.copied}"
    rec.stats.drafting = decision.why if decision is not None else "" if cfg.thinking else \
        "none: thinking off, so no reasoning to draft from; the answer's lookups read the prompt"
    index = SuffixIndex(cfg.min_match)
    index.extend("prompt", prompt_ids)
    state = _State(lm, cfg, rec, index, Chooser(cfg.temperature, cfg.top_p, cfg.seed),
                   Chooser(cfg.temperature, cfg.top_p, cfg.seed + 1), (size.slots, size.rows), planned,
                   costs(store, cfg).view(learn=not cfg.reproducible), widths_by_cost=budget_class is SSRBudget)
    budget = budget_class(markers if cfg.thinking else None, cfg, state)  # thinking off: nothing to force
    yield rec.phase("prefill")
    if len(prompt_ids) > 1:  # the last prompt token is the main row's first input in phase A
        t0 = rec.now()
        lm.step_logits(prompt_ids[:-1], state.cache, 0, last_only=True)
        yield rec.forward(t0, [RowWork("main", len(prompt_ids) - 1)], tokens=len(prompt_ids) - 1)
    state.batch = lm.row_batch(state.cache, len(prompt_ids) - 1, prompt_ids[:-1], shared=size.shared)
    if cfg.thinking:
        yield from _reason_and_draft(state, budget, prompt_ids[-1])
    else:  # the prompt closed the think block itself: its last token is the answer's first input
        state.unfed = [prompt_ids[-1]]
    if not state.ended:
        yield from answer_by_verification(state, budget)
    rec.stats.lookups = said([state.widths, *state.answer_by.values()])
    rec.stats.cache_mb = cache_mb(state.cache)
    rec.stats.flops = rec.stats.target_flops = 2.0 * lm.num_parameters * rec.stats.target_tokens
    if decision is not None and planned and not state.drafts:  # the plan was moot: say what happened instead
        rec.stats.drafting = (f"none forked: the reasoning ended before the draft start ({cfg.draft_start} "
                              "tokens), so this run measured nothing about drafts")
    yield rec.phase("done")
    done = rec.done()
    store.finished(cfg, method)
    if not cfg.reproducible:  # what its drafts cost and saved, and its forwards, for the next runs' decisions
        store.learn(cfg, done.stats, warm, book, planned, costs(store, cfg), state.costs.own)
    yield done


class SSRState(Protocol):
    """What SSR's shared steps (:func:`answer_by_verification`, :func:`open_draft`,
    :func:`take_draft_token`) read and write of a run: in process :class:`_State`, over a server
    ``engine.remote.decode.RemoteState``."""

    cfg: RunConfig
    rec: Recorder
    index: SuffixIndex  # the prompt, the reasoning, every draft and the answer, for lookups
    eos_ids: frozenset[int]
    drafts: list[Draft]  # in fork order, the newest last
    answer: list[int]  # the answer so far
    unfed: list[int]  # tokens chosen (or forced) after the committed ones, fed first by the next verify
    computed: int  # token positions the last verify computed (its FLOPs; 0 over a server)
    forward_end: float  # when the last verify's forward (request) ended, on ``rec``'s clock

    def room(self) -> int | None:
        """The most tokens a proposal may hold this step (None: any)."""
        ...

    def verify(self, proposed: list[int], probs: torch.Tensor | None) -> tuple[int, int]:
        """Feed the unfed tokens and ``proposed`` (drawn with ``probs`` ``[k, V]``, None: one-hot)
        in one forward and commit what the verifier accepts. (Accepted count, the verifier's next
        token.)"""
        ...

    def answer_widths(self, label: str) -> Widths | None:
        """How many of proposer ``label``'s tokens the answer verifies (``engine.methods.ssr.widths``);
        None: every proposal whole (a server verifies in its own kernels)."""
        ...


class _State:
    """What the two phases share: the model, one cache and its rows, the drafts, the choosers."""

    def __init__(self, lm, cfg, rec, index, main, drafter, capacity: tuple[int, int], planned: int,
                 costs: RunCosts, widths_by_cost: bool = True) -> None:
        self.lm, self.cfg, self.rec, self.index = lm, cfg, rec, index
        self.eos_ids = lm.eos_ids
        self.main, self.drafter = main, drafter
        self.planned = planned  # the drafts this run forks (0: lookups alone)
        self.cache = lm.new_cache(*capacity)
        self.batch: RowBatch | None = None  # the cache's rows: the main row, then the live drafts (phase A)
        self.drafts: list[Draft] = []
        self.unfed: list[int] = []  # main-row tokens chosen but not yet in the cache
        self.answer: list[int] = []
        self.ended = False  # the model ended the sequence inside its reasoning
        self.computed = 0
        self.forward_end = 0.0
        self.costs = costs  # this model's forward costs by tokens computed (cost-aware lookup widths)
        self.widths = Widths(self.costs, widths_by_cost)  # the main row's lookup widths in the reasoning
        self.answer_by: dict[str, Widths] = {}  # the answer's widths, per proposer (its label)

    def answer_widths(self, label: str) -> Widths:
        if label not in self.answer_by:
            self.answer_by[label] = Widths(self.costs, self.widths.by_cost, phase="answer", what=label)
        return self.answer_by[label]

    def room(self) -> int | None:
        """The most tokens a proposal may hold this step (None: any): longrope's switch point."""
        limits = self.batch.limits(len(self.unfed))
        return None if limits is None else limits[0] - len(self.unfed)

    def verify(self, proposed: list[int], probs) -> tuple[int, int]:
        """Feed the unfed token(s) and ``proposed`` in one forward; keep what the verifier
        accepts in the cache. (Accepted count, the verifier's next token.)"""
        t0 = self.rec.now()
        logits = self.batch.forward([self.unfed + proposed])[0, len(self.unfed) - 1 :]  # [k + 1, V]
        self.computed, self.forward_end = self.batch.last_tokens, self.rec.clock()
        self.costs.record(self.computed, self.forward_end - t0)
        accepted, nxt = self.main.verify(logits, proposed, probs)
        self.batch.keep([len(self.unfed) + accepted])  # a crop, or a restore and re-read of what stays
        return accepted, nxt


def _reason_and_draft(s: _State, budget: SSRBudget, first_input: int) -> Iterator[Event]:
    """Phase A: the main row reasons, drafts fork from it and ride in its batch. Ends with
    ``s.ended`` (the model ended the sequence), or with the main row alone in ``s.batch``,
    holding everything but the token(s) that closed the reasoning (and the tail ``budget`` forced
    after them): they are left in ``s.unfed``, which phase B feeds first."""
    cfg, rec, lm, markers = s.cfg, s.rec, s.lm, budget.markers
    yield rec.phase("reasoning")
    s.index.extend("reasoning", [])  # the main row's context: a live view of its reasoning
    main = Row([first_input], s.index.sources["reasoning"],
               SuffixProposer(s.index, ["prompt", "reasoning"], lm.eos_ids, cfg.spec_factor, markers.before_close), s.main)
    rows = [main]  # the batch's rows in order: the main row, then the live drafts
    batch = s.batch
    n = 0  # reasoning tokens so far
    step_times: dict[bool, list[float]] = {False: [], True: []}  # one-token steps, without / with drafts
    while True:
        t_step = time.perf_counter()
        # 1. fork: a new row copies the main row; it is fed what the main row has not fed yet,
        #    then the end-of-thinking marker and the template tail (the tail opens the draft)
        if len(s.drafts) < s.planned and n == fork_point(cfg, len(s.drafts)):
            yield from open_draft(s, n, list(markers.tail_ids))
            d = s.drafts[-1]
            lookup = SuffixProposer(s.index, [d.name, "reasoning", "prompt"], lm.eos_ids, cfg.spec_factor)
            rows.append(Row([*main.unfed, *markers.close_ids], d.tokens, lookup, s.drafter, d, opening=len(d.tokens)))
            batch.fork()
        # 2. propose: behind its unfed tokens each row may put a lookup proposal (when rows may
        #    hold holes; a cache that cannot feeds one token per row per step, as the paper does)
        spec = cfg.think_spec if (len(rows) == 1 or lm.holes_ok) else 0
        room = min(spec, budget.picks - n)  # lookups never pass the model's share of the budget
        if len(s.drafts) < s.planned:  # land exactly on the next fork
            room = min(room, fork_point(cfg, len(s.drafts)) - n - 1)
        limits = batch.limits(len(main.unfed))  # longrope: nothing reaches the switch point before the main row
        if limits is not None:
            rows = _stop_drafts_at_switch(batch, rows, limits, one_token=spec == 0)
            limits = batch.limits(len(main.unfed))
        for r, row in enumerate(rows):
            mine = room if row.is_main else min(spec, cfg.max_draft - len(row.context) - 1)
            row.feed(mine if limits is None else min(mine, limits[r] - len(row.unfed)), one_token=spec == 0)
            if row.is_main and row.proposal is not None:  # as many lookup tokens as pay (engine.methods.ssr.widths)
                row.trim(s.widths.choose(len(row.proposal.tokens), len(row.unfed) + len(rows) - 1))
        # 3. forward: one over every row
        t0 = rec.now()
        logits = batch.forward([row.fed for row in rows])  # [rows, K, V]
        t1 = rec.clock()  # the forward's end (the host's verification after it is the loop's bookkeeping)
        s.costs.record(batch.last_tokens, t1 - t0)
        # 4. verify and take: each row verifies its proposal; the batch keeps what each row took
        steps = [row.take(logits[r]) for r, row in enumerate(rows)]  # logits[r]: [K, V]
        if steps[0].proposal is not None:
            s.widths.observe(len(steps[0].proposal.tokens), steps[0].accepted)
        elif main.unverified is not None and steps[0].tokens:  # what its verify would have accepted: the first token
            s.widths.observe_unverified(steps[0].tokens[0] == main.unverified)
        batch.keep([step.kept for step in steps])
        # 5. record: the forward (what each row took), the drafts' tokens, then the main row's (its own
        #    token forced at the budget). The drafts take theirs first: the budget sees them (an early exit
        #    decides on the step a draft finishes)
        step = steps[0]
        assert step.tokens, "the main row never queues forced tokens while it reasons"
        takes, draft_works = [], []
        for row, st in zip(rows[1:], steps[1:], strict=True):
            before = len(row.draft.tokens)
            takes += _draft_takes(s, row, st, budget)
            draft_works.append(_work(row, st, len(row.draft.tokens) - before))
        own = None if budget.spent(n + step.accepted) else step.tokens[-1]  # at the budget the marker is forced
        s.ended = budget.ends_run(own, lm.eos_ids)  # ended without closing its thoughts: no answer
        forced = own is None or own in lm.eos_ids  # the budget, or a prompted model's end of turn, closes it
        closing = budget.force() if forced else step.tokens[-1:]  # the main row's next token(s), not fed yet
        works = [_work(rows[0], step, len(step.tokens) - forced,
                       0 if s.ended or not forced else len(closing) + len(budget.forced)), *draft_works]
        yield rec.forward(t0, works, end=t1, tokens=batch.last_tokens)  # padding and any re-encode: computed
        yield from takes
        for t in step.tokens[:-1]:
            yield rec.token("reasoning", t, "recovered", source=step.proposal.source, match_len=step.proposal.match_len)
        s.index.extend("reasoning", step.tokens[:-1])
        n += len(step.tokens)
        if not s.ended:
            for t in closing:
                yield rec.token("reasoning", t)
            s.index.extend("reasoning", closing)
            main.unfed = [*closing, *budget.forced]
        # 6. retire finished drafts; alone again, the main row sheds its holes
        one_token_step = all(len(row.fed) == 1 for row in rows)  # timed: a step's cost alone / with drafts
        if any(row.draft.finished for row in rows[1:]):
            keep = [r for r, row in enumerate(rows) if row.is_main or not row.draft.finished]
            batch.select(keep)
            rows = [rows[r] for r in keep]
        if one_token_step:
            step_times[len(rows) > 1].append(time.perf_counter() - t_step)
        reasoning = s.index.sources["reasoning"]
        if s.ended or forced or markers.closes_at(reasoning, len(reasoning) - 1):
            s.unfed = main.unfed  # the closing token(s), and the tail forced after them: phase B feeds them first
            break
    rec.stats.step_s_alone = _mean(step_times[False])
    rec.stats.step_s_drafting = _mean(step_times[True])
    # reasoning over: live drafts are frozen as they are; the main row goes on alone
    if len(rows) > 1:
        batch.select([0])


def _work(row: Row, step: RowStep, kept: int, forced: int = 0) -> RowWork:
    """What ``row`` did in a forward: fed, took (``kept`` of its tokens joined its stream), verified."""
    p = step.proposal
    forced, row.opening = forced + row.opening, 0
    return RowWork("main" if row.is_main else f"draft {row.draft.index}", len(row.fed), kept, forced,
                   len(p.tokens) if p else 0, step.accepted, p.label if p else None)


def _stop_drafts_at_switch(batch: RowBatch, rows: list[Row], limits: list[int], one_token: bool) -> list[Row]:
    """Longrope, the main row still below the switch point: a draft that cannot take its next
    feed without reaching it stops where it is (kept with its tokens, as at the end of the
    reasoning), so the main row's forwards stay on the short factors, as plain decoding's do."""
    keep = [r for r, row in enumerate(rows)
            if row.is_main or limits[r] >= (1 if one_token else len(row.unfed))]
    if len(keep) == len(rows):
        return rows
    for r, row in enumerate(rows):
        if r not in keep:
            row.draft.finished = True
    batch.select(keep)
    return [rows[r] for r in keep]


def _draft_takes(s: _State, row: Row, step: RowStep, budget: SSRBudget) -> Iterator[Event]:
    """Draft row ``row`` takes what it took this ``step`` (verified lookup tokens, then its own),
    until it finishes; its last token is the next it feeds. ``budget`` sees each token."""
    if not step.tokens:  # forced tokens are still queued
        return
    d = row.draft
    for j, t in enumerate(step.tokens):
        budget.drafted(d, t, step.logits[j])
        ev = take_draft_token(s, d, t, None if row.chooser.greedy else row.chooser.probs(step.logits[j]))
        if ev is not None:
            yield ev
        if d.finished:
            break
    row.unfed = [] if d.finished else step.tokens[-1:]


def run_tokens(cfg: RunConfig, markers, planned: int) -> int:
    """The most tokens an SSR run of ``planned`` drafts writes after its prompt: the reasoning, the forced
    marker and the answer, or the last draft's end where it reaches further (the cache and context room a run
    asks for); with thinking off, the answer alone."""
    if not cfg.thinking:
        return cfg.max_answer
    drafts_end = min(fork_point(cfg, planned - 1), cfg.max_think) + cfg.max_draft if planned else 0  # the last draft's
    return len(markers.close_ids) + max(cfg.max_think + cfg.max_answer, drafts_end)


@dataclass(frozen=True)
class CacheSize:
    """One SSR run's cache, sized before it runs (:func:`size_cache`)."""

    capacity: int  # the prompt, :func:`run_tokens` and room for a verify past the end: the step shapes' length
    slots: int  # the cache's slots per row...
    rows: int  # ...and its rows: one when the drafts share it, else the main row and every planned draft
    shared: bool  # the drafts read the main row's prefix from its one buffer row (engine.runtime.batch)
    copied: str | None  # why each draft holds a copy of the prefix instead (None: shared, or no drafts)


def size_cache(cfg: RunConfig, markers, prompt: int, planned: int, unshared: str | None, learned: bool,
               forks_stay: bool, context: int) -> CacheSize:
    """The cache of a run of ``prompt`` tokens and ``planned`` drafts, on a model whose forks must copy the
    prefix for the reason ``unshared`` (None: they may share it), whose positions are ``learned`` (bounded by
    its ``context``: the shared cache is sized for the most drafts live at once, and must fit them), and whose
    departed drafts keep their slots to the end (``forks_stay``: llama.cpp's cells, ``engine.llamacpp.rows``)."""
    past_end = max(cfg.max_spec, cfg.think_spec) + 1  # room for a verify past the end
    capacity = prompt + run_tokens(cfg, markers, planned) + past_end
    if not planned:
        return CacheSize(capacity, capacity, 1, False, None)
    if unshared is None:  # one row, holding the main row's budgets and the drafts live at once
        main = prompt + len(markers.close_ids) + cfg.max_think + cfg.max_answer + past_end
        opening = len(markers.close_ids) + len(markers.tail_ids)
        slots = main + shared_slots(cfg, planned, opening, per_step=1 + cfg.think_spec if learned else 1,
                                    every=forks_stay)
        if not (learned and slots > context):
            return CacheSize(capacity, slots, 1, True, None)
        unshared = f"a shared cache would hold {slots} slots, more than the model's {context} positions"
    return CacheSize(capacity, capacity, 1 + planned, False, unshared)  # every row holds the longest row's slots


def shared_slots(cfg: RunConfig, planned: int, opening: int, per_step: int = 1, every: bool = False) -> int:
    """The slots a run's drafts add to a shared cache (``engine.runtime.batch``, shared forks) at
    most at once, as the cache is first sized: a draft holds its opening (the main row's pending
    token, the marker and the template tail: ``opening + 1``), its answer and a lookup behind it,
    and lives at most one step per token it writes, in which the main row takes at least one
    token (``per_step``); drafts forked within one such lifetime of each other are live together. Padding and
    rejected slots no row sees are compacted away when room runs out, and a fork's padding (every
    row padded to the new draft's opening) is room kept for them. Where the main row's reasoning
    lookups carry it further in a draft's life (up to ``1 + think_spec`` tokens a step), more
    drafts can be live at once than sized for: the cache then grows (``RowBatch``), as the run
    shows in its cache size, instead of holding that worst case (``per_step=1 + think_spec``)
    from the start. ``every``: a draft's slots stay after it finishes, so every draft's count."""
    if not planned:
        return 0
    per_draft = opening + 1 + cfg.max_draft + cfg.think_spec
    life = (cfg.max_draft + opening + 1) * per_step  # reasoning tokens a draft can live through
    forks = [fork_point(cfg, d) for d in range(planned)]
    live = planned if every else max(sum(1 for g in forks if f <= g < f + life) for f in forks)
    return live * per_draft + (1 + live) * (opening + 1 + cfg.think_spec)


def fork_point(cfg: RunConfig, drafts_so_far: int) -> int:
    """The reasoning token count at which the next draft forks, ``drafts_so_far`` drafts in:
    ``draft_start``, then every ``draft_interval`` tokens (``draft_start=8, draft_interval=4``:
    8, 12, 16, ...). The caller stops at ``num_drafts`` drafts."""
    return cfg.draft_start + drafts_so_far * cfg.draft_interval


def open_draft(s: SSRState, at_token: int, tail: list[int]) -> Iterator[Event]:
    """Start draft ``len(s.drafts)``, forked after ``at_token`` reasoning tokens, and append it to
    ``s.drafts``: its answer opens with ``tail`` (the template tail after the end-of-thinking
    marker), indexed and shown as its first tokens."""
    d = Draft(len(s.drafts), at_token, tokens=list(tail), probs=[None] * len(tail))
    s.drafts.append(d)
    s.rec.stats.drafts += 1
    yield s.rec.phase("drafting", draft=d.index, at_token=at_token)
    s.index.extend(d.name, d.tokens)
    for t in d.tokens:
        yield s.rec.token("draft", t, draft=d.index)


def take_draft_token(s: SSRState, d: Draft, t: int, q: torch.Tensor | None) -> Event | None:
    """Draft ``d`` takes token ``t`` (drawn with ``q`` ``[V]``; None: greedy): an end of sequence
    finishes it, kept as its end; any other token joins it (its event is returned), and at
    ``max_draft`` tokens it finishes."""
    if t in s.eos_ids:
        d.finished, d.end, d.end_probs = True, t, q
        return None
    d.tokens.append(t)
    d.probs.append(q)
    s.index.extend(d.name, [t])
    d.finished = len(d.tokens) >= s.cfg.max_draft
    return s.rec.token("draft", t, draft=d.index)


def answer_by_verification(s: SSRState, budget: SSRBudget) -> Iterator[Event]:
    """Phase B, after a reasoning that closed (by itself or forced by ``budget``) with the
    token(s) that closed it still unfed (``s.unfed``): the answer, each step a proposal verified in one
    ``s.verify``. Stops at ``max_answer`` tokens or an end of sequence (the verifier's, or a
    draft's accepted end)."""
    cfg, rec = s.cfg, s.rec
    stop = s.eos_ids
    s.index.reset_cursors()  # the answer reads every source afresh
    # s.unfed: the token(s) that closed the reasoning (and the forced tail), set by phase A: verified in first
    s.answer = list(budget.forced)
    s.index.extend("answer", s.answer)
    yield from budget.open_answer(rec)
    proposers: list[Proposer] = [DraftPrefixProposer(budget.lead(s.drafts))]
    if cfg.suffix_recovery and s.drafts:
        proposers.append(SuffixProposer(s.index, [d.name for d in reversed(s.drafts)], stop, cfg.spec_factor))
    lookups = SuffixProposer(s.index, ["reasoning", "prompt", "answer"], stop, cfg.spec_factor)
    if cfg.context_lookup:
        proposers.append(lookups)
    while len(s.answer) < cfg.max_answer:
        # 1. propose
        cap = s.room()  # longrope: a verify stays below the switch point until its first kept logit is past it
        room = min(cfg.max_spec, cfg.max_answer - len(s.answer), cfg.max_spec if cap is None else cap)
        prop, who = None, None
        for who in proposers if room > 0 else []:
            prop = who.propose(s.answer, room)
            if prop is not None:
                break
        # as many of its tokens as pay on this model (engine.methods.ssr.widths); none: its first token is still
        # compared with the verifier's, as its verify would have
        # A draft's prefix is verified whole, as the paper does: it is the drafts' own answer, taken at once where
        # it is right (and under sampling its length says whether the draft drew its end, which must not decide
        # what is verified). The lookups (deterministic proposals) are verified as far as they pay.
        widths = s.answer_widths(prop.label) if prop is not None and prop.probs is None and \
            prop.status != "accepted" else None
        unverified = None
        if widths is not None:
            k = widths.choose(len(prop.tokens), len(s.unfed))
            if k == 0:
                unverified, prop = prop.tokens[0], None
            elif k < len(prop.tokens):
                prop = dataclasses.replace(prop, tokens=prop.tokens[:k], probs=None if prop.probs is None else prop.probs[:k])
        proposed = prop.tokens if prop else []
        # 2. verify: the unfed token(s) and the proposal in one forward; the state keeps what is accepted
        fed, t0 = len(s.unfed) + len(proposed), rec.now()
        accepted, nxt = s.verify(proposed, prop.probs if prop else None)
        t1 = s.forward_end
        if widths is not None and prop is not None:
            widths.observe(len(proposed), accepted)
        elif widths is not None:
            widths.observe_unverified(nxt == unverified)
        # 3. accept; a draft's end, accepted, ends the answer. What a draft won is a draft's own only where
        #    the lookups (when on) would not have proposed it at this step (RunStats.draft_saved)
        if prop is not None and prop.draft is not None and accepted:
            rec.stats.draft_saved += accepted - _common(proposed[:accepted], lookups.propose(s.answer, room)
                                                        if cfg.context_lookup else None)
        taken = proposed[:accepted]
        ended = bool(taken) and taken[-1] in stop
        if ended:
            taken.pop()
        own = not (ended or len(s.answer) + len(taken) >= cfg.max_answer or nxt in stop)  # the verifier's token joins
        yield rec.forward(t0, [RowWork("main", fed, len(taken) + own, 0, len(proposed), accepted,
                                       prop.label if prop else None)], end=t1, tokens=s.computed)
        for j, t in enumerate(taken):
            yield rec.token("answer", t, prop.status, prop.draft, prop.source, prop.match_len)
            if prop.draft is not None and (ev := rec.draft_status(prop.draft, prop.start + j, prop.status, prop.source,
                                                                  prop.match_len)) is not None:  # None: taken already
                yield ev
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
        if not own:
            break
        # 5. the verifier's own token
        yield rec.token("answer", nxt)
        s.answer.append(nxt)
        s.index.extend("answer", [nxt])
        s.unfed = [nxt]


def _common(tokens: list[int], other: Proposal | None) -> int:
    """How many of ``tokens`` ``other``'s proposal starts with (0: no proposal)."""
    n = 0
    for a, b in zip(tokens, other.tokens if other is not None else [], strict=False):
        if a != b:
            break
        n += 1
    return n


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None
