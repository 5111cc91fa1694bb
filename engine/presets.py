"""Presets for real reasoning models on the Hugging Face Hub, and the bundled model names.

Each preset names the Hub id and its thinking markers as the model card documents them:
Qwen3 and Qwen3.5 write ``<think> ... </think>`` (Qwen3's template leaves ``<think>`` to the
model; the engine opens it), DeepSeek-R1-Distill's template opens ``<think>\\n`` itself, and
Gemma 4 thinks in a ``<|channel>thought ... <channel|>`` block when the system turn carries
``<|think|>`` (its template's ``enable_thinking``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

BUNDLED = ("tiny-reasoner", "tiny-reasoner-draft", "tiny-prm")
BUNDLED_DIR = Path(__file__).resolve().parents[1] / "assets" / "models"


@dataclass(frozen=True)
class Preset:
    hub_id: str
    think_open: str = "<think>\n"
    think_close: str = "</think>"
    close_tail: str = "\n\n"  # what the template writes after the end marker, before the answer
    note: str = ""
    # the architecture's shapes (from the model's published config), so that --random-weights builds
    # it offline: meaningless text, real per-token costs
    arch: str | None = None
    shape: dict | None = None


QWEN3_SHAPE = dict(vocab_size=151936, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                   tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                   max_position_embeddings=40960)


PRESETS: dict[str, Preset] = {
    "qwen3-0.6b": Preset("Qwen/Qwen3-0.6B"),
    "qwen3-1.7b": Preset("Qwen/Qwen3-1.7B", arch="qwen3", shape={
        **QWEN3_SHAPE, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 28,
        "num_attention_heads": 16}),
    "qwen3-4b": Preset("Qwen/Qwen3-4B", arch="qwen3", shape={
        **QWEN3_SHAPE, "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36}),
    "qwen3-8b": Preset("Qwen/Qwen3-8B"),
    "qwen3.5-4b": Preset("Qwen/Qwen3.5-4B", note="the SSR paper's Qwen model"),
    "gemma-4-e4b-it": Preset("google/gemma-4-E4B-it", think_open="<|channel>thought\n",
                             think_close="<channel|>", close_tail="", note="the SSR paper's Gemma model"),
    "deepseek-r1-distill-qwen-1.5b": Preset("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", arch="qwen2", shape=dict(
        vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, tie_word_embeddings=False, max_position_embeddings=131072,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "deepseek-r1-distill-qwen-7b": Preset("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B"),
}

# SSR settings tuned per model, under RunConfig's paper defaults (which suit real models: their
# chains of thought run to thousands of tokens, ours to a few hundred).
RECOMMENDED: dict[str, dict] = {
    "tiny-reasoner": dict(draft_start=20, max_think=600, max_draft=400, max_answer=400, draft_confidence=0.5),
    # the registry's real models (engine.runtime.gguf.REGISTRY): budgets a 135M / 270M model uses on a CPU
    "smollm2-135m-instruct": dict(draft_start=32, max_think=256, max_draft=256, max_answer=256),
    "gemma-3-270m": dict(max_answer=256),
}


# Where a recommended value came from, for the studio to say (values not listed: RunConfig's own
# defaults, whose comments cite their source).
PROVENANCE: dict[str, dict[str, str]] = {
    "smollm2-135m-instruct": {k: "chosen, not tuned: SmolLM2-135M's prompted reasoning runs to tens of tokens, and the "
                                 "paper's 2000/1024 take minutes a run on a CPU" for k in ("draft_start", "max_think",
                                                                                           "max_answer")},
    "tiny-reasoner": {
        "draft_confidence": "calibrated on 200 held-out arithmetic prompts with the bundled draft and PRM",
    },
}


# ssr-exit's probes (SSR's iterative drafts: how many, how far apart) per model; the rule's own settings
# (exit_k, exit_min_think, exit_confidence) are RunConfig's defaults, calibrated on the bundled suites
EXIT_PROBES: dict[str, dict] = {
    "tiny-reasoner": dict(num_drafts=12, draft_interval=16),
}


def exit_probes(model: str | None, max_think: int, draft_start: int) -> dict:
    """The drafts an ``ssr-exit`` run forks to probe the answer on ``model``: its tuned ones, else
    8 drafts spread over the reasoning budget after ``draft_start`` (a draft every eighth of it)."""
    tuned = EXIT_PROBES.get(_bundled_name(model))
    return dict(tuned) if tuned else dict(num_drafts=8, draft_interval=max(8, (max_think - draft_start) // 8))


def with_exit_probes(cfg, model: str | None):
    """``cfg`` (a ``RunConfig``) for an ``ssr-exit`` run on ``model``: as it is, unless its drafts are
    fewer than must agree (it could never exit, and would be SSR again): then ``model``'s probes
    (:func:`exit_probes`, at least ``exit_k`` drafts). The bench CLI, a Compare and the Benchmark
    tab give an early-exit run its probes this way; the run's rule (``RunStats.exit.rule``) names them."""
    if cfg.num_drafts >= cfg.exit_k:
        return cfg
    probes = exit_probes(model, cfg.max_think, cfg.draft_start)
    return cfg.replace(num_drafts=max(probes["num_drafts"], cfg.exit_k), draft_interval=probes["draft_interval"])


def provenance(model: str | None, field: str) -> str | None:
    """Where the recommended ``field`` of ``model`` came from, if it was tuned or calibrated."""
    return PROVENANCE.get(_bundled_name(model), {}).get(field)


def _bundled_name(model: str | None) -> str:
    name = model or "tiny-reasoner"
    folder = Path(name).expanduser()
    return folder.name if folder.exists() and folder.resolve().parent == BUNDLED_DIR else name


def recommended_settings(model: str | None) -> dict:
    """Settings that override RunConfig's defaults for ``model`` (empty for most models); a bundled
    model may be named or given as its folder (``assets/models/tiny-reasoner``)."""
    return dict(RECOMMENDED.get(_bundled_name(model), {}))
