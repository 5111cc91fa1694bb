"""The studio on the two real models it can run offline (issue 30): SmolLM2-135M-Instruct, a chat
model run with prompted reasoning, and Gemma-3-270M, a base model without reasoning; byte-level
BPE text (emoji, CJK, accents split over several tokens) in the panes, the tooltips and the
exports; a model load's progress shown while it loads. Handler level, no server: each real model
is loaded once per module, runs are kept short (24 reasoning, 16 answer tokens)."""

from __future__ import annotations

import html
import re
import threading
import time
from pathlib import Path

import pytest

from engine.events import DoneEvent
from engine.runlog import RunMeta
from engine.runtime.gguf import installed

SMOL, GEMMA = "smollm2-135m-instruct", "gemma-3-270m"
SMALL = dict(max_think=24, max_answer=16, draft_start=8, max_draft=16)
needs = {name: pytest.mark.skipif(not installed(name), reason=f"{name}'s package is not installed")
         for name in (SMOL, GEMMA)}


@pytest.fixture(scope="module")
def studio(tmp_path_factory):
    from ssr_ui.handlers import Studio

    return Studio(SMOL, db=str(tmp_path_factory.mktemp("real") / "runs.db"))


@pytest.fixture(scope="module")
def smol(studio):
    """SmolLM2 loaded once (as the studio loads it: probed at load), served by the studio."""
    from engine.wiring import load_role

    lm = load_role(SMOL)
    studio.add_model(SMOL, lm)
    return lm


@pytest.fixture(scope="module")
def gemma(studio):
    """Gemma-3-270M loaded once, without the load's capability probe: a plain run measures it
    when it first needs it (an SSR refusal needs none)."""
    from engine.runtime.model import load_model

    lm = load_model(GEMMA)
    studio.add_model(GEMMA, lm)
    return lm


def shown(pane: str) -> str:
    """The text a pane shows (tags dropped, entities read)."""
    return html.unescape(re.sub(r"<[^>]+>", "", pane))


def body(pane: str) -> str:
    """The text of the pane itself, without the note above it."""
    return shown(pane.split('<div class="pane">', 1)[1])


# ----------------------------------------------------------------------------- prompted and no reasoning

@needs[SMOL]
@pytest.mark.parametrize("method", ["Baseline", "SSR"])
def test_a_prompted_model_says_so_and_its_text_marker_is_a_badge(studio, smol, method):
    assert smol.markers.prompted and smol.markers.close_text == "</think>"
    frames = list(studio.run("What is the capital of France?", method, SMOL, **SMALL))
    final = frames[-1]
    assert "error" not in final.metrics, final.metrics
    assert "thinking" in final.metrics and "prompted" in final.metrics
    assert "prompted reasoning" in final.reasoning
    # the reasoning closed (by the model or the budget: both write </think> as several tokens of text); the
    # pane shows the badge where the marker ends, never the marker's raw text
    view = final.view
    assert view.marker_tokens() > 1 and view.answer
    assert "end of thinking" in final.reasoning and "</think>" not in body(final.reasoning)
    assert "the marker written as text over" in final.reasoning
    row = studio.history()[0]
    assert row["method"] == method.lower() and row["status"] == "ok" and row["think_end"] == "</think>"
    replay = studio.replay(row["id"])  # the History tab tells the prompted run from its log
    assert "prompted" in replay.metrics and "end of thinking" in replay.reasoning


@needs[GEMMA]
def test_ssr_on_a_base_model_is_refused_in_the_engines_words(studio, gemma):
    assert gemma.markers is None
    frames = list(studio.run("The capital of France is", "SSR", GEMMA, **SMALL))
    assert len(frames) == 2 and "loading" in frames[0].metrics  # refused before warming up or running
    assert 'class="metrics error"' in frames[-1].metrics and "does not reason" in frames[-1].metrics
    assert "Traceback" not in frames[-1].metrics
    assert all(r["model"] != gemma.model_id for r in studio.history(method="ssr"))  # nothing ran, nothing logged


