"""Imported traces are data, never markup (issue 54): every import is validated against the trace
schema (derived from the event dataclasses and RunStats) and refused naming its first bad field;
every value written into HTML, live, replayed, imported or exported, passes one escaping function;
the exports' housekeeping (one folder per server process, pruned; Gradio's copies swept) and the
CSV's neutralised formulas. The browser's side is ``tests/test_trace_fuzz_browser.py``."""

from __future__ import annotations

import csv
import io
import json
import os
import random
import re
import tempfile
import time
from pathlib import Path

import pytest

from engine.runlog import RunMeta
from ssr_ui import history
from ssr_ui.export import MAX_TRACE_BYTES, logged_view, run_from_json, run_to_html, runs_to_csv
from ssr_ui.frame import Frame, where_time_goes
from ssr_ui.render import CSS, metrics_html
from ssr_ui.trace_schema import MAX_PROPOSAL, MAX_TEXT
from tests.crafted import CLEAN, PAYLOAD, Elements, crafted, doc_of, random_trace, text_fields, texts_set

ROOT = Path(__file__).resolve().parents[1]


def _pages(row: dict, events: list) -> dict[str, str]:
    """Every HTML a trace becomes: the History tab's fragments (panes, strip, both timelines) and the export."""
    view = logged_view(row, events)
    frame = Frame.of(view, metrics_html(view, str(row.get("method", "?"))))
    return {"reasoning": frame.reasoning, "draft": frame.draft, "answer": frame.answer, "metrics": frame.metrics,
            "timeline": where_time_goes(view, "time"), "by forward": where_time_goes(view, "forward"),
            "export": run_to_html(row, events, CSS)}


def test_the_clean_traces_set_every_text_field_the_schema_has():
    """So that the crafted traces put the payload in every one of them (a field added later too)."""
    assert text_fields() - texts_set([doc_of(*make()) for make in CLEAN.values()]) == set()


@pytest.mark.parametrize("name", CLEAN)
def test_markup_in_every_text_field_is_shown_as_text(name):
    """Nothing the renderer did not make: the crafted trace's pages hold no (tag, attribute) that the
    clean trace's pages lack (no <img onerror>, no second <script>, no <iframe srcdoc>, no quote
    broken out of), and the payload shows, escaped, where the fields go."""
    clean = _pages(*run_from_json(json.dumps(doc_of(*CLEAN[name]()))))
    bad = _pages(*run_from_json(json.dumps(crafted(doc_of(*CLEAN[name]())))))
    shown = PAYLOAD.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")
    for part, page in bad.items():
        assert Elements(page).pairs <= Elements(clean[part]).pairs, part
        assert Elements(page).tags.count("script") == Elements(clean[part]).tags.count("script"), part
    assert shown in bad["export"] and shown in bad["metrics"] and shown in bad["reasoning"]
    if name == "ssr":  # the probe's fields: a forward's proposer, in the strip's forwards saved
        assert f"draft prefix{shown} 1" in bad["metrics"]
    else:  # an RSD step's source, on its badge and on the rejected step's note
        assert f'class="step step-draft{shown}"' in bad["reasoning"]


# (where, the value put there, what the refusal says): every bad import is refused naming its field
_TOKEN = 4  # the clean SSR trace's first token event (reasoning "Think")
_FORWARD = 2  # its first forward
_FORK = 7  # its drafting event
REFUSED = [
    ("events", _FORWARD, "index", "3", r"event 2 is malformed: forward field 'index' must be an integer, got str"),
    ("events", _FORWARD, "index", True, r"forward field 'index' must be an integer, got bool"),
    ("events", _FORWARD, "start", "0.1", r"forward field 'start' must be a number, got str"),
    ("events", _FORWARD, "rows", None, r"forward field 'rows' must be a list, got null"),
    ("events", _FORWARD, "rows", [{"row": "main"}], r"forward field 'rows\[0\].fed' is missing"),
    ("events", _FORWARD, "rows", [{"row": "main<b>", "fed": 1}], r"'rows\[0\].row' must be main, draft, prm"),
    ("events", _FORWARD, "rows", [{"row": "main", "fed": 1, "proposed": MAX_PROPOSAL + 1}],
     rf"'rows\[0\].proposed' must be at most {MAX_PROPOSAL}"),
    ("events", _FORWARD, "rows", [{"row": "main", "fed": "<img>"}], r"'rows\[0\].fed' must be an integer, got str"),
    ("events", _TOKEN, "status", "bogus", r"event 4 is malformed: token field 'status' must be one of generated"),
    ("events", _TOKEN, "stream", "wall_s", r"token field 'stream' must be one of reasoning, draft, answer"),
    ("events", _TOKEN, "position", -1, r"token field 'position' must not be negative, got -1"),
    ("events", _TOKEN, "position", 10**40, r"token field 'position' must be a finite number of magnitude at most"),
    ("events", _TOKEN, "text", ["<script>"], r"token field 'text' must be a string, got list"),
    ("events", _TOKEN, "text", "x" * (MAX_TEXT + 1), rf"token field 'text' is {MAX_TEXT + 1} characters long"),
    ("events", _TOKEN, "evil", "<script>", r"token field 'evil' is not one of a TokenEvent's"),
    ("events", _FORK, "draft", "<img src=x>", r"phase field 'draft' must be an integer, got str"),
    ("events", _FORK, "draft", None, r"phase field 'draft' must be an integer here, got null"),
    ("events", 0, "done", "<img src=x>", r"event 0 is malformed: phase field 'done' must be an integer, got str"),
    ("events", 0, "kind", "done", r"event 0 has an unknown kind"),
    ("run", None, "draft_saved", "<img src=x onerror=alert(1)>",
     r"the run is malformed: field 'draft_saved' must be an integer, got str"),
    ("run", None, "server_accepted", [1], r"field 'server_accepted' must be an integer, got list"),
    ("run", None, "server_proposed", {"a": 1}, r"field 'server_proposed' must be an integer, got dict"),
    ("run", None, "server_steps", "9", r"field 'server_steps' must be an integer, got str"),
    ("run", None, "wall_s", 1e308, r"field 'wall_s' must be a finite number of magnitude at most"),
    ("run", None, "prompt", {"<b>": 1}, r"field 'prompt' must be a string, got dict"),
    ("run", None, "created_at", ["nested"], r"field 'created_at' must be a single value, got list"),
    ("run", None, "config", {"max_think": {"a": [1]}}, r"field 'config' \(setting 'max_think'\) must be a single value"),
    ("run", None, "config", "[]", r"field 'config' must be an object of settings, got str"),
]


