"""Exact mode's fixed route (engine/runtime/fixed.py): every step one padded shape, float32, CPU.

The route must hold the same guarantee as the per-row reference, by a different means: row 0's
logits ``torch.equal`` beside 0, 1 or 2 other rows and a token's logits alone and at every offset
of a 4-, 16- and 32-token window, measured by the model's own self-check on this route; greedy
SSR and RSD's plumbing equal to plain decoding on it; refused, before the run and with the
reason, where it cannot hold (recurrent states, a router whose shapes follow the padding); never
compared with the other route. A test also shows the route failing without its row padding, so
these tests can fail.
"""

from __future__ import annotations

import functools

import pytest
import torch

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from engine.runlog.compare import match_key
from engine.runtime import fixed
from engine.runtime.exact import invariance
from tests.families import family_model
from tests.tiny import make_model

PROMPT = "Start with 7. 7 plus 5 is 12, then the lazy dog jumps over the fence"


@functools.cache
def fp32(arch: str):
    return make_model(arch, seed=4, dtype=torch.float32, init_scale=3.0)


def final(events):
    return list(events)[-1]


@pytest.mark.parametrize("model", ["llama", "qwen3", "gpt2", "gemma3", "mistral-window"])
def test_the_self_check_finds_the_fixed_route_bitwise(model):
    lm = fp32(model) if model in ("llama", "qwen3", "gpt2") else family_model(model, dtype=torch.float32)
    inv = invariance(lm, "fixed")
    assert inv.exact, str(inv)
    assert set(inv.rows) == {2, 3} and set(inv.widths) == {4, 16, 32}


@pytest.mark.parametrize("settings", [dict(draft_start=4), dict(draft_start=2, num_drafts=2, draft_interval=5, think_spec=3),
                                      dict(draft_start=8, max_spec=40, min_match=1)], ids=["paper", "lookups", "wide"])
@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_greedy_ssr_equals_baseline_on_the_fixed_route(arch, settings):
    """Lookups with drafts riding would leave holes: on this route rows hold none (one token per row
    per step while drafts ride); a 41-token verify runs in two chunks."""
    lm = fp32(arch)
    cfg = RunConfig(max_think=16, max_answer=24, max_draft=20, exact=True, exact_route="fixed", **settings)
    base, ssr = final(decode_baseline(lm, PROMPT, cfg)), final(decode_ssr(lm, PROMPT, cfg))
    assert ssr.reasoning_ids + ssr.answer_ids == base.reasoning_ids + base.answer_ids
    assert base.stats.step_mode == ssr.stats.step_mode == f"exact fixed {fixed.SHAPE} eager"
    assert not lm.holes_ok


def test_the_routes_are_never_compared():
    lm = fp32("llama")
    runs = {route: final(decode_baseline(lm, PROMPT, RunConfig(max_think=6, max_answer=4, exact=True, exact_route=route)))
            for route in ("rows", "fixed")}
    keys = {route: match_key({"config": {"exact": True}, "step_mode": r.stats.step_mode}) for route, r in runs.items()}
    assert keys["rows"] != keys["fixed"]
    assert runs["rows"].stats.step_mode.startswith("exact rows")


@pytest.mark.parametrize("family, reason", [
    ("qwen3.5-4b", "a padding token would enter this model's recurrent states"),
    ("phi3-longrope", "rope_type 'longrope' picks its frequencies from each forward's highest position"),
    ("llama-dynamic", "rope_type 'dynamic' picks its frequencies"),
    ("qwen3-moe", "router routes the padding tokens too"),
    ("minimax", "a cache class of its own"),
])
def test_the_fixed_route_is_refused_before_the_run_where_it_cannot_hold(family, reason):
    """What the route's shape cannot fix is a property of what the model computes: refused before
    the run with the reason (and ``auto`` takes the per-row route there, on CUDA too)."""
    lm = family_model(family, dtype=torch.float32)
    with pytest.raises(ValueError, match=f"fixed route cannot hold on this model: .*{reason}.*exact_route 'rows'"):
        final(decode_baseline(lm, PROMPT, RunConfig(max_think=4, max_answer=4, exact=True, exact_route="fixed")))
    unfit = fixed.unfit(lm.model.config, lm.layout, lm.rope)
    assert fixed.resolve("auto", torch.device("cuda"), unfit) == "rows"


def test_auto_takes_the_fixed_route_on_cuda_only():
    lm = fp32("llama")
    assert fixed.unfit(lm.model.config, lm.layout, lm.rope) is None
    assert fixed.resolve("auto", torch.device("cuda"), None) == "fixed"
    assert fixed.resolve("auto", torch.device("cpu"), None) == "rows"


def test_a_run_with_more_rows_than_the_route_holds_is_refused_before_it_starts():
    lm = fp32("llama")
    cfg = RunConfig(max_think=40, max_answer=4, max_draft=4, draft_start=1, num_drafts=fixed.ROWS, draft_interval=4, drafting="always",
                    exact=True, exact_route="fixed")
    with pytest.raises(ValueError, match=f"runs {fixed.ROWS} rows a step and this run needs {fixed.ROWS + 1}"):
        next(iter(decode_ssr(lm, PROMPT, cfg)))


def test_an_expert_router_is_not_shape_invariant_on_the_fixed_route():
    """Why routed experts are refused rather than trusted to the self-check: the padding tokens are
    routed too, so an expert's token count follows the data; on this model one probe input already
    shows it (another input might not, which is why the refusal does not wait for a measurement)."""
    inv = invariance(family_model("qwen3-moe", dtype=torch.float32), "fixed")
    if inv.exact:
        pytest.skip("this CPU's expert kernels happen to be shape-invariant on this input")
    assert inv.layer and "mlp" in inv.layer


def test_without_its_padding_the_route_breaks_so_the_tests_can_fail(monkeypatch):
    """Every step at its own shape (the rows and tokens it carries): the kernels' blocking follows
    the shape, and the self-check sees it on these models."""
    monkeypatch.setattr(fixed, "_shape", lambda rows, tokens: (rows, tokens))
    results = [invariance(fp32(arch), "fixed") for arch in ("llama", "qwen3", "gpt2")]
    assert not all(r.exact for r in results), [str(r) for r in results]
