"""The transformers peers (``hf``, ``hf-pld``, ``hf-static``) keep baseline's budget: under greedy
decoding they write baseline's reasoning and answer token for token (issue 30, item 4), on models
with a marker token, with a prompted marker (text over several tokens), and without markers.

Each case says what a peer without budget forcing would do instead (the tempting wrong answer).
"""

from __future__ import annotations

import functools

import pytest

from engine.benchmarks.agreement import agreement
from engine.config import RunConfig
from engine.events import DoneEvent, TokenEvent
from engine.methods.baseline import decode_baseline
from engine.registry import decoder
from engine.runtime.markers import ThinkMarkers
from engine.runtime.model import LoadedModel
from tests.tiny import current_token_only, make_model, with_tokens

PEERS = ("hf", "hf-pld", "hf-static")
PROMPT = "class Garden: rose. class Garden: rose"
CFG = RunConfig(max_think=10, max_answer=12)


@functools.cache
def _model(arch: str = "qwen3") -> LoadedModel:
    return make_model(arch, seed=1, init_scale=3.0)


def run(method: str, lm: LoadedModel, cfg: RunConfig = CFG, prompt: str = PROMPT) -> tuple[DoneEvent, list[TokenEvent]]:
    """The run's final event, and its token events (reasoning and answer streams, in order)."""
    events = list(decode_baseline(lm, prompt, cfg) if method == "baseline" else decoder(method, lm)(prompt, cfg))
    tokens = [e for e in events if isinstance(e, TokenEvent) and e.stream in ("reasoning", "answer")]
    return events[-1], tokens


def assert_peers_equal_baseline(lm: LoadedModel, cfg: RunConfig = CFG, prompt: str = PROMPT) -> DoneEvent:
    base, base_tokens = run("baseline", lm, cfg, prompt)
    for method in PEERS:
        done, tokens = run(method, lm, cfg, prompt)
        assert done.reasoning_ids == base.reasoning_ids, f"{method}: reasoning differs from baseline"
        assert done.answer_ids == base.answer_ids, f"{method}: answer differs from baseline"
        assert [(e.stream, e.token_id) for e in tokens] == [(e.stream, e.token_id) for e in base_tokens], method
        assert done.stats.reasoning_tokens == base.stats.reasoning_tokens
        assert done.stats.answer_tokens == base.stats.answer_tokens
        if method != "hf-pld":  # one forward per answer token, counted as baseline counts (prompt lookup: fewer)
            assert done.stats.answer_forwards == base.stats.answer_forwards, method
        _assert_timing_adds_up(done, tokens)
    return base


def _assert_timing_adds_up(done: DoneEvent, tokens: list[TokenEvent]) -> None:
    s = done.stats
    assert s.forward_calls > 0 and s.wall_s > 0
    assert s.prefill_s + s.reasoning_s + s.answer_s == pytest.approx(s.wall_s)
    assert min(s.prefill_s, s.reasoning_s, s.answer_s) >= 0
    times = [e.t for e in tokens]
    assert times == sorted(times) and all(0 <= t <= s.wall_s for t in times), "stamped when produced, in order"
    if done.answer_ids:
        assert s.ttft_s == next(e.t for e in tokens if e.stream == "answer")


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_budget_cut_reasoning(arch):
    """Wrong: generate() runs on past max_think (max_new_tokens = max_think + max_answer) and never
    writes the forced marker and tail."""
    lm = _model(arch)
    base = assert_peers_equal_baseline(lm)
    marker, tail = list(lm.markers.marker_ids), list(lm.markers.tail_ids)
    assert len(base.reasoning_ids) == CFG.max_think and base.reasoning_ids[-len(marker):] == marker  # forced
    assert base.answer_ids[: len(tail)] == tail and len(base.answer_ids) == CFG.max_answer


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_model_closes_by_itself(arch):
    """Wrong: forcing the marker anyway, or cutting the answer at max_answer less a tail never forced."""
    lm = _model(arch)
    never = run("baseline", lm)[0].reasoning_ids
    steered = with_tokens(lm, close=never[4])  # the 5th reasoning token is now the end-of-thinking marker
    base = assert_peers_equal_baseline(steered)
    assert base.reasoning_ids == never[: never.index(never[4]) + 1] and len(base.answer_ids) == CFG.max_answer


