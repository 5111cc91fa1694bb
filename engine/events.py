"""The event stream every method yields, and the statistics it ends with.

A run is a generator of events: :class:`PhaseEvent` when the run enters a phase,
:class:`TokenEvent` for every token on every stream (and for every later change of a draft token's
status), and one final :class:`DoneEvent` carrying :class:`RunStats` and the texts. The UI, the
run log, the exporters and the benchmark all consume this same stream.

Streams and statuses:

* ``reasoning``: the chain of thought, ``generated`` (the end-of-thinking marker included).
* ``answer``: ``generated`` (the model's own pick), ``accepted`` (a draft token taken by prefix
  verification) or ``recovered`` (a token taken from a draft, the prompt, the reasoning or the
  answer itself after a suffix match; ``source`` and ``match_len`` say which). Each answer token is
  credited to the one proposer that won it (:func:`proposer`, :func:`credit`): the colour it shows and
  the count it adds to are the same.
* ``draft``: each draft's tokens as written (``generated``), then re-emitted with the same
  ``position`` as ``accepted`` / ``recovered`` when taken, or ``rejected`` when proposed and not
  taken. A token taken later is re-emitted as taken; a taken token gets no other verdict (one credit).

Forwards: every forward of a model becomes a :class:`ForwardEvent`, yielded before the tokens it
chose: its phase, its start and end (device synchronised: the end is when its logits were ready),
and one :class:`RowWork` per row it computed (SSR's main row and the drafts riding in its batch;
RSD's draft, target and PRM each run their own forwards): tokens fed, tokens it chose that joined a
stream (``kept``), tokens forced after it without a pick (the end-of-thinking marker and the template
tail at the budget, a draft's opening tail), and for a verify what was proposed, by whom, and how
much of it was accepted. Over a server a record is a request, as far as the server reports.
The forwards add up: every token of every stream is one forward's ``kept`` or ``forced``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import ClassVar

from engine.steps import StepMode, Verify

PHASES = ("prefill", "reasoning", "drafting", "exit", "answer", "done")
STREAMS = ("reasoning", "draft", "answer")
STATUSES = ("generated", "accepted", "recovered", "rejected")
LOOKUPS = ("prompt", "reasoning", "answer")  # a suffix match there is a lookup, not a draft's work


def is_lookup(status: str, source: str | None) -> bool:
    """Whether a token of ``status`` from ``source`` was won by a lookup (in the prompt, the reasoning
    or the answer), not by a draft: the one rule :func:`proposer` and :func:`credit` apply."""
    return status in ("accepted", "recovered") and source in LOOKUPS


def proposer(status: str, source: str | None) -> str | None:
    """Who won a sped-up token, as the forwards' records name its proposer: "draft prefix",
    "suffix in drafts", or "lookup in prompt" (reasoning, answer); None for a token the model chose
    alone (or one proposed and not taken, or one a server's own speculation accepted).

    >>> proposer("recovered", "reasoning"), proposer("recovered", "draft"), proposer("accepted", "draft")
    ('lookup in reasoning', 'suffix in drafts', 'draft prefix')"""
    if status == "accepted" and source == "draft":
        return "draft prefix"
    if is_lookup(status, source):
        return f"lookup in {source}"
    if status == "recovered":
        return "suffix in drafts"
    return None


def credit(status: str, source: str | None) -> str:
    """The :class:`RunStats` counter an answer token of ``status`` from ``source`` adds to, one per token:
    ``accepted`` (green: the draft prefix, or a server's speculation), ``recovered`` (amber: a suffix in a
    draft), ``lookup_prompt`` / ``lookup_reasoning`` / ``lookup_answer`` (blue: a lookup there) or
    ``generated``. ``credit("recovered", "reasoning")`` is ``"lookup_reasoning"``, never ``"recovered"``."""
    if is_lookup(status, source):
        return f"lookup_{source}"
    return status


@dataclass(frozen=True)
class PhaseEvent:
    phase: str  # one of PHASES; "drafting" marks a draft forking (``draft`` says which); "exit" marks ssr-exit
    # stopping the reasoning (``at_token``: the model's reasoning tokens then; ``draft``: the newest agreeing draft)
    t: float  # seconds since the run started (monotonic clock)
    draft: int | None = None
    at_token: int | None = None  # for "drafting": reasoning tokens the draft has seen
    done: int | None = None  # for "compiling": step shapes compiled so far...
    total: int | None = None  # ...of this many
    kind: str = "phase"


@dataclass(frozen=True)
class TokenEvent:
    stream: str
    status: str
    token_id: int
    text: str  # decoded piece; a stream's pieces concatenate to its decoded text
    position: int  # index of the token within its stream (within its draft for "draft"); a position already
    # seen is a new verdict on that token (a draft token taken or rejected; an answer token a server's own
    # speculation turned out to have accepted, known when its request ends)
    t: float
    draft: int | None = None  # which draft ("draft" stream, or an answer token taken from a draft)
    source: str | None = None  # for recovered tokens: "draft", "prompt", "reasoning" or "answer"
    match_len: int | None = None  # for recovered tokens: length of the suffix match
    kind: str = "token"


@dataclass
class RSDStats:
    """RSD's steps (engine.methods.rsd): how many drafted steps the PRM kept and rejected, and their mean
    rewards (None: no step of that kind). Columns as named here."""

    PREFIX: ClassVar[str] = ""
    steps_accepted: int = 0
    steps_rejected: int = 0
    mean_reward_accepted: float | None = None
    mean_reward_rejected: float | None = None


@dataclass
class ServedStats:
    """SSR on a server that speculates by itself (engine.remote.served): its method as declared, what its
    per-request metrics reported (proposed tokens accepted, proposed, verify steps), and a sentence when
    the run contradicts the declaration (no metrics, nothing proposed). Columns ``server_<field>``."""

    PREFIX: ClassVar[str] = "server_"
    speculation: str = ""
    accepted: int = 0
    proposed: int = 0
    steps: int = 0
    note: str = ""


@dataclass
class ExitStats:
    """ssr-exit (engine.methods.exit): the rule in words; where it stopped the reasoning (the model's own
    reasoning tokens then, before the forced marker; None: the drafts never agreed), which drafts agreed
    ("2,3,4") on what answer, their mean token probability under the model (measured when the rule has a
    bar), and without an exit, why the rule never held, with the counts (``ExitBudget.why_not``).
    Columns ``exit_<field>``."""

    PREFIX: ClassVar[str] = "exit_"
    rule: str = ""
    at: int | None = None
    drafts: str = ""
    answer: str = ""
    score: float | None = None
    why: str = ""


PARTS = {"rsd": RSDStats, "server": ServedStats, "exit": ExitStats}  # RunStats' field -> the record it holds


@dataclass
class RunStats:
    """Timings and counters of one run; the ``runs`` table mirrors these fields."""

    method: str = ""
    wall_s: float = 0.0
    ttft_s: float | None = None  # time to the first answer token
    prefill_s: float = 0.0
    reasoning_s: float = 0.0
    answer_s: float = 0.0
    prompt_tokens: int = 0
    reasoning_tokens: int = 0
    answer_tokens: int = 0
    draft_tokens: int = 0
    drafts: int = 0
    # the answer's tokens by the proposer that won them (``credit``; they sum to ``answer_tokens``): the draft prefix
    # (a server's speculation too), a suffix in a draft, a lookup in the prompt / the reasoning / the answer itself,
    # and ``generated`` below. Runs logged before schema 18 counted lookups in ``recovered`` (their lookup_* are null)
    accepted: int = 0
    recovered: int = 0
    lookup_prompt: int = 0
    lookup_reasoning: int = 0
    lookup_answer: int = 0
    rejected: int = 0  # draft tokens proposed and never taken (what the Draft pane shows struck through)
    rejected_lookup: int = 0  # tokens proposed from the prompt, reasoning or answer and not taken
    generated: int = 0  # answer tokens the model picked itself
    forward_calls: int = 0
    answer_forwards: int = 0  # forwards of the target while the answer is written (its verifies, for SSR)
    tokens_per_s: float = 0.0  # (reasoning + answer tokens) / wall time
    peak_memory_mb: float | None = None  # the device's peak allocation during the run (CUDA)
    cache_mb: float | None = None  # the run's preallocated KV buffers (every row, every model), sized from its budgets
    compile_s: float = 0.0  # seconds compiling step shapes before the run started (never part of wall_s)
    step_mode: str = ""  # "compiled", "eager: <why not compiled>" (engine.runtime.compiled), or exact mode's route
    numerics: str = ""  # the target's precision and how it was chosen, in words (engine.runtime.numerics); "": not said
    verify: str = ""  # SSR: how its verifies ran on this model, as the capability probe measured (engine.runtime.probe)
    # SSR with drafts: "shared prefix" (the drafts read the main row's slots: engine.runtime.batch's shared forks), or
    # "copied prefix: <why not shared>" (each draft holds a copy); "" when no draft was planned
    forks: str = ""
    # SSR: the main row's cost-aware widths in words, the reasoning's lookups then the answer's proposers
    # (engine.methods.ssr.widths)
    lookups: str = ""
    # SSR: mean seconds per reasoning step with no draft live / with drafts riding in the batch
    step_s_alone: float | None = None
    step_s_drafting: float | None = None
    # SSR's cost-aware drafting (engine.methods.ssr.policy): its decision for this run in words ("" when drafting is
    # "always", or for another method), and the answer forwards the drafts saved that no lookup would have
    drafting: str = ""
    draft_saved: int = 0
    # the models' work, per model (every method in process); FLOPs = 2 x parameters x tokens processed
    flops: float = 0.0
    target_tokens: int = 0  # tokens each model processed (prefill and decode)
    draft_model_tokens: int = 0
    prm_tokens: int = 0
    target_flops: float = 0.0
    draft_flops: float = 0.0
    prm_flops: float = 0.0
    target_s: float = 0.0
    draft_s: float = 0.0
    prm_s: float = 0.0
    # which budget cut the run (engine.methods.budget.budget_cut): "" it ended by itself, "reasoning" (the end of
    # thinking forced at max_think), "answer" (stopped at max_answer), "reasoning, answer", or RSD's "response"
    cut: str = ""
    # the forwards' own accounting (ForwardEvent): seconds inside forwards (the rest of wall_s is the loops'
    # bookkeeping), what the drafts riding in the reasoning's batch cost beyond a lone step, and the verifies
    forward_s: float = 0.0
    drafting_s: float = 0.0
    verifies: int = 0  # forwards that verified a proposal (SSR's answer and reasoning lookups, on any row)
    verify_proposed: int = 0
    verify_accepted: int = 0
    # per proposer, JSON: {"draft prefix": {"hist": [verifies that accepted 0, 1, ... tokens],
    #   "reached": [verifies proposing a 1st, 2nd, ... token], "taken": [of those, accepted]}, ...}
    acceptance: str = ""
    # what one method adds (zero-valued for the others), each a record of its own, flattened in the run log
    rsd: RSDStats = field(default_factory=RSDStats)
    server: ServedStats = field(default_factory=ServedStats)
    exit: ExitStats = field(default_factory=ExitStats)

    def stepping(self) -> StepMode:
        """How the run's steps ran (``step_mode`` read once, in ``engine.steps``)."""
        return StepMode.of(self.step_mode)

    def verifying(self) -> Verify:
        """How the run's verifies ran (``verify`` read once, in ``engine.steps``)."""
        return Verify.of(self.verify)

    def won(self) -> dict[str, int]:
        """The answer's tokens by the proposer that won them, as the panes colour them (:func:`proposer`'s
        names; "generated": the model's own); they sum to ``answer_tokens``."""
        return {"draft prefix": self.accepted, "suffix in drafts": self.recovered,
                **{f"lookup in {src}": getattr(self, f"lookup_{src}") for src in LOOKUPS}, "generated": self.generated}

    def repetition(self) -> str:
        """A note when lookups won most of the answer (the model repeats what it wrote or read), else "":
        "lookups won 83% of the answer: the model repeats its reasoning and the prompt"."""
        looked = {src: getattr(self, f"lookup_{src}") for src in LOOKUPS}
        if not self.answer_tokens or 2 * sum(looked.values()) <= self.answer_tokens:
            return ""
        names = {"prompt": "the prompt", "reasoning": "its reasoning", "answer": "its own answer"}
        what = " and ".join(names[src] for src, n in sorted(looked.items(), key=lambda kv: -kv[1]) if n)
        return f"lookups won {sum(looked.values()) / self.answer_tokens:.0%} of the answer: the model repeats {what}"

    def by_proposer(self) -> list[ProposerAcceptance]:
        """Per proposer, its verifies' acceptance over the run (from ``acceptance``: every row's verifies,
        a draft row's own lookups and the reasoning's included), most accepted tokens first."""
        mine = [ProposerAcceptance.of(who, a) for who, a in parse_acceptance(self.acceptance).items()]
        return sorted(mine, key=lambda p: (-p.num_accepted_tokens, p.proposer))

    def to_dict(self) -> dict:
        """Flat, one key per run log column: a part's fields under its prefix (``exit.at`` is ``exit_at``)."""
        parts = {kind: getattr(self, part) for part, kind in PARTS.items()}
        return {name: getattr(parts.get(owner, self), attr) for name, (owner, attr) in self.columns().items()}

    @classmethod
    def from_dict(cls, flat: dict) -> RunStats:
        """Back from :meth:`to_dict`'s keys (a run log row, a JSON trace's run); keys it does not name, and
        missing ones (a row logged before a column existed), are left to the defaults."""
        given: dict[type, dict] = {owner: {} for owner in (cls, *PARTS.values())}
        for name, (owner, attr) in cls.columns().items():
            if name in flat:
                given[owner][attr] = flat[name]
        return cls(**given[cls], **{part: kind(**given[kind]) for part, kind in PARTS.items()})

    @classmethod
    @functools.cache
    def columns(cls) -> dict[str, tuple[type, str]]:
        """Each run log column of a run's stats: the record that types it and its field there."""
        cols: dict[str, tuple[type, str]] = {}
        for f in dataclasses.fields(cls):
            if f.name in PARTS:
                kind = PARTS[f.name]
                named = {kind.PREFIX + g.name: (kind, g.name) for g in dataclasses.fields(kind)}
            else:
                named = {f.name: (cls, f.name)}
            if taken := set(named) & set(cols):
                raise TypeError(f"RunStats' columns are named twice: {', '.join(sorted(taken))}")
            cols.update(named)
        return cols


def parse_acceptance(text: str | None) -> dict[str, dict[str, list[int]]]:
    """``RunStats.acceptance`` back, per proposer (empty for runs logged before it, or without
    verifies; ``engine.forwards.acceptance`` writes it)."""
    try:
        doc = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass(frozen=True)
class ProposerAcceptance:
    """One proposer's verifies over a run, in vLLM's spec-decode terms: ``num_drafts`` (its proposals
    verified), ``num_draft_tokens`` (their tokens) and ``num_accepted_tokens`` (of them, accepted; a
    draft's accepted end of sequence included, as vLLM counts it). Its acceptance rate is accepted /
    draft tokens; its mean acceptance length 1 + accepted / drafts (the verifier's own token included).

    >>> ProposerAcceptance("draft prefix", 2, 40, 30).words()
    'draft prefix: 30 of 40 tokens accepted (75%) in 2 verifies, mean acceptance length 16.0'"""

    proposer: str
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int

    @classmethod
    def of(cls, proposer: str, a: dict[str, list[int]]) -> ProposerAcceptance:
        """From one proposer's entry of ``RunStats.acceptance`` (``engine.forwards.acceptance``)."""
        return cls(proposer, sum(a.get("hist", [])), sum(a.get("reached", [])), sum(a.get("taken", [])))

    @property
    def acceptance_rate(self) -> float | None:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else None

    def per_verify(self) -> str:
        """Tokens accepted of tokens proposed, per verify, as the strip and the timeline's cards both say
        them: "1.3 of 4.0/verify" ("" without a verify)."""
        if not self.num_drafts:
            return ""
        return f"{self.num_accepted_tokens / self.num_drafts:.1f} of {self.num_draft_tokens / self.num_drafts:.1f}/verify"

    def words(self) -> str:
        rate, mean = self.acceptance_rate, self.mean_acceptance_length
        return (f"{self.proposer}: {self.num_accepted_tokens} of {self.num_draft_tokens} tokens accepted"
                + (f" ({rate:.0%})" if rate is not None else "")
                + f" in {self.num_drafts} verif{'ies' if self.num_drafts != 1 else 'y'}"
                + (f", mean acceptance length {mean:.1f}" if mean is not None else ""))


@dataclass(frozen=True)
class StepEvent:
    """RSD: one reasoning step settled. ``source`` is who wrote the kept step ("draft" or
    "target"); a rejected draft step is reported first with ``accepted=False``."""

    index: int
    text: str
    source: str
    reward: float | None
    accepted: bool | None
    t: float
    confidence: float | None = None  # the draft's probability of its least likely token in the step
    kind: str = "step"


@dataclass(frozen=True)
class RowWork:
    """One row's part in a forward."""

    row: str  # "main" (the reasoning, then the answer), "draft 0", ...; RSD: "draft", "target", "prm"
    fed: int  # tokens fed: what the row owed the cache, then the proposal
    kept: int = 0  # tokens this forward's logits chose that joined a stream: accepted proposal, then its own pick
    forced: int = 0  # tokens put on the row's stream after this forward without a pick (budget, template)
    proposed: int = 0  # proposal tokens verified
    accepted: int = 0  # of them, accepted
    proposer: str | None = None  # "draft prefix", "suffix in drafts", "lookup in prompt" (reasoning, answer, draft)
    note: str | None = None  # what else a lane shows on hover (RSD: the step's reward and verdict)


@dataclass(frozen=True)
class ForwardEvent:
    """One forward (one request over a server), yielded before the tokens it chose."""

    index: int  # 0, 1, ... in the order the forwards ran
    phase: str  # the phase it ran in: "prefill", "reasoning", "answer"
    start: float  # seconds since the run started
    end: float  # when its logits were ready (the device synchronised); ``end - start`` is its wall time
    rows: tuple[RowWork, ...]
    kind: str = "forward"

    @property
    def t(self) -> float:
        return self.end

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    @classmethod
    def from_dict(cls, raw: dict) -> ForwardEvent:
        """Back from ``dataclasses.asdict`` (a JSON trace, the run log's column)."""
        rows = tuple(RowWork(**r) for r in raw["rows"])
        return cls(raw["index"], raw["phase"], raw["start"], raw["end"], rows)


@dataclass(frozen=True)
class DoneEvent:
    stats: RunStats
    reasoning_text: str
    answer_text: str
    reasoning_ids: list[int] = field(default_factory=list)
    answer_ids: list[int] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)
    kind: str = "done"


