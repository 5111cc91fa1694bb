"""The SQLite run log: rows mirror RunStats, traces re-render, statuses, threads, migrations."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from engine.config import RunConfig
from engine.events import RunStats
from engine.runlog import SCHEMA_VERSION, RunLog, RunMeta
from engine.ssr import decode_ssr
from tests.tiny import make_model

CFG = RunConfig(max_think=10, draft_start=2, max_draft=6, max_answer=8)


@pytest.fixture(scope="module")
def lm():
    return make_model("llama", init_scale=3.0)


def _run(log, lm, prompt="hello world"):
    return list(log.record(decode_ssr(lm, prompt, CFG), RunMeta("ssr", lm.model_id, prompt, CFG.to_dict())))


def test_row_mirrors_stats_and_trace_rerenders(tmp_path, lm):
    log = RunLog(tmp_path / "runs.db")
    events = _run(log, lm)
    [row] = log.runs()
    done = events[-1]
    assert row["status"] == "ok" and row["method"] == "ssr"
    for name, value in done.stats.to_dict().items():
        if name != "method":
            assert row[name] == pytest.approx(value), name
    assert row["answer_text"] == done.answer_text
    assert log.events(row["id"]) == events[:-1]  # every event, in order, identical


def test_cancelled_and_error_runs_are_logged(tmp_path, lm):
    log = RunLog(tmp_path / "runs.db")
    stream = log.record(decode_ssr(lm, "hello world", CFG), RunMeta("ssr", "m", "hello world"))
    for i, _ in enumerate(stream):
        if i == 5:
            break
    stream.close()

    def broken():
        yield from list(decode_ssr(lm, "x", CFG))[:3]
        raise RuntimeError("device lost")

    with pytest.raises(RuntimeError):
        list(log.record(broken(), RunMeta("ssr", "m", "x")))
    error, cancelled = log.runs()
    assert cancelled["status"] == "cancelled" and cancelled["reasoning_tokens"] > 0
    assert error["status"] == "error" and error["error"] == "RuntimeError: device lost"


def test_writes_from_many_threads(tmp_path, lm):
    log = RunLog(tmp_path / "runs.db")
    errors = []

    def work(i):
        try:
            log.save(RunMeta("baseline", "m", f"p{i}"), [], "ok")
        except Exception as err:  # collected for the assertion below
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(log.runs()) == 16
    assert sqlite3.connect(tmp_path / "runs.db").execute("pragma journal_mode").fetchone()[0] == "wal"


def test_old_schema_is_migrated(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        create table meta (key text primary key, value text);
        insert into meta values ('schema_version', '1');
        create table runs (id integer primary key, created_at text, method text, model text, prompt text,
                           prompt_hash text, config text, status text, error text);
        insert into runs (method, model, prompt, status) values ('baseline', 'old-model', 'hi', 'ok');
        create table events (run_id integer, seq integer, kind text, stream text, status text, token_id integer,
                             text text, position integer, draft integer, source text, match_len integer,
                             t float, phase text, at_token integer, primary key (run_id, seq));
    """)
    conn.commit()
    conn.close()
    log = RunLog(path)
    old = log.runs()[0]
    assert old["model"] == "old-model" and "tokens_per_s" in old and old["tokens_per_s"] is None
    assert set(RunStats.field_names()) - {"method"} <= set(log.columns())
    assert sqlite3.connect(path).execute("select value from meta").fetchone()[0] == str(SCHEMA_VERSION)


def test_bad_inputs_have_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        RunLog(tmp_path / "missing" / "runs.db")
    log = RunLog(tmp_path / "runs.db")
    with pytest.raises(ValueError, match="unknown runs column"):
        log.runs(nonsense=1)
    with pytest.raises(ValueError, match="no run with id 99"):
        log.run(99)
