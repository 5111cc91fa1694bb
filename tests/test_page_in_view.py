"""The page (right after Run, the strip and the panes are in view at 1400 and 760 px wide;
draft start is a slider over its range beside the box the run reads; a model load shows its stage
with a bar; the Runtime box is checked again on every page load; a missing model path changes no
setting), a Compare that says when it cannot tell (same work, no verdict; repeats, their spread),
and empty panes and timelines that name their true cause. Screenshots of each width go to
``test-artifacts/run-in-view-<width>.png`` (docs/img keeps a copy of each).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.events import RunStats
from engine.tools.synthetic import EVAL_SEED_BASE, make_example
from tests.apps import CHROMIUM, ROOT, launched

CLASS = make_example("classes", EVAL_SEED_BASE + 1).prompt
SMALL = dict(draft_start=2, max_think=10, max_draft=8, max_answer=10)
needs_browser = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed")


def _text(fragment: str) -> str:
    return " ".join(html.unescape(re.sub("<[^>]+>", " ", fragment)).split())


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with launched(tmp_path_factory.mktemp("studio")) as (url, db, _proc):
        yield url, db


# Installed before Run: the viewport boxes of the strip's elapsed cell and the Final answer pane when the run's
# first frame shows (the elapsed cell appears), i.e. right after Run, however slowly the test polls a busy machine
FIRST_FRAME = """() => {
    window.__first = null;
    new MutationObserver((_, observer) => {
        const cell = [...document.querySelectorAll('#strip .metric')].find(m => m.querySelector('.k')?.textContent === 'elapsed');
        if (!cell) return;
        const box = e => { const r = e.getBoundingClientRect(); return {y: r.top, height: r.height}; };
        window.__first = {elapsed: box(cell), answer: box(document.querySelector('#answer-pane'))};
        observer.disconnect();
    }).observe(document.querySelector('#strip'), {subtree: true, childList: true, characterData: true});
}"""


def _in_view(box: dict, height: int) -> bool:
    """Whether ``box`` (a viewport box) starts inside a viewport ``height`` px high with at least 40 px of it shown."""
    return box["y"] >= 0 and box["y"] + min(40, box["height"]) <= height


@needs_browser
@pytest.mark.parametrize("width", [1400, 760])
def test_the_strip_and_the_panes_are_in_view_after_run(app, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 1000})
    try:
        page.goto(app[0])
        page.wait_for_selector("#method", timeout=30_000)
        page.get_by_label("Prompt").fill(CLASS)
        page.evaluate(FIRST_FRAME)
        page.get_by_role("button", name="Run", exact=True).click()
        first = page.wait_for_function("window.__first", timeout=120_000).json_value()  # after the model's load
        (ROOT / "test-artifacts").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "test-artifacts" / f"run-in-view-{width}.png"))
        assert _in_view(first["elapsed"], 1000), first
        assert _in_view(first["answer"], 1000), first
        page.wait_for_function("document.querySelector('#stop').disabled", timeout=180_000)
    finally:
        page.close()


@needs_browser
def test_draft_start_is_a_slider_that_moves_the_box_and_follows_max_think(app, browser):
    """Dragging the slider sets the number box (the value the run reads); the slider's maximum is Max think - 1."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(app[0])
        page.wait_for_selector("#method", timeout=30_000)
        slider = page.locator("#draft-slider input[type=range]")
        assert slider.get_attribute("max") == "599"  # the bundled model's max think is 600
        slider.fill("123")  # a range input's fill sets its value and fires input, as a drag does
        page.wait_for_function("document.querySelector('#draft-start input').value === '123'", timeout=60_000)
        page.get_by_text("SSR settings").click()
        think = page.get_by_role("spinbutton", name="Max think", exact=True)
        think.fill("")
        think.press_sequentially("300", delay=100)
        think.press("Enter")
        page.wait_for_function("document.querySelector('#draft-slider input[type=range]').max === '299'",
                               timeout=60_000)
        assert page.locator("#draft-start input").input_value() == "123"  # in range: unchanged
    finally:
        page.close()


# ----------------------------------------------------------------------------- the page's plain functions

def test_the_slider_range_follows_max_think_and_a_missing_path_changes_nothing(tmp_path):
    from ssr_ui.layout import draft_range, missing_path

    assert draft_range(300)["maximum"] == 299 and draft_range("300")["maximum"] == 299
    assert "maximum" not in draft_range("abc") and "maximum" not in draft_range(1)  # the run names a bad Max think
    assert missing_path(str(tmp_path / "nope.gguf")) == f"{tmp_path / 'nope.gguf'}: no such file or folder here"
    assert missing_path("./no/such/folder") is not None
    (tmp_path / "there.gguf").write_bytes(b"")
    for name in (str(tmp_path / "there.gguf"), "Qwen/Qwen3-1.7B", "org/repo:model.Q4_K_M.gguf", "tiny-reasoner", ""):
        assert missing_path(name) is None, name


