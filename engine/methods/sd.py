"""Classic speculative decoding with a draft model, method ``sd``.

Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding" (ICML 2023,
arXiv 2211.17192); Chen et al., "Accelerating Large Language Model Decoding with Speculative
Sampling" (arXiv 2302.01318); in ``transformers``, assisted generation (``assistant_model``: our peer
``hf-assisted``, ``engine.methods.peers``). A small draft model of the target's tokenizer proposes
``lookahead`` tokens, one forward each on its own KV cache; the target verifies them all in one
forward (``k + 1`` logits), keeps the longest prefix it agrees with (greedy) or applies the
speculative-sampling rule with the draft's distributions ``q`` (``engine.methods.sampling``: the
output keeps the target's distribution), and adds its own next token: the correction after a
rejection, the bonus after a full acceptance. Both caches then roll back to the text they share.

Greedy output is plain decoding's (``engine.methods.baseline``) token for token, budgets included:
the target's picks are walked one at a time through baseline's rules (``engine.methods.plain.PlainText``: the reasoning
budget with its forced marker and tail, a prompted model's end of turn inside its reasoning, the
model's own close, the end of sequence, ``max_answer``) up to the first one a rule stops at, and
whatever the verify computed past it is rolled back. A round never proposes past the room the
budgets leave, nor across a longrope switch point before its first kept logit (``engine.runtime.rope``).

A round, greedy, ``lookahead`` 4, the text so far "... the cat" (the target has not read "cat")::

    1. propose   the draft draws "sat" "on" "the" "mat"          4 draft forwards, 1 token each
    2. verify    the target reads "cat" "sat" "on" "the" "mat"   1 forward, 5 logits
                 its picks after each:  "sat" "on" "a" ...
    3. accept    "sat" "on" accepted (taken from the draft), "a" its own correction
    4. record    Draft pane: "sat" "on" accepted, "the" "mat" rejected
    5. roll back both caches to "... the cat sat on": "a" is read by the next round's forwards

Events: the target's forwards are the row "main"; the draft model's are the row "draft 0", and its
proposals are draft 0 on the Draft pane, one stream for the whole run (written ``generated`` as
drawn, then ``accepted`` or ``rejected`` by the verify that read them), so the pane reads as what the
draft model wrote, struck through where the target disagreed. A token the target took from the draft
is ``accepted`` with source "draft" (green, credited to the draft as ``RunStats.accepted``); its own
pick is ``generated``. The verify's row names its proposer "draft model". The draft model's forwards are
in the phase "drafting" (the time split's drafting share: what the proposals cost); no draft forks from
the reasoning (``RunStats.drafts`` 0: the Draft pane's one stream is the draft model's, all run long).

Choices (flagged): a fixed ``lookahead`` (``LOOKAHEAD``; no schedule, no confidence threshold: as
transformers' "constant" schedule); the draft stops proposing at an end of sequence it drew; the
draft samples with the run's temperature and top-p from its own seeded generator (seed + 1), as
SSR's drafts do. Both models first read the prompt but its last token, which each round's first
forwards read, so every verify's first logits predict the next pick (SSR starts the same way; the
capability probe checks that split prefill on the target).
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from functools import partial

import torch

from engine.config import RunConfig
from engine.events import Event, ForwardEvent, RowWork, RunStats
from engine.methods.budget import ThinkBudget
from engine.methods.contract import Method
from engine.methods.plain import PlainText
from engine.methods.recorder import Recorder
from engine.methods.sampling import Chooser, sample
from engine.methods.seams import StepModel, check_pair
from engine.runtime.cache import cache_mb
from engine.runtime.cached import CachedModel
from engine.runtime.probe import require

LOOKAHEAD = 4  # tokens the draft proposes per verify (k); transformers' assisted generation starts at 20, then adapts
DRAFT = 0  # the draft model's proposals: draft 0 on the Draft pane, all run long
DRAFT_ROW = f"draft {DRAFT}"  # its forwards' row (a row "draft k" writes the Draft pane's draft k)
PROPOSER = "draft model"


def decode_sd(target: StepModel, draft: StepModel, prompt: str, cfg: RunConfig,
              lookahead: int = LOOKAHEAD) -> Iterator[Event]:
    """Yield the events of a speculative run of ``prompt`` (the user message, templated here): ``draft``
    proposes up to ``lookahead`` tokens per round, ``target`` verifies them in one forward. ValueError
    before any event for a draft of another tokenizer, a lookahead below 1, a run that does not fit either
    model, or a target the capability probe finds cannot verify and roll back exactly."""
    check_pair(target, draft)
    if lookahead < 1:
        raise ValueError(f"lookahead must be at least 1 (tokens the draft proposes per verify); got {lookahead}")
    prompt_ids = target.prompt_ids(prompt, cfg.thinking)
    budget = ThinkBudget.of(target.markers, cfg)
    new_tokens = budget.new_tokens(cfg.max_answer)
    capacity = len(prompt_ids) + new_tokens  # a verify never runs past the budgets (_width)
    for lm in (target, draft):
        lm.check_fits(len(prompt_ids), new_tokens)
    target.rope.check_speculation(capacity, target.model_id, target.layout.recurrent)
    caps = require(target, "speculative decoding", rollbacks=True, identical=not cfg.exact_mode)  # the draft need not be exact: the verify is
    rec = Recorder(target.tokenizer, "sd", len(prompt_ids), target.device)
    for lm in dict.fromkeys((target, draft)):  # (a model may be its own draft)
        lm.begin_run(cfg.exact_mode, cfg.compile)
        yield from rec.compiling(lm.prepare_steps(capacity))  # before the clock starts
    rec.start_clock(target)
    rec.stats.verify = caps.verify
    seq, dm = CachedModel(target, capacity, "target"), CachedModel(draft, capacity, "draft")
    chooser, drafter = Chooser(cfg.temperature, cfg.top_p, cfg.seed), Chooser(cfg.temperature, cfg.top_p, cfg.seed + 1)
    text = PlainText(list(prompt_ids), budget, target.eos_ids, cfg.max_answer)

    # 1. prefill: both models read the prompt but its last token (the first round's forwards read it)
    yield rec.phase("prefill")
    for model, row in ((seq, "main"), (dm, DRAFT_ROW)):
        if len(prompt_ids) > 1:
            t0 = rec.now()
            model.sync(prompt_ids[:-1])  # (a recurrent state is marked there: rollbacks re-read from it)
            yield rec.forward(t0, [RowWork(row, len(prompt_ids) - 1)])
    if text.stream == "reasoning":
        yield rec.phase("reasoning")
    else:  # no think markers, or thinking off: the run is its answer
        yield from budget.open_answer(rec)
    drafted = 0  # the Draft pane's tokens so far
    while not text.ended:
        # 2. propose: the draft draws up to `lookahead` tokens, each on the Draft pane as it comes
        proposal, q = yield from _propose(rec, dm, drafter, text.ids, _width(seq, text, lookahead), target.eos_ids)
        # 3. verify: the target reads what it has not of the text (its last token or more) and the proposal
        t0, owed = rec.now(), text.ids[seq.length:]
        logits = seq.feed([*owed, *proposal], all_logits=True)[len(owed) - 1:]  # [len(proposal) + 1, V]
        t1 = rec.clock()
        n, own = chooser.verify(logits, proposal, q)  # n proposal tokens accepted, then the target's own pick
        picks = [*proposal[:n], own]
        # 4. accept: the picks join the text by plain decoding's rules, up to the first that stops them
        taken = text.take(picks)
        accepted = min(n, taken.kept)
        yield rec.forward(t0, [RowWork("main", len(owed) + len(proposal), taken.kept, len(taken.forced) + len(taken.tail),
                                       len(proposal), accepted, PROPOSER if proposal else None)], end=t1)
        for j, tok in enumerate(picks[:accepted]):
            yield rec.token(taken.stream, tok, "accepted", DRAFT, source="draft")
            yield rec.draft_status(DRAFT, drafted + j, "accepted", source="draft")
        for j in range(accepted, len(proposal)):
            yield rec.draft_status(DRAFT, drafted + j, "rejected")
        drafted += len(proposal)
        if taken.kept > n:
            yield rec.token(taken.stream, own)
        for tok in taken.forced:  # the end-of-thinking marker (the tail opens the answer)
            yield rec.token("reasoning", tok)
        if taken.opened:
            yield from budget.open_answer(rec)
        # 5. roll back: each cache keeps what it shares with the text, less the text's last token
        for model, row in ((seq, "main"), (dm, DRAFT_ROW)):
            yield from _roll_back(rec, model, row, text.ids)

    s = rec.stats
    s.target_tokens, s.target_flops, s.target_s = seq.prefill_tokens + seq.decode_tokens, seq.flops, seq.seconds
    s.draft_model_tokens, s.draft_flops, s.draft_s = dm.prefill_tokens + dm.decode_tokens, dm.flops, dm.seconds
    s.flops = s.target_flops + s.draft_flops  # 2 x parameters x tokens processed, per model, as RSD counts
    s.cache_mb = cache_mb(seq.cache, dm.cache)
    yield rec.phase("done")
    yield rec.done()


def _width(seq: CachedModel, text: PlainText, lookahead: int) -> int:
    """How many tokens the draft proposes this round: ``lookahead``, less where a pick could not count:
    past the room the budgets leave (the round's last pick is the target's own), or (longrope) up to the
    switch point, which a verify may cross only once its first kept logit is past it (``Rope.limits``)."""
    owed = len(text.ids) - seq.length
    switch = seq.lm.rope.limits([seq.length], owed)
    return max(0, min(lookahead, text.room - 1, *(limit - owed for limit in switch or ())))


def _draw(chooser: Chooser, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
    """A token from logits ``[V]``, and the distribution ``q`` it was drawn from (None when greedy)."""
    if chooser.greedy:
        return int(logits.argmax()), None
    q = chooser.probs(logits)  # [V]
    return sample(q, chooser.generator), q


def _propose(rec: Recorder, dm: CachedModel, chooser: Chooser, text: list[int], k: int,
             stop: frozenset[int]) -> Generator[Event, None, tuple[list[int], torch.Tensor | None]]:
    """The draft's proposal of up to ``k`` tokens after ``text``, one forward each (the first also reads
    what the draft has not of the text), each token on the Draft pane as it is drawn; and the
    distributions they were drawn from (``[len(proposal), V]``; None when greedy). It ends at an end of
    sequence the draft drew."""
    proposal: list[int] = []
    q: list[torch.Tensor | None] = []
    while len(proposal) < k and not (proposal and proposal[-1] in stop):
        t0, unread = rec.now(), [*text, *proposal][dm.length:]
        tok, probs = _draw(chooser, dm.feed(unread))
        yield rec.forward(t0, [RowWork(DRAFT_ROW, len(unread), 1)], phase="drafting")  # time the draft model took
        yield rec.token("draft", tok, draft=DRAFT)
        proposal.append(tok)
        q.append(probs)
    return proposal, torch.stack(q) if q and q[0] is not None else None


def _roll_back(rec: Recorder, model: CachedModel, row: str, text: list[int]) -> Iterator[ForwardEvent]:
    """Roll ``model``'s cache back to what it shares with ``text``, less at least the text's last token
    (the next round's first forward reads it: its logits predict the next pick). A recurrent state
    re-reads its kept tokens from its last mark (``CachedModel.rollback``): recorded, as forwards of ``row``;
    then the state is marked there, where the next round's rollback starts (the text only grows), so a
    round re-reads its own tokens, never the run's."""
    same = next((i for i, (a, b) in enumerate(zip(model.ids, text, strict=False)) if a != b), min(model.length, len(text)))
    seen = len(model.spans)
    model.rollback(min(same, len(text) - 1))
    model.mark()
    for span in model.spans[seen:]:
        yield rec.forward(span.start - rec.t0, [RowWork(row, span.fed)], end=span.end - rec.t0,
                          phase="drafting" if row == DRAFT_ROW else None)


def _cells(s: RunStats) -> list[tuple[str, str]]:
    """The strip's cell of sd's own: what the draft model read and what it cost of the run."""
    share = f" ({s.draft_s / s.wall_s:.0%})" if s.wall_s else ""
    words = f"{s.draft_model_tokens} tokens read in {s.draft_s:.2f} s of the run's {s.wall_s:.2f} s{share}"
    rounds = f", proposing {s.verify_proposed / s.verifies:.1f} a round" if s.verifies else ""
    return [("draft model", words + rounds)]


METHOD = Method("sd", "Speculative decoding", "classic speculative decoding: a draft model proposes "
                f"{LOOKAHEAD} tokens, the target verifies them in one forward (Leviathan et al. 2023)",
                start=lambda m: partial(decode_sd, m.target, m.draft), drafts=True, uses=("draft",),
                llama="has not been checked on the llama.cpp runtime (its draft model's cache there is untested): run "
                      "it on the transformers runtime", studio=("run", "benchmark"), color="#ea580c", cells=_cells)
