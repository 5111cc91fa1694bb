"""The run log's schema: its tables, the migrations that build them version by version, and the
check that a file's tables are the ones this version writes (``RunLog`` repairs on what it says)."""

from __future__ import annotations

import dataclasses

import sqlite_utils

from engine.events import RunStats

SCHEMA_VERSION = 19


def _migrate_1(db: sqlite_utils.Database) -> None:
    db["meta"].create({"key": str, "value": str}, pk="key", if_not_exists=True)
    db["runs"].create({"id": int, "created_at": str, "method": str, "model": str, "prompt": str,
                       "prompt_hash": str, "config": str, "status": str, "error": str}, pk="id", if_not_exists=True)
    db["events"].create({"run_id": int, "seq": int, "kind": str, "stream": str, "status": str, "token_id": int,
                         "text": str, "position": int, "draft": int, "source": str, "match_len": int,
                         "t": float, "phase": str, "at_token": int}, pk=("run_id", "seq"), if_not_exists=True)


def _add_columns(table, columns: dict) -> None:
    for name, kind in columns.items():
        if name not in table.columns_dict:
            table.add_column(name, kind)


def _migrate_2(db: sqlite_utils.Database) -> None:
    """Version 2 adds the run's descriptive columns and one column per RunStats field."""
    _add_columns(db["runs"], {"draft_model": str, "prm": str, "prompt_id": str, "reference": str, "correct": int,
                              "origin": str, "device": str, "versions": str, "reasoning_text": str,
                              "answer_text": str, **_stats_columns()})
    db["runs"].create_index(["method"], if_not_exists=True)
    db["runs"].create_index(["prompt_hash"], if_not_exists=True)


def _migrate_3(db: sqlite_utils.Database) -> None:
    """Version 3 (RSD): step events carry a reward and a verdict; runs gain the RSD accounting."""
    _add_columns(db["events"], {"reward": float, "accepted": int})
    _add_columns(db["runs"], _stats_columns())


def _migrate_4(db: sqlite_utils.Database) -> None:
    """Version 4: one meaning of "rejected" (draft tokens never taken, as the Draft pane shows);
    lookup proposals not taken get their own column. Rows written before keep the old mixed count."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_5(db: sqlite_utils.Database) -> None:
    """Version 5 (RSD): a step event carries the draft's confidence (its least likely token)."""
    _add_columns(db["events"], {"confidence": float})


def _migrate_6(db: sqlite_utils.Database) -> None:
    """Version 6 (static cache, compiled steps): the run's cache size, compile time and step mode."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_7(db: sqlite_utils.Database) -> None:
    """Version 7: the target's precision (baselines are compared only at the same one) and the text
    of the model's end-of-thinking marker (a replay shows it as the live view's badge)."""
    _add_columns(db["runs"], {"dtype": str, "think_end": str})


def _migrate_8(db: sqlite_utils.Database) -> None:
    """Version 8 (capability probes): how an SSR run's verifies ran on its model."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_9(db: sqlite_utils.Database) -> None:
    """Version 9 (benchmarks): the dataset a run's prompt came from, and the target's forwards while
    writing the answer (SSR's tokens per verify)."""
    _add_columns(db["runs"], {"dataset": str, **_stats_columns()})
    db["runs"].create_index(["dataset"], if_not_exists=True)


def _migrate_10(db: sqlite_utils.Database) -> None:
    """Version 10: which budget cut a run (``RunStats.cut``). Rows written before have none."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_11(db: sqlite_utils.Database) -> None:
    """Version 11 (the timeline): forward events, their start and rows as JSON (``work``); runs gain
    the forwards' accounting (forward and drafting seconds, verifies, acceptance). Runs logged before
    have no forwards: their timeline says so."""
    _add_columns(db["events"], {"work": str})
    _add_columns(db["runs"], _stats_columns())


def _migrate_12(db: sqlite_utils.Database) -> None:
    """Version 12 (early exit, method ``ssr-exit``): the rule, where it stopped the reasoning, which
    drafts agreed and on what. Runs logged before have none."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_13(db: sqlite_utils.Database) -> None:
    """Version 13 (a shared studio): whose run it is, as an opaque visitor key (``ssr_ui.public``);
    null for runs of a studio not in public mode, and for every run logged before."""
    _add_columns(db["runs"], {"visitor": str})
    db["runs"].create_index(["visitor"], if_not_exists=True)


