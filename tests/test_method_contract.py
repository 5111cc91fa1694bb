"""The method contract (engine.methods.contract): a method written in one file, outside engine/methods/,
is found by the registry and runs through the bench CLI, the studio's /run (alone and in a Compare), the
Benchmark tab's /benchmark, the run log, History's /history and /replay, with no other file touched."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from engine.config import RunConfig
from engine.methods.contract import STUDIO, Method, Models
from engine.registry import ENV, REGISTERED, decoder, known, method_of, methods, register, register_file
from tests.apps import ROOT, launched, query

# a throwaway method: plain decoding under its own name (every token the model's own: exact), in one file
THROWAWAY = textwrap.dedent('''
    """Plain decoding that calls itself "echo": a method of one's own, in one file."""
    from functools import partial

    from engine.events import DoneEvent
    from engine.methods.baseline import decode_baseline
    from engine.methods.contract import STUDIO, Method


    def decode_echo(lm, prompt, cfg):
        for ev in decode_baseline(lm, prompt, cfg):
            if isinstance(ev, DoneEvent):
                ev.stats.method = "echo"
            yield ev


    def echo_cells(stats):
        return [("echoed", f"{stats.answer_tokens} answer tokens, <b>as plain decoding wrote them</b>")]


    METHOD = Method("echo", "Echo", "plain decoding under another name", start=lambda m: partial(decode_echo, m.target),
                    studio=STUDIO, color="#123456", cells=echo_cells)
