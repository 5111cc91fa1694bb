"""Grouped attention on the CPU without copying the cache: transformers' ``sdpa``, save one case.

A model with grouped key/value heads (GQA: SmolLM2's 9 query heads read 3 KV heads, Qwen3's,
Llama 3's) hands torch's ``scaled_dot_product_attention`` its KV heads as they are
(``enable_gqa``) only when no mask is passed; with a mask, transformers' ``sdpa`` first repeats
every KV head for its group (``repeat_kv``), a copy of the layer's whole cache, every layer, every
step. Every forward with a mask takes that copy: a verify of a few tokens after a cached prefix
(its causal mask), any step of rows holding holes, every step of SSR's shared forks. Measured on
this CPU (torch 2.13, 2 threads, SmolLM2's shapes, 2,048 cached tokens, one layer): 545 µs with
the copy against 104 µs without for 2 query tokens, 2,783 against 196 µs for 5. So the cost of a
wide verify and of drafts riding grew with the context, on top of the weights every step reads.

So :func:`register` puts :func:`grouped_sdpa` in transformers' ``AttentionInterface`` under the
name ``sdpa`` itself: ``sdpa`` with that one case changed. On the CPU, a masked forward of a model
with grouped heads goes to torch's kernel with ``enable_gqa`` (torch's CPU flash kernel takes the
mask and the groups as they are). Everything else (no mask, one KV head per query head, position
biases, soft caps, other devices, where a masked GQA call may fall back to a slow kernel) is
transformers' ``sdpa`` unchanged, and its masks are ``sdpa``'s. The name stays ``sdpa`` because
modelling code branches on it (DeepSeek-V3.2 applies its indexer's mask only under ``eager`` and
``sdpa``): a new name would change what the model computes, not just how. ``LoadedModel``
registers it, so plain decoding, SSR and the ``hf`` peers all run on it (one numerics for every
method); it is the same attention, held to a float64 reference beside transformers' own
(``tests/test_attention.py``).
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward


def grouped_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs):
    """transformers' ``sdpa`` attention function, but a masked call with grouped KV heads on the
    CPU reads the heads as they are (``enable_gqa``) instead of repeating them."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (attention_mask is None or groups <= 1 or query.device.type != "cpu" or kwargs.get("position_bias") is not None
            or kwargs.get("softcap") is not None or kwargs.get("output_attentions", False)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout,
                                                           scale=scaling, enable_gqa=True)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Make :func:`grouped_sdpa` the attention transformers runs as ``sdpa`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register("sdpa", grouped_sdpa)
