"""Pure builders: a run's events -> the HTML of the three panes and the metrics strip.

:class:`TraceView` folds the event stream into per-stream token lists (a draft token's status
changes as verification decides) and renders them. Every value written into HTML here, in
``ssr_ui.timeline`` and in ``ssr_ui.export`` (text, ids, numbers; live, replayed, imported or
exported) goes through :func:`esc`, the one escaping function: a prompt, an output or an imported
field holding ``<script>`` shows as text.
"""

from __future__ import annotations

import html
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from engine.events import (
    LOOKUPS,
    DoneEvent,
    ForwardEvent,
    PhaseEvent,
    RunStats,
    StepEvent,
    TokenEvent,
    TokenTally,
    is_lookup,
    proposer,
)
from engine.methods.budget import budget_cut, cut_parts
from engine.methods.exit.budget import NAME as EXIT
from engine.registry import is_lossy, known, writes_steps
from engine.steps import StepMode, Verify

CSS = (Path(__file__).resolve().parents[1] / "assets" / "studio.css").read_text()
STATUS_LABEL = {"generated": "generated", "accepted": "accepted", "recovered": "suffix-recovered",
                "rejected": "rejected"}


def esc(value) -> str:
    """The one escaping function: ``value`` (any value: text, an id, a number) as text safe inside
    an element or a double-quoted attribute (every attribute these builders write is double-quoted,
    so ``'`` stays as typed). ``esc('<img src=x>')`` is ``'&lt;img src=x&gt;'``; ``esc(3)`` is ``'3'``."""
    return html.escape(str(value), quote=False).replace('"', "&quot;")


@dataclass
class Tok:
    token_id: int
    text: str
    status: str
    t: float
    draft: int | None = None
    source: str | None = None
    match_len: int | None = None
    # ids of the tokens just before this one that showed no text: a byte-level tokenizer splits one character
    # (an emoji, a CJK character) over several tokens, and its text comes whole with the last of them
    joins: tuple[int, ...] = ()
    fwd: int | None = None  # the forward that chose it (the timeline highlights a forward's tokens)
    _html: str | None = field(default=None, repr=False, compare=False)  # rendered once, re-rendered on change

    def verdict(self, status: str, source: str | None, match_len: int | None) -> None:
        self.status, self.source, self.match_len, self._html = status, source, match_len, None

    def span(self, text: str | None = None, after: str = "") -> str:
        """The token as a coloured span with its tooltip; ``text`` replaces what it shows and
        ``after`` (HTML, e.g. a badge) follows it inside the span."""
        if after:
            return self._render(self.text if text is None else text, after)
        if text is not None:
            return self._render(text)
        if self._html is None:
            self._html = self._render(self.text)
        return self._html

    def _render(self, text: str, after: str = "") -> str:
        if self.joins:
            ids = " ".join(map(str, (*self.joins, self.token_id)))
            tip = f"ids {ids} (this text came over {len(self.joins) + 1} tokens)"
        else:
            tip = f"id {self.token_id}"
        won, lookup = proposer(self.status, self.source), is_lookup(self.status, self.source)
        # the strip's cell that counts it
        counted = "lookup" if lookup else "recovered" if won == "suffix in drafts" else STATUS_LABEL[self.status]
        tip += f" · {counted}"
        if self.source:
            where = f"draft {self.draft}" if self.source == "draft" and self.draft is not None else self.source
            tip += f" · from {where}" + (f" (match {self.match_len})" if self.match_len else "")
        if won is not None:
            tip += f" · won by the {won}"
        tip += f" · {self.t:.2f}s"
        if not self.text:
            tip += " · no text of its own: part of a character that a later token completes"
        f = "" if self.fwd is None else f' data-f="{esc(self.fwd)}"'
        return (f'<span class="tok st-{esc(self.status)}{" src-lookup" if lookup else ""}"{f} title="{esc(tip)}">'
                f'{esc(text)}{after}</span>')


