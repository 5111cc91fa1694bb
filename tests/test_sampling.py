"""Sampling exactness: the verifier preserves the target distribution, a broken rule does not.

How the broken rule is caught: ``_always_accept`` accepts every proposed token (the classic bug of
skipping the ``min(1, p/q)`` test); the same chi-square test that passes for the real rule must
reject it, so the test has power, not just a pass.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from engine.methods import sampling
from engine.methods.sampling import target_probs, verify_sampled


def _counts(draws: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(draws), minlength=vocab).double()


def _pvalue(observed: torch.Tensor, probs: torch.Tensor) -> float:
    keep = probs > 0
    expected = probs[keep] * observed.sum()
    return float(chisquare(observed[keep].numpy(), expected.numpy()).pvalue)


P = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05], dtype=torch.float64)
Q = torch.tensor([0.1, 0.5, 0.1, 0.2, 0.1], dtype=torch.float64)


def _first_token(verify, draft_probs, n=20000, seed=0):
    """Distribution of the first output token when the proposal x ~ q (or a fixed token)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        if draft_probs is None:
            x = 1  # a deterministic proposal (suffix / lookup)
            q = None
        else:
            x = int(torch.multinomial(draft_probs, 1, generator=g))
            q = draft_probs[None]
        accepted, nxt = verify(torch.stack([P, P]), [x], q, g)
        out.append(x if accepted else nxt)
    return _counts(out, len(P))


def _always_accept(target, tokens, q, g):
    return len(tokens), sampling.sample(target[len(tokens)], g)


@pytest.mark.parametrize("draft_probs", [Q, None], ids=["sampled-draft", "deterministic-draft"])
def test_verifier_preserves_target_distribution(draft_probs):
    assert _pvalue(_first_token(verify_sampled, draft_probs), P) > 1e-3


@pytest.mark.parametrize("draft_probs", [Q, None], ids=["sampled-draft", "deterministic-draft"])
def test_broken_rule_is_detected(draft_probs):
    assert _pvalue(_first_token(_always_accept, draft_probs), P) < 1e-6


def test_top_p_keeps_the_nucleus():
    probs = target_probs(torch.log(P)[None], temperature=1.0, top_p=0.65)[0].double()
    # 0.5 alone is short of 0.65, so 0.2 joins; then 0.7 >= 0.65 and the rest is cut.
    assert torch.allclose(probs, torch.tensor([0.5, 0.2, 0.0, 0.0, 0.0], dtype=torch.float64) / 0.7)


# ----------------------------------------------------------------------------- end to end
