"""One tiny random model per causal-LM family the engine must run exactly (CPU, float64, seconds).

Each entry is a config shrunk from a real model of that family, keeping what makes the family
different: sliding-window layers (windows of 6-8 tokens, so every run outgrows them), hybrid
linear-attention or state-space layers with recurrent states, KV sharing between layers, and
position-scaled RoPE. ``qwen3.5-4b`` and ``gemma-4-e4b-it`` follow the layouts of the SSR paper's
two models (the presets of the same names), at a few hundred parameters per matrix.
"""

from __future__ import annotations

import functools

import torch
from transformers import AutoModelForCausalLM

from engine.runtime.model import LoadedModel, find_markers
from tests.tiny import make_tokenizer

SWITCH = 40  # where position-scaled RoPE changes its frequencies: a short prompt (22 tokens) runs past it
SMALL = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
             max_position_embeddings=512)


def _config(name: str, vocab: int):
    from transformers import (
        Exaone4Config,
        Gemma2Config,
        Gemma3TextConfig,
        Gemma4TextConfig,
        GptOssConfig,
        Lfm2Config,
        LlamaConfig,
        MistralConfig,
        NemotronHConfig,
        Olmo3Config,
        Phi3Config,
        Qwen3_5TextConfig,
        Qwen3NextConfig,
    )

    linear = dict(linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                  linear_num_value_heads=4)
    configs = {
        # --- sliding-window attention
        "mistral-window": lambda: MistralConfig(vocab_size=vocab, num_hidden_layers=2, sliding_window=6, **SMALL),
        "gemma2": lambda: Gemma2Config(vocab_size=vocab, num_hidden_layers=2, sliding_window=6, **SMALL),
        "gemma3": lambda: Gemma3TextConfig(vocab_size=vocab, num_hidden_layers=3, sliding_window=6, sliding_window_pattern=2,
                                   **SMALL),
        "gpt-oss": lambda: GptOssConfig(vocab_size=vocab, num_hidden_layers=2, sliding_window=6, num_local_experts=4,
                                num_experts_per_tok=2, **SMALL),
        "olmo3": lambda: Olmo3Config(vocab_size=vocab, num_hidden_layers=4, sliding_window=6,
                             **{k: v for k, v in SMALL.items() if k != "head_dim"}),
        "exaone4": lambda: Exaone4Config(vocab_size=vocab, num_hidden_layers=4, sliding_window=6, sliding_window_pattern=2,
                                 **SMALL),
        # Gemma-4-E4B-it's layout: 5 sliding to 1 full layer, per-layer inputs (PLE), the last layers reusing
        # earlier layers' K/V (KV sharing), a bigger head and fewer KV heads on the full layers
        "gemma-4-e4b-it": lambda: Gemma4TextConfig(
            vocab_size=vocab, num_hidden_layers=6, sliding_window=8, vocab_size_per_layer_input=vocab,
            hidden_size_per_layer_input=8, num_kv_shared_layers=2, global_head_dim=16, final_logit_softcapping=30.0,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                         "sliding_attention", "full_attention"], **SMALL),
        # --- hybrid linear attention / state space (recurrent states)
        # Qwen3.5-4B's layout: three Gated DeltaNet layers to one full-attention layer
        "qwen3.5-4b": lambda: Qwen3_5TextConfig(
            vocab_size=vocab, num_hidden_layers=4, **linear, **SMALL,
            layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]),
        "qwen3-next": lambda: Qwen3NextConfig(
            vocab_size=vocab, num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
            shared_expert_intermediate_size=16, **linear, **SMALL,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"]),
        "lfm2": lambda: Lfm2Config(vocab_size=vocab, num_hidden_layers=4, full_attn_idxs=[1, 3],
                           **{k: v for k, v in SMALL.items() if k != "head_dim"}),
        "nemotron-h": lambda: NemotronHConfig(
            vocab_size=vocab, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
            intermediate_size=64, layers_block_type=["mamba", "attention", "mamba", "mlp"], ssm_state_size=8,
            mamba_num_heads=4, mamba_head_dim=16, n_groups=2, chunk_size=8, use_mamba_kernels=False,
            max_position_embeddings=512),
        # --- position-scaled RoPE: frequencies change past SWITCH positions
        "phi3-longrope": lambda: Phi3Config(
            vocab_size=vocab, num_hidden_layers=2, hidden_size=32, intermediate_size=64, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4 * SWITCH, original_max_position_embeddings=SWITCH,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 4,
                             "long_factor": [3.0] * 4, "original_max_position_embeddings": SWITCH}),
        "llama-dynamic": lambda: LlamaConfig(
            vocab_size=vocab, num_hidden_layers=2, **{**SMALL, "max_position_embeddings": SWITCH},
            rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0}),
    }
    return configs[name]()


SLIDING = ("mistral-window", "gemma2", "gemma3", "gpt-oss", "olmo3", "exaone4", "gemma-4-e4b-it")
RECURRENT = ("qwen3.5-4b", "qwen3-next", "lfm2", "nemotron-h")
SCALED_ROPE = ("phi3-longrope", "llama-dynamic")
FAMILIES = (*SLIDING, *RECURRENT, *SCALED_ROPE)


@functools.cache
def family_model(name: str, seed: int = 0, scale: float = 3.0, dtype: torch.dtype = torch.float64) -> LoadedModel:
    """A random model of family ``name`` (float64 unless asked) with the in-memory test tokenizer."""
    tok = make_tokenizer("open")
    config = _config(name, len(tok))
    config.eos_token_id = config.bos_token_id = tok.eos_token_id
    config.pad_token_id = tok.pad_token_id
    torch.manual_seed(seed)
    # eager experts: the grouped matmul of MoE layers has no float64 kernel on the CPU
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, experts_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(scale)
    return LoadedModel(model, tok, f"tiny-{name}-{seed}-{str(dtype)[6:]}", find_markers(tok))