@dataclass
class TraceView:
    """The state of one run as the UI shows it, built from its events."""

    reasoning: list[Tok] = field(default_factory=list)
    answer: list[Tok] = field(default_factory=list)
    drafts: dict[int, list[Tok]] = field(default_factory=dict)
    draft_forks: dict[int, int] = field(default_factory=dict)  # draft -> reasoning tokens seen
    phase: str = "waiting"
    elapsed: float = 0.0
    stats: RunStats | None = None
    done: DoneEvent | None = None
    steps: list[StepEvent] = field(default_factory=list)  # RSD: settled steps, rejected drafts first
    step_starts: dict[tuple[str, int], StepEvent] = field(default_factory=dict)  # (stream, first token) -> step
    method: str = ""  # "baseline", "ssr", "rsd", ... (what the Draft pane can expect)
    think_end: str | None = None  # the end-of-thinking marker's text, shown as a badge, not raw
    # how the model reasons: None (an end-of-thinking token, or not known), "prompted" (a chat model asked by its
    # template to reason between <think> and </think>, the marker written as text) or "none" (no reasoning at all)
    thinking: str | None = None
    exact: bool = False  # the run used exact (batch- and width-invariant) forwards
    rule: str | None = None  # RSD: the acceptance rule and where its numbers came from
    dtypes: str | None = None  # what precision each model runs in
    notice: str | None = None  # something the user must know about this run (e.g. "not saved: ...")
    compiled_shapes: tuple[int, int] | None = None  # while compiling: step shapes done, of how many
    budgets: tuple[int, int] | None = None  # (max_think, max_answer) of the run: a cut is shown while it streams
    forwards: list[ForwardEvent] = field(default_factory=list)  # every forward so far (the timeline's bars)
    fork_times: dict[int, float] = field(default_factory=dict)  # draft -> when it forked (seconds)
    answer_t: float | None = None  # when the answer phase began
    exit: PhaseEvent | None = None  # ssr-exit: where its drafts agreed and the reasoning was stopped (None: no exit)
    # a Compare's runs that could not run on its model, by mode name, with the reason (each its own strip cell);
    # a view of phase "skipped" is one of them: nothing ran, its panes say so
    skipped: dict[str, str] = field(default_factory=dict)
    # the run's own settings the empty panes' messages depend on (None / False where not known: a replay, a note)
    draft_start: int | None = None  # where SSR's first draft was to fork
    thinking_off: bool = False  # the run's Thinking setting was off: the answer alone, no reasoning to draft from
    # per row, the forwards whose kept and forced tokens have not all come yet: [index, tokens still to come]
    _owed: dict[str, deque] = field(default_factory=dict, repr=False, compare=False)
    _pending: dict[str, list[Tok]] = field(default_factory=dict, repr=False, compare=False)  # no forward's yet
    _next_step_at: tuple[str, int] = ("reasoning", 0)  # where the next kept step begins
    tally: TokenTally = field(default_factory=lambda: TokenTally(RunStats()), repr=False, compare=False)

    def apply(self, ev) -> None:
        self.tally.add(ev)
        if isinstance(ev, PhaseEvent):
            if ev.phase == "drafting":
                self.draft_forks[ev.draft] = ev.at_token
                self.fork_times[ev.draft] = ev.t
                self.drafts.setdefault(ev.draft, [])
            else:
                if ev.phase == "answer":
                    self.answer_t = ev.t
                elif ev.phase == "exit":
                    self.exit = ev
                self.phase = ev.phase
                if ev.phase == "compiling" and ev.total:
                    self.compiled_shapes = (ev.done, ev.total)
        elif isinstance(ev, TokenEvent):
            toks = self.reasoning if ev.stream == "reasoning" else self.answer if ev.stream == "answer" \
                else self.drafts.setdefault(ev.draft, [])
            if ev.stream != "reasoning" and ev.position < len(toks):
                # a verdict on an existing token (a draft token taken or rejected; an answer token a server's
                # speculation accepted)
                toks[ev.position].verdict(ev.status, ev.source, ev.match_len)
            else:
                tok = Tok(ev.token_id, ev.text, ev.status, ev.t, ev.draft, ev.source, ev.match_len,
                          _held(toks) if ev.text else ())
                toks.append(tok)
                self._chosen_by(tok, self._lane("main" if ev.stream != "draft" else f"draft {ev.draft}"))
        elif isinstance(ev, ForwardEvent):
            self.forwards.append(ev)
            for r in ev.rows:
                owed = r.kept + r.forced
                if not owed:
                    continue
                key = self._lane(r.row)
                # tokens that came before their forward's record, oldest first: a draft's opening tail (written at
                # its fork, fed by its first forward), or a request's tokens (its record comes when it ends)
                waiting = self._pending.get(key, [])
                claimed = min(owed, len(waiting))
                for tok in waiting[:claimed]:
                    tok.fwd, tok._html = ev.index, None
                del waiting[:claimed]
                if owed > claimed:  # the rest come after it
                    self._owed.setdefault(key, deque()).append([ev.index, owed - claimed])
        elif isinstance(ev, StepEvent):
            self.steps.append(ev)
            if ev.accepted is not False:  # a kept step: label it where it begins
                self.step_starts[self._next_step_at] = ev
                self._next_step_at = ("answer", len(self.answer)) if self.answer else ("reasoning", len(self.reasoning))
        elif isinstance(ev, DoneEvent):
            self.done, self.stats, self.phase = ev, ev.stats, "done"
        self.elapsed = max(self.elapsed, getattr(ev, "t", 0.0) or 0.0)

    def _lane(self, row: str) -> str:
        """Whose forwards write a row's tokens (a token's row: "main" or "draft k"): the row's own,
        except in RSD, where one text is written by its draft or its target ("steps"; the PRM writes none)."""
        return "steps" if writes_steps(self.method) and row != "prm" else row

    def exit_drafts(self) -> list[int]:
        """The drafts that agreed on an early exit (``RunStats.exit.drafts`` once the run's final
        stats are in; while it streams, the newest of them, which the exit event names); [] for none."""
        if self.stats is not None and self.stats.exit.drafts:
            return [int(d) for d in self.stats.exit.drafts.split(",") if d.strip().isdigit()]
        return [self.exit.draft] if self.exit is not None and self.exit.draft is not None else []

    def exit_words(self) -> str:
        """The exit in a few words, for the reasoning pane's badge and the timeline: "drafts 3, 4 agreed"."""
        drafts = self.exit_drafts()
        if not drafts:
            return "the drafts agreed"
        if self.stats is None and len(drafts) == 1:  # live: the final stats name the others
            return f"draft {drafts[0]} agreed with the drafts before it"
        return f"draft{'s' if len(drafts) > 1 else ''} {', '.join(map(str, drafts))} agreed"

    def _exit_badge(self) -> str:
        at = self.exit.at_token if self.exit is not None else None
        answer = self.stats.exit.answer if self.stats is not None and self.stats.exit.answer else ""
        tip = (f"early exit after {at} reasoning tokens: {self.exit_words()}"
               + (f" on {_short(answer, 80)!r}" if answer else "")
               + "; the end of thinking was forced here and the answer verifies the newest agreeing draft")
        return (f'<span class="exit-mark" title="{esc(tip)}">■ early exit: '
                f'{esc(self.exit_words())}</span>')

    def _chosen_by(self, tok: Tok, key: str) -> None:
        """Name the forward that chose a new token: the oldest of its row's forwards still owed tokens,
        or, where none is (a request's record comes after its tokens), the next record of its row."""
        owed = self._owed.get(key)
        if not owed:
            self._pending.setdefault(key, []).append(tok)
            return
        owed[0][1] -= 1
        tok.fwd = owed[0][0]
        if owed[0][1] == 0:
            owed.popleft()

    # ------------------------------------------------------------------ panes
    def _fork_shown_at(self, at: int) -> int:
        """Where a fork after ``at`` reasoning tokens is drawn: there, or a few tokens on at the next
        word boundary, so that the marker never splits a word or a number ("1▼08")."""
        toks = self.reasoning

        def joined(i: int) -> bool:  # token i continues the word or number before it
            return 0 < i < len(toks) and toks[i].text[:1].isalnum() and toks[i - 1].text[-1:].isalnum()

        for i in range(at, min(at + 8, len(toks))):
            if not joined(i):
                return i
        return at

    def _close(self) -> tuple[int, int] | None:
        """Where the end-of-thinking marker lies in the reasoning's text (start, end), when the last
        reasoning token completes it (the rule of ``engine.runtime.markers``: the token that
        completes the marker's text closes the reasoning, however the model split it: one marker
        token, or ``</`` ``think`` ``>`` as text); None while the reasoning is open."""
        if not self.think_end or not self.reasoning:
            return None
        text = "".join(t.text for t in self.reasoning)
        at = text.rfind(self.think_end)
        if at < 0 or at + len(self.think_end) <= len(text) - len(self.reasoning[-1].text):
            return None
        return at, at + len(self.think_end)

    def marker_tokens(self) -> int:
        """How many reasoning tokens wrote the closing marker (0 while the reasoning is open): one
        for a marker token, several for a marker written as text."""
        close = self._close()
        if close is None:
            return 0
        start, count = 0, 0
        for tok in self.reasoning:
            start += len(tok.text)
            count += start > close[0]
        return count

    def nothing_ran(self) -> str | None:
        """Why the panes are empty, for a run that never started (a Compare's skipped run, a refused
        one): the panes then say so instead of describing a run. None for a run that started."""
        if self.phase == "skipped":
            return "Not run in this comparison: the reason is in the strip."
        if self.phase == "error" and not (self.reasoning or self.answer or self.drafts or self.forwards):
            return "Nothing ran: the reason is in the strip."
        return None

    def reasoning_html(self) -> str:
        """The Reasoning pane: its tokens (the blank lines before the first word not shown), where
        each draft forked, RSD's step badges, and the closing marker shown as an "end of thinking"
        badge (its tokens keep their tooltips; the marker's text is not shown). A prompted run says
        so above the pane; a model that does not reason says so in it."""
        spans = []
        forks = sorted(((d, at, self._fork_shown_at(at)) for d, at in self.draft_forks.items()), key=lambda f: f[2])
        close, start, leading = self._close(), 0, True
        marker: list[int] = []  # the ids of the tokens that wrote the marker
        if self.nothing_ran():
            return _pane([], self.nothing_ran())
        exit_at = self.exit.at_token if self.exit is not None and self.exit.at_token is not None else None
        forks_at: dict[int, list[str]] = {}  # the marks drawn before each token, in order
        for d, at, shown in forks:
            forks_at.setdefault(shown, []).append(_fork_mark(d, at))
        for i, tok in enumerate(self.reasoning):
            if i == exit_at:  # after the exit_at-th token of the model's own reasoning: the forced marker follows
                spans.append(self._exit_badge())
            spans += forks_at.get(i, [])
            spans += self._step_badge("reasoning", i)
            begin = start
            start += len(tok.text)
            if close is None or start <= close[0]:
                # as in the answer (_trimmed), the blank lines before the first word are not shown
                spans.append(tok.span(tok.text.lstrip()) if leading and tok.text[:1].isspace() else tok.span())
                leading = leading and not tok.text.strip()
                continue
            # a token of the marker: it shows what it holds outside the marker (a byte-level tokenizer may put
            # text before it, or the template's blank lines after it); the last one carries the badge
            marker.append(tok.token_id)
            visible = tok.text[: max(0, close[0] - begin)]
            if i < len(self.reasoning) - 1:
                spans.append(tok.span(visible))
                continue
            # (the tooltip names the marker's tokens, not its text: a page never shows the raw marker)
            how = (f"the marker written as text over {len(marker)} tokens (prompted reasoning)" if len(marker) > 1
                   or self.thinking == "prompted" else "the end-of-thinking token")
            tip = f"end of thinking: {how}; {'ids' if len(marker) > 1 else 'id'} {' '.join(map(str, marker))}"
            if "reasoning" in self.cut_parts:  # the budget closed it, not the model: said on the badge itself
                tip = (f"cut at Max think ({len(self.reasoning)} tokens): the model was still reasoning, so the end of "
                       f"thinking was forced here; {tip}")
                badge = f'<span class="think-end cut" title="{esc(tip)}">cut at Max think</span>'
            else:
                if self.exit is not None:
                    tip = f"forced by the early exit: {self.exit_words()}; {tip}"
                badge = f'<span class="think-end" title="{esc(tip)}">end of thinking</span>'
            spans.append(tok.span(visible, badge + esc(tok.text[close[1] - begin:])))
        if exit_at is not None and exit_at >= len(self.reasoning):
            spans.append(self._exit_badge())
        for d, at, shown in forks:
            if shown >= len(self.reasoning):
                spans.append(_fork_mark(d, at))
        if self.thinking == "none":
            return _pane(spans, "No reasoning: this model has no think markers and no chat template (a base model), "
                                "so its whole output is the answer.")
        pane = _pane(spans, self._no_reasoning())
        if self.thinking == "prompted":
            return ('<div class="pane-note">prompted reasoning: this chat model has no end-of-thinking token, so '
                    f'its template asks it to reason between &lt;think&gt; and {esc(self.think_end or "")}'
                    '</div>' + pane)
        return pane

    def _stopped_early(self) -> bool:
        """Stopped (Stop, the time limit) before the run wrote a token."""
        return self.phase == "stopped" and not (self.reasoning or self.answer)

    def _no_reasoning(self) -> str:
        """Why the Reasoning pane is empty: Thinking off, stopped before a token, or not yet."""
        if self.thinking_off:
            return "Thinking was off for this run (Run settings' Thinking): the answer alone, no reasoning."
        if self._stopped_early():
            return "Stopped before the first token."
        return "The reasoning appears here."

    def _no_draft(self) -> str:
        """Why an SSR run's Draft pane is empty, from the run's typed facts: Thinking off, stopped
        before a draft forked, the reasoning ended before the draft start (its tokens against
        ``draft_start``), or drafting decided none (the reasoning passed the draft start, no draft
        forked: RunStats.drafts, with the policy's own words); "not yet" while the run goes."""
        if self.thinking_off:
            return "No draft: Thinking was off for this run, so there was no reasoning to fork a draft from."
        if self._stopped_early():
            return "No draft: the run was stopped before its first token."
        if self.phase == "stopped":
            return "No draft: the run was stopped before a draft forked."
        if not self.finished:
            return "No draft yet: a draft forks at the draft-start token of the reasoning."
        s, start = self.stats, self.draft_start
        thought = s.reasoning_tokens if s is not None else len(self.reasoning)
        if start is None:
            return "No draft was forked in this run."
        if thought < start:
            return (f"No draft was written: the reasoning ended after {thought} tokens, before the draft start "
                    f"({start}).")
        why = f": {s.drafting}" if s is not None and s.drafting else ""
        return (f"No draft was forked: the reasoning reached the draft start ({thought} tokens, draft start {start}) "
                f"and drafting decided none{why}.")

    def _step_badge(self, stream: str, start: int) -> list[str]:
        step = self.step_starts.get((stream, start))
        if step is None:
            return []
        score = f" {step.reward:.2f}" if step.reward is not None else ""
        tip = f"step {step.index}: written by the {step.source}" + (", PRM score" + score if score else "")
        return [f'<span class="step step-{esc(step.source)}" title="{esc(tip)}">{esc(step.source + score)}</span>']

    def draft_html(self, which: int | None = None) -> str:
        if self.nothing_ran():
            return _pane([], self.nothing_ran())
        if self.steps:  # RSD: every rejected draft step, with the score that rejected it
            rejected = [s for s in self.steps if s.accepted is False]
            if not rejected:
                return _pane([], "No draft step was rejected." if self.finished else "No draft step rejected so far.")
            return "".join('<div class="pane-note">' + esc(f"step {s.index}"
                           + (f" · PRM score {s.reward:.2f}" if s.reward is not None else "")
                           + (f" · the draft's least likely token {s.confidence:.2f}" if s.confidence is not None else "")
                           + " · rewritten by the target") + "</div>" + _pane(_trimmed(self.drafts.get(s.index, [])), "")
                           for s in rejected)
        if not self.drafts:
            if self.method == "ssr-lookups":
                return _pane([], "SSR's lookups alone (the ablation) forks no draft: its speed-ups are lookups.")
            if (method := known(self.method)) is not None and method.plain:
                return _pane([], "Plain decoding writes no draft.")
            return _pane([], self._no_draft())
        which = max(self.drafts) if which is None or which not in self.drafts else which
        fork = self.draft_forks.get(which, 0)
        agreed = (f' · <span class="exit-agreed" title="one of the drafts whose answers agreed: the early exit">'
                  f'■ agreed ({esc(self.exit_words())})</span>' if which in self.exit_drafts() else "")
        words = (f"draft {which} · forked after {fork} reasoning tokens" if which in self.draft_forks
                 else f"draft {which}: its proposals, round after round, struck through where the verifier disagreed")
        head = f'<div class="pane-note">{esc(words)}{agreed}</div>'
        empty = "The draft is starting."
        if self.finished and not any(t.text.strip() for t in self.drafts[which]):  # say why there is nothing to show
            left = max(len(self.reasoning) - fork, 0)
            empty = (f"This draft wrote {'nothing' if not self.drafts[which] else 'only blank lines'}: the reasoning "
                     f"ended {left} token{'s' if left != 1 else ''} after it forked"
                     + (" (cut at Max think)" if "reasoning" in self.cut_parts else "")
                     + ", and a draft writes only while the reasoning runs.")
            return head + _pane([], empty)
        return head + _pane(_trimmed(self.drafts[which]), empty)

    def answer_html(self) -> str:
        if self.nothing_ran():
            return _pane([], self.nothing_ran())
        spans, shown = [], _trimmed(self.answer)
        for i, span in enumerate(shown):
            spans += self._step_badge("answer", i)
            spans.append(span)
        if self.phase == "stopped":
            return _pane(spans, "Stopped before the answer.")
        pane = _pane(spans, "The answer appears here." if self.thinking == "none" or self.thinking_off else
                     "The answer appears when the reasoning ends.")
        cut = self.cut_parts
        if "answer" in cut or "response" in cut:
            what = "Max answer" if "answer" in cut else "Max think + Max answer (RSD's budget)"
            return pane + (f'<div class="pane-note cut">⚠ cut at {esc(what)}: the model had not finished, so this answer '
                           'may be incomplete</div>')
        if "reasoning" in cut:
            return pane + ('<div class="pane-note cut">⚠ written after a reasoning cut at Max think: the model had not '
                           'finished thinking</div>')
        return pane

    @property
    def cut(self) -> str:
        """Which budget cut the run (``RunStats.cut``, ``engine.methods.budget.budget_cut``): from its
        final stats once it has them, else from the counts so far and :attr:`budgets`."""
        if self.stats is not None:
            return self.stats.cut or ""
        return budget_cut(len(self.reasoning), len(self.answer), *self.budgets) if self.budgets else ""

    @property
    def cut_parts(self) -> list[str]:
        """:attr:`cut` as its parts: "reasoning", "answer", "response" (none when nothing was cut)."""
        return cut_parts(self.cut)

    def cut_words(self) -> str:
        """The cut in words, for the strip and the panes ("" when the run ended by itself)."""
        words = {"reasoning": "the reasoning at Max think", "answer": "the answer at Max answer",
                 "response": "the response at Max think + Max answer (RSD's budget)"}
        return " and ".join(words.get(p, p) for p in self.cut_parts)

    @property
    def finished(self) -> bool:
        return self.phase in ("done", "stopped", "cancelled", "error", "ok")

    def saved_by(self) -> dict[str, int]:
        """Per proposer, the forwards it saved so far: the proposal tokens the main row's verifies
        accepted (each is one forward fewer than one-token decoding), from the forwards' own
        records; the ones that saved most first. A draft row's own lookups (reasoning lookups on)
        shorten that draft, not the run: its steps ride in the main row's forwards anyway."""
        saved: dict[str, int] = {}
        for fwd in self.forwards:
            for r in fwd.rows:
                if r.row == "main" and r.proposer and r.accepted:
                    saved[r.proposer] = saved.get(r.proposer, 0) + r.accepted
        return dict(sorted(saved.items(), key=lambda kv: -kv[1]))

    def counts(self) -> dict[str, int]:
        """The strip's counters, from the events so far (``engine.events.TokenTally``)."""
        s = self.tally.stats
        return {"accepted": s.accepted, "recovered": s.recovered, "lookups": s.lookup_prompt + s.lookup_reasoning
                + s.lookup_answer, "generated": s.generated, "rejected": s.rejected,
                "steps_kept": self.tally.steps_kept, "steps_rewritten": self.tally.steps_rewritten}


