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
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from engine.events import DoneEvent

REMEMBERED = 10_000  # job ids kept to refuse a restart; old ones are forgotten first
# a bounded job joined this long ago that never started is not counted: its handler never ran (Gradio refused its
# input first) or its client left before its turn; admitted jobs enter their handlers at once (ssr_ui.layout)
STALE_S = 30.0


CANCELLED, ALREADY_FINISHED, NOT_FOUND = "cancelled", "already finished", "not found"  # the cancel replies


class Refused(ValueError):
    """A job over public mode's bounds (:class:`Bounds`); the message says which, and when to retry."""


@dataclass
class Job:
    """One submitted job: ``queued`` -> ``running`` -> ``finished``, or ``cancelled`` from either of
    the first two. ``cancel`` is set exactly when the state becomes ``cancelled``."""

    event_id: str | None
    session: str | None
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
    ``fns``, by Gradio's function index): one in flight per visitor (browser or API session), at
    most ``max_jobs`` in all. ``eta(n)``: seconds until ``n`` jobs ahead have had the model (None:
    no estimate yet), for the refusal's "try again in"."""

    fns: frozenset[int]
    max_jobs: int
    eta: Callable[[int], float | None]


def current_event_id() -> str | None:
    """The Gradio event id of the job this handler is running (None outside a Gradio queue)."""
    from gradio.context import LocalContext

    return LocalContext.event_id.get(None)