@pytest.mark.slow  # Gemma's first plain run measures the capability probe (once per module: the test below reuses it)
@needs[GEMMA]
def test_compare_on_a_base_model_runs_baseline_and_skips_the_rest_with_the_reasons(studio, gemma):
    before = {r["id"] for r in studio.history()}
    final = list(studio.run("The capital of France is", "Compare", GEMMA, **SMALL))[-1]
    assert list(final.runs) == ["Baseline", "SSR lookups alone", "SSR", "SSR early exit", "RSD"]
    assert [r["method"] for r in studio.history() if r["id"] not in before] == ["baseline"]
    assert final.view.method == "baseline" and final.view.answer  # the panes show the run that ran
    for name in ("SSR lookups alone", "SSR", "SSR early exit"):
        assert "does not reason" in final.runs[name].metrics and final.runs[name].view.phase == "skipped"
    assert "do not share a tokenizer" in final.runs["RSD"].metrics  # the bundled draft's vocabulary is not Gemma's
    assert "SSR: not run" in final.metrics and list(final.chart.data[0].x) == ["Baseline"]


@needs[SMOL]
def test_compare_on_smollm2_with_the_default_draft_logs_baseline_and_ssr_and_skips_rsd(studio, smol):
    """The new user's finding: Compare on SmolLM2 failed outright on RSD's default draft (the bundled
    one, another vocabulary). Baseline, SSR and the early exit run and are logged with answers; RSD
    is skipped with the reason and how to set it (short budgets: the rule, not the length, is tested)."""
    before = {r["id"] for r in studio.history()}
    final = list(studio.run("What is 12 plus 30?", "Compare", SMOL, **SMALL))[-1]
    new = {r["method"]: r for r in studio.history() if r["id"] not in before}
    assert set(new) == {"baseline", "ssr-lookups", "ssr", "ssr-exit"}
    assert all(r["status"] == "ok" and r["answer_text"].strip() for r in new.values())
    assert final.view.method == "ssr" and "own baseline run, just before" in final.metrics
    assert "RSD: not run" in final.metrics and "set Draft model" in final.metrics
    assert final.runs["RSD"].view.phase == "skipped"


@pytest.mark.slow  # Gemma's first plain run measures the capability probe (a minute or more on 2 CPU cores)
@needs[GEMMA]
def test_baseline_on_a_base_model_says_it_has_no_reasoning(studio, gemma):
    final = list(studio.run("The capital of France is", "Baseline", GEMMA, max_think=24, max_answer=12))[-1]
    assert "error" not in final.metrics, final.metrics
    assert "none (a base model" in final.metrics
    assert "No reasoning: this model has no think markers" in final.reasoning
    assert not final.view.reasoning and len(final.view.answer) == 12
    replay = studio.replay(studio.history()[0]["id"])
    assert "No reasoning" in replay.reasoning and "none (a base model" in replay.metrics


# ----------------------------------------------------------------------------- byte-level BPE text

REASONING = "Hi 👋, 日本語 and café naïve.</think>"
ANSWER = "\n\nSure: 日本語 👋 — crème brûlée"


@pytest.fixture(scope="module")
def smol_tokenizer():
    if not installed(SMOL):
        pytest.skip(f"{SMOL}'s package is not installed")
    from transformers import AutoTokenizer

    from engine.runtime.gguf import local_folder

    return AutoTokenizer.from_pretrained(local_folder(SMOL))


def bpe_events(tok, answer: str = ANSWER) -> list:
    """A run's events as the engine makes them (``Recorder``: incremental detokenization) over
    SmolLM2's real tokens: a reasoning, a draft forked from it (taken and rejected tokens), an answer."""
    from engine.methods.recorder import Recorder

    rec = Recorder(tok, "ssr", 3)
    ids = lambda text: tok.encode(text, add_special_tokens=False)
    events = [rec.phase("reasoning")]
    events += [rec.token("reasoning", i) for i in ids(REASONING)]
    events.append(rec.phase("drafting", draft=0, at_token=4))
    draft = ids(" 日本語 👋 ok")
    events += [rec.token("draft", i, draft=0) for i in draft]
    events += [rec.draft_status(0, p, "accepted", "draft") for p in range(4)]
    events.append(rec.draft_status(0, len(draft) - 1, "rejected"))
    events.append(rec.phase("answer"))
    events += [rec.token("answer", i) for i in ids(answer)]
    events.append(rec.done())
    return events


