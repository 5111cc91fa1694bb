"""Classic speculative decoding (``sd``) and transformers' assisted generation (``hf-assisted``).

Greedy ``sd`` must equal plain decoding token for token whatever its draft: the target itself (every
proposal accepted), the target's weights scaled (some accepted), another seed (almost none), on every
tiny architecture and template style, at every budget extreme (a budget of the marker alone, an
answer budget below the forced tail), with an end of sequence inside the reasoning and the answer, a
stray close, a prompted model (its close as text, its end of turn inside its reasoning), thinking
off, no think markers, and on the model families (sliding windows, recurrent states, longrope
across its switch). Sampled, its outputs fit plain decoding's exact law (the enumeration of
``tests/test_sampling_exact``), and the same fit rejects a broken rule. A draft of another
tokenizer is refused before any event, and the forwards add up (``tests/test_forwards``).
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from engine.config import RunConfig
from engine.events import ForwardEvent, TokenEvent
from engine.methods import sampling
from engine.methods.baseline import decode_baseline
from engine.methods.peers import decode_hf
from engine.methods.sd import DRAFT_ROW, LOOKAHEAD, PROPOSER, decode_sd
from engine.runtime.model import LoadedModel, load_model
from tests.families import SWITCH, family_model
from tests.test_forwards import assert_adds_up
from tests.test_peers_budget import prompted
from tests.tiny import ARCHS, make_model, make_small_vocab_model, position_only, with_tokens

PROMPTS = ("hello world", "class Garden: rose")
SMALL = RunConfig(max_think=16, max_answer=20)
EXTREMES = {
    "small": SMALL,
    "tiny-budgets": RunConfig(max_think=2, max_answer=3),
    "marker-alone": RunConfig(max_think=1, max_answer=6),  # the model picks no reasoning token: the marker is forced
    "answer-below-tail": RunConfig(max_think=6, max_answer=1),  # the forced tail spends the answer's budget
}


@functools.cache
def model(arch: str, style: str = "open", seed: int = 0, scale: float = 3.0) -> LoadedModel:
    return make_model(arch, seed=seed, style=style, init_scale=scale)


def drafts(arch: str, style: str = "open") -> dict[str, LoadedModel]:
    """The extremes of a draft: the target itself (always right), its weights scaled (sometimes right),
    another seed (almost never right)."""
    return {"self": model(arch, style), "near": model(arch, style, scale=2.5), "other": model(arch, style, seed=1)}


def final(events):
    return list(events)[-1]


@functools.cache
def _baseline(lm, prompt, cfg):
    return final(decode_baseline(lm, prompt, cfg))


def assert_same(lm, draft, prompt, cfg, **kw):
    base = _baseline(lm, prompt, cfg)
    sd = final(decode_sd(lm, draft, prompt, cfg, **kw))
    assert sd.reasoning_ids == base.reasoning_ids, "reasoning differs from baseline"
    assert sd.answer_ids == base.answer_ids, "answer differs from baseline"
    assert sd.answer_text == base.answer_text
    return sd, base


# ----------------------------------------------------------------------------- greedy: token-identical to baseline

@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("which", ["self", "near", "other"])
def test_greedy_equality(arch, which):
    lm, draft = model(arch), drafts(arch)[which]
    for name, cfg in EXTREMES.items():
        for prompt in PROMPTS if name == "small" else PROMPTS[:1]:
            assert_same(lm, draft, prompt, cfg)
    for lookahead in (1, 7):
        assert_same(lm, draft, PROMPTS[1], SMALL, lookahead=lookahead)


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_greedy_equality_when_the_template_leaves_the_think_block_to_the_model(arch):
    for draft in drafts(arch, "model").values():
        for prompt in PROMPTS:
            assert_same(model(arch, "model"), draft, prompt, SMALL)


def test_a_draft_always_right_is_taken_whole():
    lm = model("llama")
    sd, base = assert_same(lm, lm, PROMPTS[0], SMALL)
    s = sd.stats
    assert s.rejected == 0 and s.verify_accepted == s.verify_proposed > 0, "the target agrees with itself"
    main = [f for f in final_forwards(lm, lm, PROMPTS[0], SMALL) if f.rows[0].row == "main"]
    assert len(main) < base.stats.forward_calls / 2, "a verify takes up to LOOKAHEAD + 1 tokens"
    assert max(f.rows[0].kept for f in main) == LOOKAHEAD + 1


def test_a_draft_always_wrong_is_still_exact():
    lm, draft = position_only(make_model("gpt2", seed=5)), model("gpt2", seed=1)
    sd, _ = assert_same(lm, draft, PROMPTS[0], SMALL)
    assert sd.stats.accepted == 0 and sd.stats.verify_proposed > 0


def final_forwards(lm, draft, prompt, cfg) -> list[ForwardEvent]:
    return [e for e in decode_sd(lm, draft, prompt, cfg) if isinstance(e, ForwardEvent)]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_end_of_sequence_inside_the_reasoning_ends_the_run(arch):
    lm = model(arch)
    never = _baseline(lm, PROMPTS[0], SMALL).reasoning_ids
    steered = with_tokens(lm, eos=never[3])
    for draft in drafts(arch).values():
        sd, _ = assert_same(steered, draft, PROMPTS[0], SMALL)
        assert sd.answer_ids == [] and len(sd.reasoning_ids) == never.index(never[3])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_end_of_sequence_inside_the_answer_and_a_stray_close(arch):
    lm = model(arch)
    base = _baseline(lm, PROMPTS[1], SMALL)
    tail = len(lm.markers.tail_ids)
    for steered in (with_tokens(lm, eos=base.answer_ids[tail + 3]), with_tokens(lm, close=base.reasoning_ids[4])):
        for draft in drafts(arch).values():
            assert_same(steered, draft, PROMPTS[1], SMALL)


def test_a_model_without_markers_answers_max_answer_tokens():
    lm = model("qwen3")
    base_model = LoadedModel(lm.model, lm.tokenizer, "tiny-base", None)
    for draft in drafts("qwen3").values():
        sd, _ = assert_same(base_model, draft, PROMPTS[0], SMALL)
        assert sd.reasoning_ids == [] and len(sd.answer_ids) == SMALL.max_answer


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_prompted_models(arch):
    """The close as text over several tokens: forced at the budget, written by the model across its own
    tokens, or forced in place of an end of turn inside the reasoning."""
    lm = model(arch)
    cfg = SMALL.replace(max_think=24)
    never = prompted(lm, "\x01never\x01")
    reasoning = _baseline(never, PROMPTS[0], cfg).reasoning_ids
    tok = lm.tokenizer
    cut = next(i for i in range(3, len(reasoning)) if tok.decode(reasoning[i - 1: i]).strip()
               and tok.decode(reasoning[i: i + 1]).strip() and "\ufffd" not in tok.decode(reasoning[i - 1: i + 1]))
    across = tok.decode(reasoning[cut - 1: cut])[-1:] + tok.decode(reasoning[cut: cut + 1])[:1]
    for steered in (never, prompted(lm, across), prompted(lm, "\x01never\x01", eos=reasoning[5])):
        for draft in drafts(arch).values():
            sd, _ = assert_same(steered, draft, PROMPTS[0], cfg)
    assert sd.reasoning_ids[-len(steered.markers.marker_ids):] == list(steered.markers.marker_ids) and sd.answer_ids


@functools.cache
def reasoner_and_draft() -> tuple[LoadedModel, LoadedModel]:
    """The bundled tiny reasoner (its template has a thinking switch), and a draft of its tokenizer: its
    weights scaled."""
    lm = load_model("tiny-reasoner")
    weights = copy.deepcopy(lm.model)
    with torch.no_grad():
        for p in weights.parameters():
            p.mul_(0.9)
    return lm, LoadedModel(weights, lm.tokenizer, "tiny-reasoner-scaled", lm.markers)


def test_thinking_off():
    lm, draft = reasoner_and_draft()
    cfg = RunConfig(thinking=False, max_think=10, max_answer=24)
    for d in (lm, draft):
        sd, _ = assert_same(lm, d, "What is 12 * 7? Explain.", cfg)
        assert sd.reasoning_ids == [] and sd.answer_ids


FAST_FAMILIES = ("mistral-window", "gemma-4-e4b-it", "qwen3.5-4b", "phi3-longrope")


@pytest.mark.parametrize("family", FAST_FAMILIES)
def test_families(family):
    """A sliding window, the paper's two layouts (sliding + KV sharing; Gated DeltaNet, recurrent: a
    rollback re-reads from its mark), longrope run across its switch (wrong: a verify that crosses it
    before its first kept logit, which encodes every position with the long factors)."""
    lm, draft = family_model(family), family_model(family, seed=1)
    prompt = PROMPTS[1]
    if family == "phi3-longrope":
        assert len(lm.prompt_ids(prompt)) < SWITCH < len(lm.prompt_ids(prompt)) + 10, "precondition: the run crosses it"
    for cfg in (RunConfig(max_think=10, max_answer=10), RunConfig(max_think=2, max_answer=3)):
        for d in (lm, draft):
            assert_same(lm, d, prompt, cfg)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["gemma2", "gemma3", "gpt-oss", "olmo3", "exaone4", "qwen3-next", "lfm2",
                                    "nemotron-h", "mamba", "jamba", "deepseek-v3"])
def test_more_families(family):
    lm, draft = family_model(family), family_model(family, seed=1)
    for d in (lm, draft):
        assert_same(lm, d, PROMPTS[0], RunConfig(max_think=10, max_answer=10))


def test_dynamic_ntk_is_refused_past_its_switch_and_exact_below_it():
    """A verify encodes its tokens at its last one's length, where plain decoding encodes each at its own."""
    lm, draft = family_model("llama-dynamic"), family_model("llama-dynamic", seed=1)
    with pytest.raises(ValueError, match="dynamic"):
        next(decode_sd(lm, draft, PROMPTS[0], SMALL))
    assert_same(lm, draft, PROMPTS[0], RunConfig(max_think=3, max_answer=4))


