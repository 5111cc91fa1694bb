"""Rows and events: how an event becomes an ``events`` row and back, and what a run's row says
when it has no final ``DoneEvent`` (its texts and counters rebuilt from the events it produced)."""

from __future__ import annotations

import dataclasses
import json

from engine.events import Event, ForwardEvent, PhaseEvent, RunStats, StepEvent, TokenEvent, TokenTally
from engine.forwards import summarise
from engine.runlog.schema import EVENT_COLUMNS


def event_values(run_id: int, seq: int, ev: Event) -> list:
    row = _event_row(run_id, seq, ev)
    return [row.get(c) for c in EVENT_COLUMNS]


def _event_row(run_id: int, seq: int, ev: Event) -> dict:
    row = {"run_id": run_id, "seq": seq, "kind": ev.kind, "t": ev.t}
    if isinstance(ev, PhaseEvent):
        row.update(phase=ev.phase, draft=ev.draft, at_token=ev.at_token)
    elif isinstance(ev, ForwardEvent):  # its rows as JSON: a forward has one per row it computed
        row.update(position=ev.index, phase=ev.phase,
                   work=json.dumps({"start": ev.start, "rows": [dataclasses.asdict(r) for r in ev.rows]}))
    elif isinstance(ev, StepEvent):
        row.update(position=ev.index, text=ev.text, source=ev.source, reward=ev.reward,
                   accepted=None if ev.accepted is None else int(ev.accepted), confidence=ev.confidence)
    else:
        row.update(stream=ev.stream, status=ev.status, token_id=ev.token_id, text=ev.text, position=ev.position,
                   draft=ev.draft, source=ev.source, match_len=ev.match_len)
    return row


def row_event(r: dict) -> Event:
    if r["kind"] == "phase":
        return PhaseEvent(r["phase"], r["t"], r["draft"], r["at_token"])
    if r["kind"] == "forward":
        work = json.loads(r["work"])
        return ForwardEvent.from_dict({"index": r["position"], "phase": r["phase"], "start": work["start"], "end": r["t"],
                                       "rows": work["rows"]})
    if r["kind"] == "step":
        return StepEvent(r["position"], r["text"], r["source"], r["reward"],
                         None if r["accepted"] is None else bool(r["accepted"]), r["t"], r.get("confidence"))
    return TokenEvent(r["stream"], r["status"], r["token_id"], r["text"], r["position"], r["t"], r["draft"],
                      r["source"], r["match_len"])


def stream_text(events: list[Event], stream: str) -> str:
    """A stream's text: each position's piece once (a later verdict on a token repeats its piece)."""
    seen: set[tuple[int | None, int]] = set()
    pieces = []
    for e in events:
        if isinstance(e, TokenEvent) and e.stream == stream and (e.draft, e.position) not in seen:
            seen.add((e.draft, e.position))
            pieces.append(e.text)
    return "".join(pieces)


def partial_stats(method: str, events: list[Event]) -> RunStats:
    """Counters of a run that did not finish, from the events it produced."""
    s = RunStats(method=method)
    tally = TokenTally(s)
    for ev in events:
        tally.add(ev)
        s.wall_s = max(s.wall_s, ev.t)
    forwards = [ev for ev in events if isinstance(ev, ForwardEvent)]
    s.forward_calls = len(forwards)
    summarise(s, forwards)
    return s
