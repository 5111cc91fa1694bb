"""Traces for the import's safety tests: two clean ones that set every field the trace schema has
(an SSR run with drafts, forwards, an early exit and a server's speculation; an RSD run with
steps), the same with an attacker's markup appended to every text, and what a page built from
them may hold (its tags and attributes) for comparison with a clean page's."""

from __future__ import annotations

import dataclasses
import json
import typing
from html.parser import HTMLParser

from engine.events import ForwardEvent, PhaseEvent, RowWork, RunStats, StepEvent, TokenEvent
from engine.runlog.store import RunMeta
from ssr_ui.export import run_to_json
from ssr_ui.trace_schema import BOUNDS, CHOICES, EVENTS, FORMAT, FORMS, NEEDS, ROW_FIELDS

TITLE = "clean page"
# each part breaks out of a different place: an element's text, a double- or single-quoted attribute, a script;
# each sets the same flag, and the title, and asks for a dialog
RUN = "window.__pwned=1;document.title='pwned';alert(1)"
PAYLOAD = (f"\"'><img src=x onerror=\"{RUN}\" data-attacker=1></script><script>{RUN}</script>"
           f"<iframe srcdoc=\"<script>{RUN}</script>\"></iframe>' onmouseover='{RUN}'")
FIXED = {"kind", "stream", "status", "format", "row"}  # texts a trace must hold as they are (choices, forms)


def _stats(**given) -> dict:
    """Every RunStats field set: texts named after their field, counts 2, measures 0.5."""
    filler = {"str": lambda name: name, "int": lambda name: 2, "float": lambda name: 0.5}
    out = {}
    for name, (owner, attr) in RunStats.columns().items():  # the run log's columns (a part's under its prefix)
        hint = typing.get_type_hints(owner)[attr]
        kind = next(t.__name__ for t in (str, float, int) if t in (hint, *typing.get_args(hint)))
        out[name] = filler[kind](name)
    return {**out, **given}


def _row(method: str, **stats) -> dict:
    return {"id": 7, "created_at": "2026-01-01 00:00:00", "model": "tiny-reasoner", "draft_model": "tiny-draft",
            "prm": "tiny-prm", "prompt": "What is 2 + 3?", "prompt_id": "p1", "reference": "5", "correct": 1,
            "origin": "app", "device": "cpu", "dtype": "float32", "think_end": "</think>", "dataset": "arith",
            "visitor": "v1", "status": "ok", "error": "none", "answer_text": "5",
            "config": {"max_think": 40, "temperature": 0.0, "drafting": "always", "exact": False, "note": None},
            **_stats(method=method, **stats)}


def clean_ssr() -> tuple[dict, list]:
    """An SSR run: compiling, a draft forked and agreeing, lookups and a draft prefix winning, an early exit."""
    tok = TokenEvent
    events = [
        PhaseEvent("compiling", 0.0, done=1, total=2), PhaseEvent("prefill", 0.01),
        ForwardEvent(0, "prefill", 0.01, 0.02, (RowWork("main", 5, kept=1),)), PhaseEvent("reasoning", 0.02),
        tok("reasoning", "generated", 11, "Think", 0, 0.02),
        ForwardEvent(1, "reasoning", 0.02, 0.03, (RowWork("main", 1, kept=1),)),
        tok("reasoning", "generated", 12, " more", 1, 0.03), PhaseEvent("drafting", 0.03, draft=0, at_token=2),
        ForwardEvent(2, "reasoning", 0.03, 0.04, (RowWork("main", 1, kept=1), RowWork("draft 0", 3, kept=2))),
        tok("reasoning", "generated", 4, "</think>", 2, 0.04), tok("draft", "generated", 20, "five", 0, 0.04, draft=0),
        tok("draft", "generated", 21, " six", 1, 0.04, draft=0), PhaseEvent("exit", 0.045, draft=0, at_token=2),
        PhaseEvent("answer", 0.05),
        ForwardEvent(3, "answer", 0.05, 0.06, (RowWork("main", 3, kept=2, forced=1, proposed=2, accepted=1,
                                                        proposer="draft prefix", note="a verify"),)),
        tok("answer", "accepted", 20, "five", 0, 0.06, draft=0, source="draft"),
        tok("answer", "recovered", 22, " is", 1, 0.06, source="prompt", match_len=2),
        tok("answer", "generated", 23, " it", 2, 0.06),
        tok("draft", "accepted", 20, "five", 0, 0.06, draft=0, source="draft"),
        tok("draft", "rejected", 21, " six", 1, 0.06, draft=0),
    ]
    return _row("ssr", cut="reasoning", exit_drafts="0", exit_at=2), events