# ----------------------------------------------------------------------------- sampling: plain decoding's law

@pytest.fixture
def sampled_sd(monkeypatch):
    """tests/test_sampling_exact's fit, run on sd with a draft of another seed (same eight words)."""
    from tests import test_sampling_exact as exact

    draft = make_small_vocab_model(seed=7, init_scale=5.0)
    monkeypatch.setattr(exact, "decode_ssr", lambda lm, prompt, cfg: decode_sd(lm, draft, prompt, cfg))
    return exact


# max_think 4: reasoning proposals too (room 3); answers up to 3 tokens, proposals up to 2
SAMPLED = {"temperature-1": RunConfig(max_think=4, max_answer=3, temperature=1.0),
           "top-p-0.8": RunConfig(max_think=4, max_answer=3, temperature=0.8, top_p=0.8)}


@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_sd_sampling_fits_the_exact_baseline_law(name, sampled_sd):
    assert sampled_sd.fit_pvalue(SAMPLED[name], runs=1000) > 1e-3


def test_the_fit_detects_accepting_every_proposal(sampled_sd, monkeypatch):
    monkeypatch.setattr(sampling, "verify_sampled", sampled_sd._always_accept)
    assert sampled_sd.fit_pvalue(SAMPLED["temperature-1"], runs=1000) < 1e-4