def test_the_runtime_box_is_checked_again_without_a_restart(monkeypatch):
    from engine.llamacpp import lib
    from ssr_ui.layout import recheck_runtimes

    calls = []
    monkeypatch.setattr(lib.missing, "cache_clear", lambda: calls.append("cleared"))
    update = recheck_runtimes("transformers")
    assert calls == ["cleared"] and update["value"] == "transformers"
    assert "transformers" in update["choices"]
    if lib.missing() is not None:
        assert "reload this page" in update["info"] and "no restart needed" in update["info"]


def test_a_model_load_shows_a_bar_and_its_stage():
    from ssr_ui.handlers import load_html

    shown = load_html("loading m… 12 s · converting to GGUF")
    assert 'class="load-bar"' in shown and "converting to GGUF" in _text(shown)


def test_the_run_tab_offers_reproducible_and_compare_repeats(studio):
    import gradio as gr

    from ssr_ui.layout import build_app

    demo = build_app(studio)
    by_label = {getattr(b, "label", None): b for b in demo.blocks.values()}
    assert isinstance(by_label["Reproducible"], gr.Checkbox) and by_label["Reproducible"].info
    assert isinstance(by_label["Compare repeats"], gr.Number) and by_label["Compare repeats"].preprocess(9) == 9
    assert isinstance(by_label["Draft start slider"], gr.Slider)
    assert by_label["Draft start slider"].maximum == studio.config("tiny").max_think - 1


# ----------------------------------------------------------------------------- Compare: when it cannot tell

def test_a_run_that_did_baselines_work_gets_no_ratio_verdict():
    from ssr_ui.handlers import Trials, _judge_pair

    idle = SimpleNamespace(method="ssr", notice=None,
                           done=SimpleNamespace(stats=RunStats(drafts=0, verifies=0, drafting="auto: none paid")))
    assert _judge_pair({"ratio": 0.62, "baselines": 1, "pair": True}, "SSR", idle, Trials()) is None
    assert idle.notice.startswith("same work as baseline: SSR forked no draft and verified no proposal")
    busy = SimpleNamespace(method="ssr", notice=None, done=SimpleNamespace(stats=RunStats(drafts=1, verifies=4)))
    trials = Trials(slow={"Baseline": "slow: 3.0x the median"})
    for ratio in (0.9, 0.7, 1.1):
        judged = _judge_pair({"ratio": ratio, "baselines": 1, "pair": True}, "SSR", busy, trials)
    assert judged["ratio"] == pytest.approx(0.9)
    assert judged["matched_on"] == ("median of this comparison's 3 rounds, each against its own baseline run "
                                    "(0.70-1.10x); the baseline run slow: 3.0x the median")


def test_a_compare_states_same_work_and_the_spread_of_its_rounds(studio):
    final = list(studio.run("hello", "Compare", "tiny", "tiny-draft", "tiny-prm", repeats=2, context_lookup=False,
                            suffix_recovery=False, think_spec=0, **SMALL))[-1]
    lookups = final.runs["SSR lookups alone"]  # no draft (the ablation) and, lookups off, nothing verified
    assert not lookups.view.stats.drafts and not lookups.view.stats.verifies
    strip = _text(lookups.metrics)
    assert "same work as baseline" in strip and "x latency" not in strip and "drafts added" not in strip
    rsd = _text(final.runs["RSD"].metrics)
    assert re.search(r"x latency: median of this comparison's 2 rounds, each against its own baseline run "
                     r"\(\d+\.\d\d-\d+\.\d\dx\)", rsd), rsd
    assert len(studio.history("baseline")) == 2  # each round logged


@pytest.mark.parametrize("value", [0, 6, "abc", 2.5])
def test_compare_repeats_out_of_range_are_refused_by_name(studio, value):
    final = list(studio.run("hello", "Compare", "tiny", "tiny-draft", "tiny-prm", repeats=value, **SMALL))[-1]
    assert "Compare repeats (compare_repeats)" in _text(final.metrics)


# ----------------------------------------------------------------------------- empty panes: their true cause

def _view(**kw):
    from ssr_ui.render import TraceView

    return TraceView(method="ssr", **kw)


def test_an_empty_draft_pane_names_its_true_cause():
    drafting_none = _view(phase="done", draft_start=20, stats=RunStats(reasoning_tokens=92, drafting="auto: none paid"))
    assert "reached the draft start (92 tokens, draft start 20) and drafting decided none: auto: none paid" in \
        _text(drafting_none.draft_html())
    short = _view(phase="done", draft_start=200, stats=RunStats(reasoning_tokens=92))
    assert "the reasoning ended after 92 tokens, before the draft start (200)" in _text(short.draft_html())
    stopped = _view(phase="stopped", draft_start=20)
    assert "stopped before its first token" in _text(stopped.draft_html())
    assert "Stopped before the first token" in _text(stopped.reasoning_html())
    off = _view(phase="done", draft_start=20, thinking_off=True, stats=RunStats())
    assert "Thinking was off" in _text(off.draft_html()) and "Thinking was off" in _text(off.reasoning_html())
    assert "The answer appears here." in _text(off.answer_html())


def test_a_stopped_runs_timeline_says_it_was_stopped():
    from ssr_ui.frame import where_time_goes

    assert "the run was stopped before its first forward" in _text(where_time_goes(_view(phase="stopped")))
    assert "logged before the timeline existed" not in _text(where_time_goes(_view(phase="stopped")))