def clean_rsd() -> tuple[dict, list]:
    """An RSD run: a draft step kept, one rejected and rewritten by the target, the PRM's verdicts."""
    tok = TokenEvent
    events = [
        PhaseEvent("prefill", 0.0), ForwardEvent(0, "prefill", 0.0, 0.01, (RowWork("target", 5),)),
        PhaseEvent("reasoning", 0.01),
        ForwardEvent(1, "reasoning", 0.01, 0.02, (RowWork("draft", 2, kept=2),)),
        tok("reasoning", "generated", 11, "Add", 0, 0.02), tok("reasoning", "generated", 12, " them", 1, 0.02),
        ForwardEvent(2, "reasoning", 0.02, 0.03, (RowWork("prm", 7, note="reward 0.91 · kept"),)),
        StepEvent(0, "Add them", "draft", 0.91, True, 0.03, confidence=0.4),
        tok("draft", "generated", 13, "Guess", 0, 0.03, draft=1),
        ForwardEvent(3, "reasoning", 0.03, 0.04, (RowWork("prm", 3, note="reward 0.10 · rejected"),)),
        StepEvent(1, "Guess", "draft", 0.1, False, 0.04, confidence=0.2),
        ForwardEvent(4, "reasoning", 0.04, 0.05, (RowWork("target", 2, kept=2),)),
        tok("reasoning", "generated", 14, " 5", 2, 0.05), tok("reasoning", "generated", 4, "</think>", 3, 0.05),
        StepEvent(1, " 5", "target", None, True, 0.05),
        PhaseEvent("answer", 0.05), ForwardEvent(5, "answer", 0.05, 0.06, (RowWork("target", 1, kept=1),)),
        tok("answer", "generated", 15, "5", 0, 0.06),
    ]
    return _row("rsd"), events


CLEAN = {"ssr": clean_ssr, "rsd": clean_rsd}


def doc_of(row: dict, events: list) -> dict:
    """The trace as its JSON document (what a file holds)."""
    return json.loads(run_to_json(row, events))


def crafted(doc, key: str | None = None):
    """``doc`` with :data:`PAYLOAD` appended to every text but the fixed ones (:data:`FIXED`)."""
    if isinstance(doc, dict):
        return {k: crafted(v, k) for k, v in doc.items()}
    if isinstance(doc, list):
        return [crafted(v, key) for v in doc]
    return doc + PAYLOAD if isinstance(doc, str) and key not in FIXED else doc


def text_fields() -> set[tuple[str, str]]:
    """(owner, field) for every text field the schema has: each event class's (RowWork's too) and
    the run row's ("run": RunStats's and RunMeta's), the fields with a fixed set of values left out."""
    def texts(cls) -> set[str]:
        hints = typing.get_type_hints(cls)
        return {f.name for f in dataclasses.fields(cls) if str in (hints[f.name], *typing.get_args(hints[f.name]))
                and (cls, f.name) not in {**CHOICES, **FORMS} and f.name != "kind"}

    stats = {("run", name) for name, (owner, attr) in RunStats.columns().items()
             if str in (hint := typing.get_type_hints(owner)[attr], *typing.get_args(hint))}
    return ({(cls.__name__, name) for cls in (*EVENTS.values(), RowWork) for name in texts(cls)}
            | {("run", name) for name in texts(RunMeta) if name in ROW_FIELDS} | stats)


