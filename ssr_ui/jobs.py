"""Per-job cancellation the studio owns, because Gradio's does not target one job.

Gradio 6's ``/cancel`` (what ``gradio_client``'s ``Job.cancel()`` and a ``cancels=`` button send)
cancels *every* running task of that browser session on that endpoint, whichever job asked, and
then drops the asked job's generator; a task still running then makes a new generator and starts
the job over from scratch. Under rapid cancels that ran some jobs twice, never ran others, and
logged jobs ``ok`` whose clients had cancelled them.

So the studio keeps its own registry, keyed by Gradio's event id (one per submitted job):

* :class:`CancelRoute`, an ASGI middleware, answers ``POST .../cancel`` itself: it marks that one
  job cancelled and touches no task. A running job sees the mark at its next engine event, stops,
  logs ``cancelled`` and shows "stopped"; a job still queued returns at once when its turn comes,
  runs nothing and logs nothing (the choice documented in docs/STUDIO.md). It also reads the
  replies to ``POST .../queue/join``, so it knows each session's jobs before they start: a client
  that cancels before it has learnt its job's id (``gradio_client`` then sends no id) cancels the
  job whose join is still in flight for that session, else its session's newest unfinished job,
  else the session's next join (the client sent its cancel before its join).
* :meth:`Jobs.start` refuses a second start of the same job, so no job is ever run twice.
* The studio's own Stop button marks every job of its browser session (:meth:`Jobs.cancel_session`).

**The cancel contract.** A job's end is decided once, under the job's lock: either a cancel comes
first, or the job's last run claims its end first (:meth:`Job.end_run`, called while the run's final
event is held back from the run log). The cancel reply says which, and the run log agrees:

* ``cancelled``: the job had not finished. A queued job runs nothing and leaves no row; a running
  one stops at its next event and its run in flight is logged ``cancelled`` (runs it finished
  before, in a comparison or a sweep, stay ``ok``); nothing after it runs.
* ``already finished``: its last run had ended (logged ``ok``, or ``error`` if it failed) before the
  cancel arrived; nothing changes.
* ``not found``: no job of that id; nothing changes.

The one case the reply cannot foresee: a run that fails with an error between the cancel and its
next event is logged ``error`` (it did fail), after a ``cancelled`` reply.

**Session keys.** Gradio's own clients make keys of at most 36 characters (the page:
``Math.random().toString(36).substring(2)``, about 11; ``gradio_client``: ``str(uuid.uuid4())``).
:class:`CancelRoute` refuses (422, ``{"detail": <why>}``) any request whose session key is empty or
not 1 to :data:`MAX_SESSION_KEY` characters of ``[A-Za-z0-9_-]``, wherever it carries one (the body
of ``queue/join``, ``cancel``, ``run/``, ``api/``, ``call/``, ``component_server``; ``?session_hash=``
of ``queue/data``; ``heartbeat/<key>`` and ``stream/<key>/...``; the ``session_hash`` header of
``upload``), before :class:`Jobs` or Gradio keep anything of it. What :class:`Jobs` keeps per
session goes when it counts nothing: joins in flight and admissions when answered, an id-less
cancel waiting for its join after :data:`STALE_S`, jobs with the oldest of :data:`REMEMBERED`.
Gradio keeps a little of every session that joins its queue (the messages of a client that never
listens, up to 2,000 sessions; state, up to 10,000): under public mode's bounds one client address
(:func:`visitor_address`) brings at most :data:`SESSIONS_PER_ADDRESS` new session keys to the queue
per :data:`SESSION_WINDOW_S` (one per page load or ``gradio_client.Client``); the rest are refused
(a join: 422, in the shape Gradio's clients pass on; other routes: 429).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from engine.events import DoneEvent

REMEMBERED = 10_000  # job ids kept to refuse a restart; old ones are forgotten first
# a bounded job joined this long ago that never started is not counted: its handler never ran (Gradio refused its
# input first) or its client left before its turn; admitted jobs enter their handlers at once (ssr_ui.layout)
STALE_S = 30.0
MAX_SESSION_KEY = 64  # characters: Gradio's own keys are at most 36 (the module's "Session keys")
SESSION_KEY = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_SESSION_KEY}}}")
API = "/gradio_api"  # Gradio's routes (gradio.route_utils.API_PREFIX)
# the other routes whose JSON body may name a session (Gradio's PredictBody, ComponentServerJSONBody)
KEYED_BODIES = re.compile(rf".*?{API}/(?:run/|api/|call/|component_server/?$)")
KEYED_IN_PATH = re.compile(rf".*?{API}/(?:heartbeat|stream)/([^/]*)")  # heartbeat/<key>, stream/<key>/<run>/...
MAX_CANCEL_BODY = 16_384  # bytes: a cancel names an event id, a session key and a function
PENDING_PER_SESSION = 16  # id-less cancels kept for one session's joins to come (a client sends one per job)
SESSIONS_PER_ADDRESS, SESSION_WINDOW_S = 16, 60.0  # new session keys one client address brings to the queue, per window


CANCELLED, ALREADY_FINISHED, NOT_FOUND = "cancelled", "already finished", "not found"  # the cancel replies


class Refused(ValueError):
    """A job over public mode's bounds (:class:`Bounds`); the message says which, and when to retry."""