def test_marker_budget_of_the_marker_alone():
    """max_think equal to the marker's length: the model picks nothing (wrong: a generate() of 0 tokens)."""
    lm = _model()
    base = assert_peers_equal_baseline(lm, CFG.replace(max_think=len(lm.markers.marker_ids)))
    assert base.reasoning_ids == list(lm.markers.marker_ids)


def test_answer_budget_smaller_than_the_forced_tail():
    """The forced tail is the answer's first tokens: max_answer 1 leaves no call for the answer."""
    lm = _model()
    base = assert_peers_equal_baseline(lm, CFG.replace(max_answer=1))
    assert base.answer_ids == list(lm.markers.tail_ids)


def test_end_of_sequence_inside_the_reasoning_ends_the_run():
    """A marker-token model that ends its turn while reasoning has no answer (wrong: answering on)."""
    lm = _model()
    never = run("baseline", lm)[0].reasoning_ids
    steered = with_tokens(lm, eos=never[3])
    base = assert_peers_equal_baseline(steered)
    assert base.answer_ids == [] and len(base.reasoning_ids) == never.index(never[3])


def test_model_without_markers_answers_max_answer_tokens():
    """A base model: its whole output is the answer, max_answer tokens (wrong: max_think + max_answer)."""
    lm = _model()
    base_model = LoadedModel(lm.model, lm.tokenizer, "tiny-base", None)
    base = assert_peers_equal_baseline(base_model, CFG.replace(max_answer=20))
    assert base.reasoning_ids == [] and len(base.answer_ids) == 20


def prompted(lm: LoadedModel, close_text: str, eos: int | None = None) -> LoadedModel:
    """``lm`` as a prompted model: its end of thinking is ``close_text``, as text over several tokens."""
    tok = lm.tokenizer
    close = tuple(tok.encode(close_text, add_special_tokens=False))
    markers = ThinkMarkers(lm.markers.open_ids, close, lm.markers.tail_ids, close_text, prompted=True,
                           decode=lambda ids: tok.decode(ids, clean_up_tokenization_spaces=False))
    out = LoadedModel(lm.model, tok, f"{lm.model_id}-prompted", markers)
    if eos is not None:
        out.eos_ids = frozenset({eos})
    return out


def test_prompted_budget_forces_every_token_of_the_marker():
    """Wrong: forcing one token, or looking for the marker's ids instead of its text."""
    lm = prompted(_model(), "\x01never\x01")
    base = assert_peers_equal_baseline(lm, CFG.replace(max_think=12))
    marker = list(lm.markers.marker_ids)
    assert len(marker) > 1 and len(base.reasoning_ids) == 12 and base.reasoning_ids[-len(marker):] == marker


def test_prompted_model_closes_across_tokens():
    """The model writes the close itself, its text split across two of its tokens: the reasoning ends
    at the token that completes it (wrong: never, since the canonical ids never appear)."""
    lm = _model()
    never = run("baseline", prompted(lm, "\x01never\x01"), CFG.replace(max_think=24))[0].reasoning_ids
    tok = lm.tokenizer
    cut = next(i for i in range(3, len(never)) if tok.decode(never[i - 1 : i]).strip()
               and tok.decode(never[i : i + 1]).strip() and "\ufffd" not in tok.decode(never[i - 1 : i + 1]))
    close = tok.decode(never[cut - 1 : cut])[-1:] + tok.decode(never[cut : cut + 1])[:1]
    base = assert_peers_equal_baseline(prompted(lm, close), CFG.replace(max_think=24))
    assert len(base.reasoning_ids) <= cut + 1 and close in tok.decode(base.reasoning_ids)


def test_prompted_end_of_turn_inside_the_reasoning_is_forced_closed():
    """A prompted model's end of turn inside its reasoning: the marker replaces it and the model answers
    (ThinkBudget.ends_run; wrong: no answer)."""
    lm = _model()
    never = run("baseline", prompted(lm, "\x01never\x01"), CFG.replace(max_think=24))[0].reasoning_ids
    steered = prompted(lm, "\x01never\x01", eos=never[5])
    base = assert_peers_equal_baseline(steered, CFG.replace(max_think=24))
    assert base.reasoning_ids == never[: never.index(never[5])] + list(steered.markers.marker_ids) and base.answer_ids


