"""The line for the model: one job (a run, a comparison, a sweep, a benchmark) uses it at a time,
the others wait in the order they came, each told its place and, once jobs have finished here, an
estimate of its wait. A job stopped while it waits leaves the line at once, having run nothing.

>>> ticket = Ticket()
>>> for words in line.wait(ticket, cancelled=lambda: job.cancelled):
...     show(words)               # "in line for the model: 2nd (1 job ahead of yours, about 20 s) ..."
>>> if ticket.held:
...     try: ...                  # the job's forwards
...     finally: line.release(ticket)

A long job takes turns (a benchmark on a shared studio, ``ssr_ui.benchmark``): between two of its
runs it gives the model to the jobs waiting (:meth:`ModelLine.release`, then :meth:`ModelLine.wait`
again, behind them), or, with no one waiting, counts the run just done as one hold
(:meth:`ModelLine.lap`). So a hold is what a job ahead makes a waiting job wait: a single run, a
comparison or sweep whole, one run of a benchmark, and the estimate is made of holds.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

POLL_S = 0.5  # a waiting job's status line is refreshed (and its Stop looked at) this often
HISTORY = 20  # past holds whose median makes the estimate


@dataclass(eq=False)
class Ticket:
    """One job's place: ``held`` once the model is its."""

    held: bool = False
    since: float = field(default_factory=time.monotonic)


class ModelLine:
    def __init__(self, poll_s: float = POLL_S) -> None:
        self.poll_s = poll_s
        self._cond = threading.Condition()
        self._line: list[Ticket] = []  # waiting, in arrival order
        self._holder: Ticket | None = None
        self._holds: deque[float] = deque(maxlen=HISTORY)  # seconds the model was held, newest last

    def wait(self, ticket: Ticket, cancelled: Callable[[], bool] = lambda: False) -> Iterator[str]:
        """Queue ``ticket`` and yield a status line every ``poll_s`` seconds until the model is its
        (``ticket.held``) or ``cancelled()`` says the job was stopped (it leaves the line, not
        held). Closing the generator (a client gone) leaves the line too."""
        with self._cond:
            self._line.append(ticket)
        try:
            while True:
                with self._cond:
                    if self._holder is None and self._line[0] is ticket:
                        self._line.pop(0)
                        self._holder, ticket.held, ticket.since = ticket, True, time.monotonic()
                        return
                    words = self._words(self._line.index(ticket))
                if cancelled():
                    return
                yield words
                with self._cond:
                    if not (self._holder is None and self._line[0] is ticket):
                        self._cond.wait(self.poll_s)
        finally:
            if not ticket.held:
                with self._cond:
                    self._line.remove(ticket)
                    self._cond.notify_all()

    def release(self, ticket: Ticket) -> None:
        """The job that held the model is done with it: the next in line gets it."""
        with self._cond:
            assert self._holder is ticket, "released by a job that does not hold the model"
            self._holds.append(time.monotonic() - ticket.since)
            self._holder, ticket.held = None, False
            self._cond.notify_all()

    def lap(self, ticket: Ticket) -> None:
        """The holder begins another run of a job that takes turns, no one waiting: the time since
        its hold (or its last lap) began counts as one hold, and a new one begins."""
        with self._cond:
            assert self._holder is ticket, "a lap by a job that does not hold the model"
            now = time.monotonic()
            self._holds.append(now - ticket.since)
            ticket.since = now

    def eta(self, ahead: int) -> float | None:
        """Seconds until ``ahead`` jobs (the one holding the model first) have had their hold: for
        the holder, the longest recent hold less what it has had, but at least the median hold (it
        may be running long); the median hold for each of the others. An estimate that errs long;
        None before any hold has ended here."""
        with self._cond:
            return self._eta(ahead)

    def _eta(self, ahead: int) -> float | None:  # (under the lock)
        if not self._holds:
            return None
        if ahead <= 0:
            return 0.0
        typical = statistics.median(self._holds)
        if self._holder is None:
            return typical * ahead
        remaining = max(max(self._holds) - (time.monotonic() - self._holder.since), typical)
        return remaining + typical * (ahead - 1)

    @property
    def waiting(self) -> int:
        """Jobs in line (the holder not counted)."""
        with self._cond:
            return len(self._line)

    def _words(self, place: int) -> str:
        ahead = place + (self._holder is not None)  # (called under the lock)
        eta = self._eta(ahead)
        estimate = "" if eta is None else f", about {max(1, math.ceil(eta))} s"
        jobs = "job" if ahead == 1 else "jobs"
        return (f"in line for the model: {ordinal(ahead + 1)} ({ahead} {jobs} ahead of yours{estimate}); "
                "Stop leaves the line")


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
