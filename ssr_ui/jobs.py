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
  runs nothing and logs nothing (the choice documented in docs/STUDIO.md).
* :meth:`Jobs.start` refuses a second start of the same job, so no job is ever run twice.
* The studio's own Stop button marks every job of its browser session (:meth:`Jobs.cancel_session`).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

REMEMBERED = 10_000  # job ids kept to refuse a restart; old ones are forgotten first


@dataclass
class Job:
    event_id: str | None
    session: str | None
    cancel: threading.Event = field(default_factory=threading.Event)

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

    def cancel(self, event_id: str) -> None:
        """Mark one job cancelled, whether it is queued, running or not yet known."""
        with self._lock:
            self._job(event_id).cancel.set()

    def cancel_session(self, session: str | None) -> int:
        """Mark every job of this browser session cancelled; how many were marked."""
        with self._lock:
            jobs = [j for j in self._jobs.values() if j.session == session and not j.cancelled]
        for job in jobs:
            job.cancel.set()
        return len(jobs)


class CancelRoute:
    """ASGI middleware: ``POST .../cancel`` marks the asked job in :class:`Jobs` and answers."""

    def __init__(self, app, jobs: Jobs) -> None:
        self.app, self.jobs = app, jobs

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].endswith("/cancel"):
            await self.app(scope, receive, send)
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            event_id = json.loads(body or b"{}").get("event_id")
        except (ValueError, AttributeError):
            event_id = None
        if isinstance(event_id, str) and event_id:
            self.jobs.cancel(event_id)
        status, reply = (200, {"success": True}) if event_id else (400, {"detail": "cancel needs an event_id"})
        payload = json.dumps(reply).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