class Jobs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, Job] = OrderedDict()  # every job seen, by event id (bounded)
        self._started: set[str] = set()
        self._joining: dict[str | None, int] = {}  # per session: join requests not yet answered
        self._pending: dict[str | None, int] = {}  # per session: id-less cancels for those joins
        self.bounds: Bounds | None = None  # public mode's (set once the app is built); None: no bounds
        self._admitted: dict[str | None, int] = {}  # per session: bounded joins admitted, not yet answered

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

    def start(self, event_id: str | None, session: str | None) -> Job | None:
        """The job about to run, or None if it already started once (Gradio restarting it). Under
        :attr:`bounds`, a job that was not admitted when it joined (a route that bypasses
        ``queue/join``) is checked here, and :class:`Refused` when over a bound."""
        if event_id is None:  # called outside a Gradio queue (tests, scripts): nothing to track
            return Job(None, session)
        with self._lock:
            if event_id in self._started:
                return None
            job = self._job(event_id, session)
            if self.bounds is not None and not job.bounded:
                if self._admitted.get(session):  # admitted when it joined; its join's reply is still on its way
                    self._admitted[session] -= 1
                    job.reserved = True
                else:
                    refused = self._over(session)
                    if refused:
                        raise Refused(refused)
                job.bounded = True
            self._started.add(event_id)
        job._begin()
        return job

    def joining(self, session: str | None) -> None:
        """A join request of this session arrived; its job id comes with the reply."""
        with self._lock:
            self._joining[session] = self._joining.get(session, 0) + 1

    def admit(self, session: str | None, fn_index) -> str | None:
        """A join of ``session`` for Gradio function ``fn_index``, before it reaches the queue: under
        :attr:`bounds`, a job that uses the model is refused (the reason, for the visitor) when its
        visitor has one in flight already or ``max_jobs`` are in flight in all; else admitted (None),
        and counted from here on. Nothing is bounded without bounds, or for other functions."""
        if not self.bounded(fn_index):
            return None
        with self._lock:
            refused = self._over(session)
            if not refused:
                self._admitted[session] = self._admitted.get(session, 0) + 1
            return refused

    def bounded(self, fn_index) -> bool:
        """Whether a join for Gradio function ``fn_index`` is under :attr:`bounds` (the index as a
        client sends it: Gradio reads "7" and 7.0 as 7 too)."""
        try:
            return self.bounds is not None and int(fn_index) in self.bounds.fns
        except (TypeError, ValueError):
            return False

    def _over(self, session: str | None) -> str | None:
        """Why one more job of ``session`` would be over a bound, or None (under the lock)."""
        if self._in_flight(session, every=False):
            return ("you have a run, sweep or benchmark in flight already (one at a time on this shared "
                    "studio): wait for it to end, or press Stop, then run again")
        total = self._in_flight(None, every=True)
        if total >= self.bounds.max_jobs:
            eta = self.bounds.eta(total)
            when = f"in about {max(5, round(eta))} s" if eta is not None else "in a minute"
            return (f"the studio is busy: {total} runs are in line for its one model (at most "
                    f"{self.bounds.max_jobs} on this shared studio); try again {when}")
        return None

    def _in_flight(self, session: str | None, every: bool) -> int:
        """Bounded jobs of ``session`` (``every``: of every session) admitted and not ended: joins
        still unanswered, jobs whose handler runs (stopped ones too, until it returns), and jobs
        not started yet, not stopped, that joined less than :data:`STALE_S` ago."""
        now = time.monotonic()
        admitted = sum(n for s, n in self._admitted.items() if every or s == session)
        return admitted + sum(1 for j in self._jobs.values()
                              if j.bounded and (every or j.session == session) and not j.ended
                              and (j.started or (not j.cancelled and now - j.joined_at < STALE_S)))

    def joined(self, event_id: str | None, session: str | None, admitted: bool = False) -> None:
        """The reply to a join request: the job (if any) entered the queue (``admitted``: under
        :meth:`admit`'s bounds, counted from here on as the job)."""
        with self._lock:
            self._joining[session] = max(self._joining.get(session, 0) - 1, 0)
            job = self._job(event_id, session) if event_id else None
            if admitted and not (job is not None and job.reserved):  # (a job that started first took its reservation)
                self._admitted[session] = max(self._admitted.get(session, 0) - 1, 0)
            if job is None:
                return
            job.bounded = job.bounded or admitted
            if self._pending.get(session):
                self._pending[session] -= 1
                job.request_cancel()

    @contextlib.contextmanager
    def running(self, event_id: str | None, session: str | None) -> Iterator[Job | None]:
        """:meth:`start` the job for the duration of the block, then :meth:`Job.finish` it."""
        job = self.start(event_id, session)
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
            if self._joining.get(session, 0) <= self._pending.get(session, 0):  # no join of it in flight
                newest = [j for j in self._jobs.values() if j.session == session and not (j.finished or j.cancelled)]
                if newest:
                    return newest[-1].request_cancel(), newest[-1].event_id
            self._pending[session] = self._pending.get(session, 0) + 1  # for the join in flight, or still to come
            return CANCELLED, None

    def cancel_session(self, session: str | None) -> int:
        """Cancel every unfinished job of this browser session; how many were cancelled."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.session == session and not j.cancelled]
        return sum(job.request_cancel() == CANCELLED for job in jobs)


class CancelRoute:
    """ASGI middleware: ``POST .../cancel`` cancels the asked job in :class:`Jobs` and answers
    ``{"success", "status", "event_id"}``, ``status`` being the contract's reply;
    ``POST .../queue/join`` passes through, and its reply registers the job with its session."""

    def __init__(self, app, jobs: Jobs) -> None:
        self.app, self.jobs = app, jobs

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
        elif scope["path"].endswith("/cancel"):
            await self._cancel(receive, send)
        elif scope["path"].endswith("/queue/join"):
            await self._join(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _cancel(self, receive, send) -> None:
        body = json_object(await _read(receive))
        event_id = body.get("event_id") if isinstance(body.get("event_id"), str) else None
        status, event_id = self.jobs.cancel(event_id or None, body.get("session_hash"))
        # Gradio's own reply is {"success": true}; ours also says what happened to the job
        await _reply(send, 200, {"success": status != NOT_FOUND, "status": status, "event_id": event_id})

    async def _join(self, scope, receive, send) -> None:
        raw = await _read(receive)
        body = json_object(raw)
        session = body.get("session_hash")
        admitted = self.jobs.bounded(body.get("fn_index"))
        refused = self.jobs.admit(session, body.get("fn_index"))
        if refused:  # refused before the queue, in the shape of Gradio's own refusal of a value (422, "validate"):
            # the one its clients pass on word for word (a 503 would read "Queue is full! Please try again.")
            await _reply(send, 422, {"detail": [{"__type__": "validate", "is_valid": False, "parameter_name": "run",
                                                 "message": refused}]})
            return
        self.jobs.joining(session)
        reply, answered = b"", False

        async def replay():  # the request body, once more, for Gradio
            return {"type": "http.request", "body": raw, "more_body": False}

        async def watch(message):
            nonlocal reply, answered
            if message["type"] == "http.response.body":
                reply += message.get("body", b"")
                if not message.get("more_body"):
                    event_id = json_object(reply).get("event_id")
                    answered = True
                    self.jobs.joined(event_id if isinstance(event_id, str) else None, session, admitted)
            await send(message)

        try:
            await self.app(scope, replay, watch)
        finally:
            if not answered:  # the join failed before replying: it is no longer in flight
                self.jobs.joined(None, session, admitted)


async def _reply(send, status: int, doc: dict) -> None:
    payload = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


async def _read(receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def json_object(raw: bytes | str | None) -> dict:
    """A JSON document that should be an object, as a dict ({} for anything else)."""
    try:
        doc = json.loads(raw or b"{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
