"""Prompted reasoning: a chat model without a marker token reasons when asked, and its end of
thinking is text over several tokens (engine.runtime.markers).

The close is found on the decoded text, whatever the split (a table, each row with the tempting
wrong answer); greedy SSR equals plain decoding token for token on tiny random models whose close
the model writes itself (split across tokens), is forced by the budget, or is forced by an end of
turn inside the reasoning.
"""

from __future__ import annotations

import functools

import pytest

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.budget import ThinkBudget
from engine.methods.ssr.loop import decode_ssr
from engine.runtime.markers import PROMPTED_INSTRUCTION, ThinkMarkers, chat_prompt_ids, find_markers
from engine.runtime.model import LoadedModel
from tests.tiny import ARCHS, make_model, make_tokenizer

PIECES = ["a", "</", "think", ">", "b", "</think>\n\n", ".</th", "ink>", "</think", "<", "think>", "</thin", "k",
          "</think>", "<think>", "é", "</ think>", "\n\n", "x"]
ID = {p: i for i, p in enumerate(PIECES)}


def table_markers() -> ThinkMarkers:
    return ThinkMarkers((ID["<think>"],), (ID["</"], ID["think"], ID[">"]), (ID["\n\n"],), prompted=True,
                        decode=lambda ids: "".join(PIECES[i] for i in ids))


CLOSES = [  # (the reasoning's pieces, how many are reasoning: the marker's last piece included)
    (["a", "</", "think", ">", "b"], 4),  # wrong: never (the canonical split's ids as one run are not looked for)
    (["a", "</think>\n\n", "b"], 2),  # wrong: never (one token holds the marker and the tail)
    ([".</th", "ink>", "x"], 2),  # wrong: never (the marker starts inside a token)
    (["</think", ">"], 2),  # wrong: 1 (a prefix of the marker is not the marker)
    (["<", "</", "think>"], 3),  # wrong: never ("<</think>": text before the marker in its first token)
    (["</thin", "k", ">", "x"], 3),
    (["</think>", "</think>"], 1),  # wrong: 2 (the first close ends it)
    (["<think>", "x", "a"], None),  # wrong: 1 (the opening tag contains "think>", not "</think>")
    (["</ think>", "x"], None),  # wrong: 1 (a space inside is another text)
    (["é", "</think>"], 2),
]


@pytest.mark.parametrize("pieces, end", CLOSES)
def test_the_close_is_found_in_the_text_however_split(pieces, end):
    m = table_markers()
    ids = [ID[p] for p in pieces]
    assert m.reasoning_end(ids) == end
    assert [m.closes_at(ids, i) for i in range(len(ids))] == [end is not None and i == end - 1 for i in range(len(ids))]


def test_a_lookup_proposal_stops_before_the_close():
    m = table_markers()
    context = [ID["a"], ID["</"]]
    assert m.before_close(context, [ID["think"], ID[">"], ID["b"]]) == 1  # "think" may follow, ">" would close it
    assert m.before_close([ID["a"]], [ID["b"], ID["x"]]) == 2
    assert m.before_close([], [ID["</think>"]]) == 0


def test_a_marker_token_closes_by_its_id_only():
    tok = make_tokenizer()
    m = find_markers(tok)
    assert not m.prompted and len(m.marker_ids) == 1
    text_close = tok.encode("</", add_special_tokens=False) + tok.encode("think>", add_special_tokens=False)
    assert m.reasoning_end(text_close) is None  # on a reasoning model "</think>" as text is just text
    assert m.reasoning_end([5, m.marker_ids[0], 6]) == 2


def test_a_chat_model_without_a_marker_token_is_prompted_and_a_base_model_does_not_reason():
    tok = make_tokenizer()
    tok.chat_template = tok.chat_template.replace("'<|im_start|>assistant\\n<think>\\n'", "'<|im_start|>assistant\\n'")
    m = find_markers(tok, _NoMarker())
    assert m.prompted and m.close_text == "</think>"
    text = tok.decode(chat_prompt_ids(tok, m, "hello"))
    assert PROMPTED_INSTRUCTION in text and text.endswith("<think>\n")
    tok.chat_template = None
    assert find_markers(tok, _NoMarker()) is None


class _NoMarker:
    """A preset whose marker is no token of the tiny vocabulary (as ``</think>`` is none of SmolLM2's)."""

    think_open, think_close, close_tail = "<think>\n", "</thinking>", "\n\n"


