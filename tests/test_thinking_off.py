"""An answer alone (``RunConfig.thinking`` False), checked against the templates themselves (npm packages,
``tests/npm_tokenizers``): on Qwen3 the prompt is its template's with ``enable_thinking=False`` (an empty think
block), the run writes no reasoning and baseline, SSR and ``hf-pld`` stay token-identical (and on the bundled
tiny-reasoner, whose template has the same switch); a prompted family is not asked to reason; a model that always
reasons (a think token, a template without the switch, as DeepSeek-R1-Distill's) is refused naming it, before the
run, in the engine, the bench and the studio; a model without markers is asked as with thinking on.
"""

from __future__ import annotations

import copy
import functools

import pytest

from engine.config import RunConfig
from engine.registry import decoder, not_answer_only
from engine.runtime.markers import Conversation, chat_prompt_ids, find_markers, has_thinking_switch
from engine.runtime.model import LoadedModel, load_model
from tests.test_templates import Q, tiny, tokenizer

OFF = RunConfig(thinking=False, max_think=10, max_answer=24, max_draft=6, draft_start=2, num_drafts=2, draft_interval=3)


def template_ids(tok, messages: list[dict]) -> list[int]:
    """What the template writes for an answer alone: its generation prompt with thinking off."""
    return tok.apply_chat_template(messages, enable_thinking=False, add_generation_prompt=True, tokenize=True,
                                   return_dict=False)


def test_qwen3s_prompt_is_its_templates_with_thinking_off():
    tok, lm = tokenizer("qwen3"), tiny("qwen3")
    assert lm.markers.switch and has_thinking_switch(tok)
    turn = [{"role": "user", "content": Q}]
    ids = lm.prompt_ids(Q, thinking=False)
    assert ids == template_ids(tok, turn)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "the template closes the block"
    history = [*turn, {"role": "assistant", "content": "84", "reasoning_content": "12 * 7 = 84."}]
    assert lm.prompt_ids(Conversation(history, "And 12 * 8?"), thinking=False) == \
        template_ids(tok, [*history, {"role": "user", "content": "And 12 * 8?"}])


@pytest.mark.parametrize("method", ["ssr", "hf-pld", "ssr-lookups", "hf"])
def test_qwen3_answers_alone_and_the_methods_agree(method):
    lm = tiny("qwen3")
    base = list(decoder("baseline", lm)(Q, OFF))
    done = base[-1]
    assert done.reasoning_ids == [] and done.stats.reasoning_tokens == 0, "no reasoning"
    assert len(done.answer_ids) > 0 and done.stats.prompt_tokens == len(template_ids(tokenizer("qwen3"),
                                                                                      [{"role": "user", "content": Q}]))
    assert "reasoning" not in [ev.phase for ev in base if ev.kind == "phase"]
    other = list(decoder(method, lm)(Q, OFF))[-1]
    assert (other.reasoning_ids, other.answer_ids) == ([], done.answer_ids), method
    if method == "ssr":
        assert other.stats.drafts == 0 and "thinking off" in other.stats.drafting


def test_a_prompted_family_is_not_asked_to_reason():
    tok, lm = tokenizer("llama3_1"), tiny("llama3_1")
    assert lm.markers.prompted and lm.markers.switch
    assert lm.prompt_ids(Q, thinking=False) == template_ids(tok, [{"role": "user", "content": Q}])
    base = list(decoder("baseline", lm)(Q, OFF))[-1]
    ssr = list(decoder("ssr", lm)(Q, OFF))[-1]
    assert base.reasoning_ids == [] and (ssr.reasoning_ids, ssr.answer_ids) == ([], base.answer_ids)


@functools.cache
def always_reasons() -> LoadedModel:
    """tiny-reasoner behind a template that opens the think block whatever it is asked (as DeepSeek-R1-Distill's)."""
    lm = load_model("tiny-reasoner", "cpu")
    tok = copy.deepcopy(lm.tokenizer)
    tok.chat_template = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
                         "+ '<|im_end|>\\n' }}{%- endfor %}{{ '<|im_start|>assistant\\n<think>\\n' }}")
    return LoadedModel(lm.model, tok, "always-thinking", find_markers(tok), lm.preset)