def texts_set(docs: list[dict]) -> set[tuple[str, str]]:
    """(owner, field) of every non-empty text the documents hold (an event's owner: its class's name)."""
    names = {kind: cls.__name__ for kind, cls in EVENTS.items()}
    found = {("run", k) for d in docs for k, v in d["run"].items() if isinstance(v, str) and v}
    for d in docs:
        for ev in d["events"]:
            found |= {(names[ev["kind"]], k) for k, v in ev.items() if isinstance(v, str) and v}
            found |= {("RowWork", k) for r in ev.get("rows", []) for k, v in r.items() if isinstance(v, str) and v}
    return found


class Elements(HTMLParser):
    """The (tag, attribute) pairs of a page, and its tags in order."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.pairs: set[tuple[str, str]] = set()
        self.tags: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.pairs |= {(tag, name) for name, _ in attrs} | {(tag, "")}


def random_trace(rng, n_events: int = 30) -> dict:
    """A trace of random values that fit the schema's types, choices and forms (drawn from the
    dataclasses' own field types, so a field added later is drawn too): what validation lets
    through, for the renderer to show without raising."""
    ints = [0, 1, 2, 3, 7, 2**31, 2**53]
    floats = [0.0, 1e-9, 0.5, 3.0, 1e12, 1e30, -1e30, -0.5]
    texts = ["", " ", "x", "draft", "draft prefix", "lookup in prompt", "prompt", "answer", "</think>", "ok",
             "reasoning", "drafting", "exit", "compiling", "compiled", "one token per step: y", "0,1", "reasoning, answer",
             "kept", PAYLOAD]

    def value(cls, name, hint):
        if (cls, name) in CHOICES:
            return rng.choice(CHOICES[(cls, name)])
        if (cls, name) in BOUNDS:
            return rng.choice([i for i in ints if i <= BOUNDS[(cls, name)]])
        if (cls, name) in FORMS:
            return rng.choice(["main", "draft", "prm", "target", "draft 0", "draft 1", "draft 12"])
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if args and len(typing.get_args(hint)) > len(args) and rng.random() < 0.3:
            return None
        hint = args[0] if args and typing.get_origin(hint) not in (list, tuple) else hint
        origin = typing.get_origin(hint)
        if origin in (list, tuple):
            item = typing.get_args(hint)[0]
            return [value(cls, name, item) if not dataclasses.is_dataclass(item) else obj(item)
                    for _ in range(rng.randint(0, 3))]
        if hint is bool:
            return rng.random() < 0.5
        if hint is int:
            return rng.choice(ints)
        if hint is float:
            return rng.choice(floats + ints[:5])
        return rng.choice(texts)

    def obj(cls):
        hints = typing.get_type_hints(cls)
        out = {f.name: value(cls, f.name, hints[f.name]) for f in dataclasses.fields(cls) if f.name != "kind"}
        for owner, when, needed in NEEDS:
            if owner is cls and when(out) and not isinstance(out.get(needed), int):
                out[needed] = rng.choice(ints[:4])
        kind = [f.default for f in dataclasses.fields(cls) if f.name == "kind"]  # an event's (RowWork has none)
        return {**out, **({"kind": kind[0]} if kind else {})}

    stats = {name: value(RunStats, name, typing.get_type_hints(owner)[attr])  # the log's columns, a record's too
             for name, (owner, attr) in RunStats.columns().items()}
    meta = {name: value(RunMeta, name, hint) for name, hint in typing.get_type_hints(RunMeta).items()
            if name in ROW_FIELDS and name != "config"}
    row = {**stats, **meta, "id": rng.choice(ints), "status": rng.choice(["ok", "cancelled", "error", PAYLOAD]),
           "config": {"max_think": rng.choice(ints), "note": rng.choice(texts)}}
    kinds = list(EVENTS.values())
    return {"format": FORMAT, "run": row, "events": [obj(rng.choice(kinds)) for _ in range(n_events)]}
