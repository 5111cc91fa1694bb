"""Exporters and the importer: a run as JSON (config, stats, full trace), as a self-contained
HTML page of the coloured trace, the runs table as CSV; and a JSON trace read back for viewing.

All are plain functions over a run-log row and its events, so the CLI, the UI and the tests use
the same code.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json

from engine.events import RunStats
from engine.registry import label_of
from ssr_ui.render import LEGEND, TraceView, esc, metrics_html
from ssr_ui.timeline import TIMELINE_JS, stats_html, timeline_html
from ssr_ui.trace_schema import FORMAT, parse_trace

MAX_TRACE_BYTES = 20 * 2**20  # the largest upload (a trace to import) the studio accepts


def run_to_json(row: dict, events: list) -> str:
    """The run's row (config parsed) and every event, as one JSON document."""
    run = dict(row)
    run["config"] = json.loads(run["config"]) if isinstance(run.get("config"), str) else run.get("config")
    return json.dumps({"format": FORMAT, "run": run, "events": [dataclasses.asdict(e) for e in events]},
                      indent=1, ensure_ascii=False)


def run_from_json(text: str) -> tuple[dict, list]:
    """Read a trace written by :func:`run_to_json`, every value validated against the trace's schema
    before any is rendered (``ssr_ui.trace_schema``); ValueError names the first bad field:
    "event 12 is malformed: forward field 'index' must be an integer, got str"."""
    if len(text) > MAX_TRACE_BYTES:
        raise ValueError(f"a trace is at most {MAX_TRACE_BYTES // 2**20} MB; this one is {len(text) / 2**20:.1f} MB")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not a JSON file ({err.msg} at line {err.lineno})") from None
    except RecursionError:
        raise ValueError("not a trace: its JSON nests deeper than any trace does") from None
    except ValueError as err:  # a number of thousands of digits, say
        raise ValueError(f"not a trace: {err}") from None
    return parse_trace(doc)


FACTS = {"method": "method", "model": "model", "draft_model": "draft model", "prm": "process reward model",
         "dtype": "precision", "device": "device", "status": "status", "error": "error", "created_at": "when (UTC)"}
PHASE_OF_STATUS = {"ok": "done", "cancelled": "stopped"}


def logged_view(row: dict, events: list) -> TraceView:
    """A logged or imported run folded as the live view folded it: its panes (the end-of-thinking
    badge included), its logged statistics and a phase from its status. How the model reasoned is
    told from the log, which keeps the marker's text but not its kind: "prompted" when the closing
    marker was written over several tokens (a marker token is one), "none" when the run had no
    marker and no reasoning token (a base model); else not said."""
    view = TraceView(method=str(row.get("method") or ""), think_end=row.get("think_end"),
                     dtypes=row.get("dtype"))  # the log keeps the target's precision (its numerics: the stats)
    for ev in events:
        view.apply(ev)
    if view.marker_tokens() > 1:
        view.thinking = "prompted"
    elif not view.think_end and not view.reasoning and view.answer:
        view.thinking = "none"
    view.stats = RunStats.from_dict({k: v for k, v in row.items() if v is not None})
    view.phase = PHASE_OF_STATUS.get(row.get("status"), str(row.get("status") or "imported"))
    return view


def run_to_html(row: dict, events: list, css: str, metrics: str | None = None) -> str:
    """A self-contained page: who ran it (every model named), the metrics strip as the studio shows
    it (``metrics``: the replay's, with its vs-baseline ratio; by default the strip without one),
    the settings, and the three panes coloured as in the studio."""
    view = logged_view(row, events)
    if view.steps:  # RSD: the rejected steps, each once
        drafts = view.draft_html()
    else:
        drafts = "".join(f"<h3>Draft {esc(d)}</h3>{view.draft_html(d)}" for d in sorted(view.drafts)) or view.draft_html()
    facts = "".join(f"<tr><th>{esc(label)}</th><td>{esc(_fact(row.get(k)))}</td></tr>"
                    for k, label in FACTS.items() if row.get(k) is not None)
    config = row.get("config")
    config = json.loads(config) if isinstance(config, str) else config or {}
    settings = " · ".join(f"{esc(str(k))} {esc(_fact(v))}" for k, v in sorted(config.items()))
    strip = metrics if metrics is not None else metrics_html(view, label_of(str(row.get("method") or "?")))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>SSR Studio trace #{esc(str(row.get("id", "")))}</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;max-width:1400px}}
.grid{{display:grid;grid-template-columns:1fr 1fr 1fr;gap:16px}} th{{text-align:left;padding-right:12px}}
{css}</style></head><body>
<h1>SSR Studio trace</h1>
<p><b>Prompt:</b> {esc(str(row.get("prompt", "")))}</p>
<table>{facts}<tr><th>settings</th><td>{settings}</td></tr></table>
{strip}
{LEGEND}
<div class="grid"><div><h2>Reasoning</h2>{view.reasoning_html()}</div>
<div><h2>Draft</h2>{drafts}</div><div><h2>Final answer</h2>{view.answer_html()}</div></div>
<h2>Timeline: where the time goes</h2>
<div id="timeline">{timeline_html(view, "time")}
<details><summary>by forward index</summary>{timeline_html(view, "forward")}</details>
{stats_html(view)}</div>
<script>(function (element) {{{TIMELINE_JS}}})(document.getElementById("timeline"));</script>
</body></html>
"""


def _fact(value) -> str:
    """A value for the settings table: floats to 4 significant digits, the rest as it is."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


# a text cell starting so is a formula to a spreadsheet (OWASP's CSV injection): it gets a leading "'"
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def runs_to_csv(rows: list[dict]) -> str:
    """The runs table as CSV, every column, one line per run; a text that a spreadsheet would run
    as a formula (it starts with one of :data:`FORMULA_STARTS`: a prompt "=1+1") is written with a
    leading ``'``, so that it shows as typed. Numbers, negative ones included, are written as they are."""
    if not rows:
        return ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows({k: "'" + v if isinstance(v, str) and v.startswith(FORMULA_STARTS) else v for k, v in r.items()}
                     for r in rows)
    return out.getvalue()
