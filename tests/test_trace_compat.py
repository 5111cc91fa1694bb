"""Traces exported by an earlier release still import, replay and export: ``tests/data/trace-v17-*.json``
were written by the studio as it was at run-log schema 17 (commit ea51161: an SSR and an RSD run on
the tiny test models, exported with History's JSON export), before the trace schema, the per-proposer
counts and the thinking setting existed; ``trace-v18-*.json`` at schema 18 (commit f3c6f9e: SSR, SSR
early exit, RSD and sd, before the run's counters became per-method records). An import validates
them, folds them into the panes, draws the strip and the timeline, and writes the HTML export, with no
field refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ssr_ui.export import run_from_json, run_to_html

DATA = Path(__file__).parent / "data"
OLD = sorted(DATA.glob("trace-v*-*.json"))


def test_the_committed_traces_are_there():
    assert [p.name for p in OLD] == ["trace-v17-rsd.json", "trace-v17-ssr.json", "trace-v18-rsd.json",
                                     "trace-v18-sd.json", "trace-v18-ssr-exit.json", "trace-v18-ssr.json"]


@pytest.mark.parametrize("path", OLD, ids=lambda p: p.stem)
def test_an_earlier_schemas_trace_imports_replays_and_exports(studio, path, tmp_path):
    text = path.read_text(encoding="utf-8")
    row, events = run_from_json(text)  # the schema's checks: nothing refused
    assert row["method"] == path.stem.split("-", 2)[2] and events
    frame = studio.import_trace(str(path))
    assert "error" not in frame.metrics.lower(), frame.metrics
    for stream, pane in (("reasoning", frame.reasoning), ("answer", frame.answer)):  # every token drawn
        tokens = sum(1 for e in json.loads(text)["events"] if e.get("stream") == stream)
        assert pane.count("<span") >= tokens, stream
    assert frame.reasoning.count("<span") > 0
    page = run_to_html(row, events, css="")
    assert "<h1>SSR Studio trace</h1>" in page and "Final answer" in page


def test_a_row_logged_before_a_column_existed_exports_and_imports(studio):
    """A run logged before a migration added a column holds NULL there (schema 18's lookup counts
    on a schema 17 log's rows): its JSON export names the column with null, and the import takes it
    (the tempting wrong answer: 'field lookup_prompt must be an integer, got NoneType')."""
    import sqlite3

    list(studio.run("hello", "SSR", "tiny", draft_start=2, max_think=10, max_draft=8, max_answer=10))
    run_id = studio.history()[0]["id"]
    with sqlite3.connect(studio.log.path) as db:
        db.execute("UPDATE runs SET lookup_prompt = NULL, lookup_reasoning = NULL, lookup_answer = NULL")
    path = studio.export(run_id, "json")
    assert json.loads(Path(path).read_text())["run"]["lookup_prompt"] is None
    frame = studio.import_trace(path)
    assert "malformed" not in frame.metrics and "error" not in frame.metrics.lower(), frame.metrics


@pytest.mark.parametrize("path", OLD, ids=lambda p: p.stem)
def test_the_runs_stats_come_back_whole_from_a_flat_row(path):
    """A run's stats are records per method (``rsd``, ``server``, ``exit``) flattened only in the log and
    the trace (``exit.at`` is the column ``exit_at``): every column an earlier schema wrote reads back into
    its record and flattens to the same value."""
    from engine.events import RunStats

    row, _ = run_from_json(path.read_text(encoding="utf-8"))
    stats = RunStats.from_dict({k: v for k, v in row.items() if v is not None})
    flat = stats.to_dict()
    assert {k: row[k] for k in flat if row.get(k) is not None} == {k: flat[k] for k in flat if row.get(k) is not None}
    if row["method"] == "ssr-exit":
        assert stats.exit.rule == row["exit_rule"] and stats.exit.rule
    if row["method"] == "rsd":
        assert stats.rsd.steps_accepted + stats.rsd.steps_rejected == row["steps_accepted"] + row["steps_rejected"] > 0
