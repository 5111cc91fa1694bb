"""The SQLite run log: rows mirror RunStats, traces re-render, statuses, threads, migrations."""

from __future__ import annotations

import contextlib
import sqlite3
import threading

import pytest

from engine.config import RunConfig
from engine.events import RunStats
from engine.methods.ssr.loop import decode_ssr
from engine.runlog import SCHEMA_VERSION, RunLog, RunLogError, RunMeta, store
from tests.apps import query
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
        except Exception as err:  # noqa: BLE001 (collected for the assertion below)
            errors.append(err)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(log.runs()) == 16
    assert query(tmp_path / "runs.db", "pragma journal_mode") == [("wal",)]


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
    assert set(RunStats.columns()) - {"method"} <= set(log.columns())
    assert query(path, "select value from meta where key = 'schema_version'") == [(str(SCHEMA_VERSION),)]


def test_a_log_of_schema_17_opens_and_its_rows_show_what_they_have(tmp_path):
    """Schema 18 counts lookups apart from ``recovered``: a row logged before keeps its ``recovered``
    (lookups included), its lookup columns null, and History's chart and a replay read it as it is."""
    import sqlite_utils

    from engine.events import DoneEvent
    from ssr_ui.charts import token_composition

    path = tmp_path / "runs.db"
    log = RunLog(path)
    log.save(RunMeta("ssr", "m", "p"), [DoneEvent(RunStats(method="ssr", answer_tokens=45, recovered=40,
                                                           generated=5), "", "")], "ok")
    db = sqlite_utils.Database(path)  # back to today's file: no lookup columns, schema 17
    db["runs"].transform(drop={"lookup_prompt", "lookup_reasoning", "lookup_answer"})
    db["meta"].upsert({"key": "schema_version", "value": "17"}, pk="key")
    db.conn.close()
    old = RunLog(path).runs()[0]
    assert query(path, "select value from meta where key = 'schema_version'") == [(str(SCHEMA_VERSION),)] == [("19",)]
    assert old["recovered"] == 40 and old["lookup_reasoning"] is None
    assert {t.name: t.y[0] for t in token_composition([old]).data} == {"accepted": 0, "recovered": 40, "lookups": 0,
                                                                       "generated": 5}
    stats = RunStats.from_dict({k: v for k, v in old.items() if v is not None})
    assert stats.won()["suffix in drafts"] == 40 and stats.repetition() == ""


def test_bad_inputs_have_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        RunLog(tmp_path / "missing" / "runs.db")
    log = RunLog(tmp_path / "runs.db")
    assert log.notice is None
    with pytest.raises(ValueError, match="unknown runs column"):
        log.runs(nonsense=1)
    with pytest.raises(ValueError, match="no run with id 99"):
        log.run(99)


# ----------------------------------------------------------------------------- faults (issue 16)

def _schema_ok(path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("pragma integrity_check").fetchone()[0] == "ok"
        assert conn.execute("pragma journal_mode").fetchone()[0] == "wal"
        assert conn.execute("select value from meta where key = 'schema_version'").fetchone()[0] == str(SCHEMA_VERSION)
        runs = {r[1]: r for r in conn.execute("pragma table_info(runs)")}
        assert runs["id"][5] == 1 and runs["wall_s"][2].upper() in ("FLOAT", "REAL"), "runs is not this version's table"
        indexes = {r[1] for r in conn.execute("pragma index_list(runs)")}
        assert len(indexes) >= 2


def test_a_save_is_one_transaction(tmp_path, lm, monkeypatch):
    """A failure between the run row and its events leaves nothing behind."""
    log = RunLog(tmp_path / "runs.db")
    events = list(decode_ssr(lm, "hello world", CFG))
    real = store.event_values  # the row of each event, as the store writes it

    def failing(run_id, seq, ev):
        if seq == 3:
            raise sqlite3.OperationalError("disk full (injected)")
        return real(run_id, seq, ev)

    monkeypatch.setattr(store, "event_values", failing)
    with pytest.raises(RunLogError, match="run not saved.*disk full"):
        log.save(RunMeta("ssr", "m", "hello world"), events, "ok")
    assert query(tmp_path / "runs.db", "select count(*) from runs") == [(0,)]
    assert query(tmp_path / "runs.db", "select count(*) from events") == [(0,)]


def test_a_deleted_file_is_recreated_with_the_full_schema(tmp_path, lm):
    path = tmp_path / "runs.db"
    log = RunLog(path)
    _run(log, lm)
    path.unlink()  # deleted while the app runs
    events = _run(log, lm, "Start with 7")
    assert [r["prompt"] for r in log.runs()] == ["Start with 7"]  # History keeps working (ordered by id)
    assert log.events(log.runs()[0]["id"]) == events[:-1]
    assert log.notice and "re-created" in log.notice and str(path) in log.notice
    _schema_ok(path)
    # a restart finds a healthy file: nothing to repair, nothing to say
    again = RunLog(path)
    assert again.notice is None and len(again.runs()) == 1


def test_tables_this_app_did_not_create_are_moved_aside_never_stamped(tmp_path, lm):
    """The schema a guessed insert makes (no id, no meta, TEXT columns) is never written into."""
    path = tmp_path / "runs.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        create table runs (created_at text, method text, model text, wall_s text);
        insert into runs values ('2026', 'baseline', 'm', '0.5');
        create table events (run_id text, seq text, kind text);
    """)
    conn.commit()
    conn.close()
    log = RunLog(path)
    assert log.notice and "did not create" in log.notice
    _schema_ok(path)
    [aside] = tmp_path.glob("runs.db.broken-*")
    assert "meta" not in {r[0] for r in query(aside, "select name from sqlite_master")}, "a version was stamped"
    assert query(aside, "select count(*) from runs") == [(1,)], "the old rows are kept"
    _run(log, lm)
    assert len(log.runs()) == 1


@pytest.mark.parametrize("case, message", [
    ("directory", "is a directory"),
    ("not-sqlite", "not an SQLite database"),
    ("unwritable", "cannot be (opened for writing|written)"),
    ("newer", "newer than this app"),
])
def test_a_run_log_that_cannot_be_used_is_refused_clearly(tmp_path, case, message):
    path = tmp_path / "runs.db"
    if case == "directory":
        path.mkdir()
    elif case == "not-sqlite":
        path.write_text("these are my notes, not a database\n" * 50)
    elif case == "unwritable":
        RunLog(path)
        (tmp_path / "runs.db-wal").mkdir()  # SQLite cannot write its journal: bites root too
    else:
        RunLog(path)
        conn = sqlite3.connect(path)
        conn.execute("update meta set value = '99'")
        conn.commit()
        conn.close()
    with pytest.raises(RunLogError, match=message) as err:
        RunLog(path)
    assert str(path) in str(err.value)


def test_a_write_that_fails_mid_session_says_so(tmp_path, lm):
    path = tmp_path / "runs.db"
    log = RunLog(path)
    (tmp_path / "runs.db-wal").mkdir()
    with pytest.raises(RunLogError, match="run not saved"):
        _run(log, lm)
