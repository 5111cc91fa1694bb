"""Tolerances for the tests' numeric comparisons, derived from the dtype and the size of the numbers.

Two correct ways to compute the same logits (our static cache and transformers' DynamicCache, a
fixed-shape cache and an eager one, a rolled-back cache and a fresh one) differ by rounding alone:
each floating-point step is off by up to half an ulp, and CPU kernels (``ATEN_CPU_CAPABILITY``,
the thread count, the shapes) order their sums differently. So a tolerance is

    depth x eps(dtype) x scale

``eps``: ``torch.finfo(dtype).eps``; ``scale``: the size of the numbers compared (the largest
``|logit|``, at least 1: norms keep hidden states near 1 even where the logits are small);
``depth``: how many rounding errors can pile up along the computation (:func:`forward_depth` for a
forward pass). Where a float64 copy of the model is at hand, a float32 path is also held to a
small multiple of transformers' own float32 path's distance from it (:func:`gap_to_reference`).

A bug (a position off by one, a lost or doubled cache slot, a rollback one token too far) moves
logits by 1e-3 to 1, thousands of times these bounds; each test's companion injects one and
checks that the same bound catches it (:func:`expect` with ``bug``).

>>> g = gap(ours, theirs, lm)  # float64 tiny model: bound ~3e-13
>>> expect(g)                  # within the bound
>>> expect(gap(buggy, theirs, lm), bug="rolled back one token too far")  # beyond it, MARGIN times over
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import pytest
import torch

from engine.runtime.model import LoadedModel

# Sequential rounding steps of one decoder layer: two norms, q/k/v/o, scores, softmax, the weighted
# sum, two or three MLP matmuls, two residual adds.
ROUNDINGS_PER_LAYER = 10
# A float32 path of ours may be this many times further from the float64 reference than transformers'
# own float32 path: both are float32 evaluations of one function whose roundings differ in order only;
# the largest error over hundreds of logits varies by well under 2x between such paths (measured <= 1.2x).
SLACK = 4
# A bug must exceed the bound a correct run meets by at least this much, or the check has no teeth.
MARGIN = 10


def eps(dtype: torch.dtype) -> float:
    """The gap between 1 and the next float of ``dtype`` (2^-52 for float64, 2^-23 for float32)."""
    return torch.finfo(dtype).eps


def scale(reference) -> float:
    """The size the roundings are relative to: the largest ``|value|`` of ``reference``, at least 1."""
    peak = float(reference.abs().max()) if isinstance(reference, torch.Tensor) else abs(float(reference))
    return max(1.0, peak)


def forward_depth(config) -> int:
    """Rounding errors that can pile up along a forward pass, in units of eps of its largest logit:
    Higham's worst case for an n-term dot product is n eps of its terms (Accuracy and Stability of
    Numerical Algorithms, 3.1), taken for the widest reduction (hidden or MLP size) at every one of
    ``ROUNDINGS_PER_LAYER`` steps of every layer. E.g. the tiny gemma-4: 6 x 10 x 64 = 3840 (its
    float32 forward was measured <= 1.2e3 eps x scale off its float64 copy, the other families <= 60)."""
    width = max(config.hidden_size, getattr(config, "intermediate_size", 0) or 0)
    return config.num_hidden_layers * ROUNDINGS_PER_LAYER * width


def softmax_depth(n: int) -> int:
    """Roundings of a softmax over ``n`` logits (itself, not the forward before it): the logits
    rounded to its dtype and shifted by their max (2, at the logits' scale), the exp, the n-term sum
    (n - 1) and the division: n + 5 at the logits' scale covers them.

    >>> softmax_depth(2)  # a PRM's two-way softmax over its "+" and "-" logits: 7
    """
    return n + 5


def tolerance(dtype: torch.dtype, reference, depth: int) -> float:
    """The most two correct evaluations of one computation in ``dtype`` may differ by: ``depth``
    roundings of ``eps(dtype)`` on numbers of ``scale(reference)``, plus one ulp of the result's own
    dtype where that is coarser (a float64 model that returns float32 logits, as nemotron-h does).

    >>> tolerance(torch.float64, logits, 1280)  # llama-sized, |logits| <= 1: 1280 x 2.2e-16 = 2.8e-13
    """
    bound = depth * eps(dtype) * scale(reference)
    if isinstance(reference, torch.Tensor) and reference.is_floating_point() and eps(reference.dtype) > eps(dtype):
        bound += eps(reference.dtype) * scale(reference)
    return bound


def distance(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest ``|a - b|``, taken in float64 (so the subtraction itself does not round)."""
    assert a.shape == b.shape, f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"
    return float((a.double() - b.double()).abs().max())


@dataclass(frozen=True)
class Gap:
    """A measured difference and the bound a correct computation keeps it under."""

    error: float
    bound: float
    why: str  # where the bound comes from, for the failure message

    @property
    def ratio(self) -> float:
        return self.error / self.bound

    def __str__(self) -> str:
        return f"{self.error:.3g} against a bound of {self.bound:.3g} ({self.why})"


def gap(actual: torch.Tensor, expected: torch.Tensor, lm: LoadedModel) -> Gap:
    """How far ``actual`` is from ``expected``, two ways of computing the same logits with ``lm``'s
    model, against :func:`tolerance` for its dtype, their scale and its :func:`forward_depth`."""
    dtype, depth = lm.model.dtype, forward_depth(lm.model.config)
    return Gap(distance(actual, expected), tolerance(dtype, expected, depth),
               f"{depth} x eps({str(dtype)[6:]}) x scale {scale(expected):.3g}")


def gap_to_reference(ours: torch.Tensor, theirs: torch.Tensor, reference: torch.Tensor, lm: LoadedModel | None = None,
                     floor: float | None = None) -> Gap:
    """How far ``ours`` is from ``reference`` (the same computation in float64, e.g. on
    :func:`float64_copy`), against the larger of ``SLACK`` x ``theirs``' distance from it (another
    float32 evaluation: transformers' own path, or this machine's run) and ``floor``, by default
    :func:`gap`'s a-priori bound for ``lm``'s model (which holds where theirs happens to be exact)."""
    theirs_off = distance(theirs, reference)
    prior = gap(ours, reference, lm) if floor is None else Gap(distance(ours, reference), floor, "the floor")
    if SLACK * theirs_off <= prior.bound:
        return prior
    return Gap(prior.error, SLACK * theirs_off, f"{SLACK} x the other path's distance {theirs_off:.3g}")


@functools.cache
def float64_copy(lm: LoadedModel) -> LoadedModel:
    """``lm`` with its weights cast to float64: the same computation, rounded ~5e8 times more finely."""
    return LoadedModel(copy.deepcopy(lm.model).to(torch.float64), lm.tokenizer, f"{lm.model_id}-float64", lm.markers)


def assert_within(g: Gap, what: str = "logits") -> Gap:
    """The comparison a test makes: the error is within its bound."""
    assert g.error <= g.bound, f"{what} differ by {g}"
    return g


def assert_caught(g: Gap, what: str = "logits") -> Gap:
    """A bug was injected: :func:`assert_within` must fail, the error ``MARGIN`` times past the bound."""
    with pytest.raises(AssertionError):
        assert_within(g, what)
    assert g.ratio >= MARGIN, f"the bug moved the {what} by {g}: under {MARGIN} x the bound, too close to call"
    return g


def bug_id(bug: str | None) -> str:
    """A parametrize id for a test's ``bug`` parameter: the bug's name, or "correct" (None)."""
    return bug or "correct"


def expect(g: Gap, bug: str | None = None, what: str = "logits") -> Gap:
    """:func:`assert_within` for a correct run; :func:`assert_caught` where the test injected ``bug``."""
    return assert_within(g, what) if bug is None else assert_caught(g, f"{what} ({bug})")