def _migrate_14(db: sqlite_utils.Database) -> None:
    """Version 14: an early-exit run that never exited says why (``RunStats.exit.why``). Runs logged
    before have none: their strip says the rule never held."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_15(db: sqlite_utils.Database) -> None:
    """Version 15: SSR's cost-aware drafting, its decision in words (``RunStats.drafting``) and the answer
    forwards the drafts saved that no lookup would have (``RunStats.draft_saved``). Runs logged before: empty, 0."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_16(db: sqlite_utils.Database) -> None:
    """Version 16: how an SSR run's drafts held the prefix (``RunStats.forks``: "shared prefix", or
    "copied prefix: <why>"). Runs logged before: empty (they copied it)."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_17(db: sqlite_utils.Database) -> None:
    """Version 17: SSR's cost-aware lookup widths in the reasoning, in words (``RunStats.lookups``).
    Runs logged before: empty (they verified every lookup token proposed)."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_18(db: sqlite_utils.Database) -> None:
    """Version 18: one count per answer token, by the proposer that won it: ``recovered`` is a suffix in a draft
    alone and the lookups get ``lookup_prompt`` / ``lookup_reasoning`` / ``lookup_answer``. Rows logged before
    keep their ``recovered`` (lookups included) and null lookup columns; their replays recount from the events."""
    _add_columns(db["runs"], _stats_columns())


def _migrate_19(db: sqlite_utils.Database) -> None:
    """Version 19: the target's precision and how it was chosen, in words (``RunStats.numerics``: chosen at load by
    measured cost on the CPU, asked for, or a device's default). Runs logged before: empty."""
    _add_columns(db["runs"], _stats_columns())


MIGRATIONS = {1: _migrate_1, 2: _migrate_2, 3: _migrate_3, 4: _migrate_4, 5: _migrate_5, 6: _migrate_6, 7: _migrate_7,
              8: _migrate_8, 9: _migrate_9, 10: _migrate_10, 11: _migrate_11,
              12: _migrate_12, 13: _migrate_13, 14: _migrate_14,
              15: _migrate_15, 16: _migrate_16, 17: _migrate_17, 18: _migrate_18,
              19: _migrate_19}


def _stats_columns() -> dict:
    kinds = {"int": int, "str": str}  # annotations are strings here ("int | None" is an int); the rest are floats
    columns = RunStats.columns()
    hints = {owner: {f.name: f.type for f in dataclasses.fields(owner)} for owner in {owner for owner, _ in columns.values()}}
    return {name: kinds.get(hints[owner][attr].split(" |")[0], float) for name, (owner, attr) in columns.items()
            if name != "method"}


EVENT_COLUMNS = ("run_id", "seq", "kind", "stream", "status", "token_id", "text", "position", "draft", "source",
                 "match_len", "t", "phase", "at_token", "reward", "accepted", "confidence", "work")
INDEXES = {("method",), ("prompt_hash",), ("dataset",), ("visitor",)}


def expected_run_columns() -> set[str]:
    """Every column this version writes into ``runs``."""
    base = {"id", "created_at", "method", "model", "prompt", "prompt_hash", "config", "status", "error", "draft_model",
            "prm", "prompt_id", "reference", "correct", "origin", "device", "versions", "reasoning_text", "answer_text",
            "dtype", "think_end", "dataset", "visitor"}
    return base | set(_stats_columns())


def schema_problem(db: sqlite_utils.Database) -> str | None:
    """What differs from the schema this version writes, or None."""
    runs, events = db["runs"], db["events"]
    missing = expected_run_columns() - set(runs.columns_dict)
    if missing:
        return f"has a runs table without the columns {', '.join(sorted(missing))}"
    if runs.pks != ["id"]:
        return "has a runs table without its integer id key"
    missing = set(EVENT_COLUMNS) - set(events.columns_dict)
    if missing:
        return f"has an events table without the columns {', '.join(sorted(missing))}"
    if events.pks != ["run_id", "seq"]:
        return "has an events table without its (run_id, seq) key"
    indexed = {tuple(i.columns) for i in runs.indexes}
    if not INDEXES <= indexed:
        return "has a runs table without its indexes"
    if db.execute("pragma journal_mode").fetchone()[0] != "wal":
        return "is not in WAL mode"
    return None
