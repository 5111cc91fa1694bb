"""End to end against the launched app: gradio_client streaming, and a real headless Chromium.

The browser test needs Debian's chromium and the playwright package (``.ci/run`` installs both);
its screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.apps import CHROMIUM, ROOT, cancel_replies, launched, query, wait_for

ARTIFACTS = ROOT / "test-artifacts"
CLASS_PROMPT = ("Write a Python class Garden. Fields: rose, tulip, daisy. Each field starts at its letter count "
                "times 3. Methods: total, reset.")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The studio on the bundled model, in its own process, on a free port."""
    with launched(tmp_path_factory.mktemp("app")) as (url, db, _proc):
        yield url, db


def test_gradio_client_streams_a_run_into_the_log(app):
    from gradio_client import Client

    url, db = app
    client = Client(url, verbose=False)
    job = client.submit(prompt=CLASS_PROMPT, method="SSR", api_name="/run")
    updates = sum(1 for _ in job)
    _reasoning, _draft, answer, metrics = job.result()[:4]
    assert updates >= 5, "the run should stream in many updates"
    assert "done" in metrics and "st-" in answer
    rows = query(db, "select method, status, answer_tokens from runs")
    assert ("ssr", "ok") in [(m, s) for m, s, _ in rows]


def test_the_sweep_runs_with_the_ssr_settings_it_is_given(app):
    """Issue 22, finding 4: the sweep ignored the SSR settings (3 drafts, interval 30, suffix
    recovery off, lookups 4 were logged as 1, 250, on, 0). Its API takes them and every run logs them."""
    import json

    from gradio_client import Client

    url, db = app
    settings = dict(num_drafts=3, draft_interval=30, suffix_recovery=False, think_spec=4, max_think=120,
                    max_answer=60, max_draft=60)
    Client(url, verbose=False).predict(prompt="Start with 12, then add 30. What is the result?", start=10, stop=20,
                                       step=10, api_name="/sweep", **settings)
    rows = query(db, "select method, config from runs where prompt like 'Start with 12, then add 30%' and method = 'ssr'")
    configs = [json.loads(c) for _m, c in rows]
    assert sorted(c["draft_start"] for c in configs)[-2:] == [10, 20]
    for c in configs[-2:]:
        assert {k: c[k] for k in settings} == settings


def _text(pane_html: str) -> str:
    import html
    import re

    return html.unescape(re.sub(r"<[^>]+>", "", pane_html))


def test_two_clients_queue_and_see_only_their_own_run(app):
    from gradio_client import Client

    url, db = app
    prompts = ["Start with 12, then add 30. What is the result?", "Start with 5, then multiply by 9. What is the result?"]
    jobs = [Client(url, verbose=False).submit(prompt=p, method="Baseline", api_name="/run") for p in prompts]
    panes = [job.result() for job in jobs]
    logged = {p: (r, a) for p, r, a in query(db, "select prompt, reasoning_text, answer_text from runs "
                                                 "where method = 'baseline'")}
    assert logged[prompts[0]] != logged[prompts[1]]
    for p, (reasoning, _draft, answer, *_rest) in zip(prompts, panes, strict=True):
        # the pane shows the end-of-thinking marker as a badge, not as raw "</think>"
        assert _text(reasoning).removesuffix("end of thinking") == logged[p][0].removesuffix("</think>"), \
            "a client saw reasoning that is not from its own run"
        if logged[p][1]:
            assert _text(answer) == logged[p][1].lstrip(), "a client saw an answer that is not from its own run"


def test_cancel_stops_the_run_and_logs_it(app, monkeypatch):
    from gradio_client import Client

    url, db = app
    job = Client(url, verbose=False).submit(prompt=CLASS_PROMPT, method="SSR", max_answer=900, max_think=1000,
                                            draft_start=60, api_name="/run")
    wait_for(lambda: len(job.outputs()) >= 2, "the run's first streamed updates")
    replies = cancel_replies(monkeypatch)
    job.cancel()
    assert replies[0]["status"] == "cancelled", replies  # a 1,900-token run is still going after two updates

    def cancelled_rows():
        return query(db, "select status from runs where status = 'cancelled'")

    wait_for(cancelled_rows, "the cancelled run's row")
    # the model is free again: the next run completes
    _reasoning, _draft, _answer, metrics = Client(url, verbose=False).predict(
        prompt="Start with 3, then add 4. What is the result?", method="Baseline", api_name="/run")[:4]
    assert "done" in metrics


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian chromium is not installed (.ci/run installs it)")
def test_browser_runs_ssr_and_escapes_html(app):
    from playwright.sync_api import sync_playwright

    url, _db = app
    ARTIFACTS.mkdir(exist_ok=True)
    hostile = "<script>window.__pwned = 1</script><img src=x onerror=\"window.__pwned = 2\"> " + CLASS_PROMPT
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--no-first-run", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.goto(url)

        def run(prompt: str, shot: str) -> None:
            page.get_by_label("Prompt").fill(prompt)
            page.get_by_role("button", name="Run", exact=True).click()
            page.wait_for_selector(".pane .tok", state="attached", timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / f"{shot}-mid-run.png"), full_page=True)
            page.wait_for_function(
                "[...document.querySelectorAll('.metrics .v')].some(v => v.innerText === 'done')", timeout=120_000)
            page.screenshot(path=str(ARTIFACTS / f"{shot}-done.png"), full_page=True)

        run(CLASS_PROMPT, "studio-ssr")
        assert page.locator(".pane .tok.st-accepted").count() > 0, "no accepted span in the panes"
        assert page.locator(".pane .tok.st-recovered").count() > 0, "no suffix-recovered span in the panes"
        run(hostile, "studio-hostile")
        assert page.evaluate("window.__pwned") is None
        assert page.locator(".pane script").count() == 0 and page.locator(".pane img").count() == 0
        browser.close()