# ----------------------------------------------------------------------------- refusals and the forwards

def test_a_draft_of_another_tokenizer_is_refused_before_any_event():
    lm, other = model("llama"), make_small_vocab_model()
    with pytest.raises(ValueError, match="do not share a tokenizer"):
        next(decode_sd(lm, other, PROMPTS[0], SMALL))
    with pytest.raises(ValueError, match="do not share a tokenizer"):
        next(decode_hf(lm, PROMPTS[0], SMALL, assistant=other))
    with pytest.raises(ValueError, match="lookahead"):
        next(decode_sd(lm, lm, PROMPTS[0], SMALL, lookahead=0))


@pytest.mark.parametrize("cfg", [
    RunConfig(max_think=6, max_answer=5),  # both budgets cut: the forced marker and tail
    RunConfig(max_think=40, max_answer=30),
    RunConfig(max_think=40, max_answer=30, temperature=0.8, seed=5),
    RunConfig(thinking=False, max_think=10, max_answer=24),
])
def test_the_forwards_add_up(cfg):
    lm, draft = reasoner_and_draft()
    for d in (lm, draft):
        events = list(decode_sd(lm, d, "Start with 7. 7 plus 5", cfg))
        assert_adds_up(events)
        _assert_the_draft_pane(events)


def test_the_forwards_add_up_with_recurrent_rollbacks():
    lm, draft = family_model("qwen3.5-4b"), family_model("qwen3.5-4b", seed=1)
    events = list(decode_sd(lm, draft, PROMPTS[0], RunConfig(max_think=10, max_answer=10)))
    assert_adds_up(events)
    rereads = [f for f in events if isinstance(f, ForwardEvent) and f.rows[0].kept == 0 and f.phase != "prefill"]
    assert rereads, "a recurrent state's rollback re-reads its kept tokens: recorded as a forward"


