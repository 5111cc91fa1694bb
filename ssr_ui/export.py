"""Exporters and the importer: a run as JSON (config, stats, full trace), as a self-contained
HTML page of the coloured trace, the runs table as CSV; and a JSON trace read back for viewing.

All are plain functions over a run-log row and its events, so the CLI, the UI and the tests use
the same code.
"""

from __future__ import annotations

import csv
import dataclasses
import html
import io
import json

from engine.events import ForwardEvent, PhaseEvent, RunStats, StepEvent, TokenEvent
from ssr_ui.render import LEGEND, TraceView, metrics_html
from ssr_ui.timeline import TIMELINE_JS, stats_html, timeline_html

FORMAT = "ssr-studio-trace/1"
MAX_TRACE_BYTES = 20 * 2**20  # the largest upload (a trace to import) the studio accepts
_KINDS = {"phase": lambda raw: PhaseEvent(**raw), "token": lambda raw: TokenEvent(**raw),
          "step": lambda raw: StepEvent(**raw), "forward": ForwardEvent.from_dict}


def run_to_json(row: dict, events: list) -> str:
    """The run's row (config parsed) and every event, as one JSON document."""
    run = dict(row)
    run["config"] = json.loads(run["config"]) if isinstance(run.get("config"), str) else run.get("config")
    return json.dumps({"format": FORMAT, "run": run, "events": [dataclasses.asdict(e) for e in events]},
                      indent=1, ensure_ascii=False)


def run_from_json(text: str) -> tuple[dict, list]:
    """Read a trace written by :func:`run_to_json`; ValueError says what is wrong with it."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not a JSON file ({err.msg} at line {err.lineno})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not an SSR Studio trace (expected \"format\": \"{FORMAT}\")")
    events = []
    for i, raw in enumerate(doc.get("events", [])):
        cls = _KINDS.get(raw.get("kind")) if isinstance(raw, dict) else None
        if cls is None:
            raise ValueError(f"event {i} has an unknown kind")
        try:
            events.append(cls(raw))
        except (TypeError, KeyError) as err:
            raise ValueError(f"event {i} is malformed: {err}") from None
    return doc.get("run", {}), events


FACTS = {"method": "method", "model": "model", "draft_model": "draft model", "prm": "process reward model",
         "dtype": "precision", "device": "device", "status": "status", "error": "error", "created_at": "when (UTC)"}
PHASE_OF_STATUS = {"ok": "done", "cancelled": "stopped"}


def logged_view(row: dict, events: list) -> TraceView:
    """A logged or imported run folded as the live view folded it: its panes (the end-of-thinking
    badge included), its logged statistics and a phase from its status. How the model reasoned is
    told from the log, which keeps the marker's text but not its kind: "prompted" when the closing
    marker was written over several tokens (a marker token is one), "none" when the run had no
    marker and no reasoning token (a base model); else not said."""
    view = TraceView(method=str(row.get("method") or ""), think_end=row.get("think_end"))
    for ev in events:
        view.apply(ev)
    if view.marker_tokens() > 1:
        view.thinking = "prompted"
    elif not view.think_end and not view.reasoning and view.answer:
        view.thinking = "none"
    view.stats = RunStats(**{k: row[k] for k in RunStats.field_names() if row.get(k) is not None})
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
        drafts = "".join(f"<h3>Draft {d}</h3>{view.draft_html(d)}" for d in sorted(view.drafts)) or view.draft_html()
    facts = "".join(f"<tr><th>{label}</th><td>{html.escape(_fact(row.get(k)))}</td></tr>"
                    for k, label in FACTS.items() if row.get(k) is not None)
    config = row.get("config")
    config = json.loads(config) if isinstance(config, str) else config or {}
    settings = " · ".join(f"{html.escape(str(k))} {html.escape(_fact(v))}" for k, v in sorted(config.items()))
    strip = metrics if metrics is not None else metrics_html(view, str(row.get("method") or "?"))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>SSR Studio trace #{html.escape(str(row.get("id", "")))}</title>
<style>body{{font-family:system-ui,sans-serif;margin:24px;max-width:1400px}}
.grid{{display:grid;grid-template-columns:1fr 1fr 1fr;gap:16px}} th{{text-align:left;padding-right:12px}}
{css}</style></head><body>
<h1>SSR Studio trace</h1>
<p><b>Prompt:</b> {html.escape(str(row.get("prompt", "")))}</p>
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


def runs_to_csv(rows: list[dict]) -> str:
    """The runs table as CSV, every column, one line per run."""
    if not rows:
        return ""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