''')
PROMPT = "Start with 3, then add 4. What is the result?"


@pytest.fixture
def method_file(tmp_path) -> Path:
    path = tmp_path / "echo_method.py"
    path.write_text(THROWAWAY)
    return path


def test_a_method_record_checks_what_it_declares():
    start = lambda m: None
    for bad, message in (({"name": "My Method"}, "lower-case"), ({"label": " "}, "needs a label"),
                         ({"studio": ("menu",)}, "studio places"), ({"uses": ("oracle",)}, "may use"),
                         ({"color": "blue"}, "#rrggbb")):
        with pytest.raises(ValueError, match=message):
            Method(**{"name": "mine", "label": "Mine", "summary": "", "start": start, **bad})
    mine = Method("mine", "Mine", "", start)
    assert mine.exact and mine.plain and mine.server and not mine.studio  # the defaults: exact, in process, not shown
    with pytest.raises(ValueError, match="function of the run's stats"):
        Method("mine", "Mine", "", start, cells="a cell")


def test_a_methods_cells_join_the_strip_and_a_broken_one_says_so(monkeypatch):
    from engine.events import RunStats
    from ssr_ui.render import TraceView, metrics_html

    monkeypatch.setattr("engine.registry.REGISTERED", dict(REGISTERED))
    register(Method("celled", "Celled", "", lambda m: None, cells=lambda s: [("mine", f"{s.answer_tokens} <i>")]))
    register(Method("broken", "Broken", "", lambda m: None, cells=lambda s: 1 / 0))
    view = TraceView(method="celled", phase="done")
    view.stats = RunStats(method="celled", answer_tokens=3)
    assert ">mine<" in metrics_html(view, "Celled") and "3 &lt;i&gt;" in metrics_html(view, "Celled")
    view.method, view.stats.method = "broken", "broken"
    assert "could not be drawn: ZeroDivisionError" in metrics_html(view, "Broken")
    view.phase = "reasoning"  # a run still going: no cells of its own yet
    assert "could not be drawn" not in metrics_html(view, "Broken")


def test_the_registry_reads_traits_not_names():
    assert [m.name for m in methods("run")] == ["baseline", "ssr", "ssr-exit", "rsd", *[
        m.name for m in methods("run") if m.name not in ("baseline", "ssr", "ssr-exit", "rsd")]]
    assert method_of("ssr-exit").ssr_loop and not method_of("ssr-exit").exact
    assert method_of("rsd").steps and method_of("rsd").uses == ("draft", "prm")
    assert known("no-such-method") is None
    with pytest.raises(ValueError, match="unknown method 'nope'; choose from baseline"):
        method_of("nope")


def test_a_name_or_label_taken_is_refused_and_a_file_without_method_too(tmp_path):
    with pytest.raises(ValueError, match="registered already"):
        register(Method("ssr", "Another SSR", "", lambda m: None))
    with pytest.raises(ValueError, match="taken by another method"):
        register(Method("ssr-two", "SSR", "", lambda m: None))
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(TypeError, match="defines no METHOD"):
        register_file(empty)
    with pytest.raises(ValueError, match="no method file"):
        register_file(tmp_path / "missing.py")


def test_a_registered_method_runs_through_the_decoder(method_file, monkeypatch):
    from tests.tiny import make_model

    monkeypatch.setattr("engine.registry.REGISTERED", dict(REGISTERED))  # this test's registration only
    echo = register_file(method_file)
    assert method_of("echo") is echo and echo.studio == STUDIO
    lm = make_model("llama")
    cfg = RunConfig(max_think=12, max_answer=8)
    mine, base = (list(decoder(name, lm)("a b c", cfg))[-1] for name in ("echo", "baseline"))
    assert mine.stats.method == "echo" and mine.answer_text == base.answer_text
    assert Models(lm).draft is None


def test_the_bench_cli_runs_a_method_from_its_file(method_file, tmp_path):
    db, out = tmp_path / "runs.db", tmp_path / "out.json"
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": PROMPT}) + "\n")
    env = {**os.environ, ENV: str(method_file), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "engine.tools.bench", "--model", "tiny-reasoner", "--methods",
                           "baseline,echo", "--prompts", str(prompts), "--db", str(db), "--out", str(out),
                           "--max-think", "40", "--max-answer", "20", "--warmup", "0"],
                          check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "echo vs baseline" in done.stdout
    result = json.loads(out.read_text())
    echo = next(r for r in result["runs"] if r["method"] == "echo")
    assert echo["agreement"] == "identical"
    assert {r[0] for r in query(db, "SELECT method FROM runs")} == {"baseline", "echo"}


def test_the_studio_offers_a_method_from_its_file(method_file, tmp_path, monkeypatch):
    gradio_client = pytest.importorskip("gradio_client")
    monkeypatch.setenv(ENV, str(method_file))
    with launched(tmp_path) as (url, db, _proc):
        client = gradio_client.Client(url, verbose=False)
        metrics = client.predict(prompt=PROMPT, method="Echo", api_name="/run")[3]
        assert "echo" in metrics.lower(), metrics
        # its own strip cell, from its file, escaped where the strip draws it
        assert "echoed" in metrics and "&lt;b&gt;as plain decoding wrote them&lt;/b&gt;" in metrics, metrics
        # a Compare runs it beside the others, against its own baseline run
        client.predict(prompt=PROMPT, method="Compare", api_name="/run")
        runs = query(db, "SELECT id, method FROM runs ORDER BY id")
        assert [m for _, m in runs].count("echo") == 2, runs
        # History lists it and replays it
        table = client.predict(api_name="/history")
        assert "echo" in json.dumps(table, default=str)
        echo_id = max(i for i, m in runs if m == "echo")
        replayed = client.predict(rid=echo_id, api_name="/replay")
        assert "echo" in json.dumps(replayed, default=str).lower()
        # the Benchmark tab offers it and runs it beside baseline, every run logged
        status = client.predict(dataset="bundled-arithmetic", upload=None, methods=["baseline", "echo"], limit=1,
                                question_field="", answer_field="", max_think=40, max_answer=20,
                                api_name="/benchmark")[0]
        assert "every run logged" in status, status
        assert [m for _, m in query(db, "SELECT id, method FROM runs ORDER BY id")].count("echo") == 3



LANES = "[...document.querySelectorAll('#ID .tl-label')].map(e => e.innerText)"


def test_a_method_from_its_file_in_the_browser_timeline_history_export_and_import(method_file, tmp_path, monkeypatch,
                                                                                    browser):
    """The page as a user drives it: Echo is a choice on the Run tab and its run draws the timeline;
    History lists it, shows it with its timeline, exports it as JSON and as HTML (named by its label),
    and the JSON imports back into the same view."""
    monkeypatch.setenv(ENV, str(method_file))
    with launched(tmp_path) as (url, db, _proc):
        page = browser.new_page(viewport={"width": 1400, "height": 1200})
        page.goto(url)
        page.wait_for_selector("#method", timeout=60_000)
        page.get_by_label("Prompt").fill(PROMPT)
        page.locator("#method").get_by_label("Echo", exact=True).check()
        page.get_by_role("button", name="Run", exact=True).click()
        page.wait_for_function("!document.querySelector('#stop').disabled", timeout=30_000)
        page.wait_for_function("document.querySelector('#stop').disabled", timeout=180_000)
        assert "Echo" in page.locator(".strip").first.inner_text()
        assert page.evaluate(LANES.replace("ID", "timeline")) == ["main"]
        assert page.locator("#timeline .tl-bar").count() > 0, "every forward is a bar"
        assert "as plain decoding wrote them" in page.locator(".strip").first.inner_text()
        (rid,), = query(db, "SELECT id FROM runs WHERE method = 'echo'")
        page.get_by_role("tab", name="History").click()
        page.get_by_role("button", name="Refresh").click()
        page.wait_for_function("document.querySelector('.history-table').innerText.includes('echo')", timeout=30_000)
        page.get_by_label("Run id").fill(str(rid))
        page.get_by_role("button", name="Show this run").click()
        page.wait_for_function(f"{LANES.replace('ID', 'history-timeline')}.length === 1", timeout=30_000)
        assert page.locator("#history-timeline .tl-bar").count() > 0
        exported = {}
        for kind in ("JSON", "HTML"):
            page.get_by_role("button", name=f"Export {kind}").click()
            link = page.locator(".block", has_text="Exported file").locator(f"a[href*='.{kind.lower()}']").first
            link.wait_for(timeout=30_000)
            exported[kind] = page.request.get(link.get_attribute("href")).text()
        doc = json.loads(exported["JSON"])
        assert doc["run"]["method"] == "echo" and doc["events"]
        assert "Echo" in exported["HTML"] and "Final answer" in exported["HTML"] and "echoed" in exported["HTML"]
        # the import: a fresh page, the exported file, the run shown again with its strip and timeline
        page.goto(url)
        page.wait_for_selector("#method", timeout=60_000)
        page.get_by_role("tab", name="History").click()
        path = tmp_path / "echo-trace.json"
        path.write_text(exported["JSON"], encoding="utf-8")
        page.locator(".block", has_text="Import a JSON trace").locator("input[type=file]").set_input_files(str(path))
        page.wait_for_function(f"{LANES.replace('ID', 'history-timeline')}.length === 1", timeout=60_000)
        assert page.get_by_text("Echo", exact=True).count() > 0, "the imported run's strip names its method"
        assert page.get_by_text("Error", exact=True).count() == 0
        page.close()