def test_the_bundled_tiny_reasoner_answers_alone_and_the_methods_agree():
    lm = load_model("tiny-reasoner", "cpu")
    assert lm.markers.switch and lm.tokenizer.decode(lm.prompt_ids(Q, thinking=False)).endswith("<think>\n\n</think>\n\n")
    cfg = OFF.replace(max_answer=48)
    base = list(decoder("baseline", lm)("What is 12 * 7?", cfg))[-1]
    assert base.reasoning_ids == [] and base.answer_ids
    for method in ("ssr", "hf-pld"):
        events = list(decoder(method, lm)("What is 12 * 7?", cfg))
        assert (events[-1].reasoning_ids, events[-1].answer_ids) == ([], base.answer_ids), method
        if method == "ssr":  # its lookups were verified, and won tokens: the identity is not a plain decode's
            assert any(ev.kind == "token" and ev.status == "recovered" for ev in events)


def test_a_model_that_always_reasons_is_refused_naming_it():
    lm = always_reasons()
    assert not lm.markers.prompted and not lm.markers.switch and not has_thinking_switch(lm.tokenizer)
    why = "always-thinking cannot answer with thinking off: .*no thinking switch"
    with pytest.raises(ValueError, match=why):
        lm.prompt_ids(Q, thinking=False)
    for method in ("baseline", "ssr", "hf-pld"):
        with pytest.raises(ValueError, match=why):
            next(decoder(method, lm)(Q, OFF))  # before its first event
    assert lm.prompt_ids(Q) == chat_prompt_ids(lm.tokenizer, lm.markers, Q), "thinking on: as before"


def test_thinking_off_is_a_no_op_without_markers_and_refused_for_rsd():
    tok = copy.deepcopy(load_model("tiny-reasoner", "cpu").tokenizer)
    tok.chat_template = None  # a base model's: no template (and, passed None, no markers)
    assert chat_prompt_ids(tok, None, Q, thinking=False) == chat_prompt_ids(tok, None, Q)
    lm = tiny("qwen3")
    assert not_answer_only("ssr", lm) is None
    assert "runs with thinking on only" in not_answer_only("rsd", lm)
    assert "with thinking off there is none" in not_answer_only("ssr-exit", lm)


def test_the_setting_is_checked_and_the_bench_takes_no_thinking(capsys):
    from engine.tools import bench
    from tests.test_bench_cli import main_exit

    assert RunConfig().thinking is True and RunConfig.coerce("thinking", False) is False
    with pytest.raises(ValueError, match=r"Thinking \(thinking\) must be true or false; got 'off'"):
        RunConfig(thinking="off")
    given = ["--out", "o.json", "--prompts", "p.jsonl"]
    assert bench.parse_args([*given, "--no-thinking"]).thinking is False
    assert bench.parse_args(given).thinking is None, "not given: the config's default"
    assert main_exit(["--model", "tiny-reasoner", "--methods", "baseline,rsd", "--no-thinking"]) == 2
    assert "method 'rsd' runs with thinking on only" in capsys.readouterr().err


def test_the_studio_runs_thinking_off_logs_it_and_refuses_it_where_the_model_always_reasons(tmp_path):
    import json

    from ssr_ui.handlers import Studio
    from tests.apps import query

    db = tmp_path / "runs.db"
    studio = Studio("qwen3-tiny", db=str(db), drafting="always")
    studio.add_model("qwen3-tiny", tiny("qwen3"))
    settings = dict(max_think=10, max_answer=8, max_draft=6, draft_start=2)
    view = list(studio.run(Q, "SSR", thinking=False, **settings))[-1].view
    assert view.phase == "done" and not view.reasoning and view.answer
    assert "thinking off" in list(studio.run(Q, "SSR", thinking=False, **settings))[-1].metrics
    config = json.loads(query(db, "select config from runs where method = 'ssr' order by id desc limit 1")[0][0])
    assert config["thinking"] is False
    runs = len(query(db, "select id from runs"))
    studio.add_model("always-thinking", always_reasons())
    refused = list(studio.run(Q, "Baseline", model_name="always-thinking", thinking=False))[-1]
    assert refused.view.phase == "error" and "always-thinking cannot answer with thinking off" in refused.metrics
    assert len(query(db, "select id from runs")) == runs, "refused before the run: nothing logged"
