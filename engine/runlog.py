"""The run log: every run's settings, statistics and full token trace in one SQLite file.

Tables (open them with ``sqlite-utils tables runs.db`` or Datasette):

* ``runs``: one row per run: method, model ids, prompt and its hash, the config as JSON, status
  (``ok`` | ``cancelled`` | ``error``, with the error text), every :class:`RunStats` field, the
  texts, device, library versions, ``created_at``.
* ``events``: every event of every run in order (``run_id``, ``seq``), enough to re-render any
  past run exactly.
* ``meta``: ``schema_version``. Opening an older file runs the missing migrations, in order.

WAL mode; every write opens its own connection inside one transaction, so writers on several
threads never share a connection and a failed write leaves no half-written run.

>>> log = RunLog("runs.db")
>>> for event in log.record(decode_ssr(lm, prompt, cfg), RunMeta("ssr", "tiny-reasoner", prompt, cfg.to_dict())):
...     pass
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import platform
import sqlite3
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import sqlite_utils

from engine.events import DoneEvent, Event, PhaseEvent, RunStats, StepEvent, TokenEvent

SCHEMA_VERSION = 3


@dataclass
class RunMeta:
    """What a run was asked to do (the part of a ``runs`` row not produced by the run)."""

    method: str
    model: str
    prompt: str
    config: dict = field(default_factory=dict)
    draft_model: str | None = None
    prm: str | None = None
    prompt_id: str | None = None
    reference: str | None = None
    correct: bool | None = None
    origin: str = "app"  # "app" or "bench"
    device: str = "cpu"


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def library_versions() -> dict:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


def _migrate_1(db: sqlite_utils.Database) -> None:
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["runs"].create({"id": int, "created_at": str, "method": str, "model": str, "prompt": str,
                       "prompt_hash": str, "config": str, "status": str, "error": str}, pk="id", if_not_exists=True)
    db["events"].create({"run_id": int, "seq": int, "kind": str, "stream": str, "status": str, "token_id": int,
                         "text": str, "position": int, "draft": int, "source": str, "match_len": int,
                         "t": float, "phase": str, "at_token": int}, pk=("run_id", "seq"), if_not_exists=True)


def _migrate_2(db: sqlite_utils.Database) -> None:
    """Version 2 adds the run's descriptive columns and one column per RunStats field."""
    columns = {"draft_model": str, "prm": str, "prompt_id": str, "reference": str, "correct": int, "origin": str,
               "device": str, "versions": str, "reasoning_text": str, "answer_text": str}
    for name, kind in {**columns, **_stats_columns()}.items():
        if name not in db["runs"].columns_dict:
            db["runs"].add_column(name, kind)
    db["runs"].create_index(["method"], if_not_exists=True)
    db["runs"].create_index(["prompt_hash"], if_not_exists=True)


def _migrate_3(db: sqlite_utils.Database) -> None:
    """Version 3 (RSD): step events carry a reward and a verdict; runs gain the RSD accounting."""
    for name, kind in {"reward": float, "accepted": int}.items():
        if name not in db["events"].columns_dict:
            db["events"].add_column(name, kind)
    for name, kind in _stats_columns().items():
        if name not in db["runs"].columns_dict:
            db["runs"].add_column(name, kind)


MIGRATIONS = {1: _migrate_1, 2: _migrate_2, 3: _migrate_3}


def _stats_columns() -> dict:
    kinds = {"int": int, "str": str}  # annotations are strings here; the rest are floats
    return {f.name: kinds.get(f.type, float) for f in dataclasses.fields(RunStats) if f.name != "method"}


