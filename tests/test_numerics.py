"""The weights' precision on the CPU (``engine.runtime.numerics``) and the bf16 route it may choose.

* The route: in bf16 on the CPU, a token's logits are bitwise the same alone, beside other rows and
  inside wider forwards (``engine.runtime.attention``'s whole key blocks, one query a call), so
  greedy SSR writes plain decoding's tokens; on every family the tests build, or the route is
  refused there with the measured difference and the first module it appears in.
* The op-by-op check: a lone forward and the same token inside a batched one, compared module by
  module (``engine.runtime.exact``'s first difference): in bf16 no module differs.
* The choice: by measured costs (scripted here: the tests cannot pick the CPU they run on), bf16
  where it is faster and batch-invariant, fp32 otherwise, each with its reason; kept with the
  probe's cache; ``--dtype`` forces one; the bundled models stay fp32.
"""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
import torch.nn.functional as F

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from engine.presets import BUNDLED_DIR
from engine.runtime import numerics
from engine.runtime.attention import KEY_BLOCK, padded_keys
from engine.runtime.exact import _first_difference, invariance
from engine.runtime.model import LoadedModel, load_model
from engine.runtime.numerics import Numerics, choose, decide, settle
from engine.runtime.probe import capabilities
from tests.families import family_model
from tests.tiny import make_model

FASTER = {"float32": [90.0, 40.0, 60.0, 80.0, 60.0], "bfloat16": [45.0, 20.0, 30.0, 40.0, 30.0]}  # ms of numerics.SHAPES
SMALL = dict(max_think=10, max_answer=10, max_draft=6, draft_start=2, drafting="always")
# one of each kind: attention, sliding windows, Conv1D, experts, latent attention, per-layer inputs, hybrid
# recurrent, state space (chunked scans: refused in bf16 on this route where the width changes them)
FAMILIES = ("mistral-window", "gemma3", "gpt2", "qwen3-moe", "deepseek-v3", "gemma-4-e4b-it", "qwen3.5-4b", "mamba2",
            "jamba")


def _bf16(lm: LoadedModel) -> LoadedModel:
    """A bf16 copy (the test helpers keep their models: casting one in place would change it for others)."""
    return LoadedModel(copy.deepcopy(lm.model).to(torch.bfloat16), lm.tokenizer, lm.model_id + " bf16", lm.markers)


def _tokens(events) -> tuple:
    done = list(events)[-1]
    return done.reasoning_ids, done.answer_ids


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_is_batch_invariant_and_ssr_writes_baselines_tokens_or_bf16_is_refused(family):
    lm = _bf16(family_model(family, dtype=torch.float32))
    capabilities(lm)  # the routes the probe decides (one token a forward where multi-token forwards ignore the state)
    inv = invariance(lm, False)  # on the route runs take, as the probe's own check measures it
    if inv.exact:
        cfg = RunConfig(**SMALL)
        assert _tokens(decode_ssr(lm, "hello there", cfg)) == _tokens(decode_baseline(lm, "hello there", cfg))
        return
    # refused: the choice keeps fp32 even where bf16 is faster, and says what was measured, where
    base = family_model(family, dtype=torch.float32)
    kept = decide(base, lm, {"float32": [10.0, 20.0, 15.0, 18.0, 12.0], "bfloat16": [5.0, 10.0, 8.0, 9.0, 6.0]},
                  lambda m: capabilities(m).check("batch invariance"))
    assert kept.dtype == "float32" and "not batch-invariant" in kept.why and inv.layer in kept.why
    assert family not in ("mistral-window", "gemma3", "qwen3-moe", "gpt2"), f"plain attention must hold: {inv}"


def test_ssr_with_shared_forks_and_lookups_in_bf16_writes_baselines_tokens():
    """The bundled-shaped llama in bf16, drafts riding (shared forks: a 4-D mask over every row's
    slots), lookups verified several tokens wide, several prompts."""
    lm = _bf16(make_model("llama", dtype=torch.float32, seed=3))
    cfg = RunConfig(max_think=24, max_answer=16, max_draft=8, draft_start=2, drafting="always", num_drafts=2)
    for prompt in ("one two three one two three", "count: 1 2 3 1 2 3 1 2", "hello"):
        assert _tokens(decode_ssr(lm, prompt, cfg)) == _tokens(decode_baseline(lm, prompt, cfg))