def _held(tokens: list[Tok]) -> tuple[int, ...]:
    """The ids of the tokens at the end of ``tokens`` that showed no text (their bytes wait for a
    later token to complete a character), oldest first."""
    held = []
    for tok in reversed(tokens):
        if tok.text:
            break
        held.append(tok.token_id)
    return tuple(reversed(held))


def _trimmed(tokens: list[Tok]) -> list[str]:
    """Spans of ``tokens`` without the blank lines a template puts before an answer (the tokens
    stay, with their colours and tooltips; only their leading whitespace is not shown)."""
    spans, leading = [], True
    for tok in tokens:
        if leading and not tok.text.strip():
            spans.append(tok.span(""))
            continue
        spans.append(tok.span(tok.text.lstrip()) if leading else tok.span())
        leading = False
    return spans


def _fork_mark(draft: int, at: int) -> str:
    """The Reasoning pane's mark where ``draft`` forked, after ``at`` reasoning tokens."""
    return f'<span class="fork" title="{esc(f"draft {draft} forked after {at} reasoning tokens")}">▼ draft {esc(draft)}</span>'


def _pane(spans: list[str], empty: str) -> str:
    body = "".join(spans) if spans else f'<span class="empty">{esc(empty)}</span>'
    return f'<div class="pane">{body}</div>'


