"""How far two greedy runs of one prompt agree, read the way numerics should be read.

Outside exact mode a batched or multi-token forward may round differently from a one-token one,
so a greedy speculative run can leave plain decoding's path at a near-tie. :func:`agreement` says
"identical", or where the two token streams (reasoning, then answer) first differ and the top-2
logit margin the model gives at that point of plain decoding's path: a margin of a few
thousandths is rounding (exact mode removes it); a large margin is a bug.

>>> str(agreement(lm, prompt, baseline_ids, ssr_ids))
'diverged at token 17 (top-2 logit margin 0.0021)'
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.runtime.model import LoadedModel


@dataclass(frozen=True)
class Agreement:
    diverged_at: int | None  # first differing token (reasoning then answer); None: identical
    margin: float | None  # top-1 minus top-2 logit there, on plain decoding's prefix

    @property
    def identical(self) -> bool:
        return self.diverged_at is None

    def __str__(self) -> str:
        if self.identical:
            return "identical"
        return f"diverged at token {self.diverged_at} (top-2 logit margin {self.margin:.3g})"


def agreement(lm: LoadedModel, prompt: str, base_ids: list[int], other_ids: list[int]) -> Agreement:
    """Compare ``other_ids`` with plain decoding's ``base_ids`` (both reasoning + answer)."""
    n = next((i for i, (a, b) in enumerate(zip(base_ids, other_ids, strict=False)) if a != b),  # lengths may differ
             min(len(base_ids), len(other_ids)))
    if n == len(base_ids) == len(other_ids):
        return Agreement(None, None)
    prefix = lm.prompt_ids(prompt) + base_ids[:n]
    logits = lm.step_logits(prefix, lm.new_cache(), 0)[-1].float()  # [V]
    top = torch.topk(logits, 2).values
    return Agreement(n, float(top[0] - top[1]))
