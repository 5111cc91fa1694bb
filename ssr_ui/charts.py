"""Plotly chart builders: plain functions from numbers (or run-log rows) to figures.

Every chart uses one colour per method (:data:`COLORS`, the same in the Compare chart and in
History), puts its legend under the plot (never over the title or a second axis), formats large
numbers with SI prefixes and three significant digits, and says in a sentence when it has
nothing to show yet.
"""

from __future__ import annotations

import json
import statistics

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from engine.benchmarks.summary import iqr, wilson
from engine.events import LOOKUPS, parse_acceptance
from engine.forwards import merge
from engine.registry import methods as registered
from engine.runlog.compare import match_key, matching_baselines, pool, run_time

METHOD_COLORS = {m.name: m.color for m in registered()}  # each method's own (Method.color); COLORS adds its label
COLORS = {**METHOD_COLORS, **{m.label: m.color for m in registered()}, "accepted": "#16a34a", "recovered": "#d97706",
          "lookups": "#0284c7", "generated": "#9ca3af"}
# the legend goes at the figure's foot, under the x axis' title (never over it, the title or a second axis): placed
# on the container, not the plot (a paper fraction below the plot ran into the acceptance chart's slanted tick labels),
# it reserves its own margin on top of the axes' automargin; titles are short enough for a 700 px wide chart
LEGEND_BELOW = dict(orientation="h", yref="container", yanchor="bottom", y=0, xanchor="left", x=0)


def _layout(fig: go.Figure, title: str, height: int = 320, **kw) -> go.Figure:
    fig.update_layout(title=dict(text=title, x=0, xanchor="left", automargin=True), height=height,
                      **{"legend": LEGEND_BELOW, "margin": dict(t=44, b=90, l=56, r=64), **kw})
    # x tick labels sit 8 px below the axis (invisible ticks): a y axis' lowest label, centred on the axis line,
    # never runs into the first or last of them in a corner ("0.00" on the right axis over "0.80")
    fig.update_xaxes(automargin=True, ticks="outside", ticklen=8, tickcolor="rgba(0,0,0,0)")
    fig.update_yaxes(automargin=True)
    return fig


def _padded(fig: go.Figure, xs: list[float], least: float) -> None:
    """An x range with room beside the outer points, so that no tick label sits at the plot's
    corners (where a second y axis' lowest label would run into it) and no point on its edge."""
    low, high = min(xs), max(xs)
    pad = max(least, 0.08 * (high - low))
    fig.update_xaxes(range=[low - pad, high + pad])


def _empty(fig: go.Figure, sentence: str) -> go.Figure:
    """A figure with no data says why, instead of showing bare axes."""
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(plot_bgcolor="white")
    fig.add_annotation(text=sentence, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font=dict(size=13, color="#6b7280"))
    return fig


def latency_bars(latencies: dict[str, float | None], note: str = "") -> go.Figure:
    """Compare mode: one bar per method, seconds (``note``: e.g. that the comparison was stopped)."""
    names = [k for k, v in latencies.items() if v is not None]
    fig = go.Figure(go.Bar(x=names, y=[latencies[n] for n in names], marker_color=[COLORS.get(n, "#888") for n in names],
                           text=[f"{latencies[n]:.2f} s" for n in names], textposition="auto"))
    _layout(fig, "Latency on this prompt" + (f" ({note})" if note else ""), 300, yaxis_title="seconds", showlegend=False)
    return fig if names else _empty(fig, "No run finished.")


def latency_by_method(rows: list[dict]) -> go.Figure:
    """History: the distribution of latency per method over logged runs; runs of several models are
    split by model (one box per method and model: a 270M model's baseline never pools with a 135M's)."""
    fig = go.Figure()
    models = sorted({r.get("model") or "?" for r in rows})
    for method, model in sorted({(r["method"], r.get("model") or "?") for r in rows}, key=lambda mm: (mm[1], mm[0])):
        ys = [r["wall_s"] for r in rows if r["method"] == method and (r.get("model") or "?") == model
              and r["status"] == "ok" and r["wall_s"]]
        if ys:
            fig.add_trace(go.Box(y=ys, name=method if len(models) == 1 else f"{method} · {model}",
                                 marker_color=COLORS.get(method, "#888"), boxpoints="all"))
    _layout(fig, "Latency by method" + (f" and model ({len(models)} models)" if len(models) > 1 else ""),
            yaxis_title="seconds", showlegend=False)
    return fig if fig.data else _empty(fig, "No finished runs yet: run something on the Run tab.")