Event = PhaseEvent | TokenEvent | StepEvent | ForwardEvent | DoneEvent


class TokenTally:
    """A run's token counters, folded from its events one at a time into ``stats``: the one place
    they are counted, by the recorder as a loop emits them, by the run log for a run that stopped
    before its :class:`DoneEvent`, and by the studio while a run streams.

    Counted: reasoning and answer tokens, the answer's split by the proposer that won each token
    (:func:`credit`: ``accepted`` / ``recovered`` / ``lookup_*`` / ``generated``, once per token, a new
    verdict moving it), draft tokens written, ``rejected`` (draft tokens whose latest status is
    rejected: proposed, never taken) and, for RSD, draft steps kept and rewritten by the target.

    >>> tally = TokenTally(RunStats())
    >>> for ev in events:
    ...     tally.add(ev)
    """

    def __init__(self, stats: RunStats) -> None:
        self.stats = stats
        self.steps_kept = self.steps_rewritten = 0
        self._draft_status: dict[tuple[int | None, int], str] = {}  # each draft token's latest status
        self._answer_credit: list[str] = []  # the counter each answer token adds to, by its latest verdict

    def add(self, ev: Event) -> None:
        s = self.stats
        if isinstance(ev, TokenEvent):
            if ev.stream == "reasoning":
                s.reasoning_tokens += 1
            elif ev.stream == "answer":
                won = credit(ev.status, ev.source)
                if ev.position < len(self._answer_credit):  # a new verdict: the token moves between counts
                    before = self._answer_credit[ev.position]
                    setattr(s, before, getattr(s, before) - 1)
                    self._answer_credit[ev.position] = won
                else:
                    s.answer_tokens += 1
                    self._answer_credit.append(won)
                setattr(s, won, getattr(s, won) + 1)
            else:
                before = self._draft_status.get((ev.draft, ev.position))
                s.draft_tokens += before is None
                s.rejected += (ev.status == "rejected") - (before == "rejected")
                self._draft_status[(ev.draft, ev.position)] = ev.status
        elif isinstance(ev, StepEvent):
            self.steps_kept += ev.source == "draft" and ev.accepted is True
            self.steps_rewritten += ev.accepted is False
