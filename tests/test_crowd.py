"""A crowd on a shared studio (issue 44), the short version: 8 ``gradio_client`` visitors at once for
about a minute on loopback (``ssr_ui.tools.crowd``; the long run and its figures: docs/STUDIO.md).
Every run completes or is refused with its reason, no visitor ever receives another's prompt, and
the run log holds one row per run under its visitor's key; session keys no client makes are refused,
a visitor's second session gets no second job, and a benchmark takes turns with the others' runs.
Also through HTTP: a visitor's second job while one is in flight, and jobs past the studio's cap, are
refused saying why. Each visitor is its own client address (``X-Forwarded-For``, as behind a Space's
proxy: ``ssr_ui.jobs.visitor_address``)."""

from __future__ import annotations

import pytest

from ssr_ui.tools.crowd import address, crowd
from tests.apps import launched, query, wait_for


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    with launched(tmp_path_factory.mktemp("crowd"), "--public", "on", "--max-jobs", "3") as (url, db, proc):
        yield url, db, proc


def test_a_second_job_of_one_visitor_and_jobs_past_the_cap_are_refused_with_the_reason(shared):
    from gradio_client import Client

    url, db, _ = shared
    long = dict(method="SSR", max_think=400, max_answer=200)
    first = Client(url, verbose=False, headers=address(0))
    running = first.submit("Write a Python class Pond. Fields: a, b. Methods: total. (first)", **long, api_name="/run")
    wait_for(lambda: running.outputs(), "the first job's first update", timeout=180)
    with pytest.raises(Exception, match="in flight already"):
        first.predict("What is 1 + 1? (second of the same visitor)", "Baseline", api_name="/run")
    others = [Client(url, verbose=False, headers=address(i)) for i in (1, 2)]
    queued = [c.submit(f"What is {i} + 1? (another visitor)", **long, api_name="/run") for i, c in enumerate(others)]
    wait_for(lambda: all(j.outputs() for j in queued), "the other visitors' jobs to be admitted", timeout=180)
    with pytest.raises(Exception, match="the studio is busy: 3 runs are in line .* try again in"):
        Client(url, verbose=False, headers=address(3)).predict("What is 9 + 1? (one too many)", "Baseline",
                                                               api_name="/run")
    for job in (running, *queued):
        job.cancel()
    wait_for(lambda: all(j.done() for j in (running, *queued)), "the stopped jobs to end", timeout=180)
    assert query(db, "select count(*) from runs where prompt like '%one too many%' or prompt like '%second of%'") \
        == [(0,)]


def test_a_crowd_of_eight_visitors_gets_no_failure_no_leak_and_a_sound_log(tmp_path):
    with launched(tmp_path, "--public", "on") as (url, db, proc):
        report = crowd(url, db, visitors=8, seconds=45, seed=1, pid=proc.pid)
    print(report)
    assert report["failed"] == 0, report["failures"]
    assert report["leaks"] == [] and report["integrity"] == []
    assert report["completed"] > 0 and report["refused"].get("no run with id", 0) > 0
    assert report["refused"].get("session_hash must be", 0) > 0  # oversized and empty keys, refused saying why
    assert report["wait_p95_s"] is not None and report["peak_mb"] is not None