def test_the_budget_forces_every_token_of_the_marker():
    m = table_markers()
    budget = ThinkBudget(m, 5)
    assert budget.picks == 2 and not budget.spent(1) and budget.spent(2)
    assert budget.force() == [ID["</"], ID["think"], ID[">"]] and budget.forced == [ID["\n\n"]]
    with pytest.raises(ValueError, match="max_think=2 must be at least 3"):
        ThinkBudget(m, 2)


# --- greedy SSR == plain decoding on prompted tiny models ----------------------------------------------------

@functools.cache
def _model(arch: str):
    return make_model(arch, seed=1, init_scale=3.0)


def prompted(lm: LoadedModel, close_text: str, eos: int | None = None) -> LoadedModel:
    """``lm`` reasoning as a prompted model whose end of thinking is ``close_text``, as text."""
    tok = lm.tokenizer
    base = lm.markers
    m = ThinkMarkers(base.open_ids, tuple(tok.encode(close_text, add_special_tokens=False)), base.tail_ids, close_text,
                     prompted=True, decode=lambda ids: tok.decode(ids, clean_up_tokenization_spaces=False))
    out = LoadedModel(lm.model, tok, f"{lm.model_id}-prompted", m)
    if eos is not None:
        out.eos_ids = frozenset({eos})
    return out


def run(decode, lm, prompt, cfg):
    return list(decode(lm, prompt, cfg))[-1]


def assert_same(lm, prompt, cfg):
    base, ssr = run(decode_baseline, lm, prompt, cfg), run(decode_ssr, lm, prompt, cfg)
    assert ssr.reasoning_ids == base.reasoning_ids, "reasoning differs from baseline"
    assert ssr.answer_ids == base.answer_ids, "answer differs from baseline"
    return base


CFG = RunConfig(max_think=24, max_answer=16, max_draft=12, draft_start=4)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("prompt", ["hello world", "class Garden: rose", "héllo 😀 日本語"])
def test_ssr_equals_baseline_when_the_model_closes_by_itself_across_tokens(arch, prompt):
    never = prompted(_model(arch), "\x01never\x01")
    reasoning = run(decode_baseline, never, prompt, CFG).reasoning_ids
    dec = never.markers.decode
    own = len(reasoning) - len(never.markers.marker_ids)  # the model's own tokens: the budget forced the rest
    # a close the model will write itself: the text of two to four of its own tokens (a character of several
    # byte tokens, or characters across a token boundary)
    close = next(t for i in range(3, own) for k in (2, 3, 4) if i >= k - 1
                 and (t := dec(reasoning[i - k + 1 : i + 1])).strip() and "\ufffd" not in t)
    lm = prompted(_model(arch), close)
    base = assert_same(lm, prompt, CFG)
    first = next(i for i in range(len(reasoning)) if close in dec(reasoning[: i + 1]))
    assert base.reasoning_ids == reasoning[: first + 1], "the reasoning ends at the token that completes the close"
    assert close not in dec(reasoning[:first])


@pytest.mark.parametrize("arch", ARCHS)
def test_ssr_equals_baseline_when_the_budget_forces_the_close(arch):
    lm = prompted(_model(arch), "\x01never\x01")
    cfg = CFG.replace(max_think=12)
    base = assert_same(lm, "class Garden: rose", cfg)
    marker = list(lm.markers.marker_ids)
    assert len(base.reasoning_ids) == 12 and base.reasoning_ids[-len(marker):] == marker
    assert base.answer_ids[: len(lm.markers.tail_ids)] == list(lm.markers.tail_ids)


@pytest.mark.parametrize("arch", ARCHS)
def test_an_end_of_turn_inside_a_prompted_reasoning_closes_it(arch):
    never = prompted(_model(arch), "\x01never\x01")
    reasoning = run(decode_baseline, never, "hello world", CFG).reasoning_ids
    eos = reasoning[6]  # a token the model writes in its reasoning, taken as its end of turn
    lm = prompted(_model(arch), "\x01never\x01", eos=eos)
    base = assert_same(lm, "hello world", CFG)
    at = reasoning.index(eos)
    assert base.reasoning_ids == reasoning[:at] + list(lm.markers.marker_ids), "the marker replaces the end of turn"
    assert base.answer_ids, "and the model answers"
