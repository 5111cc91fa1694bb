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
  job whose join is still in flight for that session, else its session's newest unfinished job.
* :meth:`Jobs.start` refuses a second start of the same job, so no job is ever run twice.
* The studio's own Stop button marks every job of its browser session (:meth:`Jobs.cancel_session`).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

REMEMBERED = 10_000  # job ids kept to refuse a restart; old ones are forgotten first


@dataclass
class Job:
    event_id: str | None
    session: str | None
    cancel: threading.Event = field(default_factory=threading.Event)
    finished: bool = False

    @property
    def cancelled(self) -> bool:
        return self.cancel.is_set()


def current_event_id() -> str | None:
    """The Gradio event id of the job this handler is running (None outside a Gradio queue)."""
    from gradio.context import LocalContext  # noqa: PLC0415

    return LocalContext.event_id.get(None)


class Jobs:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: OrderedDict[str, Job] = OrderedDict()  # every job seen, by event id (bounded)
        self._started: set[str] = set()
        self._joining: dict[str | None, int] = {}  # per session: join requests not yet answered
        self._pending: dict[str | None, int] = {}  # per session: id-less cancels for those joins

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

    def start(self, event_id: str | None, session: str | None) -> Job | None:
        """The job about to run, or None if it already started once (Gradio restarting it)."""
        if event_id is None:  # called outside a Gradio queue (tests, scripts): nothing to track
            return Job(None, session)
        with self._lock:
            if event_id in self._started:
                return None
            self._started.add(event_id)
            return self._job(event_id, session)

    def joining(self, session: str | None) -> None:
        """A join request of this session arrived; its job id comes with the reply."""
        with self._lock:
            self._joining[session] = self._joining.get(session, 0) + 1

    def joined(self, event_id: str | None, session: str | None) -> None:
        """The reply to a join request: the job (if any) entered the queue."""
        with self._lock:
            self._joining[session] = max(self._joining.get(session, 0) - 1, 0)
            if not event_id:
                return
            job = self._job(event_id, session)
            if self._pending.get(session):
                self._pending[session] -= 1
                job.cancel.set()

    @contextlib.contextmanager
    def running(self, event_id: str | None, session: str | None) -> Iterator[Job | None]:
        """:meth:`start` the job for the duration of the block, then mark it finished."""
        job = self.start(event_id, session)
        try:
            yield job
        finally:
            if job is not None:
                job.finished = True

    def cancel(self, event_id: str | None, session: str | None = None) -> None:
        """Mark one job cancelled, whether it is queued, running or not yet known; without an
        ``event_id``, the newest unfinished, uncancelled job of ``session``."""
        with self._lock:
            if event_id:
                self._job(event_id).cancel.set()
                return
            if self._joining.get(session, 0) > self._pending.get(session, 0):  # its job has no id yet
                self._pending[session] = self._pending.get(session, 0) + 1
                return
            newest = [j for j in self._jobs.values() if j.session == session and not (j.finished or j.cancelled)]
            if newest:
                newest[-1].cancel.set()

    def cancel_session(self, session: str | None) -> int:
        """Mark every job of this browser session cancelled; how many were marked."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.session == session and not j.cancelled]
        for job in jobs:
            job.cancel.set()
        return len(jobs)


class CancelRoute:
    """ASGI middleware: ``POST .../cancel`` marks the asked job in :class:`Jobs` and answers;
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
        self.jobs.cancel(body.get("event_id") or None, body.get("session_hash"))
        payload = b'{"success": true}'
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def _join(self, scope, receive, send) -> None:
        raw = await _read(receive)
        session = json_object(raw).get("session_hash")
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
                    self.jobs.joined(event_id if isinstance(event_id, str) else None, session)
            await send(message)

        try:
            await self.app(scope, replay, watch)
        finally:
            if not answered:  # the join failed before replying: it is no longer in flight
                self.jobs.joined(None, session)


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
