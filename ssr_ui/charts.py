"""Plotly chart builders: plain functions from numbers (or run-log rows) to figures."""

from __future__ import annotations

import plotly.graph_objects as go

COLORS = {"baseline": "#6b7280", "ssr": "#2563eb", "Baseline": "#6b7280", "SSR": "#2563eb",
          "accepted": "#16a34a", "recovered": "#d97706", "generated": "#9ca3af"}


def latency_bars(latencies: dict[str, float | None]) -> go.Figure:
    """Compare mode: one bar per method, seconds."""
    names = [k for k, v in latencies.items() if v is not None]
    fig = go.Figure(go.Bar(x=names, y=[latencies[n] for n in names], marker_color=[COLORS.get(n, "#888") for n in names],
                           text=[f"{latencies[n]:.2f} s" for n in names], textposition="auto"))
    fig.update_layout(title="Latency on this prompt", yaxis_title="seconds", height=300, margin=dict(t=40, b=30))
    return fig


def latency_by_method(rows: list[dict]) -> go.Figure:
    """History: the distribution of latency per method over logged runs."""
    fig = go.Figure()
    for method in sorted({r["method"] for r in rows}):
        ys = [r["wall_s"] for r in rows if r["method"] == method and r["status"] == "ok" and r["wall_s"]]
        fig.add_trace(go.Box(y=ys, name=method, marker_color=COLORS.get(method, "#888"), boxpoints="all"))
    fig.update_layout(title="Latency by method", yaxis_title="seconds", height=320, margin=dict(t=40, b=30))
    return fig


def token_composition(rows: list[dict]) -> go.Figure:
    """History: answer tokens per run split into accepted / recovered / generated."""
    rows = [r for r in rows if r["status"] == "ok"][:40][::-1]
    labels = [f"#{r['id']} {r['method']}" for r in rows]
    fig = go.Figure([go.Bar(name=k, x=labels, y=[r[k] or 0 for r in rows], marker_color=COLORS[k])
                     for k in ("accepted", "recovered", "generated")])
    fig.update_layout(barmode="stack", title="Answer tokens by origin", height=320, margin=dict(t=40, b=30))
    return fig


def speedup_vs_draft_start(rows: list[dict]) -> go.Figure:
    """History: SSR latency ratio to the latest earlier baseline of the same prompt and model."""
    import json  # noqa: PLC0415

    ok = [r for r in rows if r["status"] == "ok" and r["wall_s"]]
    xs, ys, text = [], [], []
    for r in ok:
        if r["method"] != "ssr":
            continue
        base = [b for b in ok if b["method"] == "baseline" and b["prompt_hash"] == r["prompt_hash"]
                and b["model"] == r["model"]]
        if base:
            xs.append(json.loads(r["config"]).get("draft_start"))
            ys.append(r["wall_s"] / base[0]["wall_s"])
            text.append(f"run #{r['id']}")
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="markers", text=text, marker=dict(color=COLORS["ssr"], size=9)))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#6b7280")
    fig.update_layout(title="SSR latency / baseline vs draft start", xaxis_title="draft start (reasoning tokens)",
                      yaxis_title="latency ratio", height=320, margin=dict(t=40, b=30))
    return fig


def sweep_chart(points: list[dict]) -> go.Figure:
    """Draft-start sweep: latency ratio to baseline (left axis) and answer tokens taken from the
    drafts (right axis) against the draft start."""
    xs = [p["draft_start"] for p in points]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=[p["ratio"] for p in points], name="latency / baseline", mode="lines+markers",
                             marker_color=COLORS["ssr"]))
    fig.add_trace(go.Bar(x=xs, y=[p["accepted"] for p in points], name="accepted", marker_color=COLORS["accepted"],
                         opacity=0.5, yaxis="y2"))
    fig.add_trace(go.Bar(x=xs, y=[p["recovered"] for p in points], name="recovered", marker_color=COLORS["recovered"],
                         opacity=0.5, yaxis="y2"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#6b7280")
    fig.update_layout(title="Draft-start sweep", xaxis_title="draft start (reasoning tokens)", barmode="stack",
                      yaxis=dict(title="latency ratio to baseline"),
                      yaxis2=dict(title="answer tokens from drafts", overlaying="y", side="right"),
                      height=360, margin=dict(t=40, b=30))
    return fig


def rsd_by_threshold(rows: list[dict]) -> go.Figure:
    """History: RSD runs grouped by threshold: mean accuracy (runs with a reference, e.g. from the
    bench with --db) and mean FLOPs."""
    import json  # noqa: PLC0415

    groups: dict[float, list[dict]] = {}
    for r in rows:
        if r["method"] == "rsd" and r["status"] == "ok":
            groups.setdefault(json.loads(r["config"]).get("threshold"), []).append(r)
    xs = sorted(t for t in groups if t is not None)
    acc = [_mean([g["correct"] for g in groups[t] if g["correct"] is not None]) for t in xs]
    flops = [_mean([g["flops"] for g in groups[t]]) for t in xs]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=acc, name="accuracy", mode="lines+markers", marker_color=COLORS["accepted"]))
    fig.add_trace(go.Scatter(x=xs, y=flops, name="FLOPs", mode="lines+markers", yaxis="y2", marker_color="#6b7280"))
    fig.update_layout(title="RSD accuracy and FLOPs vs threshold", xaxis_title="threshold",
                      yaxis=dict(title="accuracy", range=[0, 1.05]),
                      yaxis2=dict(title="FLOPs", overlaying="y", side="right"), height=320, margin=dict(t=40, b=30))
    return fig


def _mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs else None
