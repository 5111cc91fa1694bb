"""Every decoder-only text family transformers can load, tiny and random: does the engine keep its promise?

The promise (issue 21): plain decoding runs; greedy SSR equals plain decoding, or SSR is refused
*before the run* with the capability probe's measured reason; never a crash mid-run, never a
silent divergence. ``tests/families.py`` holds hand-shrunk configs of the families the tests
list; this sweep shrinks every other causal-LM config generically (few layers, hidden 64, the
test tokenizer's vocabulary, few small experts), so a family nobody listed is still checked.

    python -m tests.family_sweep                # every family in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    python -m tests.family_sweep llama minimax  # some (model types, as transformers names them)

Each family ends in one outcome: ``ok``, ``SSR refused before the run (reason)``, ``plain refused
(reason)``, ``CRASH (where: error)``, ``DIVERGED (what)``, ``skipped (why)`` (not a decoder-only
text model, or no tiny model in the time box) or ``cannot build tiny (reason)``. Plain decoding
is also checked against ``generate()``'s path (the model's own cache, one token a forward; every
token it picked must be that path's greedy choice): an engine cache the model misreads would
otherwise make plain decoding and SSR agree on the wrong text.
"""

from __future__ import annotations

import signal
import sys
import time
import traceback
from dataclasses import dataclass

import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from engine.runtime.model import LoadedModel, SSRUnsupportedError, find_markers
from engine.runtime.probe import capabilities
from tests.families import FAMILIES, family_model
from tests.tiny import make_tokenizer

TIME_BOX = 60  # seconds a family may take (build, probe and every run); past it: skipped
LAYERS = 4  # enough for one period of most hybrid layouts (attention every 2nd-4th layer)
SMALL = dict(max_think=16, max_answer=20, max_draft=14)
SETTINGS = (dict(draft_start=7, think_spec=3), dict(draft_start=1, num_drafts=3, draft_interval=4, think_spec=2,
                                                    min_match=1))
PROMPT = "hello world"
# model types whose tests.families entry is not named after them (the rest: "_" read as "-")
HAND_SHRUNK = {"gemma3_text": "gemma3", "gemma4_text": "gemma-4-e4b-it", "qwen3_5_text": "qwen3.5-4b",
               "exaone4": "exaone4", "olmo3": "olmo3", "lfm2": "lfm2"}
# generic shrinking: every name a config may use for a size, and the tiny value (set where the config has it)
SHRINK = {
    **dict.fromkeys(("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers"), LAYERS),
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "dim", "model_dim"), 64),
    **dict.fromkeys(("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size", "decoder_ffn_dim"), 128),
    **dict.fromkeys(("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("head_dim", "attention_head_dim", "kv_channels", "qk_rope_head_dim", "qk_nope_head_dim",
                     "v_head_dim", "linear_key_head_dim", "linear_value_head_dim", "mamba_d_head",
                     "index_head_dim", "linear_head_dim", "global_head_dim"), 16),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token"), 2),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"), 32),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank", "o_lora_rank"), 16),
    **dict.fromkeys(("rotary_dim", "rotary_emb_dim"), 8),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"), 512),
    **dict.fromkeys(("sliding_window", "attention_window_size"), 8),
    **dict.fromkeys(("index_topk",), 8),
    **dict.fromkeys(("index_n_heads", "linear_num_key_heads", "linear_num_heads"), 2),
    **dict.fromkeys(("linear_num_value_heads", "mamba_n_heads"), 4),
    **dict.fromkeys(("state_size", "ssm_state_size", "mamba_d_state", "d_state"), 8),
    **dict.fromkeys(("chunk_size", "mamba_chunk_size", "block_size"), 8),
    **dict.fromkeys(("n_group", "topk_group", "n_groups", "mamba_n_groups", "first_k_dense_replace",
                     "n_shared_experts"), 1),
    **dict.fromkeys(("vocab_size_per_layer_input",), None),  # the test tokenizer's vocabulary, set below
    **dict.fromkeys(("hidden_size_per_layer_input",), 8),
    **dict.fromkeys(("num_kv_shared_layers",), 0),
}


class TimeBox(BaseException):
    """A family ran past :data:`TIME_BOX` (a BaseException: the probe records any Exception as a finding)."""