def accuracy_by_method(rows: list[dict]) -> go.Figure:
    """History and Benchmark: the share of graded runs answered right per method, with the Wilson
    95% interval as error bars and the count in the label (runs with no grade are left out)."""
    graded: dict[str, list[bool]] = {}
    for r in rows:
        if r.get("status", "ok") == "ok" and r.get("correct") is not None:
            graded.setdefault(r["method"], []).append(bool(r["correct"]))
    names = sorted(graded)
    acc = [sum(graded[n]) / len(graded[n]) for n in names]
    ci = [wilson(sum(graded[n]), len(graded[n])) for n in names]
    fig = go.Figure(go.Bar(x=names, y=acc, marker_color=[COLORS.get(n, "#888") for n in names],
                           error_y=dict(type="data", symmetric=False, array=[hi - a for a, (_, hi) in zip(acc, ci, strict=True)],
                                        arrayminus=[a - lo for a, (lo, _) in zip(acc, ci, strict=True)]),
                           text=[f"{a:.0%} of {len(graded[n])}" for a, n in zip(acc, names, strict=True)],
                           # at the bar's foot: the interval's whisker at its top never strikes the label through
                           textposition="inside", insidetextanchor="start"))
    _layout(fig, "Accuracy by method (95% interval)", yaxis_title="answered right", showlegend=False)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    return fig if names else _empty(fig, "No graded runs yet: a benchmark with references grades them.")


def token_composition(rows: list[dict]) -> go.Figure:
    """History: answer tokens per run by the proposer that won each (``engine.events.credit``), as the panes
    colour them: accepted (the draft prefix), recovered (a suffix in a draft), lookups (prompt, reasoning,
    answer) and generated, each token once. A run logged before schema 18 has no lookup counts: its
    "recovered" holds its lookups, as it was logged."""
    rows = [r for r in rows if r["status"] == "ok"][:40][::-1]
    # x: the run ids as numbers, so that plotly shows as many tick labels as fit (40 run labels at 760 px ran
    # into each other); each bar's hover names its run and method
    ids, names = [r["id"] for r in rows], [f"run #{r['id']} {r['method']}" for r in rows]
    looked = [sum(r.get(f"lookup_{src}") or 0 for src in LOOKUPS) for r in rows]
    fig = go.Figure([go.Bar(name=k, x=ids, y=looked if k == "lookups" else [r[k] or 0 for r in rows],
                            marker_color=COLORS[k], hovertext=names)
                     for k in ("accepted", "recovered", "lookups", "generated")])
    _layout(fig, "Answer tokens by origin (latest 40 runs)", barmode="stack", yaxis_title="tokens",
            xaxis_title="run id")
    fig.update_xaxes(tickformat="d")
    return fig if rows else _empty(fig, "No finished runs yet.")


