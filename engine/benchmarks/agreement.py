"""How far two greedy runs of one prompt agree, read the way numerics should be read.

Outside exact mode a batched or multi-token forward may round differently from a one-token one,
so a greedy speculative run can leave plain decoding's path at a near-tie. :func:`agreement` says
"identical", or how the two token streams (reasoning, then answer) part, and tells a numeric
divergence from a budget or length difference:

* ``numeric``: a token differs where both runs decoded freely: the top-2 logit margin the model
  gives at that point of plain decoding's path says what it is (a few thousandths is rounding, which
  exact mode removes; a large margin is a bug);
* ``budget``: they differ where one run's budget forced the end of thinking (the marker's tokens,
  at ``max_think``) and the other's model wrote on: no margin means anything there;
* ``length``: one run's tokens are the other's with more after them (a run stopped at a budget, or
  ended its sequence, where the other did not).

>>> str(agreement(lm, prompt, baseline_ids, ssr_ids))
'diverged at token 17 (top-2 logit margin 0.0021)'
>>> str(agreement(lm, prompt, baseline_ids, hf_ids, name="hf"))
'hf wrote 96 tokens, baseline 48, the same up to there: a budget or length difference, not a numeric one'
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.methods.seams import StepModel
from engine.runtime.markers import ThinkMarkers

KINDS = ("identical", "numeric", "budget", "length")


@dataclass(frozen=True)
class Agreement:
    """How a run's tokens (``name``'s) part from plain decoding's (``baseline``'s)."""

    kind: str  # one of KINDS
    at: int | None = None  # where they part: the first differing token, or the end of the shorter run
    margin: float | None = None  # numeric only: top-1 minus top-2 logit at ``at``, on plain decoding's path
    lengths: tuple[int, int] = (0, 0)  # (the run's tokens, baseline's), reasoning and answer together
    forced_by: str | None = None  # budget only: whose budget forced the end of thinking at ``at``
    name: str = "this run"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"agreement kind {self.kind!r} is not one of {', '.join(KINDS)}")

    @property
    def identical(self) -> bool:
        return self.kind == "identical"

    @property
    def diverged_at(self) -> int | None:
        """The first differing token of a numeric divergence; None for any other kind."""
        return self.at if self.kind == "numeric" else None

    def __str__(self) -> str:
        if self.kind == "identical":
            return "identical"
        if self.kind == "numeric" and self.margin is None:
            return f"diverged at token {self.at} (its top-2 logit margin is measured where the model is loaded)"
        if self.kind == "numeric":
            return f"diverged at token {self.at} (top-2 logit margin {self.margin:.3g})"
        if self.kind == "budget":
            wrote_on = "baseline" if self.forced_by == self.name else self.name
            return (f"{self.forced_by}'s budget forced the end of thinking at token {self.at}, where {wrote_on}'s model "
                    "wrote on (the same tokens before it): a budget difference, not a numeric one")
        ours, base = self.lengths
        return (f"{self.name} wrote {ours} tokens, baseline {base}, the same up to there: a budget or length difference, "
                "not a numeric one")


def agreement(lm: StepModel | None, prompt: str, base_ids: list[int], other_ids: list[int],
              max_think: int | None = None, name: str = "this run") -> Agreement:
    """Compare ``other_ids`` (``name``'s run) with plain decoding's ``base_ids`` (both reasoning +
    answer). With the runs' ``max_think``, a difference inside a budget-forced marker is told apart.
    ``lm`` None (a past run whose model is not loaded): the token-level verdict alone, a numeric
    divergence without its margin."""
    lengths = (len(other_ids), len(base_ids))
    n = next((i for i, (a, b) in enumerate(zip(base_ids, other_ids, strict=False)) if a != b), None)  # lengths may differ
    if n is None:
        if lengths[0] == lengths[1]:
            return Agreement("identical", lengths=lengths, name=name)
        return Agreement("length", min(lengths), lengths=lengths, name=name)
    if lm is None:
        return Agreement("numeric", n, lengths=lengths, name=name)
    for ids, who in ((base_ids, "baseline"), (other_ids, name)):
        if forced_marker(lm.markers, ids, max_think, n):
            return Agreement("budget", n, lengths=lengths, forced_by=who, name=name)
    prefix = lm.prompt_ids(prompt) + base_ids[:n]
    logits = lm.step_logits(prefix, lm.new_cache(len(prefix)), 0, last_only=True)[-1].float()  # [V]
    top = torch.topk(logits, 2).values
    return Agreement("numeric", n, float(top[0] - top[1]), lengths, name=name)


def forced_marker(markers: ThinkMarkers | None, ids: list[int], max_think: int | None, i: int) -> bool:
    """Whether token ``i`` of a run's ``ids`` (reasoning, then answer) is one of the end-of-thinking
    marker's tokens its budget forced: the reasoning closes at its ``max_think``-th token, with the
    marker's own tokens (a model closes by itself within ``max_think`` less the marker's length)."""
    if markers is None or max_think is None:
        return False
    k = len(markers.marker_ids)
    return (max_think - k <= i < max_think and tuple(ids[max_think - k : max_think]) == markers.marker_ids
            and markers.reasoning_end(ids[:max_think]) == max_think)
