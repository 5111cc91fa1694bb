"""The schema of an imported trace, derived from the dataclasses it was written from.

A JSON trace (``ssr_ui.export.run_to_json``) comes from anyone: it is data to validate before a
single value of it is rendered. The schema is not a hand-kept list: an event's fields and their
types are its dataclass's (``engine.events``), the run row's are :class:`~engine.events.RunStats`'s
and :class:`~engine.runlog.store.RunMeta`'s, so a field added there is validated here too. On top of
the types: every number finite and within :data:`MAX_NUMBER` (counts and ids not negative), every
text at most :data:`MAX_TEXT` characters, every list at most :data:`MAX_ITEMS` long, a token's stream
and status one of ``engine.events``' own, a forward's rows named as lanes are, a draft's events naming
their draft, and nothing nested deeper than the dataclasses nest (a row's other columns and its
settings are flat scalars). Each class's checks are compiled once from its field types.

>>> row, events = parse_trace({"format": FORMAT, "run": {...}, "events": [...]})
TraceError: event 12 is malformed: forward field 'index' must be an integer, got str
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing

from engine.events import STATUSES, STREAMS, DoneEvent, Event, PhaseEvent, RowWork, RunStats, TokenEvent
from engine.runlog.store import RunMeta

FORMAT = "ssr-studio-trace/1"
MAX_TEXT = 2_000_000  # characters in any one text (a prompt, an answer); the whole file is capped in bytes anyway
MAX_ITEMS = 1_000_000  # elements in any one list (events, a forward's rows, a run's token ids)
MAX_NUMBER = 1e30  # the largest magnitude of any number (FLOPs of a long run are ~1e16)
# the most tokens one verify proposes (max_spec's default is 32), and all of a trace's verifies together: the
# acceptance statistics count each proposed token
MAX_PROPOSAL = 2**14
MAX_PROPOSED = MAX_ITEMS
SCALARS = (str, int, float, bool, type(None))  # what a row's other columns and its settings may hold
# the run log keeps a run's final stats in its row, not as a DoneEvent
EVENTS = {f.default: cls for cls in typing.get_args(Event) if cls is not DoneEvent
          for f in dataclasses.fields(cls) if f.name == "kind"}
CHOICES = {(TokenEvent, "stream"): STREAMS, (TokenEvent, "status"): STATUSES}  # fields the renderer branches on
BOUNDS = {(RowWork, "proposed"): MAX_PROPOSAL, (RowWork, "accepted"): MAX_PROPOSAL}  # numbers with a smaller top
# texts of a set form (a pattern, and the form in words): a forward's row names its lane
FORMS = {(RowWork, "row"): (re.compile(r"main|draft|prm|target|draft \d{1,9}"), "main, draft, prm, target or draft <n>")}
# (event class, a condition on it, an integer field it then needs): a draft's events say which draft, its fork where
NEEDS = ((PhaseEvent, lambda raw: raw.get("phase") == "drafting", "draft"),
         (PhaseEvent, lambda raw: raw.get("phase") == "drafting", "at_token"),
         (TokenEvent, lambda raw: raw.get("stream") == "draft", "draft"))
ROW_FIELDS = {**{f.name: RunMeta for f in dataclasses.fields(RunMeta) if f.name != "grade"},  # grade: a function
              **{name: owner for name, (owner, _) in RunStats.columns().items()}}  # field -> the dataclass that types it
ROW_ATTRS = {name: attr for name, (_, attr) in RunStats.columns().items()}  # a stats column -> its field there
_NUMBER_WORDS = {int: "an integer", float: "a number"}


class TraceError(ValueError):
    """What is wrong with a trace, naming the first bad field."""


Check = typing.Callable[[object], "str | None"]  # why a value does not fit (None: it fits)


def parse_trace(doc) -> tuple[dict, list[Event]]:
    """The run row and the events of a parsed JSON trace, every value checked against the schema
    (see the module doc); :class:`TraceError` (a ValueError) names the first bad field."""
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise TraceError(f"not an SSR Studio trace (expected \"format\": \"{FORMAT}\")")
    row = doc.get("run", {})
    if not isinstance(row, dict):
        raise TraceError(f"the run must be an object, got {_name(row)}")
    for key, value in row.items():
        if key == "config":
            why = None if value is None else _settings(value)
        elif key in ROW_FIELDS:  # null: a column the run was logged without (a schema older than the field)
            why = None if value is None else _check(_hints(ROW_FIELDS[key])[ROW_ATTRS.get(key, key)], True)(value)
        else:  # a column no dataclass types (id, status, created_at, ...): one value
            why = _check(type(value), True)(value) if isinstance(value, SCALARS) else \
                f"must be a single value, got {_name(value)}"
        if why:
            raise TraceError(f"the run is malformed: field {key!r} {why}")
    raws = doc.get("events", [])
    why = _check(list, False)(raws)
    if why:
        raise TraceError(f"the events {why}")
    events = [_event(i, raw) for i, raw in enumerate(raws)]
    proposed = sum(r.proposed for ev in events for r in getattr(ev, "rows", ()))
    if proposed > MAX_PROPOSED:
        raise TraceError(f"the forwards propose {proposed} tokens in all: a trace holds at most {MAX_PROPOSED}")
    return row, events


def _event(i: int, raw) -> Event:
    cls = EVENTS.get(raw.get("kind")) if isinstance(raw, dict) else None
    if cls is None:
        raise TraceError(f"event {i} has an unknown kind")
    try:
        return _build(cls, raw, "")
    except TraceError as err:
        raise TraceError(f"event {i} is malformed: {raw['kind']} {err}") from None


def _build(cls, raw: dict, prefix: str):
    """An instance of dataclass ``cls`` from ``raw``, each field checked (:func:`_plan`); nested
    dataclasses (a tuple or list of them) built in turn."""
    plan = _plan(cls)
    for name in raw:
        if name not in plan:
            raise TraceError(f"field {prefix + name!r} is not one of a {cls.__name__}'s")
    values = {}
    for name, (required, check, item, container) in plan.items():
        if name not in raw:
            if required:
                raise TraceError(f"field {prefix + name!r} is missing")
            continue
        value = raw[name]
        why = check(value)
        if why:
            raise TraceError(f"field {prefix + name!r} {why}")
        if item is not None and value is not None:
            value = container(_build(item, v, f"{prefix}{name}[{k}].") for k, v in enumerate(value))
        values[name] = value
    for owner, when, needed in NEEDS:
        if owner is cls and when(raw) and not isinstance(raw.get(needed), int):
            raise TraceError(f"field {prefix + needed!r} must be an integer here, got {_name(raw.get(needed))}")
    return cls(**values)


@functools.cache
def _plan(cls) -> dict[str, tuple[bool, Check, type | None, type | None]]:
    """Per field of dataclass ``cls``: (required, its check, the dataclass a tuple or list of it
    holds and that container, or None, None)."""
    plan = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        hint = _hints(cls)[f.name]
        check = _check(hint, False)
        extra = _extra(cls, f.name)
        if extra is not None:
            check = _both(check, extra)
        origin = typing.get_origin(_optional(hint))
        item = typing.get_args(_optional(hint))[0] if origin in (list, tuple) else None
        item = item if item is not None and dataclasses.is_dataclass(item) else None
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        plan[f.name] = (required, check, item, origin if item is not None else None)
    return plan


def _extra(cls, name: str) -> Check | None:
    """The field's constraint beyond its type (:data:`CHOICES`, :data:`BOUNDS`, :data:`FORMS`), or None."""
    if (cls, name) in CHOICES:
        choices = CHOICES[(cls, name)]
        return lambda v: None if v in choices else f"must be one of {', '.join(choices)}, got {str(v)[:40]!r}"
    if (cls, name) in BOUNDS:
        top = BOUNDS[(cls, name)]
        return lambda v: None if v is None or v <= top else f"must be at most {top}, got {v}"
    if (cls, name) in FORMS:
        form, words = FORMS[(cls, name)]
        return lambda v: None if v is None or form.fullmatch(v) else f"must be {words}, got {str(v)[:40]!r}"
    return None


