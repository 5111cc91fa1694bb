"""Which logged runs a run is compared with: the one rule behind every "vs baseline" ratio, every
"same answer" verdict and every chart median (docs/STUDIO.md, "How every ratio and verdict is
computed").

A run is judged only when it finished (status ``ok``: a cancelled or errored run gets no ratio
and no verdict), and only against baseline runs that finished too and share its :func:`match_key`:
everything that changes the output or the speed.

>>> run = {"method": "ssr", "status": "ok", "prompt_hash": "ab", "model": "m", "config": {"temperature": 0}}
>>> [b["id"] for b in matching_baselines(run, rows)]  # rows: runs-table rows
[12, 9]

Noise: a run is *flagged slow* (:func:`slow_runs`) when its seconds per forward are more than
``SLOW_FACTOR`` times the median of the finished runs of its kind (same model, method, precision,
device, step mode and exact mode; at least ``MIN_KIND`` of them; runs in process only: a server's
run counts requests, not forwards): the model did the same work per forward as its peers, so the
extra time came from outside the run (a busy machine, a first run
in a fresh process). Pooled baselines (:func:`pool`) leave flagged runs out and take only runs
within ``POOL_WINDOW_S`` of the run judged; every pooled ratio says how many runs it pools, their
spread and their age.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone

from engine.steps import StepMode

SLOW_FACTOR = 2.0  # a run is flagged slow past this many times its kind's median seconds per forward
MIN_KIND = 3  # finished runs of one kind before any of them can be flagged (fewer: nothing to judge by)
POOL_WINDOW_S = 1800.0  # pooled baselines lie within this many seconds of the run judged (no stale mixes)


def finished(run: Mapping) -> bool:
    """Whether the run ended normally (only those are judged or judged against)."""
    return run.get("status") == "ok"


def match_key(run: Mapping) -> tuple:
    """What two runs must share to be compared: the prompt, model, precision, device (or server),
    both budgets, temperature and top-p, the seed when sampling (greedy runs ignore it), exact
    mode, thinking on or off (runs logged before the setting: on), and the step mode actually used
    ("compiled", "eager", "vllm <url>", or exact mode's route: "exact rows", "exact fixed 8x32 eager" /
    "... compiled", each exact only within itself; an eager run's reason for being eager does not change its speed). Exact runs logged before
    the routes (step mode "eager: exact mode ...") match no new exact run. ``run`` is a runs-table row (its
    ``config`` a dict or its JSON) or a dict of the same keys for a run not logged yet."""
    cfg = _config(run)
    sampled = (cfg.get("temperature") or 0) > 0
    steps = StepMode.of(run.get("step_mode")).head
    return (run.get("prompt_hash"), run.get("model"), run.get("dtype"), run.get("device"), cfg.get("max_think"),
            cfg.get("max_answer"), cfg.get("temperature"), cfg.get("top_p"), cfg.get("seed") if sampled else None,
            bool(cfg.get("exact")), steps, cfg.get("thinking", True))


def matching_baselines(run: Mapping, rows: Iterable[Mapping]) -> list[Mapping]:
    """The finished baseline runs among ``rows`` that ``run`` may be compared with (in ``rows``'
    order: newest first for ``RunLog.runs``); none at all when ``run`` itself did not finish."""
    if not finished(run):
        return []
    key = match_key(run)
    return [r for r in rows if r.get("method") == "baseline" and finished(r) and r.get("wall_s")
            and r.get("id") != run.get("id") and match_key(r) == key]


def matched_on(run: Mapping) -> str:
    """How the baselines of ``run`` match it, in words for the metrics strip."""
    sampled = (_config(run).get("temperature") or 0) > 0
    return "same model, settings, seed" if sampled else "same model, settings (greedy: any seed)"


def _config(run: Mapping) -> dict:
    config = run.get("config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError:
            return {}
    return config if isinstance(config, dict) else {}


def kind_key(run: Mapping) -> tuple:
    """The runs whose time per forward is comparable: same model, method, precision, device,
    step mode and exact mode (any prompt, any budget)."""
    return (run.get("model"), run.get("method"), run.get("dtype"), run.get("device"),
            str(run.get("step_mode") or "").split(":")[0], bool(_config(run).get("exact")))


def per_forward(run: Mapping) -> float | None:
    """A finished in-process run's wall seconds per forward (None without both, and for a run on a
    server: its ``forward_calls`` count requests, not forwards, so the figure says nothing there)."""
    wall, forwards = run.get("wall_s"), run.get("forward_calls")
    if str(run.get("device") or "").startswith(("http://", "https://")):
        return None
    return wall / forwards if finished(run) and wall and forwards else None


def slow_runs(rows: Iterable[Mapping]) -> dict[int, str]:
    """The runs among ``rows`` flagged slow, by id, each with why in words (the module's rule)."""
    kinds: dict[tuple, list[tuple[int, float]]] = {}
    for r in rows:
        x = per_forward(r)
        if x is not None and r.get("id") is not None:
            kinds.setdefault(kind_key(r), []).append((r["id"], x))
    flagged = {}
    for (model, method, *_), runs in kinds.items():
        if len(runs) < MIN_KIND:
            continue
        median = statistics.median(x for _, x in runs)
        for rid, x in runs:
            if x > SLOW_FACTOR * median:
                flagged[rid] = (f"slow: {x / median:.1f}x the median time per forward of {len(runs)} {method} runs "
                                f"of {model} ({x * 1000:.1f} ms against {median * 1000:.1f} ms: a busy machine or a "
                                "cold start)")
    return flagged


def run_time(run: Mapping) -> datetime | None:
    """When a logged run was made, in UTC (None for a run not logged yet, or an unreadable time)."""
    try:
        when = datetime.fromisoformat(str(run.get("created_at")))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def pool(baselines: list[Mapping], slow: Mapping[int, str], at: datetime | None = None) -> tuple[list[Mapping], dict]:
    """The baselines a pooled ratio may use, from ``baselines`` (matching ones, newest first) for a
    run made at ``at`` (default: now): the flagged slow ones left out, then those within
    ``POOL_WINDOW_S`` of the run (when none is, the newest steady one alone: one run mixes
    nothing, and its age is said); and what the pool is, for the strip: ``n``, ``spread`` (min,
    max seconds), ``ages`` (newest, oldest, in seconds before ``at``), ``left_slow`` and
    ``left_old`` (runs left out, and why)."""
    at = at or datetime.now(timezone.utc)
    steady = [b for b in baselines if b.get("id") not in slow]
    near = [b for b in steady if run_time(b) is not None and abs((at - run_time(b)).total_seconds()) <= POOL_WINDOW_S]
    kept = near or steady[:1]
    walls = [b["wall_s"] for b in kept]
    times = [run_time(b) for b in (kept[:1] + kept[-1:])] if kept else []
    ages = tuple((at - w).total_seconds() for w in times) if times and None not in times else None
    return kept, {"n": len(kept), "spread": (min(walls), max(walls)) if walls else None, "ages": ages,
                  "left_slow": len(baselines) - len(steady), "left_old": len(steady) - len(kept)}
