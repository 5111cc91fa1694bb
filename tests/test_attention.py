"""engine.runtime.attention: masked steps of grouped KV heads on the CPU read the cache as it is.

The same attention as transformers' ``sdpa`` (held to a float64 reference, as far from it as
``sdpa``'s own float32 path), without ``repeat_kv``'s copy of every layer's cache: a masked forward
runs with ``repeat_kv`` made to fail, and the companion shows transformers' own ``sdpa`` would have
called it on that very step."""

from __future__ import annotations

import contextlib

import pytest
import torch
import transformers.integrations.sdpa_attention as sdpa_module
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from engine.runtime.attention import grouped_sdpa, register
from engine.runtime.batch import RowBatch
from tests.families import family_model
from tests.numeric import bug_id, expect, float64_copy, gap_to_reference
from tests.tiny import make_model

GQA = ("llama-gqa", "qwen2", "qwen3")  # the tiny archs with fewer KV heads than query heads


@contextlib.contextmanager
def sdpa_as(fn):
    """transformers runs ``fn`` as ``sdpa`` within the block; ours again after."""
    AttentionInterface.register("sdpa", fn)
    try:
        yield
    finally:
        register()


def _holes_step(lm) -> torch.Tensor:
    """Two rows, row 1 rejecting two of its three tokens (holes), then a masked step of both."""
    ids = list(range(5, 25))
    batch = RowBatch(lm, lm.new_cache(capacity=64, rows=2), 0)
    with torch.no_grad():
        batch.forward([ids])
        batch.keep([len(ids)])
        batch.fork()
        batch.forward([[7, 8, 9], [10, 11, 12]])
        batch.keep([3, 1])
        return batch.forward([[13, 14], [15, 16]])


def test_loaded_models_run_it_as_sdpa():
    lm = make_model("llama-gqa", dtype=torch.float32)
    assert lm.model.config._attn_implementation == "sdpa"  # the name modelling code branches on is kept
    assert AttentionInterface()["sdpa"] is grouped_sdpa


@pytest.mark.parametrize("bug", [None, "mask dropped"], ids=bug_id)
@pytest.mark.parametrize("arch", GQA)
def test_same_logits_as_transformers_sdpa_against_float64(arch, bug):
    lm = make_model(arch, dtype=torch.float32)
    with sdpa_as(sdpa_attention_forward):
        theirs = _holes_step(lm)
        reference = _holes_step(float64_copy(lm))
    blind = lambda module, q, k, v, mask, **kw: grouped_sdpa(module, q, k, v, None, **kw)
    with sdpa_as(blind) if bug else contextlib.nullcontext():
        ours = _holes_step(lm)
    expect(gap_to_reference(ours, theirs, reference, lm), bug)


@pytest.mark.parametrize("ours", [True, False], ids=["grouped", "transformers-sdpa"])
def test_no_copy_of_the_cache(monkeypatch, ours):
    lm = make_model("llama-gqa", dtype=torch.float32)

    def copies(*args, **kwargs):
        raise AssertionError("repeat_kv copied the cache")

    monkeypatch.setattr(sdpa_module, "repeat_kv", copies)
    if ours:
        _holes_step(lm)
    else:  # the companion: transformers' own sdpa copies on exactly this step
        with sdpa_as(sdpa_attention_forward), pytest.raises(AssertionError, match="repeat_kv copied"):
            _holes_step(lm)


def test_modelling_code_that_branches_on_the_name_computes_the_same():
    """DeepSeek-V3.2 applies its indexer's mask under the names ``eager`` and ``sdpa`` only: the
    attention runs as ``sdpa``, so the model computes what it computes under transformers' own."""
    lm = family_model("deepseek-v32")
    ids = torch.tensor([list(range(3, 40))])

    def split_prefill() -> torch.Tensor:
        cache = lm.new_cache(64)
        with torch.no_grad():
            return torch.cat([lm.forward(ids[:, :30], cache, 0), lm.forward(ids[:, 30:], cache, 30)], dim=1)

    ours = split_prefill()
    with sdpa_as(sdpa_attention_forward):
        theirs = split_prefill()
    expect(gap_to_reference(ours, theirs, theirs, lm))