LEGEND = (
    '<div class="legend">'
    '<span class="tok st-accepted">accepted</span> won by the draft prefix (the draft, verified) · '
    '<span class="tok st-recovered">suffix-recovered</span> won by a suffix of a draft, after a mismatch · '
    '<span class="tok st-recovered src-lookup">lookup</span> won by a match in the prompt, the reasoning or the '
    'answer itself, not by a draft (hover: which) · '
    '<span class="tok st-generated">generated</span> the model\'s own token · '
    '<span class="tok st-rejected">rejected</span> proposed, not taken · '
    '<span class="fork">▼</span> where a draft forked · RSD: <span class="step step-draft">draft 0.91</span> a draft '
    'step kept with its PRM score, <span class="step step-target">target</span> a step the target rewrote'
    "</div>"
)


# what a strip cell's name means, shown when the pointer rests on it
TERMS = {
    "thinking": "prompted: a chat model without an end-of-thinking token, asked by its template to reason between "
                "<think> and </think> (its reasoning ends where it writes </think>, however that text is split into "
                "tokens); none: a base model (no think marker, no chat template), whose whole output is the answer",
    "elapsed": "wall time of the run, compiling excluded",
    "first answer token": "time from the start of the run to its first answer token",
    "accepted": "answer tokens taken from a draft by prefix verification (share of the answer)",
    "recovered": "answer tokens taken after a mismatch by a suffix match in a draft (amber; share of the answer)",
    "lookups": "answer tokens taken from a match in the prompt, the reasoning or the answer itself (blue; share of "
               "the answer; hover: which). Accepted, recovered, lookups and generated count each answer token once, "
               "as its colour",
    "acceptance": "per proposer, over its verifies (vLLM's spec-decode figures): the acceptance rate (accepted / "
                  "proposed tokens) and the mean acceptance length (1 + accepted / verifies: the verifier's own token "
                  "included); hover: the counts",
    "repeating": "lookups won most of the answer: the model repeats what it read or wrote, so the speed-up is "
                 "prompt-lookup's, not the drafts'",
    "generated": "answer tokens the model picked itself",
    "rejected": "draft tokens proposed and never taken (struck through in the Draft pane)",
    "drafts added": "SSR's latency over the same comparison's run of SSR with its lookups alone (no drafts): "
                    "what forking, carrying and verifying the drafts bought or cost on this prompt",
    "forwards saved": "per proposer, the proposal tokens the main row's verifies accepted: each is one forward fewer than "
                      "decoding one token per forward (draft prefix and suffix in drafts: the drafts' work; a lookup: "
                      "a match in the prompt, the reasoning or the answer, which needs no draft)",
    "lookup misses": "tokens proposed from the prompt, the reasoning or the answer (context lookup) that "
                     "verification did not take",
    "KV cache": "memory of the run's preallocated key/value buffers: every row (main and drafts), every model, "
                "sized from the budgets",
    "steps": "compiled: fixed-shape steps through torch.compile, compiled before the run; eager: plain PyTorch "
             "(the value's tooltip says why)",
    "FLOPs": "2 x parameters x tokens processed, summed over every model the run used",
    "steps kept": "RSD: draft steps the PRM accepted",
    "steps rewritten": "RSD: draft steps the PRM rejected, which the target then wrote itself",
    "vs baseline": "this run's latency over its baseline's: in a Compare, the baseline run it made just before; "
                   "else the median of the logged baseline runs that match it on every setting that changes the "
                   "output or the speed, taken within 30 minutes of this run (else the newest alone), runs flagged slow left out",
    "rule": "RSD's acceptance rule as run, and where each number came from",
    "cut by budget": "a budget, not the model, ended this part: the reasoning reached Max think (the end of thinking "
                     "was forced) or the answer reached Max answer before the model ended it",
    "precision": "the dtype of each model the run used; on hover, how the target's was chosen (on the CPU: by "
                 "measured cost at load, docs/SSR.md Numerics)",
    "server speculation": "the server's own speculative method (declared with --server-speculation) and what its "
                          "per-request metrics reported; green answer tokens are the ones it accepted",
    "exit rule": "SSR early exit (lossy): when the drafts' answers agree, the reasoning stops and the answer verifies "
                 "the newest agreeing draft; each finished draft is a probe of the answer (its last \\boxed{}, else its "
                 "first code block, else its text)",
    "early exit": "where the reasoning was stopped: after this many of the model's own reasoning tokens (the forced "
                  "end of thinking follows); no exit: the rule never held before the reasoning ended, so the run was plain SSR",
    "agreed": "the drafts whose answers agreed, and on what (shortened)",
    "tokens saved": "reasoning tokens this run did not write, against the baseline it is compared with (a Compare's "
                    "own baseline run, else the median of the matching logged ones); without one, the reasoning "
                    "budget it left unused",
    "drafts' own": "answer forwards the drafts saved that the lookups in the prompt, the reasoning and the answer "
                   "would not have proposed at that step: what the drafts themselves earned",
    "drafting": "SSR's cost-aware drafting (Drafting: auto): it forks its drafts only where, in this model's recent "
                "runs, they saved more time than they cost riding in the reasoning's batch; otherwise it runs on its "
                "lookups alone and re-measures every few runs",
    "forks": "how the drafts held the reasoning they forked from: shared prefix (they read the main row's cache, "
             "holding only their own tokens), or a copy of it each (the reason is given: a sliding window, "
             "recurrent states, compiled steps, ...)",
    "reasoning lookups": "SSR's cost-aware lookup widths (Reasoning lookup > 0): each reasoning step verifies as "
                         "many lookup tokens as pay, from how often this run's lookups were accepted at each position "
                         "and what a forward of that many more tokens measured on this model",
    "verify": "where SSR's verifies ran: in the model's own steps, on a speculating server, or as client-side "
              "verify requests",
}
THINKING = {"prompted": "prompted (</think> as text)", "none": "none (a base model: all answer)"}


