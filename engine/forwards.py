"""A run's forwards summed up: acceptance statistics and where the time went.

Pure functions over :class:`~engine.events.ForwardEvent` s, so that the recorder (a run's final
``RunStats``), the studio (a run streaming, or replayed from the log) and the History tab read them
one way.

* :func:`acceptance`: per proposer, a histogram of accepted length per verify, and the acceptance
  rate by position in the proposal (of the verifies that proposed a k-th token, how many accepted
  it: a verify accepts a prefix, so position k is accepted iff at least k tokens were).
* :func:`time_split`: prefill, reasoning, the drafts' cost beyond a lone reasoning step
  (``drafting``: each forward that carried drafts, less the median lone reasoning forward), answer,
  and bookkeeping (the run's wall time outside any forward).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable

from engine.events import ForwardEvent, RunStats


def acceptance(forwards: Iterable[ForwardEvent]) -> dict[str, dict[str, list[int]]]:
    """``{proposer: {"hist": [verifies accepting 0, 1, ...], "reached": [verifies proposing a
    1st, 2nd, ... token], "taken": [of those, accepted]}}``, over every row's verifies."""
    out: dict[str, dict[str, list[int]]] = {}
    for fw in forwards:
        for r in fw.rows:
            if r.proposed <= 0:
                continue
            a = out.setdefault(r.proposer or "lookup", {"hist": [], "reached": [], "taken": []})
            _bump(a["hist"], r.accepted)
            for k in range(r.proposed):
                _bump(a["reached"], k)
                if k < r.accepted:
                    _bump(a["taken"], k)
    for a in out.values():
        a["taken"] += [0] * (len(a["reached"]) - len(a["taken"]))
    return out


def merge(parts: Iterable[dict[str, dict[str, list[int]]]]) -> dict[str, dict[str, list[int]]]:
    """Several runs' :func:`acceptance` summed, proposer by proposer (History's aggregates)."""
    out: dict[str, dict[str, list[int]]] = {}
    for part in parts:
        for who, a in part.items():
            mine = out.setdefault(who, {"hist": [], "reached": [], "taken": []})
            for key in ("hist", "reached", "taken"):
                for i, n in enumerate(a.get(key, [])):
                    _bump(mine[key], i, n)
    return out


def lone_step_s(forwards: Iterable[ForwardEvent]) -> float | None:
    """The median wall time of a reasoning forward of the main row alone (None: there was none)."""
    alone = [f.wall_s for f in forwards if f.phase == "reasoning" and len(f.rows) == 1]
    return statistics.median(alone) if alone else None


def time_split(forwards: list[ForwardEvent], wall_s: float) -> dict[str, float]:
    """Seconds by part of the run; they add up to ``wall_s`` (bookkeeping takes the rest, which a
    run's own clock reading may leave slightly negative: clamped at 0)."""
    alone = lone_step_s(forwards)
    split = {"prefill": 0.0, "reasoning": 0.0, "drafting": 0.0, "answer": 0.0}
    for f in forwards:
        if f.phase == "reasoning" and len(f.rows) > 1 and alone is not None:
            extra = max(0.0, f.wall_s - alone)
            split["drafting"] += extra
            split["reasoning"] += f.wall_s - extra
        else:
            split[f.phase if f.phase in split else "reasoning"] += f.wall_s
    split["bookkeeping"] = max(0.0, wall_s - sum(split.values()))
    return split


def summarise(stats: RunStats, forwards: list[ForwardEvent]) -> None:
    """Fill ``stats``' forward fields (``forward_s``, ``drafting_s``, the verify counts,
    ``acceptance``) from the run's forwards."""
    stats.forward_s = sum(f.wall_s for f in forwards)
    stats.drafting_s = time_split(forwards, stats.wall_s)["drafting"]
    rows = [r for f in forwards for r in f.rows if r.proposed > 0]
    stats.verifies = len(rows)
    stats.verify_proposed = sum(r.proposed for r in rows)
    stats.verify_accepted = sum(r.accepted for r in rows)
    a = acceptance(forwards)
    stats.acceptance = json.dumps(a, sort_keys=True) if a else ""


def _bump(counts: list[int], i: int, n: int = 1) -> None:
    counts += [0] * (i + 1 - len(counts))
    counts[i] += n