def test_a_recurrent_models_rereads_stay_one_rounds():
    """Each round's rollback re-reads from a mark where the last round kept its text: the tokens re-read
    over a run are at most a round's proposal per round, not the whole text each round (quadratic)."""
    lm, draft = family_model("qwen3.5-4b"), family_model("qwen3.5-4b", seed=1)
    events = list(decode_sd(lm, draft, PROMPTS[0], RunConfig(max_think=40, max_answer=30)))
    rounds = [f for f in events if isinstance(f, ForwardEvent) and f.rows[0].row == "main" and f.rows[0].proposed]
    assert len(rounds) > 10
    for row in ("main", DRAFT_ROW):
        rereads = [f.rows[0].fed for f in events if isinstance(f, ForwardEvent) and f.rows[0].row == row
                   and f.rows[0].kept == 0 and f.phase != "prefill"]
        # a round re-reads what it owed and kept (its proposal and pick; a forced marker once): linear in the rounds
        assert rereads and sum(rereads) <= (LOOKAHEAD + 2) * len(rounds) + 16, (row, rereads)


def _assert_the_draft_pane(events) -> None:
    """The draft model's forwards are row "draft 0", each writing one token of draft 0; each draft token ends
    accepted or rejected; the verifies name the draft model; the stats count both models."""
    done = events[-1]
    forwards = [e for e in events if isinstance(e, ForwardEvent)]
    assert {r.row for f in forwards for r in f.rows} <= {"main", DRAFT_ROW}
    assert {r.proposer for f in forwards for r in f.rows if r.proposed} <= {PROPOSER}
    verdicts = {}
    for e in events:
        if isinstance(e, TokenEvent) and e.stream == "draft":
            assert e.draft == 0
            verdicts[e.position] = e.status
    assert set(verdicts.values()) <= {"accepted", "rejected"} and len(verdicts) == done.stats.draft_tokens
    assert list(verdicts.values()).count("accepted") == done.stats.verify_accepted
    answer = [e for e in events if isinstance(e, TokenEvent) and e.stream == "answer"]
    assert done.stats.accepted == sum(e.status == "accepted" and e.source == "draft" for e in answer)
    s = done.stats
    assert s.flops == pytest.approx(s.target_flops + s.draft_flops) and s.draft_model_tokens > 0 and s.cache_mb


# ----------------------------------------------------------------------------- hf-assisted: transformers' own

@pytest.mark.parametrize("arch", ["llama", "qwen3", "gpt2"])
def test_hf_assisted_equals_baseline(arch):
    """transformers' assisted generation, on baseline's budget, is token-identical to baseline, with the
    target as its own assistant and with another seed's; its draft model's forwards are recorded and add up."""
    lm = model(arch, seed=1)
    cases = [(lm, SMALL), (lm, RunConfig(max_think=40, max_answer=12)), (lm, RunConfig(max_think=2, max_answer=3)),
             (LoadedModel(lm.model, lm.tokenizer, "tiny-base", None), SMALL)]
    for target, cfg in cases:
        base = _baseline(target, PROMPTS[1], cfg)
        for draft in (lm, model(arch, seed=2)):
            events = list(decode_hf(target, PROMPTS[1], cfg, assistant=draft))
            done = events[-1]
            assert (done.reasoning_ids, done.answer_ids) == (base.reasoning_ids, base.answer_ids), arch
            assert_adds_up(events)
    assert lm.model.generation_config.num_assistant_tokens is None, "the assistant's own settings are put back"


def test_the_strip_says_what_the_draft_model_cost(studio):
    """sd's own strip cell (its record's ``cells``): the draft model's tokens and seconds, of the run's."""
    frames = list(studio.run(PROMPTS[0], "Speculative decoding", "tiny", draft_model="tiny-draft", max_think=12,
                             max_answer=8))
    strip = frames[-1].metrics
    assert "draft model" in strip and "tokens read in" in strip, strip
    rounds = float(strip.split("proposing ")[1].split(" a round")[0])  # the rounds' mean, at most the lookahead
    assert 0 < rounds <= LOOKAHEAD
