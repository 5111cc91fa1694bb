"""Early exit on SSR's loop: the budget hook (``engine.methods.ssr.loop.SSRBudget``) that ends the
reasoning when the drafts agree (:class:`ExitBudget`), and the method (:func:`decode_exit`).

SSR's loop is unchanged: it asks the budget, every reasoning step, whether the reasoning is spent;
this budget also says yes once :class:`~engine.methods.exit.rule.ExitRule` finds ``exit_k``
consecutive finished drafts agreeing. The end of thinking is then forced as at ``max_think``, and
SSR's answer phase verifies the newest agreeing draft (:meth:`ExitBudget.lead`) against the model,
so the answer is still the model's own continuation of its shortened reasoning. Lossy: the
reasoning (and so possibly the answer) differs from plain decoding's whenever it exits.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from functools import partial

import torch

from engine.config import RunConfig
from engine.events import Event, PhaseEvent
from engine.methods.contract import Method
from engine.methods.exit.rule import Exit, ExitRule, Probe, answer_key
from engine.methods.recorder import Recorder
from engine.methods.seams import StepModel
from engine.methods.ssr.evidence import Evidence
from engine.methods.ssr.loop import SSRBudget, SSRState, decode_ssr
from engine.methods.ssr.proposers import Draft

NAME = "ssr-exit"


class ExitBudget(SSRBudget):
    def __init__(self, markers, cfg: RunConfig, state: SSRState) -> None:
        super().__init__(markers, cfg, state)
        self.state = state
        self.rule = ExitRule(cfg.exit_k, cfg.exit_min_think, cfg.exit_confidence)
        self.planned = cfg.num_drafts
        self.thought = 0  # reasoning tokens at the last check
        self.exit: Exit | None = None
        self._probs: dict[int, list[torch.Tensor]] = {}  # per draft, each token's probability (on the device)
        self._probes: dict[int, Probe] = {}  # the finished drafts, judged once
        state.rec.stats.exit.rule = self.rule.describe(cfg.draft_interval)

    def drafted(self, draft: Draft, token: int, logits: torch.Tensor) -> None:
        if self.rule.confidence > 0:  # read back once, when the draft is judged (no device sync per token)
            self._probs.setdefault(draft.index, []).append(torch.softmax(logits.float(), -1)[token])

    def spent(self, thought: int) -> bool:
        if super().spent(thought):
            return True
        self.thought = thought
        if self.exit is None:
            self.exit = self.rule.check(self._finished(), thought)
        return self.exit is not None

    def lead(self, drafts: list[Draft]) -> Draft | None:
        if self.exit is not None:
            return next(d for d in drafts if d.index == self.exit.drafts[-1])
        return super().lead(drafts)

    def open_answer(self, rec: Recorder) -> Iterator[Event]:
        if self.exit is not None:
            s = rec.stats
            s.exit.at, s.exit.drafts = self.exit.at, ",".join(map(str, self.exit.drafts))
            s.exit.answer, s.exit.score = self.exit.key.partition(":")[2][:200], self.exit.confidence
            yield PhaseEvent("exit", rec.now(), self.exit.drafts[-1], self.exit.at)
        else:
            rec.stats.exit.why = self.why_not()
        yield from super().open_answer(rec)

    def why_not(self) -> str:
        """Why the rule never held, with the counts (``RunStats.exit.why``): drafts that never forked,
        drafts still writing when the reasoning ended (only finished drafts count), drafts cut short or
        with no answer, and what the finished ones said against what the rule needs."""
        drafts, probes = self.state.drafts, sorted(self._finished(), key=lambda p: p.index)
        k, parts = self.rule.k, []
        if self.thought < self.rule.min_think:
            parts.append(f"the reasoning ended at {self.thought} tokens, before the rule's floor of "
                         f"{self.rule.min_think}")
        if len(drafts) < self.planned:
            parts.append(f"{len(drafts)} of {self.planned} drafts forked before the reasoning ended")
        running = sum(not d.finished for d in drafts)
        if running:
            parts.append(f"{running} of {len(drafts)} still writing when the reasoning ended (only finished drafts "
                         "count)")
        cut = sum(d.finished and d.end is None for d in drafts)
        if cut:
            parts.append(f"{cut} cut short before an answer ended")
        blank = sum(p.key is None for p in probes)
        if blank:
            parts.append(f"{blank} finished with no answer in them")
        answered = [p for p in probes if p.key is not None]
        if len(answered) < k:
            parts.append(f"{len(answered)} finished with an answer: too few, the rule needs {k} in a row")
        else:
            streak, best = 1, 1
            for a, b in itertools.pairwise(answered):
                streak = streak + 1 if b.index == a.index + 1 and b.key == a.key else 1
                best = max(best, streak)
            distinct = len({p.key for p in answered})
            said = f"{len(answered)} finished with {distinct} different answer{'s' if distinct != 1 else ''}"
            if best < k:
                parts.append(f"{said}: at most {best} in a row agree, the rule needs {k}")
            else:
                parts.append(f"{said}: {k} in a row agreed, but their mean token probability stayed below "
                             f"{self.rule.confidence:g}")
        return "; ".join(parts)

    def _finished(self) -> list[Probe]:
        """The drafts that ended by themselves (their end of sequence), each judged once. A draft
        cut short (``max_draft``, longrope's switch point) wrote no whole answer: it is no probe."""
        tokenizer = self.state.rec.tokenizer
        for d in self.state.drafts:
            if d.finished and d.end is not None and d.index not in self._probes:
                probs = self._probs.get(d.index)
                self._probes[d.index] = Probe(d.index, answer_key(tokenizer.decode(d.tokens, skip_special_tokens=True)),
                                              float(torch.stack(probs).mean()) if probs else None)
        return list(self._probes.values())


def decode_exit(lm: StepModel, prompt: str, cfg: RunConfig, evidence: Evidence | None = None) -> Iterator[Event]:
    """Yield the events of an ``ssr-exit`` run: SSR's loop with :class:`ExitBudget` (``evidence``: as
    ``decode_ssr`` takes it)."""
    return decode_ssr(lm, prompt, cfg, method=NAME, budget_class=ExitBudget, evidence=evidence)


METHOD = Method(NAME, "SSR early exit", "SSR that stops reasoning once its finished drafts agree on the answer (lossy by "
                "design: the answer is the model's own, after a shorter reasoning)",
                start=lambda m: partial(decode_exit, m.target, evidence=m.evidence), exact=False, drafts=True, ssr_loop=True,
                server="over a server the drafts are requests of their own that finish when the server schedules them, "
                       "so where the reasoning stopped would depend on the server's timing, not on the tokens; "
                       "ssr-exit runs in process",
                thinking_off="ends a reasoning early, and with thinking off there is none",
                studio=("run", "compare", "benchmark"), color="#dc2626")  # (the timeline's exit line and badge too)
