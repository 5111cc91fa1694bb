"""The studio on a real model, driven as a user would (headless Chromium and gradio_client against
the app): a Compare on SmolLM2 at default settings through ``/run`` runs
what it can; every strip cell stays inside the strip at 760 and 1400 px, for every method, live
and replayed; an early exit that never exited says why; History filters by model. Screenshots
land in ``test-artifacts/``."""

from __future__ import annotations

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from engine.registry import label_of
from engine.runtime.gguf import installed
from engine.tools.synthetic import EVAL_SEED_BASE, make_example
from tests.apps import launched, query
from tests.test_studio_browser import (
    ARTIFACTS,
    _no_error_pill,
    _run_to_end,
    _type,
    needs_browser,
)

SMOL = "smollm2-135m-instruct"
ARITH = make_example("arithmetic", EVAL_SEED_BASE + 2).prompt
CLASS = make_example("classes", EVAL_SEED_BASE + 1).prompt

# every visible strip's cells, each against its strip's box: [cell key, its right edge, the strip's] for the
# cells that pass either edge
OVERFLOW = """() => [...document.querySelectorAll('.metrics')].filter(s => s.offsetParent !== null).flatMap(strip => {
    const edge = strip.getBoundingClientRect();
    return [...strip.querySelectorAll('.metric')].map(cell => [cell, cell.getBoundingClientRect()])
        .filter(([, box]) => box.width > 0 && (box.left < edge.left - 1 || box.right > edge.right + 1))
        .map(([cell, box]) => [cell.querySelector('.k').innerText, Math.round(box.right), Math.round(edge.right)]);
})"""

# the first visible strip's method cell is exactly this run's name (not merely containing it: "SSR" is in
# "SSR lookups alone")
METHOD_IS = """name => [...document.querySelectorAll('.metrics')].filter(s => s.offsetParent !== null).slice(0, 1)
    .some(strip => [...strip.querySelectorAll('.metric')].some(cell => cell.querySelector('.k').innerText === 'method'
        && cell.querySelector('.v').innerText.replace(/ \\(lossy\\)$/, '') === name))"""


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with launched(tmp_path_factory.mktemp("third")) as (url, db, _proc):
        yield url, db


def _fits(page, where: str) -> None:
    over = page.evaluate(OVERFLOW)
    assert not over, f"{where}: cells past the strip's edge (key, right, strip's right): {over}"


@needs_browser
@pytest.mark.parametrize("width", [1400, 760])
def test_every_strip_cell_stays_inside_the_strip_for_every_method_live_and_replayed(app, browser, width):
    """Every method (an early exit that never exits included: its reason is the longest cell), each
    run of a Compare, and each run replayed from History: no cell passes its strip's edges."""
    page = browser.new_page(viewport={"width": width, "height": 1200})
    page.goto(app[0])
    page.wait_for_selector("#method", timeout=30_000)
    try:
        for method, prompt in (("Baseline", CLASS), ("SSR", CLASS), ("RSD", ARITH)):
            _run_to_end(page, prompt, method)
            _fits(page, f"{method}, live")
        page.get_by_text("SSR settings").click()
        page.locator("#method").get_by_label("SSR early exit", exact=True).check()
        page.wait_for_function("document.querySelector('#num-drafts input').value === '12'", timeout=10_000)
        _type(page, "Agreeing drafts", "13")  # more than the 12 drafts it forks: it cannot exit, and says why
        page.wait_for_function("document.querySelector('#exit-k input').value === '13'", timeout=10_000)
        strip = _run_to_end(page, CLASS, "SSR early exit")
        assert "no exit:" in strip and "the rule needs 13" in strip and "ran as SSR" in strip, strip
        _fits(page, "SSR early exit, live")
        page.locator(".strip").first.scroll_into_view_if_needed()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"strip-no-exit-{width}.png"), full_page=True)
        _run_to_end(page, CLASS, "Compare")
        for name in ("Baseline", "SSR lookups alone", "SSR", "SSR early exit", "RSD"):
            page.locator(".run-pick").get_by_label(name, exact=True).check()
            try:
                page.wait_for_function(METHOD_IS, arg=name, timeout=60_000)
            except PlaywrightTimeout:
                raise AssertionError(f"{name}: {page.locator('.strip').first.inner_text()[:300]}") from None
            _fits(page, f"Compare's {name}")
        page.get_by_role("tab", name="History").click()
        for method in ("baseline", "ssr-lookups", "ssr", "ssr-exit", "rsd"):
            rid = query(app[1], "select max(id) from runs where method = ? and status = 'ok'", method)[0][0]
            page.get_by_label("Run id").fill(str(rid))
            page.get_by_role("button", name="Show this run").click()
            page.wait_for_function(f"[...document.querySelectorAll('.metrics .v')].some(v => v.offsetParent && "
                                   f"v.innerText.startsWith({label_of(method)!r}))",  # named as the Run tab names it
                                   timeout=30_000)
            _fits(page, f"{method}, replayed")
        page.screenshot(path=str(ARTIFACTS / f"strip-replayed-{width}.png"), full_page=True)
        _no_error_pill(page)
    finally:
        page.close()


@needs_browser
def test_history_filters_by_model_in_the_page(app, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(app[0])
    page.wait_for_selector("#method", timeout=30_000)
    try:
        page.locator("#model input").fill("tiny-reasoner-draft")
        page.locator("#model input").press("Enter")
        _run_to_end(page, CLASS, "Baseline")
        page.get_by_role("tab", name="History").click()
        page.locator("#history-model input").click()
        page.get_by_role("option", name="tiny-reasoner-draft", exact=True).click()
        page.wait_for_function("document.querySelector('.history-table').innerText.includes('tiny-reasoner-draft') && "
                               "!/tiny-reasoner(?!-draft)/.test(document.querySelector('.history-table').innerText)",
                               timeout=30_000)
        _no_error_pill(page)
    finally:
        page.close()


@pytest.mark.slow
@pytest.mark.skipif(not installed(SMOL), reason=f"{SMOL}'s package is not installed")
def test_compare_on_smollm2_at_default_settings_through_the_api(tmp_path):
    """The new user's run: ``--model smollm2-135m-instruct``, a prompt, Compare, nothing else set.
    Baseline and SSR (and the early exit) run and are logged with answers; RSD is skipped with its reason."""
    from gradio_client import Client

    with launched(tmp_path, "--model", SMOL) as (url, db, _proc):
        client = Client(url, verbose=False)
        out = client.predict(prompt="What is 2 plus 2? Answer briefly.", method="Compare", api_name="/run")
        strip = out[3]
        rows = query(db, "select method, status, answer_text from runs order by id")
        assert [r[0] for r in rows] == ["baseline", "ssr-lookups", "ssr", "ssr-exit"], rows
        assert all(status == "ok" and answer.strip() for _, status, answer in rows), rows
        assert "RSD: not run" in strip and "do not share a tokenizer" in strip and "set Draft model" in strip
        assert "same as baseline" in strip and "✔ identical" in strip
