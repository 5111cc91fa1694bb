"""A shared studio (issue 44): each visitor's runs their own, the operator's model list, bounds per
visitor and in all, the model's line with places and Stop, and nothing changed with public mode off."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import pytest

from engine.methods.rsd.prm import MathShepherdScorer
from engine.runlog import RunLog
from ssr_ui.handlers import Studio
from ssr_ui.jobs import Bounds, Job, Jobs
from ssr_ui.public import Public, public_on
from ssr_ui.waiting import ModelLine, Ticket
from tests.tiny import make_model

SMALL = dict(max_think=12, max_answer=6, draft_start=4, max_draft=6)


def _studio(tmp_path, public: bool) -> Studio:
    models = "tiny,tiny-draft,tiny-prm"
    s = Studio("tiny", db=str(tmp_path / "runs.db"), draft_model="tiny-draft", prm="tiny-prm",
               public=Public.build("on" if public else "off", models, ["tiny"]))
    s.add_model("tiny", make_model("llama", init_scale=3.0))
    s.add_model("tiny-draft", make_model("qwen2", seed=4, init_scale=2.0))
    s.add_scorer("tiny-prm", MathShepherdScorer(make_model("llama", seed=5)))
    return s


def _run(studio, session: str, prompt: str, method: str = "Baseline", **names) -> list:
    return list(studio.run(prompt, method, job=Job(None, session), **SMALL, **names))


def test_public_mode_is_on_where_hugging_face_runs_it_or_when_asked():
    assert public_on("auto", {"SPACE_ID": "someone/ssr-studio"})
    assert not public_on("auto", {})
    assert public_on("on", {}) and not public_on("off", {"SPACE_ID": "x"})
    with pytest.raises(ValueError, match="--public"):
        public_on("maybe", {})
    with pytest.raises(ValueError, match="names no model"):
        Public.build("on", " , ", [])


def test_two_visitors_histories_are_disjoint_and_each_others_runs_are_unknown(tmp_path):
    studio = _studio(tmp_path, public=True)
    a, b = studio.visitor("session-a"), studio.visitor("session-b")
    assert a and b and a != b and "session-a" not in a  # an opaque key, not the session id
    _run(studio, "session-a", "alpha's secret prompt")
    _run(studio, "session-a", "alpha's second prompt", "SSR")
    _run(studio, "session-b", "bravo's own prompt")
    mine_a, mine_b = studio.history(visitor=a), studio.history(visitor=b)
    assert {r["prompt"] for r in mine_a} == {"alpha's secret prompt", "alpha's second prompt"}
    assert {r["prompt"] for r in mine_b} == {"bravo's own prompt"}
    assert not {r["id"] for r in mine_a} & {r["id"] for r in mine_b}
    missing = max(r["id"] for r in [*mine_a, *mine_b]) + 100
    for rid in (r["id"] for r in mine_a):  # every one of a's ids, on every call that takes one, as if it did not exist
        for call in (lambda i: studio.replay(i, b), lambda i: studio.export(i, "json", visitor=b),
                     lambda i: studio.export(i, "html", visitor=b)):
            with pytest.raises(ValueError) as theirs:
                call(rid)
            with pytest.raises(ValueError) as nobody:
                call(missing)
            assert re.sub(r"id \d+", "id N", str(theirs.value)) == re.sub(r"id \d+", "id N", str(nobody.value))
        assert studio.replay(rid, a).prompt  # its owner still sees it
    csv = Path(studio.export(None, "csv", visitor=b)).read_text()
    assert "bravo" in csv and "alpha" not in csv
    # each visitor's live comparison pools only their own baselines
    _run(studio, "session-b", "alpha's secret prompt", "SSR")
    rows = studio.history(visitor=b)
    assert all(r["visitor"] == b for r in rows)


def test_without_public_mode_nothing_changes(tmp_path):
    studio = _studio(tmp_path, public=False)
    assert studio.visitor("session-a") is None
    _run(studio, "session-a", "one prompt")
    _run(studio, "session-b", "another prompt")
    rows = studio.history(visitor=studio.visitor("session-b"))
    assert {r["prompt"] for r in rows} == {"one prompt", "another prompt"}
    assert all(r["visitor"] is None for r in rows)
    assert studio.replay(rows[-1]["id"], studio.visitor("session-b")).prompt == rows[-1]["prompt"]
    studio.vet("/etc", "/nope", "someone/some-model")  # any name goes through to the loader, as before


@pytest.mark.parametrize("field", ["model_name", "draft_model", "prm"])
def test_a_path_or_unlisted_hub_id_is_refused_the_same_whether_it_exists_or_not(tmp_path, field):
    studio = _studio(tmp_path, public=True)
    messages = {}
    for name in ("/etc", "/no/such/folder", "/tmp", "someone/huge-model", "/etc/passwd"):
        frames = list(studio.run("a prompt", "Compare", job=Job(None, "s"), **{field: name}, **SMALL))
        assert len(frames) == 1 and frames[0].view.phase == "error"
        messages[name] = frames[0].metrics.replace(name, "NAME")
    assert len(set(messages.values())) == 1, messages
    assert "not offered on this shared studio" in next(iter(messages.values()))
    assert studio.history() == []  # nothing ran, nothing logged
    frames = list(studio.benchmark("bundled-arithmetic", limit=1, job=Job(None, "s"), **{field: "/etc"}, **SMALL))
    assert "not offered on this shared studio" in frames[-1].status
    if field == "model_name":
        out = list(studio.sweep("p", "/etc", 0, 4, 4, job=Job(None, "s"), **SMALL))
        assert "not offered on this shared studio" in out[-1][0]
    long = str(pytest.raises(ValueError, studio.vet, "y" + "x" * 50_000).value)
    assert "y" + "x" * 59 + "…'" in long and len(long) < 200  # never echoed whole


def test_the_line_for_the_model_serves_in_order_says_each_place_and_lets_a_stopped_job_leave():
    line = ModelLine(poll_s=0.01)
    first = Ticket()
    assert list(line.wait(first)) == [] and first.held
    order, words, stop = [], {}, threading.Event()

    def job(name, cancelled=lambda: False):
        t = Ticket()
        words[name] = []
        for w in line.wait(t, cancelled):
            words[name].append(w)
        if t.held:
            order.append(name)
            line.release(t)

    threads = []
    for name in ("second", "third", "quitter", "fourth"):
        threads.append(threading.Thread(target=job, args=(name, stop.is_set if name == "quitter" else lambda: False)))
        threads[-1].start()
        while line.waiting < len(threads):  # each in line before the next comes
            time.sleep(0.005)
    while not all(words[n] for n in ("second", "third", "quitter", "fourth")):
        time.sleep(0.005)
    assert words["second"][0].startswith("in line for the model: 2nd (1 job ahead of yours)")
    assert words["fourth"][0].startswith("in line for the model: 5th (4 jobs ahead of yours)")
    stop.set()  # the quitter leaves the line before its turn: the others move up
    while line.waiting > 3:
        time.sleep(0.005)
    line.release(first)
    for t in threads:
        t.join(5)
    assert order == ["second", "third", "fourth"]
    assert line.eta(2) is not None  # jobs have finished here: the line can estimate
    assert "about" in line._words(1)


def test_bounds_refuse_a_second_job_of_a_visitor_and_jobs_past_the_cap():
    jobs = Jobs()
    jobs.bounds = Bounds(frozenset({7}), max_jobs=2, eta=lambda n: 30.0 * n)
    assert jobs.admit("a", 3) is None and jobs.admit("a", 3) is None  # other functions (History) are not bounded
    assert jobs.admit("a", 7) is None
    jobs.joined("e1", "a", admitted=True)
    assert "in flight already" in jobs.admit("a", 7)
    assert jobs.admit("b", 7) is None  # another visitor: admitted
    refused = jobs.admit("c", 7)  # two in flight: the cap
    assert "busy" in refused and "at most 2" in refused and "about 60 s" in refused
    jobs.joined("e2", "b", admitted=True)
    assert jobs.cancel("e1", "b")[0] == "not found"  # another visitor's job is not theirs to stop
    jobs.cancel("e1", "a")  # a's job stopped before it started: a may run again, and there is room
    assert jobs.admit("a", 7) is None
    with jobs.running("e2", "b"):
        assert "in flight already" in jobs.admit("b", 7)
    jobs.joined(None, "a", admitted=True)  # a's join failed: its reservation goes
    assert jobs.admit("b", 7) is None
    no_bounds = Jobs()
    assert all(no_bounds.admit("a", 7) is None for _ in range(20))


def test_a_job_stopped_while_in_line_runs_nothing_and_logs_nothing(tmp_path):
    studio = _studio(tmp_path, public=True)
    holder = Ticket()
    assert list(studio.line.wait(holder)) == []  # someone else holds the model
    job = Job(None, "waiter")
    frames = []
    def go():
        for frame in studio.run("p", "SSR", job=job, **SMALL):
            frames.append(frame)  # noqa: PERF402 (one by one: the test watches them come)

    runner = threading.Thread(target=go, daemon=True)
    runner.start()
    deadline = time.monotonic() + 60
    while not any("in line for the model" in f.metrics for f in frames):
        assert time.monotonic() < deadline, [f.metrics for f in frames]
        time.sleep(0.01)
    job.request_cancel()
    runner.join(10)
    assert not runner.is_alive()
    assert "stopped while in line" in frames[-1].metrics
    studio.line.release(holder)
    assert studio.history() == []


def test_an_older_run_log_gains_the_visitor_column(tmp_path):
    import sqlite3

    path = tmp_path / "old.db"
    RunLog(path)
    with sqlite3.connect(path) as conn:  # as version 12 left it
        conn.execute("drop index if exists idx_runs_visitor")
        conn.execute("alter table runs drop column visitor")
        conn.execute("update meta set value = '12' where key = 'schema_version'")
    log = RunLog(path)
    assert "visitor" in log.columns()


def test_a_job_that_bypassed_the_join_is_checked_when_it_starts_and_a_join_that_raced_its_start_counts_once():
    from ssr_ui.jobs import NOT_FOUND, Refused

    jobs = Jobs()
    jobs.bounds = Bounds(frozenset({7}), max_jobs=2, eta=lambda n: None)
    with jobs.running("direct-1", "a"):  # no join seen (a route around queue/join): checked here, admitted
        with pytest.raises(Refused, match="in flight already"):
            jobs.start("direct-2", "a")
        assert jobs.admit("a", "7") is not None  # "7" is function 7 to Gradio: bounded too
    assert jobs.admit("b", 7) is None  # admitted at its join ...
    with jobs.running("raced", "b"):  # ... and started before its join's reply came back
        jobs.joined("raced", "b", admitted=True)
        assert jobs._in_flight("b", every=False) == 1 and jobs._in_flight(None, every=True) == 1
        assert jobs.cancel("raced", "someone-else") == (NOT_FOUND, "raced")  # not another visitor's to stop
    assert jobs._in_flight(None, every=True) == 0
    jobs.joined("e", "c", admitted=False)
    with jobs.running("e", "c") as job:  # stopped, its handler still going: still counted until it returns
        job.request_cancel()
        assert "in flight already" in jobs.admit("c", 7)
    assert jobs.admit("c", 7) is None


def test_an_imported_trace_is_compared_with_the_importers_own_baselines_only(tmp_path):
    import json

    studio = _studio(tmp_path, public=True)
    prompt = "Start with 4, then add 7. What is the result? (a's)"
    _run(studio, "a", prompt)
    _run(studio, "a", prompt, "SSR")
    a = studio.visitor("a")
    ssr = next(r for r in studio.history(visitor=a) if r["method"] == "ssr")
    doc = json.loads(Path(studio.export(ssr["id"], "json", visitor=a)).read_text())
    doc["run"].pop("visitor", None)  # a crafted file names no visitor: the importer's are used whatever it says
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(doc))
    own = studio.import_trace(str(path), a).metrics
    theirs = studio.import_trace(str(path), studio.visitor("b")).metrics
    assert "same as baseline" in own and "same as baseline" not in theirs


def test_each_visitor_has_their_own_drafting_ledger(tmp_path, monkeypatch):
    """SSR's cost-aware drafting learns per visitor on a shared studio: a's runs neither decide
    whether b's run drafts nor appear in the numbers b's strip gives; with public mode off the
    model keeps one ledger, as before."""
    from engine.methods.ssr import policy

    planned = []
    plan = policy.plan
    monkeypatch.setattr("engine.methods.ssr.loop.plan", lambda book, cfg: planned.append(len(book.runs)) or plan(book, cfg))
    studio = _studio(tmp_path, public=True)
    studio.drafting = "auto"
    for _ in range(2):
        _run(studio, "session-a", "alpha's prompt", "SSR")
    _run(studio, "session-b", "bravo's prompt", "SSR")
    assert planned == [0, 1, 0], "b's run saw a's ledger"
    last = studio.history(visitor=studio.visitor("session-b"))[0]
    assert last["drafting"].startswith("as planned: no run with drafts on this model yet")
    from engine.methods.ssr.evidence import Evidence

    assert not any(book.runs for book in Evidence.of(studio.model("tiny")).ledgers.values()), \
        "a visitor's ledger was left on the shared model"
    (tmp_path / "off").mkdir()
    shared = _studio(tmp_path / "off", public=False)
    shared.drafting = "auto"
    for session in ("session-a", "session-b"):
        _run(shared, session, "a prompt", "SSR")
    assert planned[-2:] == [0, 1], "public mode off: one ledger per model, whoever ran"


def test_a_benchmark_over_the_shared_studios_bound_is_refused_before_anything_runs(tmp_path):
    studio = _studio(tmp_path, public=True)
    methods = ["baseline", "ssr", "ssr-lookups", "ssr-exit", "rsd", "target"]
    frames = list(studio.benchmark("bundled-arithmetic", None, methods, 20, 5, job=Job(None, "s"), **SMALL))
    assert len(frames) == 1, [f.status for f in frames]  # nothing read, loaded or run
    assert ("a benchmark of 20 problems x 5 repeats x 6 methods = 600 runs is over this shared studio's bound of "
            "120 runs") in frames[0].status
    assert studio.history() == []
    studio.public.max_benchmark_runs = 600  # (app --max-benchmark-runs 600)
    studio.public.check_benchmark(20, 5, 6)
    Public(on=False).check_benchmark(200, 5, 6)  # public mode off: the tab's own limits alone
    with pytest.raises(ValueError, match="--max-benchmark-runs"):
        Public.build("on", None, [], max_benchmark_runs=0)


def test_a_benchmark_gives_the_model_to_a_waiting_job_between_two_runs_and_queues_behind_it(tmp_path):
    """A run submitted while a benchmark holds the model runs after the benchmark's run in flight,
    not after the whole benchmark; the benchmark then goes on, every run logged once."""
    studio = _studio(tmp_path, public=True)
    order: list[str] = []
    lap = studio.line.lap

    def lapping(ticket):  # the benchmark begins a run with no one waiting: a job arrives now, once
        lap(ticket)
        if not order:
            order.append("benchmark")
            runner.start()
            while studio.line.waiting < 1:
                time.sleep(0.005)

    def single():
        frames = _run(studio, "other", "the other visitor's run")
        order.append("single" if frames[-1].view.done is not None else "single failed")

    runner = threading.Thread(target=single, daemon=True)
    studio.line.lap = lapping
    frames = list(studio.benchmark("bundled-arithmetic", None, ["baseline"], 3, 1, job=Job(None, "bench"), **SMALL))
    runner.join(60)
    assert "done: 3 runs" in frames[-1].status, frames[-1].status
    rows = studio.history(visitor=studio.visitor("bench"))
    single_at = [r["id"] for r in studio.history(visitor=studio.visitor("other"))]
    assert order == ["benchmark", "single"] and len(rows) == 3 and len(single_at) == 1
    assert min(r["id"] for r in rows) < single_at[0] < max(r["id"] for r in rows), \
        "the waiting run went after the whole benchmark"
    assert studio.line.eta(1) is not None  # the benchmark's runs and the single one are holds the estimate reads


def test_the_estimate_counts_a_hold_for_each_job_ahead_and_errs_long():
    line = ModelLine(poll_s=0.01)
    assert line.eta(1) is None  # nothing finished here yet
    line._holds.extend([1.0, 1.0, 4.0])
    holder = Ticket()
    assert list(line.wait(holder)) == []
    # the holder: the longest hold less what it has had (but at least the median); each other job: the median
    assert 4.0 + 1.0 * 2 - 0.5 <= line.eta(3) <= 4.0 + 1.0 * 2
    holder.since -= 10  # running long: at least one typical hold more, never "about 0 s"
    assert line.eta(1) == 1.0
    line.lap(holder)
    assert line._holds[-1] >= 10 and time.monotonic() - holder.since < 1
