"""The run log tells the truth under faults: cancel storms, a deleted file, kill -9 mid-burst.

Each job gets its own prompt, so a row names its job. After every storm the log must hold at
most one row per job, and each row must agree with the studio's reply to that job's cancel (the
cancel contract, ssr_ui/jobs.py): ``cancelled`` -> the row says ``cancelled``, or there is no row (a
job cancelled before it started runs nothing, by design: docs/STUDIO.md); ``already finished`` or
``not found`` (an id-less cancel after the session's jobs had all ended) -> the row says ``ok``. No
job may run twice, and ``PRAGMA integrity_check`` must pass. The test never guesses from timing
whether a job ended first: the reply says. Bounded: each storm is 20 Baseline jobs.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter

import pytest

from tests.apps import cancel_replies, launched, query, wait_for

JOBS = 20
SHORT = dict(method="Baseline", max_think=60, max_answer=20)
LONG = dict(method="Baseline", max_think=600, max_answer=400)  # a class prompt: over a second, longer than any delay


def _prompt(tag: str, i: int) -> str:
    return f"Start with {i}, then add 7. What is the result? ({tag})"


def _class_prompt(tag: str, i: int) -> str:
    return (f"Write a Python class Garden{i}. Fields: rose, tulip, daisy. Each field starts at its letter count "
            f"times 3. Methods: total, reset. ({tag})")


def _rows(db) -> list[tuple[str, str]]:
    assert query(db, "pragma integrity_check") == [("ok",)]
    return query(db, "select prompt, status from runs")


def _settle(url: str) -> None:
    """Wait until every queued job has been handled: a fresh job behind them all completes."""
    from gradio_client import Client

    metrics = Client(url, verbose=False).predict(prompt="Start with 1, then add 1. What is the result?",
                                                 api_name="/run", **SHORT)[3]
    assert "done" in metrics


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with launched(tmp_path_factory.mktemp("storm")) as (url, db, _proc):
        yield url, db


@pytest.mark.parametrize("shared", [True, False], ids=["shared-client", "client-per-job"])
@pytest.mark.parametrize("delay", [0.05, 0.2])
def test_cancel_storm_logs_each_job_as_its_reply_said(app, shared, delay, monkeypatch):
    from gradio_client import Client

    url, db = app
    tag = f"{'shared' if shared else 'own'}-{delay}"
    client = Client(url, verbose=False) if shared else None
    replies = cancel_replies(monkeypatch)
    said = {}
    for i in range(JOBS):
        job = (client or Client(url, verbose=False)).submit(prompt=_class_prompt(tag, i), api_name="/run", **LONG)
        time.sleep(delay)  # how far the job gets before its cancel: varied, never relied on
        job.cancel()
        assert len(replies) == i + 1, "each cancel gets a reply"
        said[_class_prompt(tag, i)] = replies[-1]["status"]
    _settle(url)
    rows = [(p, s) for p, s in _rows(db) if p.endswith(f"({tag})")]
    per_job = Counter(p for p, _ in rows)
    assert all(n == 1 for n in per_job.values()), f"a job was logged twice: {per_job.most_common(3)}"
    logged = dict(rows)
    expected = {"cancelled": {"cancelled", None}, "already finished": {"ok"}, "not found": {"ok"}}
    wrong = [(said[p], logged.get(p)) for p in said if logged.get(p) not in expected[said[p]]]
    assert not wrong, f"(reply, row) pairs that disagree: {Counter(wrong)} of {JOBS}"
    assert Counter(said.values())["cancelled"] > 0, f"no cancel reached a job: {Counter(said.values())}"


def test_deleting_the_file_while_running(app, tmp_path):
    from gradio_client import Client

    url, db = app
    os.remove(db)
    client = Client(url, verbose=False)
    strips = [client.predict(prompt=_prompt("after-delete", i), api_name="/run", **SHORT)[3] for i in (0, 1, 2, 9)]
    assert all("done" in m for m in strips)
    assert "re-created" in strips[0] and not any("re-created" in m for m in strips[1:]), "said once, by the run that re-created it"
    rows = _rows(db)
    assert sorted(p for p, _ in rows) == sorted([_prompt("after-delete", i) for i in (0, 1, 2, 9)])
    assert {s for _, s in rows} == {"ok"}
    history = client.predict("all", api_name="/history")
    assert len(history[0]["data"]) == 4


def test_kill_9_mid_burst_leaves_a_sound_log(tmp_path):
    from gradio_client import Client

    with launched(tmp_path) as (url, db, proc):
        jobs = [Client(url, verbose=False).submit(prompt=_prompt("burst", i), api_name="/run", **SHORT)
                for i in range(6)]
        wait_for(lambda: any(j.done() for j in jobs), "a job of the burst to finish")
        finished = sum(j.done() for j in jobs)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=20)
        rows = _rows(db)
    assert finished >= 1
    assert finished <= len(rows) <= len(jobs), "rows must be the finished jobs (one may finish while being killed)"
    assert {s for _, s in rows} == {"ok"}
    assert all(n > 0 for (n,) in query(db, "select count(e.seq) from runs r left join events e on e.run_id = r.id "
                                          "group by r.id")), "a run row without its events"
