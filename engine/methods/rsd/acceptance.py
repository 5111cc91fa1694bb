"""RSD's acceptance rules as pure functions of a step's reward.

Liao et al., "Reward-Guided Speculative Decoding for Efficient LLM Reasoning" (arXiv 2501.19324),
Section 3: a draft step with reward ``r`` is kept with probability ``w(r)``. The paper shows the
optimal rule is a binary threshold, ``w(r) = 1[r >= delta]`` (delta = 0.7 in the released code);
it also defines soft weightings, implemented here as seeded stochastic acceptance:

* constant: ``w(r) = p``
* clipping: ``w(r) = min(1, max(0, r))``
* sigmoidal: ``w(r) = max(0, r / (1 + r))``
* logistic: ``w(r) = 1 / (1 + exp(-a (r - delta)))``

>>> weight("binary", 0.8, threshold=0.7), weight("clipping", 1.4)
(1.0, 1.0)
"""

from __future__ import annotations

import math

from engine.config import WEIGHTINGS


def weight(weighting: str, reward: float, threshold: float = 0.7, param: float = 1.0) -> float:
    """Probability of keeping a draft step with this ``reward``."""
    if weighting == "binary":
        return 1.0 if reward >= threshold else 0.0
    if weighting == "constant":
        return param
    if weighting == "clipping":
        return min(1.0, max(0.0, reward))
    if weighting == "sigmoidal":
        return max(0.0, reward / (1.0 + reward)) if reward > -1 else 0.0
    if weighting == "logistic":
        return 1.0 / (1.0 + math.exp(-param * (reward - threshold)))
    raise ValueError(f"weighting={weighting!r} is not one of {', '.join(WEIGHTINGS)}")


def accept(weighting: str, reward: float, uniform: float, threshold: float = 0.7, param: float = 1.0) -> bool:
    """Keep the step iff ``uniform`` (a U[0, 1) draw) falls below its weight; the binary rule is
    deterministic whatever the draw."""
    return uniform < weight(weighting, reward, threshold, param)