def metrics_html(view: TraceView, method: str, compare: dict | None = None) -> str:
    """The live metrics strip; ``compare`` (after a finished run) is
    ``ssr_ui.handlers.Studio.compare_to_baseline``'s: ``{"baselines": 0, ...}`` when no logged
    baseline matches the run's settings, else ``{"ratio", "identical", "baselines", "matched_on", ...}``.
    Its cells come in sections, in this order: :data:`STRIP_SECTIONS`, then the Compare's runs not run."""
    not_run = [(f"{name}: not run", reason) for name, reason in view.skipped.items() if name != method]
    if view.phase == "skipped":
        return _strip([("method", method), ("not run", view.skipped.get(method, "")),
                       *not_run], view.notice)
    items = [cell for section in STRIP_SECTIONS for cell in section(view, method, compare)]
    return _strip(items + not_run, view.notice)


def _run_cells(view: TraceView, method: str, compare: dict | None) -> list:
    """What ran and how fast: the method (lossy said), how it reasons, its phase, the budget that cut it,
    exact numerics, the time, the first answer token's time and the rate."""
    elapsed = view.stats.wall_s if view.stats else view.elapsed
    rate = (len(view.reasoning) + len(view.answer)) / elapsed if elapsed > 0 else 0.0
    phase = view.phase
    if view.phase == "compiling":
        shapes = f": {view.compiled_shapes[0]} of {view.compiled_shapes[1]} shapes" if view.compiled_shapes else ""
        phase = f"compiling steps for this device{shapes} (once per model and shape)"
    lossy = is_lossy(view.method)  # its output may differ from baseline's by design: never called exact
    items = [("method", f"{method} (lossy)" if lossy else method)]
    if view.thinking in THINKING:  # next to the method: how this model's reasoning is told apart
        items.append(("thinking", THINKING[view.thinking]))
    items.append(("phase", phase))
    if view.cut:
        items.append(("cut by budget", view.cut_words()))
    if view.exact:
        items.append(("numerics", ("exact forwards" if lossy else "exact")
                      + _route(view.stats.stepping() if view.stats else StepMode.of(""))))
    items.append(("elapsed", f"{elapsed:.2f} s"))
    if view.stats and view.stats.ttft_s is not None:
        items.append(("first answer token", f"{view.stats.ttft_s:.2f} s"))
    return [*items, ("tokens/s", f"{rate:.1f}")]


