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
        BambaConfig,
        DeepseekV3Config,
        DeepseekV4Config,
        DeepseekV32Config,
        Exaone4Config,
        FalconH1Config,
        FalconMambaConfig,
        Gemma2Config,
        Gemma3TextConfig,
        Gemma4TextConfig,
        Glm4MoeConfig,
        GPT2Config,
        GptOssConfig,
        GraniteMoeHybridConfig,
        JambaConfig,
        KimiLinearConfig,
        Lfm2Config,
        LlamaConfig,
        Mamba2Config,
        MambaConfig,
        MiniMaxConfig,
        MistralConfig,
        NemotronHConfig,
        Olmo3Config,
        Phi3Config,
        Qwen3_5TextConfig,
        Qwen3MoeConfig,
        Qwen3NextConfig,
    )

    MLA = dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1,
               kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_group=1,
               topk_group=1)
    MLA_SMALL = {**{k: v for k, v in SMALL.items() if k != "head_dim"}, "num_key_value_heads": 4}
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
        # --- pure state space (no attention layer at all), and Jamba's Mamba-1 hybrid, whose multi-token
        # forward after a cached state ignores the state (the probe routes it one token at a time)
        "mamba": lambda: MambaConfig(vocab_size=vocab, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                                     conv_kernel=4),
        "mamba2": lambda: Mamba2Config(vocab_size=vocab, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2,
                                       num_heads=4, head_dim=16, n_groups=1, chunk_size=8),
        "falcon-mamba": lambda: FalconMambaConfig(vocab_size=vocab, hidden_size=32, state_size=8, num_hidden_layers=2,
                                                  expand=2, conv_kernel=4),
        "jamba": lambda: JambaConfig(
            vocab_size=vocab, num_hidden_layers=4, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
            expert_layer_offset=1, num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2,
            **{k: v for k, v in SMALL.items() if k != "head_dim"}),
        "falcon-h1": lambda: FalconH1Config(
            vocab_size=vocab, num_hidden_layers=2, mamba_d_ssm=32, mamba_n_heads=4, mamba_d_head=8, mamba_d_state=8,
            mamba_n_groups=1, mamba_chunk_size=8, mamba_expand=1, **SMALL),
        "bamba": lambda: BambaConfig(
            vocab_size=vocab, num_hidden_layers=2, attn_layer_indices=[1], mamba_n_heads=4, mamba_d_head=16,
            mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=8, mamba_expand=2,
            **{k: v for k, v in SMALL.items() if k != "head_dim"}),
        "granitemoehybrid": lambda: GraniteMoeHybridConfig(
            vocab_size=vocab, num_hidden_layers=2, layer_types=["mamba", "attention"], num_local_experts=4,
            num_experts_per_tok=2, mamba_n_heads=4, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
            mamba_chunk_size=8, mamba_expand=2, **{k: v for k, v in SMALL.items() if k != "head_dim"}),
        # --- mixture of experts, multi-head latent attention, GPT-2's Conv1D (addmm) projections
        "qwen3-moe": lambda: Qwen3MoeConfig(vocab_size=vocab, num_hidden_layers=2, num_experts=4, num_experts_per_tok=2,
                                            moe_intermediate_size=16, **SMALL),
        "deepseek-v3": lambda: DeepseekV3Config(vocab_size=vocab, num_hidden_layers=2, **MLA, **MLA_SMALL),
        "glm4-moe": lambda: Glm4MoeConfig(vocab_size=vocab, num_hidden_layers=2, n_routed_experts=4,
                                          num_experts_per_tok=2, moe_intermediate_size=16, first_k_dense_replace=1,
                                          n_group=1, topk_group=1, **SMALL),
        "gpt2": lambda: GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=512),
        # --- DeepSeek-V3.2's indexed sparse attention: its indexer keeps keys of its own (a layer kind the
        # SlotCache does not know: it runs on its own cache), and picks its top-k differently in a multi-token
        # forward: SSR is refused by the probe (plain decoding runs)
        "deepseek-v32": lambda: DeepseekV32Config(vocab_size=vocab, num_hidden_layers=2, index_topk=8, index_n_heads=2,
                                                  index_head_dim=16, **MLA, **MLA_SMALL),
        # --- caches the engine cannot swap for its own (engine.runtime.cache.OwnCache): MiniMax's lightning
        # attention refuses any cache but its own class (which reports no length); DeepSeek-V4's compressed
        # attention (a sliding window plus compressor and indexer states that grow every 4 / 8 tokens, one mask
        # for every layer read off the first sliding one) has layer kinds of its own
        "deepseek-v4": lambda: DeepseekV4Config(
            vocab_size=vocab, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, q_lora_rank=16, o_groups=2, o_lora_rank=16, n_routed_experts=4,
            num_experts_per_tok=2, hc_mult=2, sliding_window=6, index_n_heads=2, index_head_dim=16, index_topk=4,
            layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            max_position_embeddings=512),
        "minimax": lambda: MiniMaxConfig(vocab_size=vocab, num_hidden_layers=2, num_local_experts=4,
                                         num_experts_per_tok=2, layer_types=["linear_attention", "full_attention"],
                                         block_size=8, **SMALL),
        # --- Kimi-Linear: Kimi Delta Attention (gated delta rule, short convolutions) beside MLA full attention
        "kimi-linear": lambda: KimiLinearConfig(
            vocab_size=vocab, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=8, num_local_experts=4, num_experts_per_tok=2, linear_head_dim=8, linear_num_heads=4,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
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
STATE_SPACE = ("mamba", "mamba2", "falcon-mamba", "jamba", "falcon-h1", "bamba", "granitemoehybrid")
MIXED = ("qwen3-moe", "deepseek-v3", "glm4-moe", "gpt2")  # experts, latent attention, Conv1D projections
LINEAR_MLA = ("kimi-linear",)  # linear attention beside latent attention (tested in tests/test_probe.py)
OWN_CACHE = ("minimax",)  # on the model's own cache class (engine.runtime.cache.OwnCache), SSR exact
# family: the probe's check that fails there. Both run on their own caches, whose rollbacks and forks are
# right; their prefill of n tokens differs from n - 1 then 1 (SSR's start), beyond rounding
SSR_REFUSED = {"deepseek-v32": "split prefill", "deepseek-v4": "split prefill"}
PLAIN_REFUSED: dict[str, str] = {}  # family: what the probe's one-token decoding raised
FAMILIES = (*SLIDING, *RECURRENT, *SCALED_ROPE, *STATE_SPACE, *MIXED, *LINEAR_MLA, *OWN_CACHE, *SSR_REFUSED, *PLAIN_REFUSED)


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
