"""Tiny random models and an in-memory tokenizer for CPU tests (seconds, no downloads).

Models run in float64 so that a batched or multi-token forward and a one-token forward agree to
~1e-15: greedy ties cannot flip, and exact equality is a fair test of the logic.
"""

from __future__ import annotations

import functools

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from engine.runtime.model import LoadedModel, find_markers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

# style "open": the generation prompt opens <think> (Qwen3.5, DeepSeek-R1-Distill);
# style "model": it does not, the model would write it itself (Qwen3), so the engine opens it.
TEMPLATES = {
    "open": (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}"
    ),
    "model": (
        "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
    ),
}

@functools.cache
def _tokenizer_json() -> str:
    """A byte-level BPE with a fixed vocabulary (specials, then the 256 byte symbols) and a few
    fixed merges: the same ids in every process (a trained BPE can break ties differently)."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {t: i for i, t in enumerate(SPECIALS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ċ", "Ċ"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    return tok.to_str()


def make_tokenizer(style: str = "open") -> PreTrainedTokenizerFast:
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(_tokenizer_json()),
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.add_tokens(["ки"])  # math-shepherd's step tag, for the PRM tests
    tok.chat_template = TEMPLATES[style]
    return tok


def _config(arch: str, vocab: int):
    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=64, max_position_embeddings=512)
    if arch == "llama":
        return LlamaForCausalLM, LlamaConfig(num_key_value_heads=4, **common)
    if arch == "llama-gqa":
        return LlamaForCausalLM, LlamaConfig(num_key_value_heads=2, tie_word_embeddings=True,
                                             **{**common, "num_hidden_layers": 3})
    if arch == "qwen2":
        return Qwen2ForCausalLM, Qwen2Config(num_key_value_heads=2, **common)
    if arch == "qwen3":
        return Qwen3ForCausalLM, Qwen3Config(num_key_value_heads=2, head_dim=8, **common)
    if arch == "gpt2":
        return GPT2LMHeadModel, GPT2Config(vocab_size=vocab, n_embd=32, n_layer=2, n_head=4, n_positions=512)
    raise ValueError(arch)


ARCHS = ("llama", "llama-gqa", "qwen2", "qwen3", "gpt2")


def make_model(arch: str = "llama", seed: int = 0, style: str = "open", dtype=torch.float64,
               init_scale: float = 1.0):
    """A random model of ``arch`` wrapped as a :class:`LoadedModel`. ``init_scale`` > 1 makes
    the output distributions peakier (more varied greedy text, less uniform sampling)."""
    tok = make_tokenizer(style)
    cls, config = _config(arch, len(tok))
    config.eos_token_id = config.bos_token_id = tok.eos_token_id
    config.pad_token_id = tok.pad_token_id
    torch.manual_seed(seed)
    model = cls(config).to(dtype).eval()
    if init_scale != 1.0:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(init_scale)
    return LoadedModel(model, tok, f"tiny-{arch}-{style}-{seed}", find_markers(tok))


def with_tokens(lm: LoadedModel, eos: int | None = None, close: int | None = None) -> LoadedModel:
    """The same model with a chosen token treated as end of sequence or end of thinking, to steer
    a random model into the control-flow corners (an end inside a draft, a stray marker)."""
    from dataclasses import replace

    out = LoadedModel(lm.model, lm.tokenizer, lm.model_id, lm.markers)
    if eos is not None:
        out.eos_ids = frozenset({eos})
    if close is not None:
        out.markers = replace(lm.markers, marker_ids=(close,))
    return out


def current_token_only(lm: LoadedModel) -> LoadedModel:
    """Zero every attention output projection: each position's logits depend on its own token
    alone, so a draft's answer is always exactly the final answer (a draft always right)."""
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if name.endswith("o_proj.weight"):
                p.zero_()
    return lm


def position_only(lm: LoadedModel) -> LoadedModel:
    """GPT-2 with tiny token and large position embeddings: output depends on the absolute
    position, so a draft written at earlier positions is almost always wrong."""
    with torch.no_grad():
        lm.model.transformer.wte.weight.mul_(0.001)
        lm.model.transformer.wpe.weight.mul_(50.0)
    return lm


def make_small_vocab_model(seed: int = 0, init_scale: float = 2.0) -> LoadedModel:
    """A float64 Llama over eight words (``a``, ``b``, ``c``, the markers, end of sequence): small
    enough to enumerate its exact output distribution for a few tokens. End of sequence scores
    exactly as ``a`` everywhere, so drafts and answers end often (the corner sampling must get right)."""
    from tokenizers import pre_tokenizers as pre

    words = ["<|endoftext|>", "<|im_end|>", "<think>", "</think>", "a", "b", "c", "[UNK]"]
    inner = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    inner.pre_tokenizer = pre.WhitespaceSplit()
    inner.decoder = decoders.WordPiece()
    inner.add_special_tokens(words[:4])
    tok = PreTrainedTokenizerFast(tokenizer_object=inner, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token="[UNK]")
    config = LlamaConfig(vocab_size=len(words), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=32, max_position_embeddings=64,
                         tie_word_embeddings=False, eos_token_id=1, bos_token_id=1, pad_token_id=0)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(init_scale)
        model.lm_head.weight[1] = model.lm_head.weight[4]  # end of sequence as likely as "a"
    return LoadedModel(model, tok, f"tiny-vocab-{seed}", find_markers(tok))


def counting_compiles(monkeypatch) -> tuple[LoadedModel, list]:
    """A tiny qwen3 model whose compiled steps run on dynamo's eager backend (its tracing and
    guards, without inductor's compile time), and the list each dynamo compile (first or re-)
    appends to: what a test counts to show a run compiles nothing."""
    from engine.runtime.compiled import CompiledSteps

    compiles = []

    def counting(gm, example_inputs):
        compiles.append(1)
        return gm.forward

    monkeypatch.setattr("engine.runtime.compiled.shutil.which", lambda _: "/usr/bin/c++")
    lm = make_model("qwen3", seed=2, style="open", init_scale=3.0)
    lm._steps = CompiledSteps(lm.model, cuda_graphs=False, backend=counting)
    return lm, compiles
