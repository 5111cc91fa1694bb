"""The studio's job registry: which job a cancel reaches, that no job starts twice, and the cancel
contract (ssr_ui/jobs.py): the reply says what happened to the job, and its run-log row agrees,
whichever of the cancel and the job's end comes first (each order driven deterministically).
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from engine.events import DoneEvent
from ssr_ui import handlers
from ssr_ui.handlers import Studio
from ssr_ui.jobs import ALREADY_FINISHED, CANCELLED, NOT_FOUND, CancelRoute, Jobs
from tests.apps import query
from tests.tiny import make_model


def test_a_cancel_reaches_its_own_job_only():
    jobs = Jobs()
    jobs.joined("a", "s1")
    jobs.joined("b", "s1")
    jobs.cancel("a")
    assert jobs.start("a", "s1").cancelled and not jobs.start("b", "s1").cancelled


def test_a_job_never_starts_twice():
    jobs = Jobs()
    assert jobs.start("a", "s") is not None
    assert jobs.start("a", "s") is None  # Gradio restarting it after a reset


def test_cancel_before_the_join_reply_reaches_the_joining_job_not_the_running_one():
    jobs = Jobs()
    jobs.joined("running", "s")
    jobs.start("running", "s")
    jobs.joining("s")  # the client submitted another job and cancels before learning its id
    jobs.cancel(None, "s")
    jobs.joined("new", "s")
    assert jobs.start("new", "s").cancelled
    assert not jobs.get("running").cancelled  # tempting wrong answer: the session's newest known job


def test_cancel_without_an_id_and_no_join_in_flight_takes_the_newest_unfinished_job():
    jobs = Jobs()
    with jobs.running("old", "s"):
        pass
    jobs.joined("queued", "s")
    jobs.joined("other-session", "t")
    assert jobs.cancel(None, "s") == (CANCELLED, "queued")
    assert jobs.get("queued").cancelled and not jobs.get("other-session").cancelled


def test_cancel_sent_before_its_join_arrives_reaches_that_join():
    """gradio_client may post the cancel before its join reaches the server; the session's other
    jobs have ended. The tempting wrong answers: "not found" (the job then runs, its cancel lost),
    or a later id-less cancel taking this job for its own (a storm caught that)."""
    jobs = Jobs()
    jobs.joined("earlier", "s")
    jobs.cancel("earlier")
    assert jobs.cancel(None, "s") == (CANCELLED, None)  # for the job still to come
    jobs.joining("s")
    jobs.joined("late", "s")
    assert jobs.get("late").cancelled
    jobs.joined("next", "s")
    assert not jobs.get("next").cancelled  # one cancel, one job


def test_stop_marks_every_job_of_its_session_only():
    jobs = Jobs()
    for eid, session in (("a", "tab1"), ("b", "tab1"), ("c", "tab2")):
        jobs.joined(eid, session)
    assert jobs.cancel_session("tab1") == 2
    assert [jobs.get(e).cancelled for e in "abc"] == [True, True, False]


# ----------------------------------------------------------------------------- the reply, in each order

def test_the_reply_says_what_happened_to_the_job():
    jobs = Jobs()
    jobs.joined("queued", "s")
    assert jobs.cancel("queued") == (CANCELLED, "queued")
    assert jobs.cancel("never-joined") == (NOT_FOUND, "never-joined")
    with jobs.running("done", "s") as job:
        assert job.end_run(last=True)  # its last run claimed its end
        assert jobs.cancel("done") == (ALREADY_FINISHED, "done")
    assert not job.cancelled and job.finished
    with jobs.running("late", "s") as job:
        assert jobs.cancel("late") == (CANCELLED, "late")
        assert not job.end_run(last=True)  # the run claims its end after the cancel: too late
    assert job.cancelled and not job.finished
    assert jobs.cancel(None, "s") == (CANCELLED, None)  # nothing unfinished: for the session's next join


def test_a_middle_run_of_a_job_leaves_it_cancellable():
    jobs = Jobs()
    with jobs.running("compare", "s") as job:
        assert job.end_run(last=False)  # the baseline of a comparison ended: the job goes on
        assert jobs.cancel("compare") == (CANCELLED, "compare")
        assert not job.end_run(last=True)


def test_the_cancel_route_answers_with_the_contract():
    jobs = Jobs()
    jobs.joined("e1", "s")
    with jobs.running("e2", "s") as job:
        job.end_run(last=True)
    route = CancelRoute(None, jobs)

    def post(body: dict) -> dict:
        sent = []

        async def receive():
            return {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}

        async def send(message):
            sent.append(message)

        asyncio.run(route({"type": "http", "method": "POST", "path": "/gradio_api/cancel"}, receive, send))
        assert sent[0]["status"] == 200
        return json.loads(sent[1]["body"])

    assert post({"event_id": "e1", "session_hash": "s"}) == {"success": True, "status": CANCELLED, "event_id": "e1"}
    assert post({"event_id": "e2", "session_hash": "s"})["status"] == ALREADY_FINISHED
    assert post({"event_id": "zz", "session_hash": "s"}) == {"success": False, "status": NOT_FOUND, "event_id": "zz"}
    # not a string id: read as no id, so it waits for that session's next join
    assert post({"event_id": 7, "session_hash": "nobody"}) == {"success": True, "status": CANCELLED, "event_id": None}


# ----------------------------------------------------------------------------- the race, held both ways

PROMPT = "Start with 4, then add 5. What is the result?"
SETTINGS = dict(max_think=12, max_answer=8)


@pytest.fixture
def studio(tmp_path):
    s = Studio("tiny", db=str(tmp_path / "runs.db"))
    s.add_model("tiny", make_model("llama", init_scale=3.0))
    return s


def _statuses(studio) -> list[str]:
    return [status for (status,) in query(studio.log.path, "select status from runs order by id")]


class Hold:
    """A gate in another thread's way: ``reached`` is set when that thread arrives, and it waits
    there until the test calls :meth:`release`."""

    def __init__(self) -> None:
        self.reached, self._go = threading.Event(), threading.Event()

    def wait_here(self) -> None:
        self.reached.set()
        assert self._go.wait(60), "the test never released the hold"

    def release(self) -> None:
        self._go.set()


def _race(studio, hold: Hold, event_id: str, reply: str) -> list:
    """Run a job in a thread until it reaches ``hold``, cancel it there (the reply must be
    ``reply``), let it go on; its frames."""
    frames: list = []

    def work():
        with studio.jobs.running(event_id, "s") as job:
            frames.extend(studio.run(PROMPT, "Baseline", job=job, **SETTINGS))

    studio.jobs.joined(event_id, "s")
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    assert hold.reached.wait(60), "the job never reached the hold"
    assert studio.jobs.cancel(event_id) == (reply, event_id)
    hold.release()
    thread.join(60)
    return frames


def test_a_cancel_that_arrives_while_the_final_event_is_held_wins(studio, monkeypatch):
    """The run's final event is held before it reaches the run log; the cancel arrives: the reply
    says cancelled and the row says cancelled."""
    hold, real = Hold(), handlers.decoder

    def held_decoder(*args):
        decode = real(*args)

        def run(prompt, cfg):
            for ev in decode(prompt, cfg):
                if isinstance(ev, DoneEvent):
                    hold.wait_here()
                yield ev
        return run

    monkeypatch.setattr(handlers, "decoder", held_decoder)
    frames = _race(studio, hold, "e1", CANCELLED)
    assert _statuses(studio) == ["cancelled"]
    assert frames[-1].view.phase == "stopped" and "stopped" in frames[-1].metrics


def test_a_cancel_that_arrives_after_the_job_claimed_its_end_changes_nothing(studio, monkeypatch):
    """The reverse: the run has claimed its end and its row is being written (held) when the
    cancel arrives: the reply says already finished and the row says ok."""
    hold, save = Hold(), studio.log.save

    def held_save(*args, **kwargs):
        hold.wait_here()
        return save(*args, **kwargs)

    monkeypatch.setattr(studio.log, "save", held_save)
    frames = _race(studio, hold, "e2", ALREADY_FINISHED)
    assert _statuses(studio) == ["ok"]
    assert frames[-1].view.phase == "done"


def test_a_job_cancelled_while_queued_runs_nothing_and_leaves_no_row(studio):
    studio.jobs.joined("e3", "s")
    assert studio.jobs.cancel("e3") == (CANCELLED, "e3")
    with studio.jobs.running("e3", "s") as job:
        frames = list(studio.run(PROMPT, "Baseline", job=job, **SETTINGS))
    assert _statuses(studio) == [] and frames == []
