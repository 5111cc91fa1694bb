"""Token choice and speculative verification as pure tensor functions.

Verification follows Leviathan et al. / Chen et al. speculative sampling: a proposed token ``x``
with draft probability ``q(x)`` is accepted with probability ``min(1, p(x) / q(x))``; on rejection
the token is resampled from ``norm(max(0, p - q))``. Deviation from the SSR paper (flagged): the
paper's suffix stage is exact only under greedy decoding; here a suffix or lookup proposal is a
deterministic draft (``q`` one-hot), for which the same rule reads "accept with probability
``p(x)``, otherwise sample from ``p`` with ``x`` removed", which keeps every stage lossless.
"""

from __future__ import annotations

import torch


def target_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Sampling distribution(s) from logits ``[..., V]`` (temperature, then nucleus filtering)."""
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # [..., V]
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p >= top_p  # mass before this token already >= top_p
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from ``probs`` ``[V]``."""
    return int(torch.multinomial(probs, 1, generator=generator))


def verify_greedy(target_logits: torch.Tensor, draft_tokens: list[int]) -> tuple[int, int]:
    """Greedy verification. ``target_logits`` ``[k + 1, V]`` predict the draft's k tokens and one
    more. Returns (accepted count n, the target's own token at position n)."""
    return accept_greedy(target_logits.argmax(-1).tolist(), draft_tokens)


def accept_greedy(picks: list[int], draft_tokens: list[int]) -> tuple[int, int]:
    """Greedy acceptance from the verifier's own picks ``[k + 1]`` (its token at each draft
    position, then one more): (accepted count n, its token at position n)."""
    n = 0
    while n < len(draft_tokens) and draft_tokens[n] == picks[n]:
        n += 1
    return n, picks[n]


def verify_sampled(
    target_probs_: torch.Tensor,
    draft_tokens: list[int],
    draft_probs: torch.Tensor | None,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Speculative-sampling verification.

    ``target_probs_`` ``[k + 1, V]``; ``draft_probs`` ``[k, V]`` are the distributions the draft
    tokens were sampled from, or None for a deterministic proposal (one-hot ``q``). Returns
    (accepted count n, next token): the residual sample after a rejection, else the bonus sample.
    """
    for i, x in enumerate(draft_tokens):
        p = target_probs_[i]  # [V]
        q_x = 1.0 if draft_probs is None else float(draft_probs[i, x])
        u = float(torch.rand((), generator=generator))
        if q_x > 0 and u < min(1.0, float(p[x]) / q_x):
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[x] = 0.0
        else:
            residual = (p - draft_probs[i]).clamp_min(0.0)
        total = float(residual.sum())
        if total <= 0:  # p == q on the support: any rejection is impossible in exact arithmetic
            residual, total = p, float(p.sum())
        return i, sample(residual / total, generator)
    return len(draft_tokens), sample(target_probs_[len(draft_tokens)], generator)


class Chooser:
    """Picks the next token under one run's settings (greedy, or seeded sampling)."""

    def __init__(self, temperature: float, top_p: float, seed: int) -> None:
        self.temperature, self.top_p = temperature, top_p
        self.generator = torch.Generator(device="cpu").manual_seed(seed)  # draws on the CPU, whatever the device

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        return target_probs(logits.cpu(), self.temperature, self.top_p)

    def pick(self, logits: torch.Tensor) -> int:
        """The next token from logits ``[V]``."""
        if self.greedy:
            return int(logits.argmax())
        return sample(self.probs(logits), self.generator)

    def verify(self, logits: torch.Tensor, proposal: list[int], draft_probs: torch.Tensor | None) -> tuple[int, int]:
        """Accepted count and next token for ``proposal`` given target logits ``[k + 1, V]``."""
        if self.greedy:
            return verify_greedy(logits, proposal)
        return verify_sampled(self.probs(logits), proposal, draft_probs, self.generator)