def test_no_module_differs_between_a_lone_token_and_the_same_token_batched():
    """Op by op: every module's output for a token fed alone equals its output for that token at
    every offset inside a wider forward and beside other rows."""
    lm = _bf16(make_model("qwen3", dtype=torch.float32, seed=1))
    vocab = lm.model.get_output_embeddings().weight.shape[0]
    ids = [(7 * i + 3) % vocab for i in range(40)]
    prefix, window = ids[:30], ids[30:]
    for j in range(len(window)):
        wide = (prefix, [window], slice(j, j + 1))
        assert _first_difference(lm, wide, (prefix + window[:j], [window[j : j + 1]], slice(0, 1))) is None, j
    others = [[(t * 5 + 1) % vocab for t in window], [(t * 11 + 2) % vocab for t in window]]
    assert _first_difference(lm, (prefix, [window, *others], slice(None)), (prefix, [window], slice(None))) is None


@pytest.mark.parametrize("keys", [3, 27, 64, 65, 130, 511, 513])
def test_padded_keys_leave_a_querys_attention_as_over_its_own_keys(keys):
    """The padding is masked: the result equals attention over the visible keys alone (to bf16's
    rounding against a float64 reference), for a bool mask, an additive one and the causal one."""
    torch.manual_seed(keys)
    q = torch.randn(1, 4, 1, 16, dtype=torch.bfloat16)
    k, v = torch.randn(2, 1, 2, keys, 16, dtype=torch.bfloat16)
    reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), enable_gqa=True)
    for mask in (None, torch.ones(1, 1, 1, keys, dtype=torch.bool), torch.zeros(1, 1, 1, keys, dtype=torch.bfloat16)):
        kk, vv, m = padded_keys(k, v, mask, 1, True)
        assert kk.shape[2] % KEY_BLOCK == 0 and kk.shape[2] - keys < KEY_BLOCK
        out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=m, enable_gqa=True)
        assert (out.double() - reference).abs().max() <= 4 * torch.finfo(torch.bfloat16).eps * reference.abs().max()


def _pair():
    base = make_model("llama", dtype=torch.float32)
    return base, _bf16(base)


def test_bf16_is_chosen_where_measured_faster_and_invariant():
    base, twin = _pair()
    picked = decide(base, twin, FASTER, invariance_of(exact=True))
    assert picked.dtype == "bfloat16" and "bitwise" in picked.why
    assert "a lone step at 64 tokens 20.0 against 40.0 ms" in picked.why and "a 4-token verify at 64 tokens" in picked.why
    assert "a 64-token prefill 45.0 against 90.0 ms" in picked.why and "not timed" not in picked.why


def test_a_cpu_without_fast_bf16_stays_on_float32_and_says_why():
    """Forced costs of a CPU that emulates bf16: fp32 stays, the invariance check is not even run."""
    base, twin = _pair()

    def never(_):
        raise AssertionError("the invariance check runs only where bf16 would pay")

    slower = {"float32": [90.0], "bfloat16": [400.0]}  # the timing stops at the first forward bf16 does not win
    only_lone = {"float32": [90.0, 40.0, 60.0], "bfloat16": [60.0, 30.0, 120.0]}  # a lone step faster, a verify slower
    for ms in (slower, only_lone):
        kept = decide(base, twin, ms, never)
        assert kept.dtype == "float32" and kept.why.startswith("float32, chosen at load: bfloat16 against float32")
        assert kept.why.endswith("(the other forwards not timed)")


def test_bf16_faster_but_not_invariant_stays_on_float32_with_the_measured_difference():
    base, twin = _pair()
    kept = decide(base, twin, FASTER, invariance_of(exact=False))
    assert kept.dtype == "float32" and "not batch-invariant" in kept.why and "model.layers.1.mlp" in kept.why


