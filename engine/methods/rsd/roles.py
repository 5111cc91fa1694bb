"""What tells RSD's three step-wise methods apart, as objects the loop reads instead of a method name.

* ``rsd``: the draft writes each step, a PRM judges it, the target rewrites a rejected step.
* ``target``: the target writes every step (the quality the paper compares against).
* ``draft``: the draft writes every step (the speed floor).

:data:`PLANS` says it as data (who writes first, whether a judge reads the step); :func:`cast`
turns a plan into the run's :class:`Roles`: the :class:`Author` of each step, its :class:`Judge`
and who rewrites what the judge rejects.

>>> PLANS["rsd"].models, PLANS["target"].models
(('draft', 'target'), ('target',))
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

from engine.config import RunConfig
from engine.methods.rsd.acceptance import accept
from engine.methods.rsd.prm import StepScorer, TargetLikelihoodScorer
from engine.methods.rsd.writer import Step, StepWriter


@dataclass(frozen=True)
class Plan:
    """One method's shape, fixed before any model is touched."""

    writer: str  # who writes each step first: "draft" or "target"
    judged: bool  # a PRM judges each written step, and the target rewrites a rejected one

    @property
    def models(self) -> tuple[str, ...]:
        """The models the method runs, in the order they are set up (the draft first, if it writes)."""
        return ("draft", "target") if self.writer == "draft" else ("target",)


PLANS = {"rsd": Plan("draft", judged=True), "target": Plan("target", judged=False), "draft": Plan("draft", judged=False)}
RSD_METHODS = tuple(PLANS)


@dataclass(frozen=True)
class Verdict:
    """A judge's word on a written step."""

    reward: float | None = None  # the PRM's score; None: nobody scored the step
    kept: bool | None = None  # None: not judged, kept as written


UNJUDGED = Verdict()


@dataclass(frozen=True)
class Author:
    """A model writing steps in one role, and how its kept steps are recorded."""

    source: str  # "draft" or "target": the StepEvent's source
    writer: StepWriter
    status: str  # its kept tokens' status: "accepted" (a judged draft step, taken) or "generated"
    shows_confidence: bool  # its StepEvents carry the writer's confidence (the draft's doubt)


class Judge(Protocol):
    """Decides whether a written step stays; sees every step that joins the text."""

    rewards: dict[bool, list[float]]  # the rewards of the steps kept (True) and rejected (False)
    scorer: StepScorer | None

    def decide(self, step: Step, text: str, seq: list[int]) -> Verdict: ...

    def commit(self, text: str) -> None: ...


@dataclass
class NoJudge:
    """``target`` and ``draft``: every step is kept as written, and nothing is scored."""

    rewards: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})
    scorer: StepScorer | None = None

    def decide(self, step: Step, text: str, seq: list[int]) -> Verdict:
        return UNJUDGED

    def commit(self, text: str) -> None:
        pass


class RewardJudge:
    """``rsd``: the PRM scores the draft's step; it stays iff the acceptance rule keeps its reward
    (Liao et al., Section 3) and the draft's least likely pick has at least ``cfg.draft_confidence``
    (beyond the paper: the draft's own doubt; 0 turns it off)."""

    def __init__(self, scorer: StepScorer, cfg: RunConfig) -> None:
        self.scorer, self.cfg = scorer, cfg
        self.coin = random.Random(cfg.seed)  # the soft rules' acceptance draws
        self.rewards: dict[bool, list[float]] = {True: [], False: []}

    def decide(self, step: Step, text: str, seq: list[int]) -> Verdict:
        cfg = self.cfg
        reward = self.scorer.score(text, seq, step.tokens)
        # the draw is taken for every step, whatever the doubt says, so the seeded draws do not shift
        kept = accept(cfg.weighting, reward, self.coin.random(), cfg.threshold, cfg.weight_param)
        kept = kept and step.confidence >= cfg.draft_confidence
        self.rewards[kept].append(reward)
        return Verdict(reward, kept)

    def commit(self, text: str) -> None:
        self.scorer.commit(text)  # by whoever wrote it: the PRM's input is the shared text


@dataclass(frozen=True)
class Roles:
    """A run's cast: who writes first, who judges, who rewrites a rejected step."""

    author: Author
    judge: Judge
    rewriter: Author | None  # None where nothing is ever rejected


def cast(plan: Plan, writers: dict[str, StepWriter], scorer, cfg: RunConfig, question: str) -> Roles:
    """The roles ``plan`` needs, over ``writers`` (one per model in ``plan.models``). ``scorer``: a
    :class:`StepScorer`, or "target-likelihood" (resolved here: it reads the target's writer);
    started on ``question``. ValueError for a judged plan without a scorer."""
    first = Author(plan.writer, writers[plan.writer], "accepted" if plan.judged else "generated",
                   shows_confidence=plan.writer == "draft")
    if not plan.judged:
        return Roles(first, NoJudge(), None)
    if scorer is None:
        raise ValueError("method 'rsd' needs a process reward model (or the 'target-likelihood' scorer)")
    if scorer == "target-likelihood":
        scorer = TargetLikelihoodScorer(writers["target"])
    scorer.start(question)
    target = Author("target", writers["target"], "generated", shows_confidence=False)
    return Roles(first, RewardJudge(scorer, cfg), target)