def session_problem(key, required: bool = True) -> str | None:
    """Why ``key`` is no session key a Gradio client makes (None: it is one; absent and not
    ``required``: fine too). The message never echoes the key.

    >>> session_problem("4e1c2f0a-9b7d-4c1e-8f3a-2b6d5e7f9a10") is None and session_problem("") is not None
    True
    """
    if key is None and not required:
        return None
    if isinstance(key, str) and SESSION_KEY.fullmatch(key):
        return None
    shown = f"{len(key)} characters" if isinstance(key, str) else f"a {type(key).__name__}"
    return (f"session_hash must be 1 to {MAX_SESSION_KEY} characters of A-Z, a-z, 0-9, '_' and '-' "
            f"(the keys Gradio's clients make), not {shown}")


def visitor_address(peer: str | None, forwarded: str | None) -> str | None:
    """The client address a shared studio bounds a visitor by, besides their session (None: no
    address, sessions alone). Behind a proxy on loopback or a private network (a Hugging Face Space's
    ingress) it is the first address of ``X-Forwarded-For`` (``forwarded``), the client the proxy
    served; else the connecting ``peer``. A loopback peer with no ``X-Forwarded-For`` is this machine
    itself (the operator's own browser, tests and tools): no address. Only an IP address counts from
    the header (anything else there: the peer's address).

    >>> visitor_address("10.16.3.80", "81.2.69.160, 10.0.0.1"), visitor_address("81.2.69.142", "1.2.3.4")
    ('81.2.69.160', '81.2.69.142')
    """
    try:
        ip = ipaddress.ip_address(peer or "")
    except ValueError:
        return peer or None
    if forwarded and (ip.is_loopback or ip.is_private):
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(forwarded.split(",")[0].strip()))
    return None if ip.is_loopback and not forwarded else str(ip)


@dataclass
class Job:
    """One submitted job: ``queued`` -> ``running`` -> ``finished``, or ``cancelled`` from either of
    the first two. ``cancel`` is set exactly when the state becomes ``cancelled``."""

    event_id: str | None
    session: str | None
    address: str | None = None  # its visitor's client address (:func:`visitor_address`), under public mode's bounds
    cancel: threading.Event = field(default_factory=threading.Event)
    state: str = "queued"
    bounded: bool = False  # a run, sweep or benchmark admitted under public mode's bounds (:class:`Bounds`)
    joined_at: float = field(default_factory=time.monotonic)
    started: bool = False  # its handler began
    ended: bool = False  # its handler returned (a cancelled job counts against the bounds until then)
    reserved: bool = False  # it started before its join's reply came back, and took the join's reservation
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()

    @property
    def finished(self) -> bool:
        return self.state == "finished"

    def request_cancel(self) -> str:
        """Cancel the job unless it has finished: :data:`CANCELLED` or :data:`ALREADY_FINISHED`."""
        with self._lock:
            if self.state == "finished":
                return ALREADY_FINISHED
            self.state = "cancelled"
            self.cancel.set()
            return CANCELLED

    def end_run(self, last: bool) -> bool:
        """Claim one run's end, before its final event reaches the run log: False if the job was
        cancelled first (the run is then logged ``cancelled``), else True, and when ``last`` (the
        job's last run) the job is finished from here on: a later cancel changes nothing."""
        with self._lock:
            if self.state == "cancelled":
                return False
            if last:
                self.state = "finished"
            return True

    def finish(self) -> None:
        """The job ended another way (its handler returned, a run failed): finished, unless a
        cancel came first."""
        with self._lock:
            if self.state != "cancelled":
                self.state = "finished"

    def _begin(self) -> None:
        with self._lock:
            self.started = True
            if self.state == "queued":
                self.state = "running"