def invariance_of(exact: bool):
    """A scripted probe check (what ``numerics`` reads from the capability probe)."""
    from engine.runtime.capabilities import INVARIANCE, Check
    from engine.runtime.exact import Invariance

    found = Invariance({2: 0.0, 3: 0.0}, {4: 0.0 if exact else 0.25}, None if exact else "model.layers.1.mlp", 0.1)
    check = Check(INVARIANCE, True, 0.0) if exact else Check(INVARIANCE, False, reason=str(found))
    return lambda lm: check


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A model loaded from a folder (so its decision is cached), with the cache under tmp_path."""
    monkeypatch.setenv("SSR_STUDIO_CACHE", str(tmp_path / "cache"))
    return shutil.copytree(BUNDLED_DIR / "tiny-reasoner", tmp_path / "tiny-copy")


def test_the_choice_runs_in_the_chosen_precision_and_is_read_back_later(folder):
    costs = []

    def scripted(a, b):
        costs.append((a.dtype, b.dtype))
        return FASTER

    lm = choose(load_model(str(folder)), cost=scripted, check=invariance_of(exact=True))
    assert lm.dtype == "bfloat16" and next(lm.model.parameters()).dtype == torch.bfloat16
    assert lm.numerics.dtype == "bfloat16" and lm.numerics.cached is None and costs == [("float32", "bfloat16")]
    again = choose(load_model(str(folder)), cost=scripted, check=invariance_of(exact=True))
    assert again.dtype == "bfloat16" and costs == [("float32", "bfloat16")]  # read back, not measured again
    assert again.numerics.cached and again.numerics.why == lm.numerics.why
    assert "(measured on " in again.numerics.sentence


def test_the_real_measurement_times_both_precisions_at_each_context():
    base, twin = _pair()
    ms = numerics.step_costs(base, twin)
    fp32, bf16 = ms["float32"], ms["bfloat16"]
    assert 1 <= len(fp32) == len(bf16) <= len(numerics.SHAPES) and all(m > 0 for m in fp32 + bf16)
    if len(bf16) < len(numerics.SHAPES):  # stopped where bf16 did not win
        assert bf16[-1] > numerics.MARGIN * fp32[-1]


def test_dtype_forces_and_the_bundled_models_stay_float32(monkeypatch):
    monkeypatch.setattr(numerics, "choose", lambda *a, **k: pytest.fail("a settled precision is not measured"))
    forced = settle(load_model("tiny-reasoner", dtype="bfloat16"), "bfloat16")
    assert forced.dtype == "bfloat16" and forced.numerics.why == "bfloat16: as asked (--dtype)"
    bundled = settle(load_model("tiny-reasoner"), None)
    assert bundled.dtype == "float32" and "bundled models keep the float32" in bundled.numerics.why


def test_no_room_for_a_copy_keeps_float32_and_says_so(folder, monkeypatch):
    monkeypatch.setattr(numerics, "available_bytes", lambda device: 1024)
    lm = choose(load_model(str(folder)), cost=lambda *m: pytest.fail("nothing to measure"))
    assert lm.dtype == "float32" and lm.numerics.why.startswith("float32: no room to measure bfloat16 beside it")


def test_a_runs_stats_say_how_its_precision_was_chosen():
    lm = make_model("llama", dtype=torch.float32)
    lm.numerics = Numerics("float32", "float32, chosen at load: a lone step cost ...")
    done = list(decode_baseline(lm, "hi", RunConfig(max_think=4, max_answer=4)))[-1]
    assert done.stats.numerics == "float32, chosen at load: a lone step cost ..."
    assert done.stats.to_dict()["numerics"] == done.stats.numerics


def test_a_bf16_model_that_is_not_batch_invariant_is_refused_ssr_before_the_run():
    """A model forced into bf16 (``--dtype bfloat16``) on the CPU is probed for the route's property;
    where it fails, SSR and sd are refused before anything streams, with the measured difference and
    the first module, and plain decoding still runs (exact mode's own self-check decides there)."""
    from engine.methods.sd import decode_sd
    from engine.runtime.probe import MethodRefused

    lm = _bf16(family_model("mamba2", dtype=torch.float32))
    check = capabilities(lm).check("batch invariance")
    assert check is not None and not check.ok and "first differing layer" in str(check)
    events = []
    with pytest.raises(MethodRefused, match=r"SSR is refused on .*batch invariance: max logit difference.*--dtype float32"):
        events.extend(decode_ssr(lm, "hello there", RunConfig(**SMALL)))
    assert events == []
    with pytest.raises(MethodRefused, match="speculative decoding is refused"):
        list(decode_sd(lm, lm, "hello there", RunConfig(**SMALL)))
    list(decode_baseline(lm, "hello there", RunConfig(**SMALL)))  # plain decoding runs
    ok = _bf16(make_model("llama", dtype=torch.float32))
    assert capabilities(ok).check("batch invariance").ok
    assert capabilities(make_model("llama", dtype=torch.float32)).check("batch invariance") is None  # fp32: not this route


def test_the_strip_names_the_precision_and_says_on_hover_how_it_was_chosen(tmp_path):
    """Through the studio: a run's precision cell carries the numerics sentence as its tooltip (escaped
    at the strip's one place), and the run log and the replay keep it."""
    from ssr_ui.export import logged_view
    from ssr_ui.handlers import Studio
    from ssr_ui.render import metrics_html

    studio = Studio("tiny", db=str(tmp_path / "runs.db"))
    lm = make_model("llama", dtype=torch.float32)
    lm.numerics = Numerics("float32", 'float32, chosen at load: a "verify" <cost> measured')
    studio.add_model("tiny", lm)
    strip = list(studio.run("hello", "Baseline", "tiny", max_think=4, max_answer=4))[-1].metrics
    assert 'title="float32, chosen at load: a &quot;verify&quot; &lt;cost&gt; measured">float32<' in strip
    [row] = studio.log.runs(limit=1)
    assert row["numerics"] == 'float32, chosen at load: a "verify" <cost> measured'
    assert "&lt;cost&gt; measured" in metrics_html(logged_view(row, studio.log.events(row["id"])), "Baseline")