def _token_cells(view: TraceView, method: str, compare: dict | None) -> list:
    """The tokens: reasoning and answer, then one cell per colour (each answer token in one of them; a
    step writer keeps or rewrites whole steps and recovers none)."""
    c, answered = view.counts(), max(1, len(view.answer))
    items = [("reasoning", str(len(view.reasoning))), ("answer", str(len(view.answer))),
             ("accepted", f"{c['accepted']} ({c['accepted'] / answered:.0%})")]
    if not view.steps:
        items.append(("recovered", f"{c['recovered']} ({c['recovered'] / answered:.0%})"))
    if c["lookups"]:
        won = view.tally.stats.won()
        items.append(("lookups", Tipped(f"{c['lookups']} ({c['lookups'] / answered:.0%})", " · ".join(
            f"{who} {won[who]}" for who in (f"lookup in {src}" for src in LOOKUPS) if won[who]))))
    return [*items, ("generated", str(c["generated"])), ("rejected", str(c["rejected"]))]


def _where_cells(view: TraceView, method: str, compare: dict | None) -> list:
    """Where the forwards ran: the backend or the steps (compiled or eager), how verifies ran, a server's own
    speculation, the KV cache."""
    s, items = view.stats, []
    steps, verifies = (s.stepping(), s.verifying()) if s else (StepMode.of(""), Verify.of(""))
    if steps.backend:  # where the forwards ran, in full
        items.append(("backend", steps.text))
    elif steps.text:
        words = "compiled" + (f" (compiling took {s.compile_s:.1f} s before the run)" if s.compile_s
                              else "") if steps.compiled else "eager"
        items.append(("steps", Tipped(words, steps.text)))
    if verifies.one_token:  # the probe routed this model's verifies
        items.append(("verify", Tipped("one token per step", verifies.text)))
    elif verifies.remote:
        items.append(("verify", verifies.head))
    if s and s.server.speculation:
        figures = (f"{s.server.speculation}: {s.server.accepted} of {s.server.proposed} proposed tokens "
                   f"accepted in {s.server.steps} verify steps (colours reconstructed from its stream)")
        items.append(("server speculation", figures))
    if s and s.cache_mb:
        items.append(("KV cache", si(s.cache_mb * 2**20) + "B"))
    return items


