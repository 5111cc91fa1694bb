"""A crafted trace in headless Chromium (issue 54): the attacker's markup in every text field of
the trace schema, through the HTML export, the History tab's fragments and the live studio's
import. No script runs (the title stays, no dialog opens, the payload's window flag is never set)
and no element exists that the renderer did not make: the page's (tag, attribute) pairs are a
subset of the clean trace's page's. A malformed import says which field, never a bare "Error"."""

from __future__ import annotations

import json

import pytest

from ssr_ui.export import logged_view, run_from_json, run_to_html
from ssr_ui.frame import Frame, where_time_goes
from ssr_ui.render import CSS, LEGEND, metrics_html
from tests.apps import launched
from tests.crafted import CLEAN, TITLE, crafted, doc_of

# what a page holds after its scripts had their chance: every (tag, attribute) pair, and the payload's traces
INSPECT = """() => ({
    pairs: [...document.querySelectorAll('*')].flatMap(e => [e.tagName.toLowerCase() + ' ',
        ...[...e.attributes].map(a => e.tagName.toLowerCase() + ' ' + a.name)]),
    title: document.title,
    flagged: window.__pwned !== undefined || (window.parent && window.parent.__pwned !== undefined),
    attacker: document.querySelectorAll('img[src="x"], iframe[srcdoc], [onerror], [onmouseover], [data-attacker]')
        .length,
})"""


def _fragments(doc: dict) -> str:
    """The History tab's fragments of a trace, in one page (as the studio shows them, with its CSS)."""
    row, events = run_from_json(json.dumps(doc))
    view = logged_view(row, events)
    frame = Frame.of(view, metrics_html(view, str(row.get("method", "?"))))
    body = "".join((frame.metrics, LEGEND, frame.reasoning, frame.draft, frame.answer, where_time_goes(view, "time"),
                    where_time_goes(view, "forward")))
    return f"<!doctype html><html><head><title>{TITLE}</title><style>{CSS}</style></head><body>{body}</body></html>"


def _export(doc: dict) -> str:
    return run_to_html(*run_from_json(json.dumps(doc)), CSS)


def _load(browser, html: str) -> tuple[dict, list[str]]:
    page = browser.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.set_content(html, wait_until="load")
    page.mouse.move(300, 300)  # an onmouseover, had one been made
    page.wait_for_timeout(300)
    seen = page.evaluate(INSPECT)
    page.close()
    return seen, dialogs


@pytest.mark.parametrize("name", CLEAN)
@pytest.mark.parametrize("build", [_export, _fragments], ids=["export", "fragments"])
def test_a_crafted_trace_runs_nothing_and_makes_no_element(browser, name, build):
    clean, _ = _load(browser, build(doc_of(*CLEAN[name]())))
    seen, dialogs = _load(browser, build(crafted(doc_of(*CLEAN[name]()))))
    assert dialogs == [] and not seen["flagged"] and seen["attacker"] == 0
    assert seen["title"] == clean["title"]
    assert set(seen["pairs"]) <= set(clean["pairs"]), set(seen["pairs"]) - set(clean["pairs"])


@pytest.fixture(scope="module")
def studio_url(tmp_path_factory):
    with launched(tmp_path_factory.mktemp("studio")) as (url, _db, _proc):
        yield url


def _import(browser, url: str, path) -> tuple[object, list[str]]:
    """The studio's History tab with ``path`` imported; the page (open) and the dialogs it asked for."""
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(url)
    page.wait_for_selector("#method", timeout=60_000)
    page.get_by_role("tab", name="History").click()
    page.locator(".block", has_text="Import a JSON trace").locator("input[type=file]").set_input_files(str(path))
    return page, dialogs


def test_the_live_studio_imports_a_crafted_trace_as_text(browser, studio_url, tmp_path):
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(crafted(doc_of(*CLEAN["ssr"]()))), encoding="utf-8")
    page, dialogs = _import(browser, studio_url, path)
    page.locator(".prompt-box").wait_for(timeout=60_000)
    page.get_by_text("forwards saved").last.wait_for(timeout=20_000)
    page.mouse.move(400, 400)
    page.wait_for_timeout(500)
    seen = page.evaluate(INSPECT)
    prompt = page.locator(".prompt-box").inner_text()
    page.close()
    assert "<img src=x onerror=" in prompt, "the payload shows as text"
    assert dialogs == [] and not seen["flagged"] and seen["attacker"] == 0 and seen["title"] == "SSR Studio"


def test_the_live_studio_names_the_bad_field_of_a_malformed_import(browser, studio_url, tmp_path):
    doc = doc_of(*CLEAN["ssr"]())
    doc["events"][2]["index"] = "two"
    path = tmp_path / "malformed.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    page, _ = _import(browser, studio_url, path)
    page.locator(".metrics.error").wait_for(timeout=60_000)
    message = page.locator(".metrics.error").inner_text()
    bare = page.get_by_text("Error", exact=True).count()
    page.close()
    assert "event 2 is malformed: forward field 'index' must be an integer, got str" in message
    assert bare == 0, "a bare Error pill"