def speedup_vs_draft_start(rows: list[dict]) -> go.Figure:
    """History: SSR latency ratio to the median of the logged baselines that match each run,
    pooled as the strip pools them (``engine.runlog.compare``: same prompt, model and settings,
    finished, within 30 minutes of the run; the caller leaves flagged runs out of ``rows``)."""
    import statistics

    xs, ys, text = [], [], []
    for r in rows:
        pooled = pool(matching_baselines(r, rows), {}, run_time(r))[0] if r["method"] == "ssr" else []
        if pooled:
            base = [b["wall_s"] for b in pooled]
            xs.append(json.loads(r["config"]).get("draft_start"))
            ys.append(r["wall_s"] / statistics.median(base))
            text.append(f"run #{r['id']} (vs median of {len(base)} matching baselines)")
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="markers", text=text, name="SSR",
                               marker=dict(color=COLORS["ssr"], size=9)))
    _layout(fig, "SSR latency / baseline vs draft start", xaxis_title="draft start (reasoning tokens)",
            yaxis_title="latency ratio", showlegend=False)
    if not xs:
        return _empty(fig, "Needs an SSR run and a Baseline run of the same prompt and settings (or use Compare).")
    fig.add_hline(y=1.0, line_dash="dot", line_color="#6b7280")
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
    _layout(fig, "Draft-start sweep", 360, xaxis_title="draft start (reasoning tokens)", barmode="stack",
            yaxis=dict(title="latency ratio to baseline", rangemode="tozero"),
            yaxis2=dict(title="answer tokens from drafts", overlaying="y", side="right"))
    if not points:
        return _empty(fig, "No draft start finished.")
    _padded(fig, xs, 10)  # one point: a readable axis around it, not one bar across the plot
    fig.update_xaxes(tickformat="d")
    fig.add_hline(y=1.0, line_dash="dot", line_color="#6b7280")
    return fig


def rsd_by_threshold(rows: list[dict]) -> go.Figure:
    """History: RSD runs grouped by threshold: mean accuracy (runs with a reference, e.g. from the
    bench with --db) and FLOPs, as a ratio to the target's (or plain decoding's, which is the
    target writing alone) on the same prompts where those were logged, else absolute; the
    target's accuracy on those prompts as a dotted line."""
    ok = [r for r in rows if r["status"] == "ok"]
    ref: dict[tuple, list[dict]] = {}  # the target's runs by match key (same prompt, model, settings)
    for r in ok:
        if r["method"] in ("target", "baseline") and r.get("flops"):
            ref.setdefault(match_key(r), []).append(r)
    groups: dict[float, list[dict]] = {}
    for r in ok:
        if r["method"] == "rsd":
            groups.setdefault(json.loads(r["config"]).get("threshold"), []).append(r)
    xs = sorted(t for t in groups if t is not None)
    acc = [_mean([g["correct"] for g in groups[t] if g["correct"] is not None]) for t in xs]
    ratios = [_mean([g["flops"] / _mean([b["flops"] for b in ref[match_key(g)]])
                     for g in groups[t] if match_key(g) in ref]) for t in xs]
    relative = all(r is not None for r in ratios) and bool(xs)
    flops = ratios if relative else [_mean([g["flops"] for g in groups[t]]) for t in xs]
    fig = go.Figure()
    if any(a is not None for a in acc):
        fig.add_trace(go.Scatter(x=xs, y=acc, name="RSD accuracy", mode="lines+markers", marker_color=COLORS["rsd"]))
        seen = {match_key(g) for t in xs for g in groups[t]}
        target_acc = _mean([b["correct"] for k in seen for b in ref.get(k, []) if b["correct"] is not None])
        if target_acc is not None:  # named in the legend, not by a label over the points
            fig.add_trace(go.Scatter(x=[min(xs), max(xs)] if xs else [], y=[target_acc] * (2 if xs else 0),
                                     mode="lines", name="target alone, same prompts",
                                     line=dict(color=COLORS["target"], dash="dot")))
    fig.add_trace(go.Scatter(x=xs, y=flops, name="RSD FLOPs / target" if relative else "RSD FLOPs per run",
                             mode="lines+markers", yaxis="y2", marker=dict(color="#6b7280", size=9),
                             line=dict(dash="dash")))
    _layout(fig, "RSD accuracy and FLOPs vs threshold", xaxis_title="threshold",
            yaxis=dict(title="accuracy", range=[0, 1.05], tickformat=".0%"),
            yaxis2=dict(title="FLOPs / target" if relative else "FLOPs", overlaying="y", side="right",
                        tickformat=".2f" if relative else ".3s", rangemode="tozero"))
    fig.update_xaxes(tickformat=".2f")
    if not xs:
        return _empty(fig, "No RSD runs yet.")
    _padded(fig, xs, 0.1)  # one point: a readable axis around it, not a hair-thin range
    if all(a is None for a in acc):  # said in the title, above the plot: never over a point
        fig.update_layout(title_text="RSD FLOPs vs threshold (accuracy needs runs with a reference answer)")
    return fig