def _work_cells(view: TraceView, method: str, compare: dict | None) -> list:
    """The work: steps kept and rewritten (a step writer), FLOPs, the acceptance rule, an early exit's
    cells, each model's precision."""
    c, s, items = view.counts(), view.stats, []
    if view.steps:
        items += [("steps kept", str(c["steps_kept"])), ("steps rewritten", str(c["steps_rewritten"]))]
    if s and s.flops:
        ratio = f" ({compare['flops_ratio']:.2f}x baseline)" if compare and compare.get("flops_ratio") else ""
        items.append(("FLOPs", si(s.flops) + ratio))
    if view.rule:
        items.append(("rule", view.rule))
    if view.method == EXIT or (s and s.exit.rule):
        items += _exit_items(view, compare)
    if view.dtypes:  # how the target's precision was chosen (measured at load, asked for, a device's default) on hover
        items.append(("precision", Tipped(view.dtypes, s.numerics) if s and s.numerics else view.dtypes))
    return items


def _proposer_cells(view: TraceView, method: str, compare: dict | None) -> list:
    """What the proposers did: lookups missed, forwards saved, acceptance per proposer (vLLM's figures: the
    rate and mean length in the cell, the counts on hover), repetition, what drafts did and were decided."""
    s, items = view.stats, []
    if s and s.rejected_lookup:
        items.append(("lookup misses", str(s.rejected_lookup)))
    if saved := view.saved_by():
        items.append(("forwards saved", " · ".join(f"{who} {n}" for who, n in saved.items())))
    if rates := s.by_proposer() if s else []:
        items.append(("acceptance", Tipped(" · ".join(
            f"{p.proposer} {p.acceptance_rate:.0%}, {p.per_verify()}" for p in rates),
            "; ".join(p.words() for p in rates))))
    if s and s.repetition():
        items.append(("repeating", s.repetition()))
    if s and s.drafts and view.phase in ("done", "ok", "imported"):
        n = s.draft_saved
        items.append(("drafts' own", f"{n} forward{'s' if n != 1 else ''} no lookup would have saved"))
    if s and s.drafting:
        items.append(("drafting", s.drafting))
    if s and s.drafts and s.forks:
        items.append(("forks", s.forks))
    if s and s.lookups:
        items.append(("reasoning lookups", s.lookups))
    return items


def _versus_cells(view: TraceView, method: str, compare: dict | None) -> list:
    """Against baseline: the latency ratio and what it was matched on (or why there is none), whether the
    output is the same, and, for SSR in a Compare, what its drafts added against its lookups alone."""
    items = []
    if compare is not None and not compare.get("baselines"):
        left = _left_out(compare.get("pool") or {})
        items.append(("vs baseline", "no baseline run with these settings yet: run Baseline with them" if not left
                      else f"no steady baseline run with these settings: {left}"))
    elif compare:
        items.append(("vs baseline", (f"{compare['ratio']:.2f}x latency{_pooled(compare)}: "
                                      f"{compare['matched_on']}")))
        if compare.get("agreement") is not None:
            a = compare["agreement"]
            items.append(("same as baseline", "✔ identical" if a.identical else f"✘ {a}"))
        elif compare.get("identical") is not None:
            items.append(("same answer", "✔" if compare["identical"] else "✘ differs"))
    elif view.phase in ("stopped", "error") and view.method not in ("", "baseline"):
        ended = "was stopped" if view.phase == "stopped" else "failed"
        items.append(("vs baseline", f"none: a run that {ended} is not compared"))
    if compare and compare.get("vs_lookups"):
        items.append(("drafts added", (f"{compare['vs_lookups']:.2f}x the latency of SSR's lookups alone (this "
                                       "comparison's own run: under 1, the drafts paid for themselves)")))
    return items


def _method_cells(view: TraceView, method: str, compare: dict | None) -> list:
    """The cells the run's method adds itself (``Method.cells``, from its finished run's stats), after every
    run's; a method's function that fails says so in a cell instead of breaking the strip."""
    mine = known(view.method)
    if mine is None or mine.cells is None or view.stats is None or view.phase not in ("done", "ok", "imported"):
        return []
    try:
        return [(str(key), str(words)) for key, words in mine.cells(view.stats)]
    except Exception as err:  # noqa: BLE001 (a method of one's own: its bug is shown, the strip still drawn)
        return [(f"{mine.label}'s cells", f"could not be drawn: {type(err).__name__}: {err}")]