def claimed(events, job: Job, last: bool):
    """The engine's ``events``, with the run's end claimed from ``job`` (:meth:`Job.end_run`) while
    its final event is held back: a job cancelled first never passes it on, so the run log records
    the run ``cancelled``, as the cancel's reply said. A failing run ends the job before its row is
    written, so a cancel after that answers "already finished"."""
    try:
        for ev in events:
            if isinstance(ev, DoneEvent) and not job.end_run(last):
                return
            yield ev
    except Exception:
        job.finish()
        raise


@dataclass
class Bounds:
    """Public mode's bounds on the jobs that use the model (runs, sweeps, benchmarks: the events
    ``fns``, by Gradio's function index): one in flight per visitor (a browser or API session, and
    every session of one client address: :func:`visitor_address`), at most ``max_jobs`` in all.
    ``eta(n)``: seconds until ``n`` jobs ahead have had the model (None: no estimate yet), for the
    refusal's "try again in"."""

    fns: frozenset[int]
    max_jobs: int
    eta: Callable[[int], float | None]


def current_event_id() -> str | None:
    """The Gradio event id of the job this handler is running (None outside a Gradio queue)."""
    from gradio.context import LocalContext

    return LocalContext.event_id.get(None)


class Jobs:
    """The studio's jobs, by Gradio event id (the module's contract). What it keeps per session is
    bounded: a count is removed when it falls to 0, an id-less cancel waiting for its join is
    forgotten after :data:`STALE_S`, and jobs past :data:`REMEMBERED` go oldest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, Job] = OrderedDict()  # every job seen, by event id (bounded)
        self._started: set[str] = set()
        self._joining: dict[str | None, int] = {}  # per session: join requests not yet answered
        # per session: id-less cancels for those joins (or for joins still to come), when each was sent; oldest first
        self._pending: OrderedDict[str | None, list[float]] = OrderedDict()
        self.bounds: Bounds | None = None  # public mode's (set once the app is built); None: no bounds
        # per (session, address): bounded joins admitted, not yet answered
        self._admitted: dict[tuple[str | None, str | None], int] = {}
        # per client address: its session keys seen in the last SESSION_WINDOW_S, when each was last seen; oldest first
        self._sessions_of: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()

    def sessions_kept(self) -> int:
        """How many per-session entries the registry holds beside its jobs (0 when idle)."""
        with self._lock:
            self._forget_stale(time.monotonic())
            return len(self._joining) + len(self._pending) + len(self._admitted) + len(self._sessions_of)

    def new_session(self, session: str, address: str | None) -> str | None:
        """Under :attr:`bounds`, why ``session`` may not reach the queue from client ``address``
        (it would be that address's ``SESSIONS_PER_ADDRESS + 1``-th session key within
        :data:`SESSION_WINDOW_S`), or None; a key already seen is always let through."""
        if self.bounds is None or address is None:
            return None
        with self._lock:
            now = time.monotonic()
            self._forget_stale(now)
            seen = self._sessions_of.setdefault(address, OrderedDict())
            while seen and now - next(iter(seen.values())) >= SESSION_WINDOW_S:
                seen.popitem(last=False)
            if session not in seen and len(seen) >= SESSIONS_PER_ADDRESS:
                return (f"this client address opened {len(seen)} sessions in the last {SESSION_WINDOW_S:.0f} s (at "
                        f"most {SESSIONS_PER_ADDRESS} on this shared studio): use the one you have, or try again in "
                        "a minute")
            seen[session] = now
            seen.move_to_end(session)
            self._sessions_of.move_to_end(address)
            while len(self._sessions_of) > REMEMBERED:
                self._sessions_of.popitem(last=False)
            return None

    def _job(self, event_id: str, session: str | None = None) -> Job:
        job = self._jobs.get(event_id)
        if job is None:
            job = self._jobs[event_id] = Job(event_id, session)
            while len(self._jobs) > REMEMBERED:
                old, _ = self._jobs.popitem(last=False)
                self._started.discard(old)
        if session is not None:
            job.session = session
        return job

    def get(self, event_id: str) -> Job | None:
        """The job of this event id, if it is known (joined or started, and not yet forgotten)."""
        with self._lock:
            return self._jobs.get(event_id)

    def start(self, event_id: str | None, session: str | None, address: str | None = None) -> Job | None:
        """The job about to run, or None if it already started once (Gradio restarting it). Under
        :attr:`bounds`, a job that was not admitted when it joined (a route that bypasses
        ``queue/join``) is checked here, and :class:`Refused` when over a bound; ``address``: its
        visitor's client address (:func:`visitor_address`)."""
        if event_id is None:  # called outside a Gradio queue (tests, scripts): nothing to track
            return Job(None, session, address)
        with self._lock:
            if event_id in self._started:
                return None
            job = self._job(event_id, session)
            if self.bounds is not None and not job.bounded:
                job.address = address
                if self._admitted.get((session, address)):  # admitted when it joined; its join's reply is on its way
                    _count(self._admitted, (session, address), -1)
                    job.reserved = True
                else:
                    refused = self._over(session, address)
                    if refused:
                        raise Refused(refused)
                job.bounded = True
            self._started.add(event_id)
        job._begin()
        return job

    def joining(self, session: str | None) -> None:
        """A join request of this session arrived; its job id comes with the reply."""
        with self._lock:
            _count(self._joining, session, 1)

    def admit(self, session: str | None, fn_index, address: str | None = None) -> str | None:
        """A join of ``session`` (from client ``address``: :func:`visitor_address`) for Gradio
        function ``fn_index``, before it reaches the queue: under :attr:`bounds`, a job that uses the
        model is refused (the reason, for the visitor) when its visitor (that session, or any session
        of that address) has one in flight already or ``max_jobs`` are in flight in all; else
        admitted (None), and counted from here on. Nothing is bounded without bounds, or for other
        functions."""
        if not self.bounded(fn_index):
            return None
        with self._lock:
            refused = self._over(session, address)
            if not refused:
                _count(self._admitted, (session, address), 1)
            return refused

    def bounded(self, fn_index) -> bool:
        """Whether a join for Gradio function ``fn_index`` is under :attr:`bounds` (the index as a
        client sends it: Gradio reads "7" and 7.0 as 7 too)."""
        try:
            return self.bounds is not None and int(fn_index) in self.bounds.fns
        except (TypeError, ValueError):
            return False

    def _over(self, session: str | None, address: str | None = None) -> str | None:
        """Why one more job of ``session`` from ``address`` would be over a bound, or None (under the lock)."""
        if self._in_flight(session, every=False, address=address):
            return ("you have a run, sweep or benchmark in flight already (one at a time on this shared "
                    "studio): wait for it to end, or press Stop, then run again")
        total = self._in_flight(None, every=True)
        if total >= self.bounds.max_jobs:
            eta = self.bounds.eta(total)
            when = f"in about {max(5, round(eta))} s" if eta is not None else "in a minute"
            return (f"the studio is busy: {total} runs are in line for its one model (at most "
                    f"{self.bounds.max_jobs} on this shared studio); try again {when}")
        return None

    def _in_flight(self, session: str | None, every: bool, address: str | None = None) -> int:
        """Bounded jobs of ``session`` or of client ``address`` (``every``: of every visitor)
        admitted and not ended: joins still unanswered, jobs whose handler runs (stopped ones too,
        until it returns), and jobs not started yet, not stopped, that joined less than
        :data:`STALE_S` ago."""
        now = time.monotonic()

        def theirs(s, a) -> bool:
            return every or s == session or (address is not None and a == address)

        admitted = sum(n for (s, a), n in self._admitted.items() if theirs(s, a))
        return admitted + sum(1 for j in self._jobs.values()
                              if j.bounded and theirs(j.session, j.address) and not j.ended
                              and (j.started or (not j.cancelled and now - j.joined_at < STALE_S)))

    def joined(self, event_id: str | None, session: str | None, admitted: bool = False,
               address: str | None = None) -> None:
        """The reply to a join request: the job (if any) entered the queue (``admitted``: under
        :meth:`admit`'s bounds, from client ``address``, counted from here on as the job)."""
        with self._lock:
            _count(self._joining, session, -1)
            job = self._job(event_id, session) if event_id else None
            if admitted and not (job is not None and job.reserved):  # (a job that started first took its reservation)
                _count(self._admitted, (session, address), -1)
            if job is None:
                return
            if admitted and not job.bounded:
                job.bounded, job.address = True, address
            self._forget_stale(time.monotonic())
            if self._pending.get(session):
                self._pending[session].pop(0)
                if not self._pending[session]:
                    del self._pending[session]
                job.request_cancel()

    @contextlib.contextmanager
    def running(self, event_id: str | None, session: str | None, address: str | None = None) -> Iterator[Job | None]:
        """:meth:`start` the job for the duration of the block, then :meth:`Job.finish` it."""
        job = self.start(event_id, session, address)
        try:
            yield job
        finally:
            if job is not None:
                job.finish()
                job.ended = True

    def cancel(self, event_id: str | None, session: str | None = None) -> tuple[str, str | None]:
        """Cancel one job, queued or running: ``(reply, event_id)``, the reply one of
        :data:`CANCELLED`, :data:`ALREADY_FINISHED`, :data:`NOT_FOUND` (the module's contract).
        Without an ``event_id`` (the client has not learnt it): the job whose join is still in
        flight for ``session``; else that session's newest unfinished, uncancelled job (its join
        reply has not reached the client yet); else the session's next join, which has not arrived
        yet (``gradio_client`` may send the cancel before its join). The last two reply with no id
        for a job still to come: ``(CANCELLED, None)``."""
        with self._lock:
            if event_id:
                job = self._jobs.get(event_id)
                if job is not None and self.bounds is not None and job.session != session:
                    job = None  # a shared studio: another visitor's job is not this caller's to stop
                return (job.request_cancel() if job else NOT_FOUND), event_id
            now = time.monotonic()
            self._forget_stale(now)
            if self._joining.get(session, 0) <= len(self._pending.get(session, ())):  # no join of it in flight
                newest = [j for j in self._jobs.values() if j.session == session and not (j.finished or j.cancelled)]
                if newest:
                    return newest[-1].request_cancel(), newest[-1].event_id
            sent = self._pending.setdefault(session, [])  # for the join in flight, or still to come
            sent[:] = [*sent[-(PENDING_PER_SESSION - 1):], now]
            self._pending.move_to_end(session)
            while len(self._pending) > REMEMBERED:
                self._pending.popitem(last=False)
            return CANCELLED, None

    def _forget_stale(self, now: float) -> None:
        """Drop the id-less cancels whose join has not come within :data:`STALE_S` (under the lock):
        ``gradio_client`` sends its join at once, so a cancel that old waits for nothing; and the
        addresses that brought no session key within :data:`SESSION_WINDOW_S`."""
        while self._sessions_of:
            address, seen = next(iter(self._sessions_of.items()))
            if seen and now - next(reversed(seen.values())) < SESSION_WINDOW_S:
                break
            del self._sessions_of[address]
        while self._pending:
            session, sent = next(iter(self._pending.items()))
            if now - sent[-1] < STALE_S:
                return
            del self._pending[session]

    def cancel_session(self, session: str | None) -> int:
        """Cancel every unfinished job of this browser session; how many were cancelled."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.session == session and not j.cancelled]
        return sum(job.request_cancel() == CANCELLED for job in jobs)


def _count(counts: dict, key, delta: int) -> None:
    """Add ``delta`` to ``counts[key]``, removing the key at 0: a dict of counts holds what counts now."""
    n = counts.get(key, 0) + delta
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)


class CancelRoute:
    """ASGI middleware: ``POST .../cancel`` cancels the asked job in :class:`Jobs` and answers
    ``{"success", "status", "event_id"}``, ``status`` being the contract's reply;
    ``POST .../queue/join`` passes through (under public mode's bounds, by session and client
    address: :func:`visitor_address`), and its reply registers the job with its session. Every
    request whose session key is not one (:func:`session_problem`, the module's "Session keys") is
    answered 422 ``{"detail": <why>}`` here, before anything keeps it."""

    def __init__(self, app, jobs: Jobs) -> None:
        self.app, self.jobs = app, jobs

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        if why := _key_outside_body(scope):
            await _reply(send, 422, {"detail": why})
        elif scope["method"] != "POST":
            await self.app(scope, receive, send)
        elif path.endswith("/cancel"):
            await self._cancel(receive, send)
        elif path.endswith("/queue/join"):
            await self._join(scope, receive, send)
        elif KEYED_BODIES.match(path) and _header(scope, b"content-type").startswith("application/json"):
            raw = await _read(receive)
            key = json_object(raw).get("session_hash")
            if why := session_problem(key, required=False):
                await _reply(send, 422, {"detail": why})
            elif key and (why := self.jobs.new_session(key, _address(scope))):
                await _reply(send, 429, {"detail": why})
            else:
                await self.app(scope, _replay(raw, receive), send)
        else:
            await self.app(scope, receive, send)

    async def _cancel(self, receive, send) -> None:
        raw = await _read(receive, MAX_CANCEL_BODY)
        if raw is None:
            await _reply(send, 413, {"detail": f"a cancel's body is at most {MAX_CANCEL_BODY} bytes"})
            return
        body = json_object(raw)
        if why := session_problem(body.get("session_hash")):
            await _reply(send, 422, {"detail": why})
            return
        event_id = body.get("event_id") if isinstance(body.get("event_id"), str) else None
        status, event_id = self.jobs.cancel(event_id or None, body.get("session_hash"))
        # Gradio's own reply is {"success": true}; ours also says what happened to the job
        await _reply(send, 200, {"success": status != NOT_FOUND, "status": status, "event_id": event_id})

    async def _join(self, scope, receive, send) -> None:
        raw = await _read(receive)
        body = json_object(raw)
        session = body.get("session_hash")
        address = _address(scope)
        refused = session_problem(session) or self.jobs.new_session(session, address)
        admitted = not refused and self.jobs.bounded(body.get("fn_index"))
        refused = refused or self.jobs.admit(session, body.get("fn_index"), address)
        if refused:  # refused before the queue, in the shape of Gradio's own refusal of a value (422, "validate"):
            # the one its clients pass on word for word (a 503 would read "Queue is full! Please try again.")
            await _reply(send, 422, {"detail": [{"__type__": "validate", "is_valid": False, "parameter_name": "run",
                                                 "message": refused}]})
            return
        self.jobs.joining(session)
        reply, answered = b"", False

        async def watch(message):
            nonlocal reply, answered
            if message["type"] == "http.response.body":
                reply += message.get("body", b"")
                if not message.get("more_body"):
                    event_id = json_object(reply).get("event_id")
                    answered = True
                    self.jobs.joined(event_id if isinstance(event_id, str) else None, session, admitted, address)
            await send(message)

        try:
            await self.app(scope, _replay(raw, receive), watch)
        finally:
            if not answered:  # the join failed before replying: it is no longer in flight
                self.jobs.joined(None, session, admitted, address)


def _key_outside_body(scope) -> str | None:
    """Why the session key a request carries outside its body (``heartbeat/<key>``,
    ``stream/<key>/...``, ``?session_hash=``, a ``session_hash`` header) is no key, or None."""
    keys = [m.group(1)] if (m := KEYED_IN_PATH.match(scope["path"])) else []
    keys += parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True).get("session_hash", [])
    keys += [value.decode("latin-1") for name, value in scope.get("headers", ()) if name.lower() == b"session_hash"]
    return next((why for key in keys if (why := session_problem(key))), None)


def _address(scope) -> str | None:
    """The request's client address, as a shared studio bounds it (:func:`visitor_address`)."""
    return visitor_address((scope.get("client") or (None,))[0], _header(scope, b"x-forwarded-for") or None)


def _header(scope, name: bytes) -> str:
    """The request's first ``name`` header ("" if none)."""
    return next((value.decode("latin-1") for key, value in scope.get("headers", ()) if key.lower() == name), "")


def _replay(raw: bytes, receive):
    """An ASGI ``receive`` that gives ``raw``, the request body already read, once more (for
    Gradio), then passes on what ``receive`` gets (a disconnect)."""
    given = False

    async def again():
        nonlocal given
        if given:
            return await receive()
        given = True
        return {"type": "http.request", "body": raw, "more_body": False}
    return again


async def _reply(send, status: int, doc: dict) -> None:
    payload = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def _read(receive, limit: int | None = None) -> bytes | None:
    """The request body (None: longer than ``limit`` bytes; the rest is not read)."""
    parts, size = [], 0
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        size += len(parts[-1])
        if limit is not None and size > limit:
            return None
        if not message.get("more_body"):
            return b"".join(parts)


def json_object(raw: bytes | str | None) -> dict:
    """A JSON document that should be an object, as a dict ({} for anything else)."""
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
