"""Exact mode's self-check (``engine.runtime.exact.invariance``, run by ``LoadedModel.begin_run``):
exact mode holds bitwise on the loaded model, or it is refused before the run with the measured
difference and the first layer it appears in. Never a run that says "exact" and is not.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from engine.runtime.exact import ExactOps, ExactRefused, invariance
from engine.runtime.model import LoadedModel
from tests.families import family_model
from tests.tiny import make_model

SMALL = dict(max_think=8, max_answer=8, max_draft=6, draft_start=2)
# one of each kind exact mode must cover: attention only, sliding windows, GPT-2's Conv1D (addmm),
# hybrid recurrent layers (one token a forward in exact mode, so chunks never follow the width), a
# Mamba-1 mixer, experts, per-layer inputs and KV sharing (the rest: python -m tests.family_table)
FAMILIES = ("mistral-window", "gpt2", "qwen3.5-4b", "nemotron-h", "mamba", "qwen3-moe", "gemma-4-e4b-it", "glm4-moe")
# the self-check refused these until exact mode covered what it had missed (issue 21): sigmoid routers and
# per-layer-input activations (a SIMD tail), Mamba-1's dt_proj W @ x and state @ C (batched matmuls)
ESCAPED = ("glm4-moe", "deepseek-v32", "mamba", "jamba", "gemma-4-e4b-it")


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
        lm._exact_checks.clear()  # measured again, as a new model would be
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


@pytest.mark.parametrize("family", ESCAPED)
def test_the_families_that_escaped_exact_mode_are_bitwise_now(family):
    inv = invariance(_fresh(family_model(family, dtype=torch.float32)))
    assert inv.exact and inv.layer is None, str(inv)


def test_grouped_matmul_experts_are_covered():
    """The experts' grouped matmul (transformers' default on hardware that has it) runs each token
    row against its expert alone: how many tokens an expert got no longer picks the kernel."""
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    from engine.runtime.model import find_markers
    from tests.families import SMALL
    from tests.tiny import make_tokenizer

    tok = make_tokenizer("open")
    config = Qwen3MoeConfig(vocab_size=len(tok), num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                            moe_intermediate_size=16, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id,
                            pad_token_id=tok.pad_token_id, **SMALL)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, experts_implementation="grouped_mm").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    inv = invariance(LoadedModel(model, tok, "tiny-qwen3-moe-grouped-mm", find_markers(tok)))
    assert inv.exact, str(inv)


def _rows_alone_equal_rows_beside(op, *batch: torch.Tensor, exact: bool = True) -> bool:
    """Whether ``op(*batch)``'s result for each row is bitwise the same computed alone (the
    tensors of ``batch`` share their first, row, dimension)."""
    with torch.no_grad(), ExactOps() if exact else contextlib.nullcontext():
        alone = [op(*(t[i : i + 1] for t in batch)) for i in range(len(batch[0]))]
        return torch.equal(op(*batch), torch.cat(alone))


@pytest.mark.parametrize("act", [F.silu, torch.sigmoid, F.softplus, lambda x: F.gelu(x, approximate="tanh"),
                                 lambda x: x.clone().sigmoid_(), lambda x: torch.pow(x.abs(), 1.5)])
def test_activations_take_the_same_path_whatever_the_tensor_size(act):
    """On the CPU the last elements of a call take the scalar formula, which may round differently
    from the vector one (here it does for every op below): under exact mode every element takes the
    vector path, so each 15-element row alone equals the same row among 64."""
    torch.manual_seed(1)
    batch = torch.randn(64, 15) * 4
    if torch.backends.cpu.get_cpu_capability() == "AVX2":  # this machine: the test can fail
        assert not _rows_alone_equal_rows_beside(act, batch, exact=False)
    assert _rows_alone_equal_rows_beside(act, batch)


def test_contractions_do_not_depend_on_the_rows_beside():
    """Mamba-1's ops and their kin: a weight times activations (``W @ x``), activations times
    activations (a state times C), an einsum and a depthwise causal conv1d give each row bitwise
    alike alone and beside two other rows (the first two do not outside exact mode, here), and
    the value of the plain op."""
    torch.manual_seed(2)
    weight = torch.nn.Parameter(torch.randn(64, 6))
    state, c = torch.randn(3, 64, 8), torch.randn(3, 8, 1)  # Mamba-1's state and C, one token
    conv = torch.nn.Parameter(torch.randn(64, 1, 4))
    ops = {
        "W @ x": (lambda x: weight @ x, (torch.randn(3, 6, 1),)),
        "state @ C": (torch.matmul, (state, c)),
        "einsum": (lambda s, c: torch.einsum("bis,bsj->bij", s, c), (state, c)),
        "conv1d": (lambda x: F.conv1d(x, conv, padding=3, groups=64)[..., :5], (torch.randn(3, 64, 5),)),
    }
    if torch.backends.cpu.get_cpu_capability() == "AVX2":  # this machine: the test can fail
        assert not any(_rows_alone_equal_rows_beside(ops[k][0], *ops[k][1], exact=False) for k in ("W @ x", "state @ C"))
    for name, (op, batch) in ops.items():
        assert _rows_alone_equal_rows_beside(op, *batch), name
        with torch.no_grad(), ExactOps():
            exact = op(*batch)
        with torch.no_grad():
            torch.testing.assert_close(exact, op(*batch), msg=name)
