"""Where the time goes: a run's forwards as a timeline, its acceptance statistics and its time split.

Pure builders from a :class:`~ssr_ui.render.TraceView` (its ``forwards``, fork and phase times,
RSD's steps) to HTML with inline SVG, so that the studio (live and replayed) and the HTML export
show the same pictures, with no script needed to read them.

* :func:`timeline_html`: one lane per row (SSR's main row, then each draft; RSD's draft, PRM and
  target), a bar per forward. x is time (a bar spans the forward's start to end) or the forward's
  index; a bar's height grows with the tokens it was fed, its dark part with the tokens it kept;
  its colour is its phase (a PRM forward: the step's verdict). Vertical lines mark each draft's fork
  and the end of thinking. Hovering a bar gives its numbers; clicking it highlights its tokens in
  the panes (``TIMELINE_JS``; tokens carry ``data-f``, the forward that chose them). A lane with
  more forwards than :data:`MAX_BARS` draws neighbours as one bar (the numbers summed, the range
  said), so a run of thousands of tokens stays a few hundred shapes.
* :func:`stats_html`: the time split (prefill, reasoning, the drafts' cost beyond a lone step,
  answer, bookkeeping) and, per proposer, the histogram of accepted length per verify and the
  acceptance rate by position in the proposal.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from engine.events import ForwardEvent, ProposerAcceptance, RowWork
from engine.forwards import acceptance, time_split
from ssr_ui.render import esc
from ssr_ui.waiting import ordinal

MAX_BARS = 240  # per lane: more forwards than this are drawn in groups
WIDTH = 1000  # the SVG's user units across (it stretches to the page's width)
LANE_H = 30
PHASE_COLORS = {"prefill": "#9ca3af", "reasoning": "#2563eb", "answer": "#16a34a"}
DRAFT_COLOR = "#d97706"
EXIT_COLOR = "#dc2626"  # ssr-exit's colour (ssr_ui.charts.METHOD_COLORS)
VERDICT_COLORS = {"kept": "#16a34a", "rejected": "#dc2626"}
SPLIT_COLORS = {"prefill": "#9ca3af", "reasoning": "#2563eb", "drafting": "#d97706", "answer": "#16a34a",
                "bookkeeping": "#e5e7eb"}
X_MODES = ("time", "forward")

# installed once on the timeline's element: a click on a bar highlights the tokens its forwards chose
TIMELINE_JS = """
element.addEventListener('click', (event) => {
  const bar = event.target.closest('[data-f]');
  if (!bar) return;
  const lo = Number(bar.dataset.f), hi = Number(bar.dataset.g ?? bar.dataset.f);
  const root = element.closest('[role="tabpanel"]') || document;  // this tab's panes (History has its own)
  root.querySelectorAll('.tok.hl').forEach((t) => t.classList.remove('hl'));
  let first = null;
  root.querySelectorAll('.tok[data-f]').forEach((t) => {
    const f = Number(t.dataset.f);
    if (f >= lo && f <= hi) { t.classList.add('hl'); first = first || t; }
  });
  if (first) first.scrollIntoView({block: 'nearest', inline: 'nearest'});
});
"""


@dataclass
class _Bar:
    lo: int  # the first forward's index
    hi: int  # the last's
    start: float
    end: float
    wall: float  # the forwards' own seconds (a group's gaps left out)
    fed: int
    kept: int
    phase: str
    tip: str
    color: str


def lanes(forwards: list[ForwardEvent]) -> list[str]:
    """The rows in the order they are drawn: the main row (or RSD's draft, PRM, target), then drafts."""
    seen = {r.row for f in forwards for r in f.rows}
    order = ["main", "draft", "prm", "target"]
    drafts = sorted((r for r in seen if r.startswith("draft ")), key=lambda r: int(r.split()[1]))
    return [r for r in order if r in seen] + drafts + sorted(seen - set(order) - set(drafts))


def _tip(f: ForwardEvent, r: RowWork) -> str:
    tip = f"forward {f.index} · {f.phase} · {1000 * f.wall_s:.1f} ms · {r.row}: fed {r.fed}, kept {r.kept}"
    if r.forced:
        tip += f", then {r.forced} forced"
    if r.proposed:
        tip += f" · verified {r.proposed} proposed by {r.proposer}: accepted {r.accepted}"
    if len(f.rows) > 1:
        tip += f" · {len(f.rows)} rows in this forward"
    if r.note:
        tip += f" · {r.note}"
    return tip


def _color(f: ForwardEvent, r: RowWork) -> str:
    if r.row == "prm" and r.note:
        return VERDICT_COLORS["kept" if r.note.endswith("kept") else "rejected"]
    if r.row.startswith("draft ") or (r.row == "draft" and f.phase != "prefill"):
        return DRAFT_COLOR
    return PHASE_COLORS.get(f.phase, "#6b7280")


def _bars(mine: list[tuple[ForwardEvent, RowWork]], lane: str) -> list[_Bar]:
    """The bars of ``lane`` (``mine``: its rows, with their forwards): one per forward, or one per
    group of neighbours past :data:`MAX_BARS`."""
    bars = [_Bar(f.index, f.index, f.start, f.end, f.wall_s, r.fed, r.kept, f.phase, _tip(f, r), _color(f, r))
            for f, r in mine]
    if len(bars) <= MAX_BARS:
        return bars
    size = -(-len(bars) // MAX_BARS)
    out = []
    for i in range(0, len(bars), size):
        group = bars[i:i + size]
        first, last = group[0], group[-1]
        fed, kept, wall = sum(b.fed for b in group), sum(b.kept for b in group), sum(b.wall for b in group)
        phases = sorted({b.phase for b in group})
        tip = (f"forwards {first.lo}–{last.hi} ({len(group)} on this lane) · {', '.join(phases)} · "
               f"{1000 * wall:.1f} ms in forwards · {lane}: fed {fed}, kept {kept}")
        out.append(_Bar(first.lo, last.hi, first.start, last.end, wall, fed, kept, phases[-1], tip, first.color))
    return out


def timeline_html(view, x: str = "time") -> str:
    """The run's timeline (see the module doc); ``x``: "time" or "forward"."""
    forwards = list(view.forwards)  # a copy: a live run's thread appends to it
    if not forwards:
        return f'<div class="timeline empty">{esc(_why_empty(view.phase))}</div>'
    span = max(f.end for f in forwards) if x == "time" else len(forwards)
    span = span or 1.0

    def at(f_start: float, index: int) -> float:
        return WIDTH * (f_start if x == "time" else index) / span

    names = lanes(forwards)
    widest = max((r.fed for f in forwards for r in f.rows), default=1) or 1
    marks = _marks(view, forwards, x, span)
    rows_of: dict[str, list[tuple[ForwardEvent, RowWork]]] = {}  # each lane's rows, gathered once
    for f in forwards:
        for r in f.rows:
            rows_of.setdefault(r.row, []).append((f, r))
    marks_on: dict[str | None, list[int]] = {}  # the marks of each lane (None: of every lane), by their order
    for i, mark in enumerate(marks):
        marks_on.setdefault(mark[3], []).append(i)
    rows, grouped = [], False
    for lane in names:
        shapes = []
        bars = _bars(rows_of.get(lane, []), lane)
        grouped = grouped or any(b.hi != b.lo for b in bars)
        for b in bars:
            x0 = at(b.start, b.lo)
            x1 = at(b.end, b.hi + 1)
            w = max(x1 - x0, 0.8)
            h = 6 + (LANE_H - 8) * min(1.0, (b.fed / widest) ** 0.5)  # height: tokens fed (square root: 1 and 64 both show)
            k = h * min(1.0, b.kept / b.fed) if b.fed else 0.0
            g = f' data-g="{esc(b.hi)}"' if b.hi != b.lo else ""
            shapes.append(f'<g class="tl-bar" data-f="{esc(b.lo)}"{g}><title>{esc(b.tip)}</title>'
                          f'<rect x="{x0:.2f}" y="{LANE_H - h:.2f}" width="{w:.2f}" height="{h:.2f}" '
                          f'fill="{esc(b.color)}" fill-opacity="0.35"/>'
                          f'<rect x="{x0:.2f}" y="{LANE_H - k:.2f}" width="{w:.2f}" height="{k:.2f}" '
                          f'fill="{esc(b.color)}"/></g>')
        for mx, label, color, _ in (marks[i] for i in sorted(marks_on.get(None, []) + marks_on.get(lane, []))):
            shapes.append(f'<line x1="{mx:.2f}" x2="{mx:.2f}" y1="0" y2="{LANE_H}" stroke="{esc(color)}" '
                          f'stroke-width="1.5" vector-effect="non-scaling-stroke" stroke-dasharray="3 2">'
                          f'<title>{esc(label)}</title></line>')
        rows.append(f'<div class="tl-label">{esc(lane)}</div><div class="tl-lane">'
                    f'<svg viewBox="0 0 {WIDTH} {LANE_H}" preserveAspectRatio="none" role="img" '
                    f'aria-label="{esc(lane)} lane">{"".join(shapes)}</svg></div>')
    ticks = "".join(f'<span style="left:{100 * v / span:.2f}%">{esc(_tick(v, x))}</span>' for v in _ticks(span))
    unit = "seconds since the run started" if x == "time" else "forward index"
    legend = " ".join(f'<span class="tl-key" style="background:{esc(c)}"></span>{esc(name)}' for name, c in
                      (("prefill", PHASE_COLORS["prefill"]), ("reasoning", PHASE_COLORS["reasoning"]),
                       ("draft", DRAFT_COLOR), ("answer", PHASE_COLORS["answer"])))
    if "prm" in names:
        legend += " " + " ".join(f'<span class="tl-key" style="background:{esc(c)}"></span>PRM: step {esc(name)}'
                                 for name, c in VERDICT_COLORS.items())
    note = (f"{len(forwards)} forwards{' (neighbours grouped past ' + str(MAX_BARS) + ' per lane)' if grouped else ''}"
            " · bar height: tokens fed, dark part: tokens kept · dashed: forks"
            + (", the early exit (red)" if view.exit is not None else "") + " and the end of thinking · "
            "hover a bar for its numbers, click it to highlight its tokens")
    flags = ""
    if view.exit is not None:  # the exit's line gets a label above the lanes (a line's tooltip alone is easy to miss)
        mx = next(m for m, label, color, _ in marks if color == EXIT_COLOR)
        side = "right" if mx > 0.6 * WIDTH else "left"  # a label near the right end ends at its line
        flags = (f'<div></div><div class="tl-flags"><span class="{side}" style="left:{100 * mx / WIDTH:.2f}%" title="'
                 f'{esc(view.exit_words())}">{esc(f"■ early exit · token {view.exit.at_token}")}</span></div>')
    return (f'<div class="timeline"><div class="tl-note">{legend} · {esc(note)}</div>'
            f'<div class="tl-grid">{flags}{"".join(rows)}<div></div><div class="tl-axis">{ticks}</div>'
            f'<div></div><div class="tl-unit">{esc(unit)}</div></div></div>')


def _why_empty(phase: str) -> str:
    if phase in ("stopped", "cancelled"):
        return "no forwards recorded: the run was stopped before its first forward"
    if phase in ("done", "imported"):
        return "no forwards recorded: a run logged before the timeline existed"
    if phase in ("waiting", "compiling", "prefill", "reasoning", "answer"):
        return "the timeline fills as the run's forwards come"
    return "no forwards to show"


def _marks(view, forwards: list[ForwardEvent], x: str, span: float) -> list[tuple[float, str, str, str | None]]:
    """(x, label, colour, lane or None for every lane): each draft's fork, the end of thinking
    (``span``: what the lanes' width stands for, seconds or forwards)."""

    # by forward index, a moment is drawn at the first forward (in the list's order) that starts at or after it:
    # the first whose running maximum of starts reaches it, found by bisection (a run of thousands of drafts)
    reached = list(itertools.accumulate((f.start for f in forwards), max))

    def pos(t: float) -> float:
        if x == "time":
            return WIDTH * t / span
        i = bisect.bisect_left(reached, t)
        return WIDTH * (forwards[i].index if i < len(forwards) else len(forwards)) / span

    out = []
    for d, t in sorted(dict(view.fork_times).items()):  # (a copy: a live run's thread adds to it)
        at = view.draft_forks.get(d)
        label = f"draft {d} forked" + (f" after {at} reasoning tokens" if at is not None else "")
        out += [(pos(t), label, DRAFT_COLOR, "main"), (pos(t), label, DRAFT_COLOR, f"draft {d}")]
    if view.answer_t is not None and view.reasoning:
        out.append((pos(view.answer_t), "end of thinking: the answer starts", "#111827", None))
    if view.exit is not None:  # ssr-exit: the drafts agreed and the end of thinking was forced (drawn on top of it)
        out.append((pos(view.exit.t), f"early exit after {view.exit.at_token} reasoning tokens: {view.exit_words()}",
                    EXIT_COLOR, None))
    return out


def _ticks(span: float) -> list[float]:
    step = _nice(span / 5)
    return [i * step for i in range(int(span / step) + 1) if i * step <= span * 0.98]


def _nice(raw: float) -> float:
    for scale in (10.0 ** k for k in range(-3, 7)):
        for m in (1, 2, 5):
            if m * scale >= raw:
                return m * scale
    return raw


def _tick(v: float, x: str) -> str:
    return f"{v:g}" if x == "forward" else (f"{v:.3g}s" if v else "0")


# ---------------------------------------------------------------------------- statistics

def stats_html(view) -> str:
    """The time split and the acceptance statistics of the run so far."""
    forwards = list(view.forwards)
    if not forwards:
        return ""
    wall = view.stats.wall_s if view.stats is not None and view.stats.wall_s else max(f.end for f in forwards)
    split = time_split(forwards, wall)
    total = sum(split.values()) or 1.0
    bar = "".join(f'<span class="tl-split" style="width:{100 * v / total:.2f}%;background:{esc(SPLIT_COLORS[k])}" '
                  f'title="{esc(k)}: {v:.3f} s ({100 * v / total:.0f}%)"></span>' for k, v in split.items() if v > 0)
    keys = " ".join(f'<span class="tl-key" style="background:{esc(SPLIT_COLORS[k])}"></span>{esc(k)} {v:.2f} s '
                    f'({100 * v / total:.0f}%)' for k, v in split.items() if v > 0)
    head = (f'<div class="tl-stats"><div class="tl-head">Where the time went ({wall:.2f} s, {len(forwards)} forwards)'
            f'</div><div class="tl-splitbar">{bar}</div><div class="tl-note">{keys} · drafting: what the forwards '
            'carrying drafts cost beyond a lone reasoning step · bookkeeping: the run outside any forward</div>')
    parts = [head]
    acc = acceptance(forwards)
    if acc:
        cards = "".join(_proposer_card(who, a) for who, a in sorted(acc.items(), key=lambda kv: -sum(kv[1]["hist"])))
        parts.append(f'<div class="tl-head">Acceptance per verify, by proposer</div><div class="tl-cards">{cards}</div>')
    else:
        parts.append('<div class="tl-note">no verifies in this run: every forward took one token per row</div>')
    parts.append("</div>")
    return "".join(parts)


def _proposer_card(who: str, a: dict[str, list[int]]) -> str:
    n = sum(a["hist"])
    rates = [t / r if r else 0.0 for t, r in zip(a["taken"], a["reached"], strict=True)]
    hist = _mini_bars(a["hist"], [f"accepted {i}: {c} of {n} verifies" for i, c in enumerate(a["hist"])],
                      "#2563eb", max(a["hist"]) or 1)
    pos = _mini_bars(rates, [f"position {i + 1}: {t} of {r} accepted ({100 * t / r:.0f}%)" if r else ""
                             for i, (t, r) in enumerate(zip(a["taken"], a["reached"], strict=True))], "#16a34a", 1.0)
    return (f'<div class="tl-card"><b>{esc(who)}</b>: {n} verif{"y" if n == 1 else "ies"}, accepted '
            f'{ProposerAcceptance.of(who, a).per_verify()}'
            f'<div class="tl-mini"><span>accepted length per verify (0 to {len(a["hist"]) - 1})</span>{hist}</div>'
            f'<div class="tl-mini"><span>acceptance by position in the proposal (1st to {ordinal(len(rates))})</span>'
            f'{pos}</div></div>')


def _mini_bars(values: list[float], tips: list[str], color: str, top: float) -> str:
    w = 100 / max(len(values), 8)  # a short histogram keeps narrow bars (one verify is not a wall of colour)
    rects = "".join(f'<rect x="{i * w + 0.1 * w:.2f}" y="{40 * (1 - v / top):.2f}" width="{0.8 * w:.2f}" '
                    f'height="{40 * v / top:.2f}" fill="{esc(color)}"><title>{esc(tip)}</title></rect>'
                    for i, (v, tip) in enumerate(zip(values, tips, strict=True)))
    return f'<svg viewBox="0 0 100 40" preserveAspectRatio="none">{rects}</svg>'