@dataclass
class Outcome:
    family: str
    kind: str  # ok / SSR refused / plain refused / CRASH / DIVERGED / skipped / cannot build tiny
    detail: str = ""
    seconds: float = 0.0

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"| {self.family} | {self.kind}{detail} | {self.seconds:.1f} |"


# ----------------------------------------------------------------------------- building a tiny model
def text_decoder(model_type: str) -> str | None:
    """Why ``model_type`` is not a decoder-only text model the sweep can build (None: it is)."""
    cls_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
    if cls_name is None:
        return "not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
    if model_type not in CONFIG_MAPPING or not hasattr(transformers, cls_name):
        return "needs remote code"
    config = CONFIG_MAPPING[model_type]()
    if getattr(config, "is_encoder_decoder", False):
        return "encoder-decoder"
    subs = set(getattr(config, "sub_configs", {}) or {})
    if subs & {"vision_config", "audio_config", "encoder_config", "speech_config", "image_config"}:
        return "multimodal (" + ", ".join(sorted(subs)) + ")"
    return None


def tiny_config(model_type: str, vocab: int):
    """The family's default config, every size :data:`SHRINK` names set small; lists laid out per
    layer (``layer_types``...) cut to the first :data:`LAYERS`."""
    default = CONFIG_MAPPING[model_type]()
    text = default.get_text_config(decoder=True)
    layers = next((getattr(text, k) for k in ("num_hidden_layers", "n_layer", "num_layers") if hasattr(text, k)), None)
    settable = {k for k in vars(text)} | {k for k in dir(type(text)) if not isinstance(getattr(type(text), k), property)}
    kwargs = {k: v for k, v in SHRINK.items() if hasattr(text, k) and k in settable}
    if "kv_lora_rank" in kwargs and "num_key_value_heads" in kwargs:  # latent attention: as many K/V heads as queries
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    kwargs.update({k: vocab for k in ("vocab_size", "vocab_size_per_layer_input") if hasattr(text, k)})
    for k, v in vars(text).items():  # per-layer lists follow the layer count
        if isinstance(v, list) and layers and len(v) == layers and k not in kwargs:
            kwargs[k] = v[:LAYERS]
    config = type(text)(**kwargs)
    if text is not default:  # a composite config without vision parts: the text part stands alone
        config = type(default)(text_config=config.to_dict())
    return config


def hand_shrunk(model_type: str) -> str | None:
    """The family of ``tests.families`` that shrinks this model type by hand, if any."""
    name = HAND_SHRUNK.get(model_type, model_type.replace("_", "-"))
    return name if name in FAMILIES else None


def tiny_model(model_type: str, tok) -> LoadedModel:
    """A random model of the family in float64 (as ``tests.families.family_model`` builds them);
    the hand-shrunk config of ``tests.families`` where there is one."""
    if hand_shrunk(model_type):
        return family_model(hand_shrunk(model_type))
    config = tiny_config(model_type, len(tok))
    text = config.get_text_config(decoder=True)
    for cfg in {id(config): config, id(text): text}.values():
        cfg.is_decoder = True  # BERT-style LM heads are causal only as decoders (decoder-only models ignore it)
        cfg.eos_token_id = cfg.bos_token_id = tok.eos_token_id
        cfg.pad_token_id = tok.pad_token_id
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float64, experts_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
        model(input_ids=torch.arange(12)[None], use_cache=False)  # the shrunk config holds together
    return LoadedModel(model, tok, f"tiny-{model_type}", find_markers(tok))


# ----------------------------------------------------------------------------- the checks
def _final(events):
    return list(events)[-1]


def _generate_choices(lm: LoadedModel, ids: list[int], prompt: int) -> list[int]:
    """The model's greedy choice after every prefix of ``ids`` from ``prompt`` on, as
    ``generate()`` computes it: the prompt in one forward on the cache the model builds itself,
    then one token a forward."""
    with torch.inference_mode():
        out = lm.model(input_ids=torch.tensor([ids[:prompt]]), position_ids=torch.arange(prompt)[None], use_cache=True)
        choices = [int(out.logits[0, -1].argmax())]
        for j, t in enumerate(ids[prompt:-1], prompt):
            out = lm.model(input_ids=torch.tensor([[t]]), position_ids=torch.tensor([[j]]), cache=out.cache,
                           use_cache=True)
            choices.append(int(out.logits[0, -1].argmax()))
    return choices