@pytest.mark.parametrize("where, index, field, value, message", REFUSED,
                         ids=[f"{w}-{f}-{type(v).__name__}" for w, _, f, v, _ in REFUSED])
def test_a_bad_import_is_refused_naming_its_first_bad_field(where, index, field, value, message):
    doc = doc_of(*CLEAN["ssr"]())
    target = doc["run"] if where == "run" else doc["events"][index]
    target[field] = value
    with pytest.raises(ValueError, match=message):
        run_from_json(json.dumps(doc))


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "nests deeper than any trace does"),
    ('{"format": "ssr-studio-trace/1", "run": {"id": ' + "9" * 5000 + "}}", "not a trace: "),
    ('{"format": "ssr-studio-trace/1", "run": {"wall_s": NaN}}', "'wall_s' must be a finite number"),
    ('{"format": "ssr-studio-trace/1", "run": {}, "events": {"0": {}}}', "the events must be a list, got dict"),
    ('{"format": "ssr-studio-trace/1", "run": [1]}', "the run must be an object, got list"),
    ("<script>alert(1)</script>", "not a JSON file"),
    ('{"format": "other"}', "not an SSR Studio trace"),
])
def test_a_file_that_is_not_a_trace_is_refused_with_its_reason(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        run_from_json(text)


def test_the_studio_refuses_a_bad_or_huge_import_with_a_message_not_an_error(studio, tmp_path):
    """import_trace (what History's import calls; its ValueError becomes the strip's message) on the
    probe's string index, an upload over the limit, and the crafted trace, which it shows as text."""
    doc = doc_of(*CLEAN["ssr"]())
    doc["events"][_FORWARD]["index"] = "<img src=x onerror=alert(1)>"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(ValueError, match="event 2 is malformed: forward field 'index' must be an integer, got str"):
        studio.import_trace(str(bad))
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({**doc_of(*CLEAN["ssr"]()), "pad": "x" * (MAX_TRACE_BYTES + 2**20)}), encoding="utf-8")
    with pytest.raises(ValueError, match=f"huge.json is 21.0 MB: a trace import reads at most {MAX_TRACE_BYTES // 2**20} MB"):
        studio.import_trace(str(huge))
    with pytest.raises(ValueError, match="a trace is at most 20 MB"):
        run_from_json(huge.read_text(encoding="utf-8"))
    evil = tmp_path / "evil.json"
    evil.write_text(json.dumps(crafted(doc_of(*CLEAN["ssr"]()))), encoding="utf-8")
    frame = studio.import_trace(str(evil))
    clean = tmp_path / "clean.json"
    clean.write_text(json.dumps(doc_of(*CLEAN["ssr"]())), encoding="utf-8")
    plain = studio.import_trace(str(clean))
    for part in ("reasoning", "draft", "answer", "metrics"):
        assert Elements(getattr(frame, part)).pairs <= Elements(getattr(plain, part)).pairs, part


def test_random_traces_that_fit_the_schema_render_without_raising():
    """What validation lets through, the renderer shows: 150 random traces of schema-typed values
    (huge, negative, empty, markup) through every page, nothing but a ValueError ever raised."""
    for seed in range(150):
        doc = random_trace(random.Random(seed))
        row, events = run_from_json(json.dumps(doc))
        pages = _pages(row, events)
        for part, page in pages.items():
            assert "<img" not in page and "<iframe" not in page, (seed, part)


