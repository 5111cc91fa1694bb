"""The studio's job registry: which job a cancel reaches, and that no job starts twice."""

from __future__ import annotations

from ssr_ui.jobs import Jobs


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
    assert not jobs._jobs["running"].cancelled  # tempting wrong answer: the session's newest known job


def test_cancel_without_an_id_and_no_join_in_flight_takes_the_newest_unfinished_job():
    jobs = Jobs()
    with jobs.running("old", "s"):
        pass
    jobs.joined("queued", "s")
    jobs.joined("other-session", "t")
    jobs.cancel(None, "s")
    assert jobs._jobs["queued"].cancelled and not jobs._jobs["other-session"].cancelled


def test_stop_marks_every_job_of_its_session_only():
    jobs = Jobs()
    for eid, session in (("a", "tab1"), ("b", "tab1"), ("c", "tab2")):
        jobs.joined(eid, session)
    assert jobs.cancel_session("tab1") == 2
    assert [j.cancelled for j in jobs._jobs.values()] == [True, True, False]