def _both(first: Check, then: Check) -> Check:
    return lambda v: first(v) or then(v)


def _optional(hint):
    """``X`` of ``X | None`` (the schema's only unions); other types as they are."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (hint,) = (a for a in typing.get_args(hint) if a is not type(None))
    return hint


@functools.cache
def _check(hint, signed: bool) -> Check:
    """The check of a value against type ``hint`` (a dataclass field's); ``signed``: an integer
    may be negative (a run's statistics and settings; an event's counts, positions and ids may not)."""
    if _optional(hint) is not hint:
        inner = _check(_optional(hint), signed)
        return lambda v: None if v is None else inner(v)
    origin = typing.get_origin(hint)
    if origin in (list, tuple) or hint is list:
        item = _check(typing.get_args(hint)[0], signed) if origin else None

        def check_list(v):
            if not isinstance(v, list):
                return f"must be a list, got {_name(v)}"
            if len(v) > MAX_ITEMS:
                return f"holds {len(v)} items: at most {MAX_ITEMS}"
            for k, x in enumerate(v if item else ()):
                why = item(x)
                if why:
                    return f"item {k} {why}"
            return None
        return check_list
    if dataclasses.is_dataclass(hint):  # its fields: _build
        return lambda v: None if isinstance(v, dict) else f"must be an object, got {_name(v)}"
    if hint in (int, float):
        kinds = (int,) if hint is int else (int, float)

        def check_number(v):
            if isinstance(v, bool) or not isinstance(v, kinds):
                return f"must be {_NUMBER_WORDS[hint]}, got {_name(v)}"
            if not (math.isfinite(v) and abs(v) <= MAX_NUMBER):
                return f"must be a finite number of magnitude at most {MAX_NUMBER:g}, got {str(v)[:40]}"
            return f"must not be negative, got {v}" if hint is int and v < 0 and not signed else None
        return check_number
    if hint is str:
        return lambda v: (f"must be a string, got {_name(v)}" if not isinstance(v, str) else
                          f"is {len(v)} characters long: at most {MAX_TEXT}" if len(v) > MAX_TEXT else None)
    if hint is bool:  # the run log stores 0 / 1
        return lambda v: None if v in (True, False) and not isinstance(v, float) else \
            f"must be true or false, got {_name(v)}"
    if hint is type(None):
        return lambda v: None if v is None else f"must be null, got {_name(v)}"
    raise TypeError(f"the trace schema has no check for {hint!r}")  # a new field type: teach _check it


def _settings(value) -> str | None:
    """Why ``value`` is not an object of single values (a run's settings), or None."""
    if not isinstance(value, dict):
        return f"must be an object of settings, got {_name(value)}"
    for key, v in value.items():
        why = _check(type(v), True)(v) if isinstance(v, SCALARS) else f"must be a single value, got {_name(v)}"
        if why:
            return f"(setting {key[:40]!r}) {why}"
    return None


@functools.cache
def _hints(cls) -> dict:
    """A dataclass's field types, resolved once (its annotations are strings)."""
    return typing.get_type_hints(cls)


def _name(value) -> str:
    """A JSON value's type in the trace's words: str, int, float, bool, list, dict, null."""
    return "null" if value is None else type(value).__name__
