"""Incremental detokenization, run configuration validation, events."""

from __future__ import annotations

import pytest

from engine.config import RunConfig
from engine.methods.detok import IncrementalDetokenizer
from engine.methods.ssr.loop import decode_ssr
from tests.tiny import make_model, make_tokenizer

TEXTS = ["héllo wörld naïve café", "😀 日本語 and 🙂🙃", "class Garden:\n    def __init__(self):", "a\u0301 ≠ á"]


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_concatenate_to_decoded_text(text):
    tok = make_tokenizer()
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok)
    pieces = [d.push(t) for t in ids]
    assert "".join(pieces) + d.flush() == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces), "a piece split a multi-byte character"


def test_event_pieces_rebuild_every_stream():
    lm = make_model("qwen3", init_scale=3.0)
    events = list(decode_ssr(lm, "héllo 😀", RunConfig(max_think=12, draft_start=2, max_draft=8, max_answer=10)))
    done = events[-1]
    for stream in ("reasoning", "answer"):
        text = "".join(e.text for e in events if e.kind == "token" and e.stream == stream)
        assert done.answer_text.startswith(text) if stream == "answer" else done.reasoning_text.startswith(text)
    draft_tokens = [e for e in events if e.kind == "token" and e.stream == "draft" and e.status == "generated"]
    assert [e.token_id for e in draft_tokens] == done.drafts[0]
    assert [e.position for e in draft_tokens] == list(range(len(done.drafts[0])))
    assert [e.phase for e in events if e.kind == "phase"] == ["prefill", "reasoning", "drafting", "answer", "done"]


@pytest.mark.parametrize("field, value, message, got", [
    ("max_think", 0, "(max_think) must be", "got 0"),
    ("max_answer", -1, "(max_answer) must be", "got -1"),
    ("draft_start", -5, "(draft_start) must be", "got -5"),
    ("temperature", -0.1, "(temperature) must be", "got -0.1"),
    ("temperature", float("nan"), "(temperature) must be", "got nan"),
    ("top_p", 0.0, "(top_p) must be", "got 0.0"),
    ("top_p", 1.5, "(top_p) must be", "got 1.5"),
    ("max_spec", 0, "(max_spec) must be", "got 0"),
    ("min_match", 0, "(min_match) must be", "got 0"),
    ("num_drafts", 0, "(num_drafts) must be", "got 0"),
    ("spec_factor", -1.0, "(spec_factor) must be", "got -1.0"),
])
def test_invalid_values_name_the_field(field, value, message, got):
    with pytest.raises(ValueError) as err:
        RunConfig(**{field: value})
    assert message in str(err.value) and str(err.value).endswith(got)


def test_ssr_needs_the_draft_inside_the_reasoning_budget():
    cfg = RunConfig(draft_start=2000)  # fine for plain decoding and RSD
    with pytest.raises(ValueError, match=r"Draft start \(draft_start\) must be a whole number in 0..1999 \(below Max think 2000\); got 2000"):
        cfg.check_ssr()
    with pytest.raises(ValueError, match="got 2000"):
        next(decode_ssr(make_model("llama"), "hi", cfg))


def test_iterative_needs_an_interval():
    with pytest.raises(ValueError, match=r"Draft interval \(draft_interval\) must be a whole number in 1..1000000 \(Number of drafts is above 1\); got 0"):
        RunConfig(num_drafts=2, draft_interval=0)
    assert RunConfig(num_drafts=1, draft_interval=0).num_drafts == 1


def test_config_is_frozen_and_defaults_follow_the_paper():
    cfg = RunConfig()
    assert (cfg.draft_start, cfg.max_think, cfg.max_draft) == (500, 2000, 500)
    with pytest.raises(AttributeError):
        cfg.max_think = 5  # type: ignore[misc]
