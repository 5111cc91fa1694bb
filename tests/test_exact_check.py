"""Exact mode's self-check (``engine.runtime.exact.invariance``, run by ``LoadedModel.begin_run``):
exact mode holds bitwise on the loaded model, or it is refused before the run with the measured
difference and the first layer it appears in. Never a run that says "exact" and is not.
"""

from __future__ import annotations

import pytest
import torch

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from engine.runtime.exact import ExactRefused, invariance
from engine.runtime.model import LoadedModel
from tests.families import family_model
from tests.tiny import make_model

SMALL = dict(max_think=8, max_answer=8, max_draft=6, draft_start=2)
# one of each kind exact mode must cover: attention only, sliding windows, GPT-2's Conv1D (addmm),
# hybrid recurrent layers (one token a forward in exact mode, so chunks never follow the width), a
# Mamba-1 mixer, experts, per-layer inputs and KV sharing (the rest: python -m tests.family_table)
FAMILIES = ("mistral-window", "gpt2", "qwen3.5-4b", "nemotron-h", "mamba", "qwen3-moe", "gemma-4-e4b-it")


def _fresh(lm: LoadedModel) -> LoadedModel:
    return LoadedModel(lm.model, lm.tokenizer, lm.model_id + "-fresh", lm.markers)


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_mode_holds_bitwise_or_is_refused_before_the_run(family):
    """Which families pass depends on the CPU's kernels (docs/SSR.md has this machine's table); what
    may not happen anywhere is a run called exact that is not: bitwise SSR == baseline, or a refusal
    with the measured difference and the first layer it appears in, before anything streams."""
    lm = _fresh(family_model(family, dtype=torch.float32))
    inv = invariance(lm)
    cfg = RunConfig(**SMALL, exact=True)
    if inv.exact:
        assert inv.layer is None and set(inv.rows) == {2, 3} and set(inv.widths) == {4, 16, 32}
        base, ssr = list(decode_baseline(lm, "hello", cfg))[-1], list(decode_ssr(lm, "hello", cfg))[-1]
        assert (ssr.reasoning_ids, ssr.answer_ids) == (base.reasoning_ids, base.answer_ids)
        return
    events = []
    with pytest.raises(ExactRefused, match="exact mode is refused on .*max logit difference.*first differing layer: "):
        events.extend(decode_baseline(lm, "hello", cfg))
    assert events == [] and inv.layer  # before the run: nothing streamed, nothing logged as exact
    list(decode_baseline(lm, "hello", RunConfig(**SMALL)))  # without exact mode it runs


def test_gpt2_conv1d_is_covered():
    """``addmm`` (GPT-2's Conv1D) row by row: an M=1 matmul per token, the same call in any batch."""
    assert invariance(_fresh(family_model("gpt2", dtype=torch.float32))).exact


def test_a_deliberately_batch_dependent_op_makes_the_self_check_refuse():
    """The companion check: a layer whose output leans on the other rows (one part in 10^6 of
    their mean) is found by the self-check, and named."""
    lm = _fresh(make_model("llama", seed=5, dtype=torch.float32, init_scale=3.0))
    assert lm.check_exact().exact  # as built, exact
    mlp = lm.model.model.layers[1].mlp
    hook = mlp.register_forward_hook(lambda mod, args, out: out + 1e-6 * out.mean(dim=0, keepdim=True))
    try:
        inv = invariance(lm)
        assert not inv.exact and inv.rows[2] > 0 and inv.layer == "model.layers.1.mlp"
        lm._exact_check = None  # measured again, as a new model would be
        with pytest.raises(ExactRefused, match="model.layers.1.mlp"):
            lm.begin_run(exact=True)
    finally:
        hook.remove()


def test_the_self_check_runs_once_per_model_and_keeps_the_run_settings():
    lm = _fresh(make_model("qwen3", seed=6, dtype=torch.float32))
    lm.begin_run(exact=False, compile="off")
    first = lm.check_exact()
    assert lm.exact is False  # the check put the run's own settings back
    calls = []
    hook = lm.model.register_forward_hook(lambda *_: calls.append(1))
    try:
        assert lm.check_exact() is first and not calls
    finally:
        hook.remove()