def exit_by_k(rows: list[dict]) -> go.Figure:
    """History and Benchmark: ``ssr-exit`` runs grouped by (exit_k, draft_interval) from their
    config: accuracy (runs with a grade) with its Wilson 95% interval, one line per interval, a
    point per k; and mean reasoning tokens (right axis) relative to the baseline runs of the same
    prompts and model where every group has them, else absolute. Baseline's and SSR's accuracy on
    those prompts are dotted reference lines (baseline's reasoning is 1 on the relative axis)."""
    ok = [r for r in rows if r.get("status", "ok") == "ok"]

    def prompt_of(r: dict) -> tuple:
        return r.get("prompt_hash") or r.get("prompt_id") or r.get("prompt"), r.get("model")

    def config(r: dict) -> dict:
        c = r.get("config")
        return c if isinstance(c, dict) else json.loads(c) if c else {}

    base: dict[tuple, list[dict]] = {}
    for r in ok:
        if r["method"] == "baseline" and r.get("reasoning_tokens") is not None:
            base.setdefault(prompt_of(r), []).append(r)
    groups: dict[tuple, list[dict]] = {}
    for r in ok:
        if r["method"] == "ssr-exit":
            c = config(r)
            groups.setdefault((c.get("exit_k"), c.get("draft_interval")), []).append(r)
    keys = sorted(k for k in groups if None not in k)
    relative = bool(keys) and all(prompt_of(r) in base for k in keys for r in groups[k])

    def thought(r: dict) -> float:
        return r["reasoning_tokens"] / _mean([b["reasoning_tokens"] for b in base[prompt_of(r)]]) if relative \
            else r["reasoning_tokens"]

    fig = go.Figure()
    graded_any = False
    for interval in sorted({i for _, i in keys}):
        ks = [k for k, i in keys if i == interval]
        grades = [[bool(r["correct"]) for r in groups[(k, interval)] if r.get("correct") is not None] for k in ks]
        color = COLORS["ssr-exit"] if len({i for _, i in keys}) == 1 else None
        if any(grades):
            graded_any = True
            acc = [sum(g) / len(g) if g else None for g in grades]
            ci = [wilson(sum(g), len(g)) if g else (None, None) for g in grades]
            fig.add_trace(go.Scatter(
                x=ks, y=acc, mode="lines+markers", name=f"accuracy, a draft every {interval}",
                marker=dict(color=color, size=9), line=dict(color=color),
                text=[f"k={k}: {a:.0%} of {len(g)} graded" if a is not None else f"k={k}: none graded"
                      for k, a, g in zip(ks, acc, grades, strict=True)], hoverinfo="text",
                error_y=dict(type="data", symmetric=False,
                             array=[hi - a if a is not None else 0 for a, (_, hi) in zip(acc, ci, strict=True)],
                             arrayminus=[a - lo if a is not None else 0 for a, (lo, _) in zip(acc, ci, strict=True)])))
        fig.add_trace(go.Scatter(
            x=ks, y=[_mean([thought(r) for r in groups[(k, interval)] if r.get("reasoning_tokens") is not None])
                     for k in ks],
            mode="lines+markers", yaxis="y2", name=f"reasoning{' / baseline' if relative else ''}, every {interval}",
            marker=dict(color=color or "#6b7280", size=8, symbol="square"), line=dict(color=color, dash="dash"),
            text=[f"k={k}: {len(groups[(k, interval)])} runs" for k in ks], hoverinfo="text+y"))
    seen = {prompt_of(r) for k in keys for r in groups[k]}
    if keys and graded_any:  # baseline and SSR on the same prompts, as reference lines
        for method, name in (("baseline", "baseline, same prompts"), ("ssr", "SSR, same prompts")):
            grades = [bool(r["correct"]) for r in ok if r["method"] == method and prompt_of(r) in seen
                      and r.get("correct") is not None]
            if grades:
                fig.add_trace(go.Scatter(x=[min(k for k, _ in keys), max(k for k, _ in keys)],
                                         y=[sum(grades) / len(grades)] * 2, mode="lines", name=name,
                                         line=dict(color=COLORS[method], dash="dot")))
    _layout(fig, "Early exit: accuracy and reasoning tokens by k", 360, xaxis_title="agreeing drafts (k)",
            yaxis=dict(title="accuracy", range=[0, 1.05], tickformat=".0%"),
            yaxis2=dict(title="reasoning / baseline" if relative else "reasoning tokens", overlaying="y",
                        side="right", tickformat=".0%" if relative else ".3s", rangemode="tozero"))
    fig.update_xaxes(tickformat="d", dtick=1)
    if not keys:
        return _empty(fig, "No SSR early exit runs yet.")
    _padded(fig, [k for k, _ in keys], 0.5)
    if not graded_any:  # said in the title, above the plot: never over a point
        fig.update_layout(title_text="Early exit: reasoning by k (accuracy needs graded runs)")
    return fig