def test_smollm2_splits_the_test_text_over_several_tokens(smol_tokenizer):
    pieces = [smol_tokenizer.decode([i]) for i in smol_tokenizer.encode("👋日本語", add_special_tokens=False)]
    assert len(pieces) >= 5 and any("\ufffd" in p for p in pieces)  # single tokens are partial characters


def test_split_characters_render_whole_in_the_panes_and_hovers(smol_tokenizer):
    from ssr_ui.render import TraceView, metrics_html

    events = bpe_events(smol_tokenizer)
    tokens = [e for e in events if getattr(e, "kind", "") == "token"]
    assert any(e.text == "" for e in tokens), "the stream should hold back partial characters"
    view = TraceView(method="ssr", think_end="</think>", thinking="prompted")
    for ev in events:
        view.apply(ev)
    panes = view.reasoning_html() + view.draft_html() + view.answer_html() + metrics_html(view, "SSR")
    assert "\ufffd" not in panes
    assert body(view.reasoning_html()) == "Hi 👋▼ draft 0, 日本語 and café naïve.end of thinking"  # the fork after 4
    assert shown(view.answer_html()) == ANSWER.lstrip()
    assert "日本語 👋" in shown(view.draft_html())
    # every token has a tooltip with its id; a token whose text came over several tokens names them all
    for ev in tokens:
        assert re.search(rf'title="ids? ([0-9 ]+ )?{ev.token_id}\b', panes), ev
    held = [e.token_id for e in tokens if e.stream == "reasoning"][1:4]  # " 👋" is three tokens
    assert f"ids {' '.join(map(str, held))} (this text came over 3 tokens)" in view.reasoning_html()
    assert "part of a character that a later token completes" in view.reasoning_html()


def test_split_characters_survive_the_log_and_every_export(smol_tokenizer, tmp_path):
    from ssr_ui.export import logged_view, run_from_json
    from ssr_ui.handlers import Studio

    studio = Studio("unused", db=str(tmp_path / "runs.db"))
    events = bpe_events(smol_tokenizer)
    run_id = studio.log.save(RunMeta("ssr", SMOL, "Say hi 👋 in 日本語", think_end="</think>"), events, "ok")
    text = Path(studio.export(run_id, "json")).read_text(encoding="utf-8")
    assert "\ufffd" not in text and "\\ufffd" not in text.lower()
    row, logged = run_from_json(text)
    assert row["answer_text"] == ANSWER and row["reasoning_text"] == REASONING
    answer = "".join(e.text for e in logged if e.kind == "token" and e.stream == "answer")
    assert answer == ANSWER and "👋" in text and "日本語" in text
    assert shown(logged_view(row, logged).answer_html()) == ANSWER.lstrip()
    page = Path(studio.export(run_id, "html")).read_text(encoding="utf-8")
    assert "\ufffd" not in page and 'charset="utf-8"' in page
    assert "Hi 👋▼ draft 0, 日本語 and café naïve.end of thinking" in shown(page) and "crème brûlée" in shown(page)
    assert "prompted" in page  # the replay tells the prompted run from its log: </think> over 3 tokens
    replay = studio.import_trace(str(Path(studio.export(run_id, "json"))))
    assert "\ufffd" not in replay.reasoning + replay.answer + replay.draft


def test_a_run_stopped_inside_a_character_shows_no_replacement_character(smol_tokenizer):
    from ssr_ui.render import TraceView

    events = [e for e in bpe_events(smol_tokenizer, "ok 👋") if not isinstance(e, DoneEvent)][:-2]  # 👋's last byte never came
    view = TraceView(think_end="</think>", phase="stopped")
    for ev in events:
        view.apply(ev)
    assert shown(view.answer_html()) == "ok" and "\ufffd" not in view.answer_html()
    assert "part of a character that a later token completes" in view.answer_html()