def test_prompt_lookup_accepting_past_the_close():
    """A model that repeats itself (its logits depend on the current token alone) on a prompt that
    holds its reasoning: prompt lookup accepts several tokens in one step, the close among them; the
    tokens after it are not reasoning (wrong: keeping them, or the cache that saw them)."""
    lm = current_token_only(make_model("llama", seed=3, init_scale=3.0))
    cfg = RunConfig(max_think=40, max_answer=16)
    never = run("baseline", lm, cfg, "hello world")[0].reasoning_ids  # the same on any prompt: one token decides
    prompt = "hello world " + lm.tokenizer.decode(never[1:12])
    close = never[4]
    assert close not in never[:4], "precondition: the close is first written inside a lookup"
    steered = with_tokens(lm, close=close)
    pld = run("hf-pld", steered, cfg, prompt)[0]
    assert pld.stats.forward_calls < len(pld.reasoning_ids) + len(pld.answer_ids) - 4, \
        "precondition: prompt lookup takes several tokens per forward"
    base = assert_peers_equal_baseline(steered, cfg, prompt)
    assert base.reasoning_ids == never[:5]


def test_sliding_window_family():
    """A sliding-window model (gemma3): the answer's generate() reuses the reasoning's cache."""
    from tests.families import family_model

    lm = family_model("gemma3")
    assert_peers_equal_baseline(lm, CFG.replace(max_think=14))


# ---------------------------------------------------------------- agreement: numeric, budget or length


def _ids(done: DoneEvent) -> list[int]:
    return done.reasoning_ids + done.answer_ids


def test_agreement_tells_a_length_difference_from_a_numeric_one():
    """Wrong: "diverged at token 22 (top-2 logit margin ...)" for a run that only wrote more."""
    lm = _model()
    ids = _ids(run("baseline", lm)[0])
    longer = agreement(lm, PROMPT, ids, ids + [7, 8, 9], CFG.max_think, name="hf")
    assert longer.kind == "length" and not longer.identical and longer.diverged_at is None and longer.margin is None
    assert str(longer) == (f"hf wrote {len(ids) + 3} tokens, baseline {len(ids)}, the same up to there: "
                           "a budget or length difference, not a numeric one")
    shorter = agreement(lm, PROMPT, ids, ids[:5])
    assert shorter.kind == "length" and str(shorter).startswith(f"this run wrote 5 tokens, baseline {len(ids)}")
    other = ids[:5] + [(ids[5] + 1) % 200] + ids[6:]
    numeric = agreement(lm, PROMPT, ids, other, CFG.max_think, name="hf")
    assert numeric.kind == "numeric" and numeric.diverged_at == 5 and numeric.margin > 0
    assert str(numeric).startswith("diverged at token 5 (top-2 logit margin ")
    assert str(agreement(lm, PROMPT, ids, list(ids), CFG.max_think)) == "identical"


def test_agreement_tells_a_budget_forced_close_from_a_numeric_divergence():
    """A run that wrote on where baseline's budget forced the marker (a peer without budget forcing):
    a budget difference, with no margin (wrong: the margin of the model's own pick there)."""
    lm = _model()
    ids = _ids(run("baseline", lm)[0])
    wrote_on = _ids(run("baseline", lm, CFG.replace(max_think=40))[0])  # the model never closes by itself
    at = CFG.max_think - len(lm.markers.marker_ids)
    assert wrote_on[:at] == ids[:at] and wrote_on[at] != ids[at], "precondition: they part at the forced marker"
    a = agreement(lm, PROMPT, ids, wrote_on, CFG.max_think, name="hf")
    assert a.kind == "budget" and a.at == at and a.forced_by == "baseline" and a.margin is None
    assert str(a) == (f"baseline's budget forced the end of thinking at token {at}, where hf's model wrote on "
                      "(the same tokens before it): a budget difference, not a numeric one")
    b = agreement(lm, PROMPT, wrote_on, ids, CFG.max_think, name="hf")  # the other way round: hf's budget forced it
    assert b.kind == "budget" and b.forced_by == "hf" and "where baseline's model wrote on" in str(b)