def acceptance_by_method(rows: list[dict]) -> go.Figure:
    """History and Benchmark: per method and model, the mean accepted length per verify (the median
    over runs, its IQR as the whisker, the run count in the hover) and the acceptance rate by position
    in the proposal, every run's verifies pooled (``RunStats.acceptance``). Runs without verifies
    (plain decoding, runs logged before forwards were recorded) are left out."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("status", "ok") == "ok" and r.get("verifies"):
            groups.setdefault(f"{r['method']} · {_short(r.get('model'))}", []).append(r)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("accepted per verify", "acceptance by position"),
                        horizontal_spacing=0.14)
    several = len({r.get("model") for runs in groups.values() for r in runs}) > 1  # one model: the bars name methods
    for name in sorted(groups):
        runs = groups[name]
        color = COLORS.get(runs[0]["method"], "#888")
        means = sorted(r["verify_accepted"] / r["verifies"] for r in runs)
        mid = statistics.median(means)
        low, high = iqr(means)
        fig.add_trace(go.Bar(x=[name if several else runs[0]["method"]], y=[mid], marker_color=color, name=name,
                             legendgroup=name, showlegend=False,
                             error_y=dict(type="data", symmetric=False, array=[high - mid], arrayminus=[mid - low]),
                             hovertext=f"{name}: median {mid:.2f} over {len(runs)} runs (IQR {low:.2f}-{high:.2f})",
                             hoverinfo="text"), row=1, col=1)
        pooled = merge(parse_acceptance(r.get("acceptance")) for r in runs)
        for who, a in sorted(pooled.items()):
            rates = [t / n for t, n in zip(a["taken"], a["reached"], strict=True) if n]
            fig.add_trace(go.Scatter(x=list(range(1, len(rates) + 1)), y=rates, mode="lines+markers",
                                     name=f"{name}: {who}", line=dict(color=color, dash=_DASHES.get(who, "dot")),
                                     legendgroup=name), row=1, col=2)
    if not groups:
        return _empty(_layout(go.Figure(), "Acceptance by method and model", 360),
                      "No verifies logged yet: SSR (or hf-pld) runs verify proposals.")
    # its legend (a curve per method, model and proposer) reserves its own room at the foot: the figure grows by it,
    # so the plots keep their height
    _layout(fig, "Acceptance by method and model", 360 + 11 * sum(1 for t in fig.data if t.showlegend is not False))
    fig.update_yaxes(title_text="tokens", row=1, col=1)
    fig.update_yaxes(title_text="accepted", tickformat=".0%", range=[0, 1.05], row=1, col=2)
    fig.update_xaxes(title_text="position in the proposal", tickformat="d", dtick=1, row=1, col=2)
    fig.update_xaxes(tickangle=-30, row=1, col=1)  # five SSR-loop and peer methods side by side at 760 px
    return fig


_DASHES = {"draft prefix": "solid", "suffix in drafts": "dash"}


def _short(model) -> str:
    """A model's name without its folder (a local path is long)."""
    return str(model or "?").rstrip("/").rsplit("/", 1)[-1]


def _mean(xs: list) -> float | None:
    return sum(xs) / len(xs) if xs else None
