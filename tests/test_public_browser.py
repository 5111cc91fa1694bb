"""A shared studio in Chromium (issue 44): a visitor whose run waits for the model sees its place in
line, and Stop takes it out of the line at once (nothing runs, nothing is logged); their History
never shows the other visitor's prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.apps import launched, query, wait_for
from tests.test_studio_browser import ARTIFACTS, CHROMIUM, _start

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(),
                                reason="Debian chromium is not installed (.ci/run installs it)")

OTHER = "Write a Python class Garden. Fields: rose, tulip. Methods: total. (the other visitor's secret)"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with launched(tmp_path_factory.mktemp("shared"), "--public", "on") as (url, db, _proc):
        yield url, db


@pytest.mark.parametrize("width", [1400, 760])
def test_a_queued_visitor_sees_their_place_and_can_leave_the_line(shared, width):
    from gradio_client import Client
    from playwright.sync_api import sync_playwright

    url, db = shared
    other = Client(url, verbose=False)  # another visitor holds the model: a sweep of many SSR runs
    holding = other.submit(OTHER, "", 0, 400, 10, api_name="/sweep")
    wait_for(lambda: query(db, "select count(*) from runs where prompt = ?", OTHER)[0][0] >= 1,
             "the other visitor's sweep to hold the model", timeout=180)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": width, "height": 1200})
        try:
            page.goto(url)
            page.wait_for_selector("#method", timeout=30_000)
            mine = f"What is 2 + 3? (mine, at {width} px)"
            _start(page, mine, "SSR")
            strip = page.locator(".metrics").first
            page.wait_for_function("document.querySelector('.metrics') && document.querySelector('.metrics')"
                                   ".innerText.includes('in line for the model')", timeout=180_000)
            said = strip.inner_text()
            assert "2nd" in said and "1 job ahead of yours" in said and "Stop leaves the line" in said, said
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / f"public-queued-{width}.png"), full_page=True)
            page.locator("#stop").click()
            page.wait_for_function("document.querySelector('.metrics').innerText.includes('stopped while in line')",
                                   timeout=60_000)
            page.wait_for_function("document.querySelector('#stop').disabled", timeout=60_000)
            assert query(db, "select count(*) from runs where prompt = ?", mine) == [(0,)]  # nothing ran
            page.get_by_role("tab", name="History").click()
            page.get_by_role("button", name="Refresh").click()
            page.wait_for_timeout(1500)
            assert "secret" not in page.locator(".history-table").inner_text()
        finally:
            page.close()
            browser.close()
            holding.cancel()
