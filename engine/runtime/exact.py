"""Exact mode: forwards whose result for one row and one position does not depend on the batch.

A matmul, a norm or an attention reduction may sum in an order chosen by the shape of the call:
how many rows the batch holds (the main row alone, or with drafts) and how many query tokens the
forward carries (a 1-token step, or a k-token verify). Then the same token at the same position
gets slightly different logits in different forwards, and a near-tie flips the greedy token: on
a GPU in bf16, "SSR gives the same answer as plain decoding" fails at random.

Exact mode removes every shape-dependent reduction from the forward, under the model's own
modelling code (nothing forked, nothing monkey-patched):

* **Linear layers** (every projection, the LM head): a ``TorchFunctionMode`` computes
  ``F.linear`` one token row at a time, so every row is the same call on the same shapes, whatever
  else is in the batch.
* **Attention**: an attention function registered with transformers' ``AttentionInterface`` (and
  its mask with ``AttentionMaskInterface``) computes each query on its own, over exactly the keys
  its mask lets it see, gathered in position order: the scores, the softmax and the weighted sum
  have the same shapes and order for that query in a lone step, in a wide verify, beside other
  rows, and with holes. Soft-capped logits (Gemma 2) are supported; attention sinks are refused.
* Norms, softmax over the vocabulary, rotary embeddings, activations and residual adds reduce per
  row along the last dimension only (or not at all), which is already independent of the batch;
  the tests check the end result, bitwise, so a kernel that broke this would be caught.

It is slow (one call per token row per linear layer and per query per attention layer): the
reference that CPU tests run. A GPU would want fixed-tile Triton kernels with the same property;
until then the same code runs there too, as the slow, exact path.

>>> with exact_forwards(model):
...     logits = model(input_ids=ids).logits  # row 0's logits do not depend on the other rows
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

NAME = "ssr-exact"


class _RowwiseLinear(TorchFunctionMode):
    """``F.linear`` computed one token row at a time (the same call for every row)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.linear:
            return func(*args, **kwargs)
        x, weight = args[0], args[1]
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        rows = x.reshape(-1, x.shape[-1])  # [N, in]
        out = torch.cat([F.linear(rows[i : i + 1], weight, bias) for i in range(rows.shape[0])])  # [N, out]
        return out.reshape(*x.shape[:-1], weight.shape[0])


def exact_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """Attention one query at a time over its visible keys. ``query`` ``[B, H, T, D]``, ``key`` /
    ``value`` ``[B, Hkv, S, D]``, ``attention_mask`` additive ``[B, 1, T, S]`` (0: visible).
    Returns ``([B, T, H, D], None)`` as transformers' attention functions do."""
    if kwargs.get("s_aux") is not None:
        raise ValueError("exact mode does not support attention sinks (gpt-oss): turn exact mode off for this model")
    softcap = kwargs.get("softcap")
    b, h, t, _d = query.shape
    groups = h // key.shape[1]
    out = query.new_empty(b, t, h, value.shape[-1])
    for row in range(b):
        keys = key[row].repeat_interleave(groups, dim=0)  # [H, S, D]
        values = value[row].repeat_interleave(groups, dim=0)
        for q in range(t):
            visible = (attention_mask[row, 0, q] == 0).nonzero().flatten() if attention_mask is not None \
                else torch.arange(key.shape[2] - t + q + 1, device=key.device)
            k_sel, v_sel = keys[:, visible], values[:, visible]  # [H, n, D]
            scores = torch.matmul(query[row, :, q : q + 1], k_sel.transpose(1, 2)) * scaling  # [H, 1, n]
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
            out[row, q] = torch.matmul(probs, v_sel)[:, 0]  # [H, D]
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, exact_attention)
    AttentionMaskInterface.register(NAME, eager_mask)  # an additive mask, always materialised


@contextlib.contextmanager
def exact_forwards(model):
    """Within the block, ``model``'s forwards are batch- and width-invariant (see the module doc)."""
    _register()
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        with _RowwiseLinear():
            yield
    finally:
        config._attn_implementation = before
