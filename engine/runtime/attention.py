"""Attention on the CPU as the engine runs it: transformers' ``sdpa``, save two cases.

**Grouped heads without copying the cache.** A model with grouped key/value heads (GQA: SmolLM2's
9 query heads read 3 KV heads, Qwen3's, Llama 3's) hands torch's ``scaled_dot_product_attention``
its KV heads as they are (``enable_gqa``) only when no mask is passed; with a mask, transformers'
``sdpa`` first repeats every KV head for its group (``repeat_kv``), a copy of the layer's whole
cache, every layer, every step. Every forward with a mask takes that copy: a verify of a few
tokens after a cached prefix (its causal mask), any step of rows holding holes, every step of
SSR's shared forks. Measured on this CPU (torch 2.13, 2 threads, SmolLM2's shapes, 2,048 cached
tokens, one layer): 545 µs with the copy against 104 µs without for 2 query tokens, 2,783 against
196 µs for 5. So a masked forward of a model with grouped heads goes to torch's kernel with
``enable_gqa`` (torch's CPU flash kernel takes the mask and the groups as they are).

**Keys in whole blocks, in bf16 and fp16** (:data:`KEY_BLOCK`). torch's CPU kernel sums a query's
scores and weighted values over the keys in SIMD vectors, and finishes the keys past the last
whole vector another way, so the same query over the same visible keys rounds differently when
the call holds more keys, masked or not: a token alone (its keys end at itself) and the same token
inside a verify (the verify's later tokens are masked keys) differ in the last bit now and then
(measured: SmolLM2 in bf16, a 1-ulp difference in 2 of 30 layers' attention over 4 tokens, enough
to flip a near-tie later; a lone query over 27-300 keys against the same query beside 8 or 32
masked keys: 5-17 of 30 differ). Padded with masked keys to a multiple of :data:`KEY_BLOCK`, every
call's keys fill whole blocks: a masked key adds an exact zero, so a query's result is the same
whatever the call holds around it (0 of 200 differ). The kernel also blocks several queries of one
call together, which rounds them differently from a query alone (2-18 of 160-1,280 differ over 4-32
queries), so a call of several queries runs one query at a time over the padded keys (0 of 1,040
differ); rows (the batch) are already independent. A lone step, the common case, pays one small
copy of the keys per layer. In fp32 the matmuls themselves already
differ between one row and several on the CPU (MKL's one-row path), so padding would buy nothing
there and is not done; the capability probe measures what a loaded model actually keeps
(``engine.runtime.numerics``).

Everything else (no mask and one KV head per query head in fp32, position biases, soft caps, other
devices) is transformers' ``sdpa`` unchanged, and its masks are ``sdpa``'s. The name stays
``sdpa`` because modelling code branches on it (DeepSeek-V3.2 applies its indexer's mask only under
``eager`` and ``sdpa``): a new name would change what the model computes, not just how.
``LoadedModel`` registers it, so plain decoding, SSR and the ``hf`` peers all run on it (one
numerics for every method); it is the same attention, held to a float64 reference beside
transformers' own (``tests/test_attention.py``).
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

KEY_BLOCK = 64  # a multiple of every CPU's SIMD width in bf16/fp16 lanes (8 on AVX2, 16 and 32 on AVX-512)
BLOCKED = (torch.bfloat16, torch.float16)  # the dtypes whose keys are padded to whole blocks on the CPU


def grouped_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
                 is_causal: bool | None = None, **kwargs):
    """transformers' ``sdpa`` attention function, but on the CPU a masked call with grouped KV
    heads reads the heads as they are (``enable_gqa``) instead of repeating them, and a bf16 or
    fp16 call's keys are padded to whole blocks (:func:`padded_keys`)."""
    groups = getattr(module, "num_key_value_groups", 1)
    blocked = key.dtype in BLOCKED
    if (query.device.type != "cpu" or kwargs.get("position_bias") is not None or kwargs.get("softcap") is not None
            or kwargs.get("output_attentions", False) or not blocked and (attention_mask is None or groups <= 1)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    def sdpa(query, mask):
        return torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout,
                                                                scale=scaling, enable_gqa=groups > 1)

    if not blocked:
        return sdpa(query, attention_mask).transpose(1, 2).contiguous(), None
    queries = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    key, value, attention_mask = padded_keys(key, value, attention_mask, queries, causal)
    if queries == 1:
        return sdpa(query, attention_mask).transpose(1, 2).contiguous(), None
    out = torch.cat([sdpa(query[:, :, j : j + 1], attention_mask[..., j : j + 1, :]) for j in range(queries)], dim=2)
    return out.transpose(1, 2).contiguous(), None


def padded_keys(key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None, queries: int, causal: bool):
    """``key`` / ``value`` ``[B, Hkv, S, D]`` padded with zeros to a multiple of :data:`KEY_BLOCK`
    slots, and the mask ``[B|1, 1, T, S]`` (bool, or additive) that hides the padding: the given
    mask, else the causal one of ``queries`` tokens ending at the last key (every key visible for
    one query, or where ``causal`` is false)."""
    slots = key.shape[2]
    pad = -slots % KEY_BLOCK
    if mask is None:
        keys = torch.arange(slots, device=key.device)
        ends = torch.arange(slots - queries, slots, device=key.device) if causal else torch.full((queries,), slots - 1,
                                                                                                 device=key.device)
        mask = (keys[None, :] <= ends[:, None])[None, None]
    mask = mask[..., :slots]
    if not pad:
        return key, value, mask
    hidden = False if mask.dtype == torch.bool else torch.finfo(mask.dtype).min
    mask = torch.cat([mask, mask.new_full((*mask.shape[:-1], pad), hidden)], dim=-1)
    return _zeros_after(key, pad), _zeros_after(value, pad), mask


def _zeros_after(t: torch.Tensor, pad: int) -> torch.Tensor:
    """``t`` ``[B, H, S, D]`` with ``pad`` slots of zeros after its own."""
    return torch.cat([t, t.new_zeros(*t.shape[:2], pad, t.shape[3])], dim=2)


def register() -> None:
    """Make :func:`grouped_sdpa` the attention transformers runs as ``sdpa`` (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register("sdpa", grouped_sdpa)