def plain_matches_generate(lm: LoadedModel, done, prompt_text: str = PROMPT) -> str | None:
    """What plain decoding (of ``prompt_text``) picked that ``generate()``'s path would not (None: nothing)."""
    prompt = lm.prompt_ids(prompt_text)
    seq = prompt + done.reasoning_ids + done.answer_ids
    choices = _generate_choices(lm, seq, len(prompt))
    forced = set(lm.markers.close_ids)
    for j, (t, c) in enumerate(zip(seq[len(prompt):], choices, strict=True)):
        if t not in forced and t != c:
            return f"plain decoding's token {j} is {t}, generate()'s greedy choice {c}"
    return None


def ssr_outcome(lm: LoadedModel, base) -> tuple[str, str]:
    """SSR at each setting against plain decoding: (kind, detail)."""
    for setting in SETTINGS:
        events = []
        try:
            events.extend(decode_ssr(lm, PROMPT, RunConfig(**SMALL, **setting)))
        except SSRUnsupportedError as err:
            if events:
                return "CRASH", f"SSR refused after {len(events)} events: {err}"
            return "SSR refused before the run", str(err)
        ssr = events[-1]
        if (ssr.reasoning_ids, ssr.answer_ids) != (base.reasoning_ids, base.answer_ids):
            return "DIVERGED", f"SSR {setting} differs from plain decoding"
    return "ok", capabilities(lm).verify


def check(lm: LoadedModel) -> tuple[str, str]:
    """Probe, plain decoding (against the uncached forward), SSR (against plain decoding)."""
    stage = "probe"
    try:
        caps = capabilities(lm)
        why = caps.refusal("plain decoding", lm.model_id, rollbacks=False)
        if why:
            return "plain refused", why
        stage = "plain decoding"
        base = _final(decode_baseline(lm, PROMPT, RunConfig(**SMALL)))
        stage = "generate() check"
        try:
            wrong = plain_matches_generate(lm, base)
        except Exception as err:  # noqa: BLE001 (transformers' own path fails: nothing to compare with)
            wrong, note = None, f"; generate()'s path itself raised {_summary(err)}"
        else:
            note = ""
        if wrong:
            return "DIVERGED", wrong
        stage = "SSR"
        kind, detail = ssr_outcome(lm, base)
        return kind, detail + note
    except TimeBox:
        raise
    except Exception as err:  # noqa: BLE001 (the finding: where it crashed, and with what)
        return "CRASH", f"{stage}: {_summary(err)}"


def _summary(err: Exception) -> str:
    """The error and the innermost frames that are not torch's, so a crash says where it came from."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "/torch/" not in f.filename][-2:]
    where = " <- ".join(f"{f.filename.split('site-packages/')[-1]}:{f.lineno}" for f in reversed(frames))
    return f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''} [{where}]"


def _alarm(signum, frame):
    raise TimeBox


def _outcome(model_type: str, tok) -> Outcome:
    try:
        skip = text_decoder(model_type)
        if skip:
            return Outcome(model_type, "skipped", skip)
        lm = tiny_model(model_type, tok)
    except TimeBox:
        raise
    except Exception as err:  # noqa: BLE001 (reported, not fixed: some families need fields of their own)
        return Outcome(model_type, "cannot build tiny", _summary(err))
    return Outcome(model_type, *check(lm))


def sweep_one(model_type: str, tok) -> Outcome:
    """One family's outcome, within :data:`TIME_BOX` (a SIGALRM ends a family that runs past it)."""
    t0 = time.perf_counter()
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(TIME_BOX)
    try:
        out = _outcome(model_type, tok)
    except TimeBox:
        out = Outcome(model_type, "skipped", f"over {TIME_BOX} s")
    finally:
        signal.alarm(0)
    out.seconds = time.perf_counter() - t0
    return out


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)  # tiny models: threads cost more than they save, worst on a shared CPU
    tok = make_tokenizer("open")
    families = argv or sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    t0 = time.perf_counter()
    print("| family | outcome | s |\n|---|---|---|", flush=True)
    counts: dict[str, int] = {}
    for family in families:
        out = sweep_one(family, tok)
        counts[out.kind] = counts.get(out.kind, 0) + 1
        print(out, flush=True)
    print(f"\n{len(families)} families in {time.perf_counter() - t0:.0f} s: "
          + ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
