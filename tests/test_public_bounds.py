"""A shared studio that strangers cannot starve (issue 54): session keys no Gradio client makes are
refused before anything keeps them, what the job registry keeps per session goes when it counts
nothing, a visitor is a session and a client address, and a benchmark takes turns for the model
(ssr_ui/jobs.py, ssr_ui/waiting.py, ssr_ui/benchmark.py)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from pathlib import Path

import pytest

from ssr_ui.jobs import (
    MAX_SESSION_KEY,
    PENDING_PER_SESSION,
    SESSION_WINDOW_S,
    SESSIONS_PER_ADDRESS,
    STALE_S,
    Bounds,
    CancelRoute,
    Jobs,
    session_problem,
    visitor_address,
)
from tests.apps import launched, query, wait_for

HUGE = "k" * 4_000_000  # a 4 MB session key, as the probe sent
SMALL = dict(max_think=12, max_answer=6, draft_start=4, max_draft=6)


@pytest.mark.parametrize(("key", "ok"), [
    (str(uuid.uuid4()), True),  # gradio_client's
    ("k3j5x0q9z1a", True),  # the page's: Math.random().toString(36).substring(2)
    ("a" * MAX_SESSION_KEY, True),
    ("a" * (MAX_SESSION_KEY + 1), False),  # tempting wrong answer: any string is a key
    ("", False),  # Gradio answered this join with an HTTP 500
    (None, False), (7, False), (["s"], False),
    ("../../etc", False), ("a b", False), ("ключ", False),
])
def test_a_session_key_is_one_a_gradio_client_makes(key, ok):
    why = session_problem(key)
    assert (why is None) == ok, why
    if why:
        assert "session_hash must be" in why and len(why) < 200  # never echoed whole


@pytest.mark.parametrize(("peer", "forwarded", "address"), [
    ("81.2.69.142", None, "81.2.69.142"),  # a client straight on the internet
    ("81.2.69.142", "1.2.3.4", "81.2.69.142"),  # tempting wrong answer: a public peer's header is believed
    ("10.16.3.80", "81.2.69.160, 10.0.0.1", "81.2.69.160"),  # a Space's ingress, on a private network
    ("127.0.0.1", "81.2.69.160", "81.2.69.160"),  # a proxy on this machine
    ("10.16.3.80", "not-an-address", "10.16.3.80"),  # a header that names no address: the proxy's own
    ("127.0.0.1", None, None),  # this machine itself: sessions alone
    (None, None, None),
])
def test_a_visitors_address_is_the_proxys_client_only_behind_a_private_proxy(peer, forwarded, address):
    assert visitor_address(peer, forwarded) == address


def test_two_sessions_of_one_address_are_one_visitor_and_other_addresses_are_not():
    jobs = Jobs()
    jobs.bounds = Bounds(frozenset({7}), max_jobs=8, eta=lambda n: None)
    assert jobs.admit("tab-1", 7, "81.2.69.160") is None
    jobs.joined("e1", "tab-1", admitted=True, address="81.2.69.160")
    assert "in flight already" in jobs.admit("tab-2", 7, "81.2.69.160")  # a second session, the same client
    assert jobs.admit("tab-3", 7, "81.2.69.161") is None  # another client
    assert jobs.admit("tab-4", 7, None) is None  # no address: its session alone
    with pytest.raises(Exception, match="in flight already"):  # a route around the join: checked at its start
        jobs.start("direct", "tab-5", "81.2.69.160")
    jobs.cancel("e1", "tab-1")  # the first job stopped before it started: the client may run again
    assert jobs.admit("tab-2", 7, "81.2.69.160") is None


def test_what_the_registry_keeps_per_session_goes_when_it_counts_nothing(monkeypatch):
    """A join answered, an admission used, an id-less cancel whose join never comes (after
    STALE_S): every per-session count is gone, however many keys were seen."""
    now = [1000.0]
    monkeypatch.setattr("ssr_ui.jobs.time.monotonic", lambda: now[0])
    jobs = Jobs()
    jobs.bounds = Bounds(frozenset({7}), max_jobs=8, eta=lambda n: None)
    for n in range(500):
        key = f"fresh-{n}"
        jobs.joining(key)
        jobs.joined(None, key)  # a join that failed: no longer in flight
        jobs.cancel(None, key)  # a cancel for a join still to come
    assert jobs.admit("a", 7, "81.2.69.160") is None
    with jobs.running("e", "a", "81.2.69.160"):
        jobs.joined("e", "a", admitted=True, address="81.2.69.160")
    for _ in range(1000):  # one session's cancel flood keeps no more than a client could have joins to come
        jobs.cancel(None, "flood")
    assert len(jobs._pending["flood"]) == PENDING_PER_SESSION
    assert jobs.sessions_kept() == 501  # the cancels, waiting for their joins
    now[0] += STALE_S + 1
    assert jobs.sessions_kept() == 0
    jobs.cancel(None, "late")
    jobs.joining("late")
    jobs.joined("j", "late")
    assert jobs.get("j").cancelled and jobs.sessions_kept() == 0  # the cancel met its join, and went


def test_one_client_address_brings_a_bounded_number_of_new_sessions_per_minute(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr("ssr_ui.jobs.time.monotonic", lambda: now[0])
    jobs = Jobs()
    assert all(jobs.new_session(f"s{n}", "81.2.69.160") is None for n in range(100))  # no bounds: public mode off
    jobs.bounds = Bounds(frozenset({7}), max_jobs=8, eta=lambda n: None)
    assert all(jobs.new_session(f"k{n}", "81.2.69.161") is None for n in range(SESSIONS_PER_ADDRESS))
    assert "sessions in the last 60 s" in jobs.new_session("one-more", "81.2.69.161")
    assert jobs.new_session("k0", "81.2.69.161") is None  # a session it has: always
    assert jobs.new_session("one-more", "81.2.69.162") is None  # another client
    assert all(jobs.new_session(f"m{n}", None) is None for n in range(100))  # no address (this machine): no bound
    now[0] += SESSION_WINDOW_S
    assert jobs.new_session("one-more", "81.2.69.161") is None  # a minute on
    now[0] += SESSION_WINDOW_S
    assert jobs.sessions_kept() == 0  # every address forgotten


def _asgi(route, method: str, path: str, body: bytes = b"", query: bytes = b"", headers=()) -> tuple[int, dict]:
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": list(headers),
             "client": ("127.0.0.1", 5000)}
    asyncio.run(route(scope, receive, send))
    return sent[0]["status"], json.loads(sent[1]["body"])


def _sent_to(route, where: str, key: str) -> tuple[int, dict]:
    """What ``route`` answers a request to ``where`` carrying session key ``key``."""
    body = json.dumps({"session_hash": key, "fn_index": 0, "data": [], "event_id": None}).encode()
    json_type = [(b"content-type", b"application/json")]
    if where in ("queue/join", "cancel", "run/predict", "component_server"):
        return _asgi(route, "POST", f"/gradio_api/{where}", body, headers=json_type)
    if where == "queue/data":
        return _asgi(route, "GET", "/gradio_api/queue/data", query=f"session_hash={key}".encode())
    if where == "upload":
        return _asgi(route, "POST", "/gradio_api/upload", headers=[(b"session_hash", key.encode())])
    return _asgi(route, "GET", f"/gradio_api/{where.format(key=key)}")


@pytest.mark.parametrize("where", ["queue/join", "cancel", "run/predict", "component_server", "queue/data",
                                   "heartbeat/{key}", "stream/{key}/0/1/playlist.m3u8", "upload"])
def test_every_route_that_takes_a_session_key_refuses_one_no_client_makes_before_gradio_sees_it(where):
    seen = []

    async def gradio(scope, receive, send):  # stands for Gradio: says it was reached
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b'{"event_id": "e"}'})

    jobs = Jobs()
    route = CancelRoute(gradio, jobs)
    for key in (HUGE[:5000], "", "a b"):
        status, doc = _sent_to(route, where, key)
        assert status == 422 and "session_hash must be" in json.dumps(doc), (where, status, doc)
    assert seen == [] and jobs.sessions_kept() == 0
    assert _sent_to(route, where, str(uuid.uuid4()))[0] == 200  # a real key goes through
    assert _asgi(route, "POST", "/gradio_api/cancel", b"x" * 20_000)[0] == 413  # a cancel is small


def _rss_mb(pid: int) -> float:
    return int(re.search(r"VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text()).group(1)) / 1024


def test_oversized_and_fresh_session_keys_leave_the_studios_memory_where_it_was(tmp_path):
    """200 joins and cancels with 4 MB keys, 200 with fresh keys (one client address: a run, or
    History, whose answer Gradio keeps for a client that never listens), on loopback: the bad keys
    are refused (422; a cancel that large, 413), an empty key too (Gradio answered it 500), the fresh
    keys past the address's session bound are refused, and the studio's RSS ends within 50 MB of
    where it started (History alone grew it by 66 MB in 200 such joins before the bound)."""
    import httpx

    with launched(tmp_path, "--public", "on") as (url, _db, proc):
        api = url + "gradio_api/"
        config = httpx.get(url + "config", timeout=60).json()
        fns = {d.get("api_name"): d["id"] for d in config["dependencies"]}
        fn = fns["run"]
        proxied = {"X-Forwarded-For": "81.2.69.160"}  # one client, behind a proxy on loopback
        with httpx.Client(timeout=60) as http:
            def join(key, fn=fn, data=()):
                return http.post(api + "queue/join", json={"data": list(data), "fn_index": fn, "session_hash": key},
                                 headers=proxied)

            def cancel(key):
                return http.post(api + "cancel", json={"event_id": None, "fn_index": fn, "session_hash": key})

            for key in ("warm-up", "", HUGE):  # (the server's first requests allocate what it keeps anyway)
                join(key)
                cancel(key)
            assert join("").status_code == 422 and "session_hash must be" in join("").text
            began = time.monotonic()
            before = _rss_mb(proc.pid)
            for _ in range(100):
                assert join(HUGE).status_code == 422 and cancel(HUGE).status_code == 413  # (a cancel is small)
            refused = {}
            for n in range(100):
                history = (fns["history"], ["all", "all", False])
                reply = join(str(uuid.uuid4())) if n % 2 else join(str(uuid.uuid4()), *history)
                refused[reply.status_code] = refused.get(reply.status_code, 0) + 1
                assert cancel(str(uuid.uuid4())).status_code == 200
            after = _rss_mb(proc.pid)
        print(f"studio RSS: {before:.0f} MB before, {after:.0f} MB after 400 requests "
              f"({time.monotonic() - began:.1f} s); fresh-key joins by status: {refused}")
        assert refused.get(422, 0) >= 100 - SESSIONS_PER_ADDRESS  # one client: a few sessions, one job in flight
        assert after - before < 50, (before, after)


def test_a_benchmark_takes_turns_with_a_short_run_and_says_how_long_the_wait_is(tmp_path):
    """A 600-run benchmark of one visitor holds the model; another visitor's short run, submitted
    meanwhile, is done within the benchmark's longest single run plus 5 s, and the wait its strip
    first gave is not under the time it then waited. A second session from the benchmark's client
    address is refused while the benchmark is in flight; the benchmark, stopped, runs no more."""
    from gradio_client import Client

    methods = ["baseline", "ssr", "ssr-lookups", "ssr-exit", "rsd", "target"]
    with launched(tmp_path, "--public", "on", "--max-benchmark-runs", "600") as (url, db, _proc):
        bench = Client(url, verbose=False, headers={"X-Forwarded-For": "81.2.69.160"})
        long = dict(max_think=100, max_answer=20, draft_start=4, max_draft=6)  # runs long enough that a wait shows
        benchmark = bench.submit("bundled-arithmetic", None, methods, 20, 5, "", "auto", "", "", "", **long,
                                 api_name="/benchmark")
        logged = "select count(*) from runs where dataset like '%arithmetic%'"
        wait_for(lambda: query(db, logged)[0][0] >= 12, "the benchmark's first runs", timeout=300)
        with pytest.raises(Exception, match="in flight already"):  # its visitor's other session: the same client
            Client(url, verbose=False, headers={"X-Forwarded-For": "81.2.69.160"}).predict(
                "What is 1 + 1?", "Baseline", **SMALL, api_name="/run")
        short = Client(url, verbose=False, headers={"X-Forwarded-For": "81.2.69.161"})
        start = time.monotonic()
        job = short.submit("What is 2 + 2? (the short run)", "Baseline", max_think=8, max_answer=8, api_name="/run")
        estimate = running_at = None
        seen = 0
        while not job.done():
            outputs = job.outputs()
            for out in outputs[seen:]:
                strip, now = str(out[3]), time.monotonic()
                if m := re.search(r"in line for the model: \w+ \(\d+ jobs? ahead of yours, about (\d+) s\)", strip):
                    estimate = int(m.group(1)) if estimate is None else estimate
                elif running_at is None and "in line" not in strip:
                    running_at = now
            seen = len(outputs)
            time.sleep(0.02)
        done_at = time.monotonic()
        job.result()
        benchmark.cancel()
        wait_for(benchmark.done, "the stopped benchmark to end", timeout=120)
        longest = query(db, "select max(wall_s) from runs where dataset like '%arithmetic%'")[0][0]
        ran = query(db, logged)[0][0]
        print(f"short run: began {running_at - start:.2f} s and was done {done_at - start:.2f} s after its submit, "
              f"first told 'about {estimate} s'; the benchmark's longest run {longest:.2f} s; {ran} of its 600 runs "
              "logged")
        assert estimate is not None and running_at is not None
        assert done_at - start <= longest + 5.0
        assert estimate >= running_at - start  # (from its submit: the strip said it a little later)
        assert ran < 600 and query(db, "select status from runs where prompt like '%the short run%'") == [("ok",)]