def test_a_run_of_thousands_of_drafts_renders_in_linear_time():
    """A trace is no way to starve the studio: 3000 drafts, each with its lane and fork marks."""
    doc = doc_of(*CLEAN["ssr"]())
    doc["events"] = [e for i in range(3000) for e in (
        {"kind": "phase", "phase": "drafting", "t": i * 1e-3, "draft": i, "at_token": i},
        {"kind": "forward", "index": i, "phase": "reasoning", "start": i * 1e-3, "end": i * 1e-3 + 1e-4,
         "rows": [{"row": "main", "fed": 1, "kept": 1}, {"row": f"draft {i}", "fed": 1, "kept": 1}]},
        {"kind": "token", "stream": "reasoning", "status": "generated", "token_id": 1, "text": "a", "position": i,
         "t": i * 1e-3})]
    start = time.perf_counter()
    pages = _pages(*run_from_json(json.dumps(doc)))
    assert time.perf_counter() - start < 10, "quadratic in the drafts (a lane's rows, a lane's marks, the forks)"
    assert pages["export"].count('aria-label="draft ') == 2 * 3000  # both timelines


def test_one_escaping_function_writes_every_value():
    """The renderer's three files escape through ``ssr_ui.render.esc`` alone."""
    sources = {name: (ROOT / "ssr_ui" / name).read_text(encoding="utf-8")
               for name in ("render.py", "timeline.py", "export.py")}
    assert sum(text.count("html.escape(") for text in sources.values()) == 1
    assert "def esc(" in sources["render.py"] and "import html\n" not in sources["timeline.py"] + sources["export.py"]


def test_the_csv_export_neutralises_formulas_and_keeps_numbers():
    """OWASP's rule: a text cell starting with = + - @ tab or carriage return gets a leading quote;
    numbers (negative ones too) and other texts are written as they are."""
    prompts = ["=HYPERLINK(\"http://x\")", "+1", "-2+3", "@SUM(A1)", "\tx", "\rx", "plain", "a=b", "'=quoted"]
    rows = [{"id": 1, "prompt": p, "wall_s": -0.5, "correct": -1} for p in prompts]
    back = list(csv.DictReader(io.StringIO(runs_to_csv(rows), newline="")))
    assert [r["prompt"] for r in back] == ["'" + p for p in prompts[:6]] + prompts[6:]
    assert {r["wall_s"] for r in back} == {"-0.5"} and {r["correct"] for r in back} == {"-1"}


def test_the_studio_csv_of_a_formula_prompt_is_neutralised(studio):
    studio.log.save(RunMeta("baseline", "tiny", "=1+1", {}), [], "ok")
    text = Path(studio.export(None, "csv")).read_text(encoding="utf-8")
    assert [r["prompt"] for r in csv.DictReader(text.splitlines())] == ["'=1+1"]


def test_exports_share_one_folder_per_process_and_it_is_pruned(studio, tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    run_id = studio.log.save(RunMeta("baseline", "tiny", "hello", {}), [], "ok")
    paths = [Path(studio.export(run_id, kind)) for kind in ("json", "html", "json")] + [
        Path(studio.export(None, "csv", "ssr/../../x"))]
    folder = tmp_path / "tmp" / f"ssr-studio-exports-{os.getpid()}"
    assert os.listdir(tmp_path / "tmp") == [folder.name], "one folder, no mkdtemp per export beside it"
    assert [p.parent.parent for p in paths] == [folder] * 4 and len({p.parent for p in paths}) == 4
    assert [p.name for p in paths] == [f"run-{run_id}.json", f"run-{run_id}.html", f"run-{run_id}.json",
                                       "runs-ssr_______x.csv"]
    # the newest EXPORTS_KEPT stay, and none past EXPORT_MAX_AGE_S
    now = time.time()
    for i in range(history.EXPORTS_KEPT + 10):
        made = folder / f"old{i:03d}"
        made.mkdir()
        (made / "run-1.json").write_text("{}")
        os.utime(made, (now - 60 - i, now - 60 - i))
    stale = paths[0].parent
    os.utime(stale, (now - history.EXPORT_MAX_AGE_S - 5,) * 2)
    history.prune_exports(folder, now)
    left = sorted(p.name for p in folder.iterdir())
    assert len(left) == history.EXPORTS_KEPT and stale.name not in left
    assert "old000" in left and f"old{history.EXPORTS_KEPT + 9:03d}" not in left  # the oldest went first


def test_gradio_sweeps_its_copies_of_the_exports(studio):
    """Gradio copies each served file into its cache: the studio's Blocks sweeps them (delete_cache)."""
    from ssr_ui.layout import build_app

    assert build_app(studio).delete_cache == history.PastRuns.DELETE_CACHE == (600, history.EXPORT_MAX_AGE_S)