# ----------------------------------------------------------------------------- load progress

def _slow_load(monkeypatch, seconds: float, messages=("dequantizing 272 tensors of x.gguf (first use)",)):
    """Make the shelf's loads report ``messages`` then take ``seconds`` (a tiny model comes back)."""
    import ssr_ui.shelf
    from tests.tiny import make_model

    def load_role(name, device=None, server=None, progress=None, random_weights=False, tokenizer=None, dtype=None):
        for message in messages:
            progress(message)
        time.sleep(seconds)
        return make_model("llama", init_scale=3.0)

    monkeypatch.setattr(ssr_ui.shelf, "load_role", load_role)


def test_a_load_shows_the_engines_progress_while_it_waits(monkeypatch, tmp_path):
    from ssr_ui.handlers import Studio

    _slow_load(monkeypatch, 1.3)
    studio = Studio("slow", db=str(tmp_path / "runs.db"))
    frames = list(studio.run("hi", "Baseline", "slow", max_think=4, max_answer=4))
    notes = [f.metrics for f in frames if "loading slow" in f.metrics]
    assert len(notes) >= 3, notes  # the first note, then one about every half second
    assert any("1 s · dequantizing 272 tensors of x.gguf (first use)" in note for note in notes), notes
    assert "done" in frames[-1].metrics
    assert list(studio.loading("slow")) == []  # loaded: nothing to wait for


def test_a_load_past_the_timeout_still_gives_up_with_the_message(monkeypatch, tmp_path):
    from ssr_ui.handlers import Studio

    _slow_load(monkeypatch, 2.0)
    studio = Studio("slow", db=str(tmp_path / "runs.db"), load_timeout=0.6)
    started = time.monotonic()
    frames = list(studio.run("hi", "Baseline", "slow"))
    assert time.monotonic() - started < 1.5
    assert "took longer than 1 s; gave up" in frames[-1].metrics and "error" in frames[-1].metrics


def test_a_second_waiter_shares_the_load_and_a_closed_one_leaves_it_going(monkeypatch, tmp_path):
    from ssr_ui.handlers import Studio

    calls = []
    _slow_load(monkeypatch, 0.8, messages=())
    import ssr_ui.shelf

    inner = ssr_ui.shelf.load_role
    monkeypatch.setattr(ssr_ui.shelf, "load_role", lambda *a, **k: calls.append(1) or inner(*a, **k))
    studio = Studio("slow", db=str(tmp_path / "runs.db"))
    first = studio.loading("slow", poll_s=0.1)
    next(first)
    first.close()  # a stopped run: the load goes on, the lock is free
    other = threading.Thread(target=studio.model, args=("slow",))
    other.start()
    assert studio.model("slow") is not None
    other.join(5)
    assert calls == [1]


# ----------------------------------------------------------------------------- the Run tab's lists

def test_the_model_list_has_the_installed_real_models_after_the_bundled_one():
    from ssr_ui.layout import REAL_EXAMPLES_MODEL, examples, model_choices

    names = model_choices("tiny-reasoner")
    assert names[0] == "tiny-reasoner" and len(names) == len(set(names))
    for name in (SMOL, GEMMA):
        assert (name in names) == installed(name)
    assert model_choices("/models/x.gguf")[:2] == ["/models/x.gguf", "tiny-reasoner"]
    groups = examples()
    suits = {label: model for label, (_method, model, _prompts) in groups.items()}
    assert list(suits.values())[:2] == ["tiny-reasoner", "tiny-reasoner"]
    real = [label for label, model in suits.items() if model == REAL_EXAMPLES_MODEL]
    assert len(real) == installed(REAL_EXAMPLES_MODEL)
    if real:
        method, _model, prompts = groups[real[0]]
        assert method == "SSR" and "Write a Python function that reverses a string." in prompts