STRIP_SECTIONS = (_run_cells, _token_cells, _where_cells, _work_cells, _proposer_cells, _method_cells, _versus_cells)


@dataclass(frozen=True)
class Tipped:
    """A strip value with a tooltip of its own (the value's details)."""

    text: str
    tip: str


def _strip(items: list[tuple[str, str | Tipped]], notice: str | None = None) -> str:
    """The strip's cells and a notice. Each cell is (key, value): plain text, or :class:`Tipped`
    text, both escaped here (a key in ``TERMS`` explains itself on hover)."""
    cells = "".join('<div class="metric"><div class="k"'
                    + (f' title="{esc(TERMS[k])}"' if k in TERMS else "") + f'>{esc(k)}</div><div class="v">'
                    + (f'<span title="{esc(v.tip)}">{esc(v.text)}</span>' if isinstance(v, Tipped) else esc(v))
                    + "</div></div>" for k, v in items)
    note = f'<div class="metrics-notice">⚠ {esc(notice)}</div>' if notice else ""
    return f'<div class="strip"><div class="metrics">{cells}</div>{note}</div>'


def _exit_items(view: TraceView, compare: dict | None) -> list[tuple[str, str]]:
    """An early-exit run's cells: its rule, where it exited (or that it never did), which drafts
    agreed on what, and the reasoning tokens it saved against its baseline (never a number made up:
    without a baseline, the budget it left, and how to see the saving)."""
    s = view.stats
    items = [("exit rule", s.exit.rule)] if s and s.exit.rule else []
    at = view.exit.at_token if view.exit is not None else s.exit.at if s is not None else None
    if at is not None:
        items.append(("early exit", f"exited at reasoning token {at}"))
        answer = s.exit.answer if s is not None else ""
        score = s.exit.score if s is not None else None
        items.append(("agreed", view.exit_words() + (f" on “{_short(answer, 40)}”" if answer else "")
                      + (f" (mean token probability {score:.2f})" if score is not None else "")))
    elif s is not None and view.phase in ("done", "ok", "imported"):
        why = s.exit.why if s.exit.why else (  # runs logged before the reason was kept
            f"the rule never held in {s.drafts} draft{'s' if s.drafts != 1 else ''} before the reasoning ended")
        items.append(("early exit", f"no exit: {why} — ran as SSR"))
    elif s is None and view.phase not in ("stopped", "error"):
        items.append(("early exit", "not yet: the drafts have not agreed"))
    if s is None or view.phase not in ("done", "ok", "imported"):
        return items
    mine = s.reasoning_tokens or len(view.reasoning)
    base = compare.get("base_reasoning") if compare else None
    if base:
        saved = base - mine
        items.append(("tokens saved", f"{saved:g} reasoning tokens ({mine} vs baseline's {base:g}: {mine / base:.0%})"
                      if saved > 0 else f"none: {mine} reasoning tokens, baseline's {base:g}"))
    elif view.budgets:
        left = view.budgets[0] - mine
        items.append(("tokens saved", (f"budget left: {left} of Max think {view.budgets[0]} (run Compare to see "
                                       "tokens saved against baseline)")))
    else:
        items.append(("tokens saved", "run Compare to see tokens saved"))
    return items


def _short(text: str, most: int) -> str:
    """``text`` on one line, at most ``most`` characters (an ellipsis says it was cut)."""
    line = " ".join(str(text).split())
    return line if len(line) <= most else line[: most - 1] + "…"


def _pooled(compare: dict) -> str:
    """How a ratio's baseline was made: a Compare's own pair, or the logged pool (how many runs,
    their spread and age, and what the pool left out: ``engine.runlog.compare.pool``)."""
    if compare.get("pair"):
        return ""
    p = compare.get("pool") or {}
    n = compare["baselines"]
    spread = f", {p['spread'][0]:.2f}-{p['spread'][1]:.2f} s" if n > 1 and p.get("spread") else ""
    ages = p.get("ages")
    age = (f", {_age(ages[0])}" if n == 1 or _age(ages[0]) == _age(ages[1]) else f", {_age(ages[0])} to {_age(ages[1])}"
           ) if ages else ""
    left = _left_out(p)
    which = f" (median of {n} baseline runs{spread}{age})" if n > 1 else f" (1 baseline run{age})"
    return which + (f"; {left}" if left else "")


def _left_out(pool: dict) -> str:
    """What a pooled baseline left out, in words ("" when nothing)."""
    parts = [f"{pool[k]} {why}" for k, why in (("left_slow", "flagged slow"), ("left_old", "more than 30 min from this run"))
             if pool.get(k)]
    return f"left out {' and '.join(parts)}" if parts else ""


def _age(seconds: float) -> str:
    """A baseline's age against the run, in words: "40 s old", "12 min old", or "3 h newer" (a
    replayed run pooled with baselines made after it)."""
    when = "old" if seconds >= 0 else "newer"
    seconds = abs(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} {when}"
    return f"{seconds:.0f} s {when}"


def si(x: float) -> str:
    """A number with an SI prefix and three significant digits: 2.03 G, 964 M, 12.5 k."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}"
    return f"{x:.3g}"


def prompt_html(prompt: str) -> str:
    return f'<div class="prompt-box"><b>Prompt</b> {esc(prompt)}</div>' if prompt else ""


def html_note(message: str) -> str:
    """A status line for the metrics strip (loading, waiting)."""
    return f'<div class="metrics status">{esc(message)}</div>'


def error_html(message: str) -> str:
    return f'<div class="metrics error">⚠ {esc(message)}</div>'


def _route(steps: StepMode) -> str:
    """Exact mode's route, in the numerics cell: " (fixed 8x32)", " (per row)"."""
    return f" ({steps.route})" if steps.route else ""