class RunLog:
    def __init__(self, path: str | Path = "runs.db") -> None:
        self.path = Path(path)
        self._lock = threading.Lock()  # serialises migrations and writes within this process
        if self.path.parent and not self.path.parent.exists():
            raise ValueError(f"run log folder {str(self.path.parent)!r} does not exist")
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            self._migrate(db)

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite_utils.Database]:
        conn = sqlite3.connect(self.path, timeout=30)
        try:
            yield sqlite_utils.Database(conn)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    def _migrate(self, db: sqlite_utils.Database) -> None:
        with self._lock:
            version = 0
            if "meta" in db.table_names():
                row = db.execute("select value from meta where key = 'schema_version'").fetchone()
                version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise ValueError(f"{self.path} has schema version {version}, newer than this app's {SCHEMA_VERSION}")
            for v in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[v](db)
                db["meta"].upsert({"key": "schema_version", "value": str(v)}, pk="key")

    # ------------------------------------------------------------------ writing
    def record(self, events: Iterable[Event], meta: RunMeta) -> Iterator[Event]:
        """Pass ``events`` through unchanged and log the run when it ends: ``ok`` when the stream
        finishes, ``cancelled`` when the consumer stops early, ``error`` when it raises."""
        seen: list[Event] = []
        try:
            for ev in events:
                seen.append(ev)
                yield ev
        except GeneratorExit:
            self.save(meta, seen, "cancelled")
            raise
        except Exception as err:  # logged, then re-raised for the caller to report
            self.save(meta, seen, "error", f"{type(err).__name__}: {err}")
            raise
        else:
            self.save(meta, seen, "ok" if seen and isinstance(seen[-1], DoneEvent) else "cancelled")

    def save(self, meta: RunMeta, events: list[Event], status: str, error: str | None = None) -> int:
        """Write one run and its events in a single transaction; returns the run id."""
        done = events[-1] if events and isinstance(events[-1], DoneEvent) else None
        stats = done.stats if done else _partial_stats(meta.method, events)
        row = {
            "created_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "method": meta.method, "model": meta.model, "draft_model": meta.draft_model, "prm": meta.prm,
            "prompt": meta.prompt, "prompt_hash": prompt_hash(meta.prompt), "prompt_id": meta.prompt_id,
            "reference": meta.reference, "correct": None if meta.correct is None else int(meta.correct),
            "origin": meta.origin, "device": meta.device, "config": json.dumps(meta.config, sort_keys=True),
            "status": status, "error": error, "versions": json.dumps(library_versions()),
            "reasoning_text": done.reasoning_text if done else _text(events, "reasoning"),
            "answer_text": done.answer_text if done else _text(events, "answer"),
            **{k: v for k, v in stats.to_dict().items() if k != "method"},
        }
        with self._lock, self._db() as db:
            run_id = db["runs"].insert(row).last_pk
            db["events"].insert_all((_event_row(run_id, i, ev) for i, ev in enumerate(events)
                                     if not isinstance(ev, DoneEvent)), batch_size=500)
        return run_id

    # ------------------------------------------------------------------ reading
    def runs(self, limit: int = 500, **equals) -> list[dict]:
        """Newest runs first, filtered by exact column values (``method="ssr"``, ...)."""
        for key in equals:
            if key not in self.columns():
                raise ValueError(f"unknown runs column {key!r}")
        where = " and ".join(f"[{k}] = :{k}" for k in equals) or None
        with self._db() as db:
            return list(db["runs"].rows_where(where, equals, order_by="id desc", limit=limit))

    def run(self, run_id: int) -> dict:
        with self._db() as db:
            try:
                return db["runs"].get(run_id)
            except sqlite_utils.db.NotFoundError:
                raise ValueError(f"no run with id {run_id} in {self.path}") from None

    def columns(self) -> list[str]:
        with self._db() as db:
            return list(db["runs"].columns_dict)

    def events(self, run_id: int) -> list[Event]:
        """The run's events, rebuilt as event objects (the final DoneEvent is not stored)."""
        with self._db() as db:
            rows = list(db["events"].rows_where("run_id = ?", [run_id], order_by="seq"))
        return [_row_event(r) for r in rows]


def _event_row(run_id: int, seq: int, ev: Event) -> dict:
    row = {"run_id": run_id, "seq": seq, "kind": ev.kind, "t": ev.t}
    if isinstance(ev, PhaseEvent):
        row.update(phase=ev.phase, draft=ev.draft, at_token=ev.at_token)
    elif isinstance(ev, StepEvent):
        row.update(position=ev.index, text=ev.text, source=ev.source, reward=ev.reward,
                   accepted=None if ev.accepted is None else int(ev.accepted))
    else:
        row.update(stream=ev.stream, status=ev.status, token_id=ev.token_id, text=ev.text, position=ev.position,
                   draft=ev.draft, source=ev.source, match_len=ev.match_len)
    return row


def _row_event(r: dict) -> Event:
    if r["kind"] == "phase":
        return PhaseEvent(r["phase"], r["t"], r["draft"], r["at_token"])
    if r["kind"] == "step":
        return StepEvent(r["position"], r["text"], r["source"], r["reward"],
                         None if r["accepted"] is None else bool(r["accepted"]), r["t"])
    return TokenEvent(r["stream"], r["status"], r["token_id"], r["text"], r["position"], r["t"], r["draft"],
                      r["source"], r["match_len"])


def _text(events: list[Event], stream: str) -> str:
    return "".join(e.text for e in events if isinstance(e, TokenEvent) and e.stream == stream)


def _partial_stats(method: str, events: list[Event]) -> RunStats:
    """Counters of a run that did not finish, from the events it produced."""
    s = RunStats(method=method)
    for ev in events:
        if isinstance(ev, TokenEvent):
            if ev.stream == "reasoning":
                s.reasoning_tokens += 1
            elif ev.stream == "answer":
                s.answer_tokens += 1
                setattr(s, ev.status, getattr(s, ev.status) + 1)
            elif ev.status == "generated":
                s.draft_tokens += 1
        s.wall_s = max(s.wall_s, ev.t)
    return s
