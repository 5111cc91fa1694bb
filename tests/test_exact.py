"""Exact mode: bitwise batch- and width-invariant forwards (engine/runtime/exact.py), float32.

Row 0's logits must be *equal* (``torch.equal``, not allclose) whether it shares its forward with
0, 1 or 2 other rows, and a token's logits whether it is fed alone or at any offset of a 4-, 16-
or 32-token window; greedy SSR must then equal plain decoding in float32. A test also shows the
fast path breaking the property on some shape, so these tests can fail.
"""

from __future__ import annotations

import functools

import pytest
import torch

from engine.benchmarks.agreement import agreement
from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from engine.tools.gpu_check import logits_beside as _logits
from tests.tiny import make_model

ARCHS = ("llama", "qwen3")
PROMPT = "Start with 7. 7 plus 5 is 12, then the lazy dog jumps over the fence"


@functools.cache
def fp32(arch: str):
    return make_model(arch, seed=4, dtype=torch.float32, init_scale=3.0)


def _window_vs_alone(lm, k: int, exact: bool) -> list[bool]:
    """For each offset j of a k-token window: does the token there get the same logits alone?"""
    ids = lm.prompt_ids(PROMPT * 3)
    prefix, window = ids[:20], ids[20 : 20 + k]
    together = _logits(lm, [window], prefix, exact)[0]  # [k, V]
    return [torch.equal(together[j], _logits(lm, [window[j : j + 1]], prefix + window[:j], exact)[0, 0])
            for j in range(k)]


@pytest.mark.parametrize("arch", ARCHS)
def test_row_zero_is_the_same_beside_any_number_of_rows(arch):
    lm = fp32(arch)
    ids = lm.prompt_ids(PROMPT)
    prefix, mine = ids[:-6], ids[-6:]
    others = [[(t * 7 + 3) % 200 for t in mine], [(t * 13 + 1) % 200 for t in mine]]
    alone = _logits(lm, [mine], prefix, exact=True)[0]
    for n in (1, 2):
        assert torch.equal(_logits(lm, [mine, *others[:n]], prefix, exact=True)[0], alone), f"{n + 1} rows differ"


@pytest.mark.parametrize("k", [4, 16, 32])
@pytest.mark.parametrize("arch", ARCHS)
def test_a_token_is_the_same_alone_and_at_every_offset_of_a_window(arch, k):
    assert all(_window_vs_alone(fp32(arch), k, exact=True))


def test_the_fast_path_breaks_the_property_so_the_test_can_fail():
    """Without exact mode a wide verify rounds differently from a one-token step (float32, CPU)."""
    assert not all(all(_window_vs_alone(fp32(arch), 16, exact=False)) for arch in ARCHS)


@pytest.mark.parametrize("settings", [dict(draft_start=4), dict(draft_start=2, num_drafts=2, draft_interval=5, think_spec=3),
                                      dict(draft_start=8, max_spec=32, min_match=1)], ids=["paper", "holes", "wide"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_ssr_equals_baseline_in_float32(arch, settings):
    lm = fp32(arch)
    cfg = RunConfig(max_think=16, max_answer=24, max_draft=20, exact=True, **settings)
    base, ssr = list(decode_baseline(lm, PROMPT, cfg))[-1], list(decode_ssr(lm, PROMPT, cfg))[-1]
    assert ssr.reasoning_ids + ssr.answer_ids == base.reasoning_ids + base.answer_ids
    a = agreement(lm, PROMPT, base.reasoning_ids + base.answer_ids, ssr.reasoning_ids + ssr.answer_ids)
    assert a.identical and str(a) == "identical"


def test_agreement_names_the_token_and_the_margin():
    lm = fp32("llama")
    base = list(decode_baseline(lm, PROMPT, RunConfig(max_think=8, max_answer=4)))[-1]
    ids = base.reasoning_ids + base.answer_ids
    other = ids[:5] + [(ids[5] + 1) % 200] + ids[6:]
    a = agreement(lm, PROMPT, ids, other)
    assert a.diverged_at == 5 and a.margin > 0 and str(a).startswith("diverged at token 5 (top-2 logit margin ")


def test_gpu_check_runs_on_the_cpu(tmp_path):
    """The one-command numerics check (run on an H200 by whoever has one) works here, smaller."""
    import json

    from engine.tools import gpu_check

    out = tmp_path / "check.json"
    assert gpu_check.main(["--device", "cpu", "--prompts", "2", "--tokens", "12", "--bundled-prompts", "1",
                           "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    speed = report["speed"]
    assert set(speed["ms_per_token"]) == {"baseline", "hf", "hf-static"} and speed["verify32_over_step1"] > 0
    assert speed["step_2rows_over_1row"] > 0 and speed["step_mode"].startswith("eager: auto compiles on CUDA only")
    assert speed["weights_gb"] > 0 and report["bundled"]["ssr_answers_identical"] == 1
    exact = report["exact"]
    assert set(exact["rows_max_abs_diff"].values()) == {0.0} and set(exact["width_max_abs_diff"].values()) == {0.0}
    assert exact["agreement"]["identical"] == exact["agreement"]["of"] == 2
    assert report["exact_cost_per_token"] > 0 and report["fast"]["agreement"]["of"] == 2
