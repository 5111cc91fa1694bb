"""The run log's store: every run's settings, statistics and full token trace in one SQLite file.

Tables (open them with ``sqlite-utils tables runs.db`` or Datasette):

* ``runs``: one row per run: method, model ids, prompt and its hash, the config as JSON, status
  (``ok`` | ``cancelled`` | ``error``, with the error text), every :class:`RunStats` field, the
  texts, device, library versions, ``created_at``.
* ``events``: every event of every run in order (``run_id``, ``seq``), enough to re-render any
  past run exactly.
* ``meta``: ``schema_version``. Opening an older file of ours runs the missing migrations, in order.

Promises, each tested:

* **A save is one transaction**: the run row and all its events, or nothing (WAL mode; every
  write opens its own connection, so writers on several threads never share one).
* **The schema is verified, never guessed.** Whenever the file is new to this object (first use,
  or its inode changed: deleted, replaced), the tables, columns, indexes, journal mode and version
  are checked. A vanished file is re-created with the full schema; a file whose tables are not
  what this version writes is moved aside (``runs.db.broken-<time>``, nothing deleted) and a fresh
  one created; :attr:`RunLog.notice` says which, for the studio to show. A version is only ever
  stamped on tables this code created or migrated. What cannot be fixed (a folder that does not
  exist, a directory, a file that is not SQLite, no write permission, a newer schema) raises
  :class:`RunLogError` naming the file and the reason.

>>> log = RunLog("runs.db")
>>> for event in log.record(decode_ssr(lm, prompt, cfg), RunMeta("ssr", "tiny-reasoner", prompt, cfg.to_dict())):
...     pass
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import sqlite_utils

from engine.events import DoneEvent, Event
from engine.runlog.rows import event_values, partial_stats, row_event, stream_text
from engine.runlog.schema import EVENT_COLUMNS, MIGRATIONS, SCHEMA_VERSION, schema_problem


class RunLogError(ValueError):
    """The run log cannot be used; the message names the file and says why."""


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
    # grades a finished run's answer text against ``reference`` (True / False, None: no checker applies),
    # so that ``correct`` is logged with the run
    grade: Callable[[str], bool | None] | None = field(default=None, repr=False, compare=False)
    origin: str = "app"  # "app" or "bench"
    device: str = "cpu"
    dtype: str | None = None  # the target's precision, e.g. "float32"
    think_end: str | None = None  # the text of the model's end-of-thinking marker
    dataset: str | None = None  # the benchmark the prompt came from (a file's name, or a Hub dataset)
    visitor: str | None = None  # whose run it is on a shared studio (an opaque key); None: nobody's in particular


def prompt_hash(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def library_versions() -> dict:
    import torch
    import transformers

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}


class RunLog:
    def __init__(self, path: str | Path = "runs.db") -> None:
        self.path = Path(path)
        self.notice: str | None = None  # the latest repair, e.g. "run log re-created at runs.db (...)"
        self._lock = threading.RLock()  # serialises checks, repairs and writes within this process
        self._identity: tuple[int, int] | None = None  # (device, inode) of the file last verified
        if self.path.is_dir():
            raise RunLogError(f"run log {str(self.path)!r} is a directory, not a file: pass a file path (--db)")
        if not self.path.parent.is_dir():
            raise RunLogError(f"run log folder {str(self.path.parent)!r} does not exist (for {str(self.path)!r}, --db)")
        self._ensure()
        self._probe_write()

    def _probe_write(self) -> None:
        """A real write that changes nothing: file modes do not bind root, and a read-only file or
        folder only shows when SQLite writes."""
        try:
            with contextlib.closing(self._connect()) as conn:
                conn.execute("update meta set value = value where key = 'schema_version'")
                conn.commit()
        except sqlite3.Error as err:
            raise RunLogError(f"run log {str(self.path)!r} cannot be written ({err}): check the file's and its "
                              "folder's permissions, or pass another --db") from None

    # ------------------------------------------------------------------ the file and its schema
    def _ensure(self) -> None:
        """Verify (or create, or repair) the schema if the file is not the one last verified."""
        with self._lock:
            identity = _identity(self.path)
            if identity is not None and identity == self._identity:
                return
            if identity is None:  # no file: a first run, or it vanished under us
                if self._identity is not None:
                    self.notice = f"run log re-created at {self.path} (the file had vanished)"
                    for suffix in ("-wal", "-shm"):  # they belong to the vanished file
                        Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                self._create()
            else:
                problem = self._verify_or_migrate()
                if problem:
                    aside = self.path.with_name(f"{self.path.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
                    try:
                        self.path.rename(aside)
                        for suffix in ("-wal", "-shm"):
                            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
                    except OSError as err:
                        raise RunLogError(f"run log {str(self.path)!r} {problem}, and it cannot be moved aside: {err}") \
                            from None
                    self._create()
                    self.notice = f"run log re-created at {self.path} (it {problem}; the old file is {aside.name})"
            self._identity = _identity(self.path)

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(self.path, timeout=30)
            conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.DatabaseError as err:
            if "not a database" in str(err):
                raise RunLogError(f"run log {str(self.path)!r} is not an SQLite database ({err}): pass another --db") \
                    from None
            raise RunLogError(f"run log {str(self.path)!r} cannot be opened for writing ({err}): check the file's "
                              "and its folder's permissions, or pass another --db") from None
        return conn

    def _create(self) -> None:
        with contextlib.closing(self._connect()) as conn:
            db = sqlite_utils.Database(conn)
            for v in range(1, SCHEMA_VERSION + 1):
                MIGRATIONS[v](db)
            db["meta"].upsert({"key": "schema_version", "value": str(SCHEMA_VERSION)}, pk="key")
            conn.commit()

    def _verify_or_migrate(self) -> str | None:
        """Bring an older file of ours up to date; return what is wrong with the file, or None."""
        try:
            with contextlib.closing(self._connect()) as conn:
                db = sqlite_utils.Database(conn)
                tables = set(db.table_names())
                if not tables:  # an empty SQLite file (or an empty file): ours to fill
                    conn.close()
                    self._create()
                    return None
                if "meta" not in tables:
                    return "holds tables this app did not create (no meta table)"
                row = conn.execute("select value from meta where key = 'schema_version'").fetchone()
                version = int(row[0]) if row else 0
                if version > SCHEMA_VERSION:
                    raise RunLogError(f"run log {str(self.path)!r} has schema version {version}, newer than this "
                                      f"app's {SCHEMA_VERSION}: upgrade the app or pass another --db")
                if version < 1 or not {"runs", "events"} <= tables:
                    return f"has a meta table but not this app's tables (version {version})"
                for v in range(version + 1, SCHEMA_VERSION + 1):
                    MIGRATIONS[v](db)
                    db["meta"].upsert({"key": "schema_version", "value": str(v)}, pk="key")
                    conn.commit()
                return schema_problem(db)
        except sqlite3.DatabaseError as err:
            raise RunLogError(f"run log {str(self.path)!r} is not an SQLite database ({err}): pass another --db") \
                from None

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite_utils.Database]:
        self._ensure()
        conn = self._connect()
        try:
            yield sqlite_utils.Database(conn)
            conn.commit()
        except BaseException:
            conn.rollback()
            raise
        finally:
            conn.close()

    # ------------------------------------------------------------------ writing
    def record(self, events: Iterable[Event], meta: RunMeta) -> Iterator[Event]:
        """Pass ``events`` through unchanged and log the run when it ends: ``ok`` when the stream
        finishes, ``cancelled`` when the consumer stops early, ``error`` when it raises. A stream
        that refuses its input (a ``ValueError`` before its first event: a prompt too long for the
        model, a setting out of range) never ran, and is not logged."""
        seen: list[Event] = []
        try:
            for ev in events:
                seen.append(ev)
                yield ev
        except GeneratorExit:
            self.save(meta, seen, "cancelled")
            raise
        except Exception as err:  # logged (unless a refusal before anything ran), then re-raised
            if seen or not isinstance(err, ValueError):
                self.save(meta, seen, "error", f"{type(err).__name__}: {err}")
            raise
        else:
            self.save(meta, seen, "ok" if seen and isinstance(seen[-1], DoneEvent) else "cancelled")

    def save(self, meta: RunMeta, events: list[Event], status: str, error: str | None = None) -> int:
        """Write one run and its events in a single transaction (all or nothing); returns the run id."""
        done = events[-1] if events and isinstance(events[-1], DoneEvent) else None
        stats = done.stats if done else partial_stats(meta.method, events)
        correct = meta.correct
        if correct is None and done is not None and meta.grade is not None and status == "ok":
            correct = meta.grade(done.answer_text)
        row = {
            "created_at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
            "method": meta.method, "model": meta.model, "draft_model": meta.draft_model, "prm": meta.prm,
            "prompt": meta.prompt, "prompt_hash": prompt_hash(meta.prompt), "prompt_id": meta.prompt_id,
            "reference": meta.reference, "correct": None if correct is None else int(correct),
            "origin": meta.origin, "device": meta.device, "dtype": meta.dtype, "think_end": meta.think_end,
            "dataset": meta.dataset, "visitor": meta.visitor, "config": json.dumps(meta.config, sort_keys=True),
            "status": status, "error": error, "versions": json.dumps(library_versions()),
            "reasoning_text": done.reasoning_text if done else stream_text(events, "reasoning"),
            "answer_text": done.answer_text if done else stream_text(events, "answer"),
            **{k: v for k, v in stats.to_dict().items() if k != "method"},
        }
        names = ", ".join(f"[{k}]" for k in row)
        try:
            with self._lock, self._db() as db:
                run_id = db.conn.execute(f"insert into runs ({names}) values ({', '.join('?' * len(row))})",
                                         list(row.values())).lastrowid
                db.conn.executemany(
                    f"insert into events ({', '.join(EVENT_COLUMNS)}) values ({', '.join('?' * len(EVENT_COLUMNS))})",
                    (event_values(run_id, i, ev) for i, ev in enumerate(events) if not isinstance(ev, DoneEvent)))
        except (sqlite3.Error, RunLogError) as err:
            raise RunLogError(f"run not saved to {self.path}: {err}") from None
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

    def run(self, run_id: int, visitor: str | None = None) -> dict:
        """The run's row. With ``visitor``, only that visitor's run: another's is refused with the
        very words a run id that does not exist gets."""
        with self._db() as db:
            try:
                row = db["runs"].get(run_id)
            except sqlite_utils.db.NotFoundError:
                row = None
        if visitor is not None and (row is None or row.get("visitor") != visitor):
            raise ValueError(f"no run with id {run_id}")  # (a visitor of a shared studio: the server's path unsaid)
        if row is None:
            raise ValueError(f"no run with id {run_id} in {self.path}")
        return row

    def used(self, column: str, visitor: str | None = None) -> list[str]:
        """The values runs were logged under in ``column`` ("dataset", "model"; ``visitor``'s runs
        only, if given), the most recently used first."""
        if column not in ("dataset", "model"):
            raise ValueError(f"runs are listed by dataset or model, not {column!r}")
        mine = "" if visitor is None else " and visitor = ?"
        with self._db() as db:
            return [r[0] for r in db.execute(f"select [{column}] from runs where [{column}] is not null{mine} "
                                             f"group by [{column}] order by max(id) desc",
                                             [] if visitor is None else [visitor])]

    def columns(self) -> list[str]:
        with self._db() as db:
            return list(db["runs"].columns_dict)

    def events(self, run_id: int) -> list[Event]:
        """The run's events, rebuilt as event objects (the final DoneEvent is not stored)."""
        with self._db() as db:
            rows = list(db["events"].rows_where("run_id = ?", [run_id], order_by="seq"))
        return [row_event(r) for r in rows]


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


