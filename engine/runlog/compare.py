"""Which logged runs a run is compared with: the one rule behind every "vs baseline" ratio, every
"same answer" verdict and every chart median (docs/STUDIO.md, "How every ratio and verdict is
computed").

A run is judged only when it finished (status ``ok``: a cancelled or errored run gets no ratio
and no verdict), and only against baseline runs that finished too and share its :func:`match_key`:
everything that changes the output or the speed.

>>> run = {"method": "ssr", "status": "ok", "prompt_hash": "ab", "model": "m", "config": {"temperature": 0}}
>>> [b["id"] for b in matching_baselines(run, rows)]  # rows: runs-table rows
[12, 9]
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping


def finished(run: Mapping) -> bool:
    """Whether the run ended normally (only those are judged or judged against)."""
    return run.get("status") == "ok"


def match_key(run: Mapping) -> tuple:
    """What two runs must share to be compared: the prompt, model, precision, device (or server),
    both budgets, temperature and top-p, the seed when sampling (greedy runs ignore it), exact
    mode, and the step mode actually used ("compiled", "eager", "vllm <url>", or exact mode's
    route: "exact rows", "exact fixed 8x32 eager" / "... compiled", each exact only within itself;
    an eager run's reason for being eager does not change its speed). Exact runs logged before
    the routes (step mode "eager: exact mode ...") match no new exact run. ``run`` is a runs-table row (its
    ``config`` a dict or its JSON) or a dict of the same keys for a run not logged yet."""
    cfg = _config(run)
    sampled = (cfg.get("temperature") or 0) > 0
    steps = str(run.get("step_mode") or "").split(":")[0]
    return (run.get("prompt_hash"), run.get("model"), run.get("dtype"), run.get("device"), cfg.get("max_think"),
            cfg.get("max_answer"), cfg.get("temperature"), cfg.get("top_p"), cfg.get("seed") if sampled else None,
            bool(cfg.get("exact")), steps)


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
