"""Plain-function handlers behind the studio, testable without a server.

:class:`Studio` holds the lazily loaded models (cached between runs, one lock so that browser
tabs queue for the model), the run log, and the streaming ``run`` handler: it consumes an
engine event stream, logs it, and yields pane HTML at most ``UPDATES_PER_S`` times a second.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

from engine.config import RunConfig
from engine.methods import decoder
from engine.model import LoadedModel, ModelLoadError, SSRUnsupportedError, load_model
from engine.presets import recommended_settings
from engine.prm import make_scorer
from engine.rsd import check_pair
from engine.runlog import RunLog, RunLogError, RunMeta, prompt_hash
from ssr_ui import charts
from ssr_ui.jobs import Job, Jobs
from ssr_ui.render import TraceView, error_html, metrics_html

UPDATES_PER_S = 12  # at most; long traces update less often (see _interval)
METHOD_NAMES = {"Baseline": "baseline", "SSR": "ssr", "RSD": "rsd"}
MODES = ("Baseline", "SSR", "RSD", "Compare")
DEFAULT_DRAFT, DEFAULT_PRM = "tiny-reasoner-draft", "tiny-prm"
COMPARE_SHOWS = "SSR"  # the run whose panes a finished comparison shows first


@dataclass
class Frame:
    """One UI update: the three panes, the metrics strip and (after Compare) a chart plus every
    compared run's own final frame, so the UI can switch the panes between them."""

    reasoning: str
    draft: str
    answer: str
    metrics: str
    chart: object = None
    view: TraceView | None = None  # the run as folded so far (lets the UI re-render one draft)
    runs: dict[str, Frame] | None = None  # after Compare: each run's final frame, by mode name

    @classmethod
    def of(cls, view: TraceView, metrics: str, chart=None) -> Frame:
        return cls(view.reasoning_html(), view.draft_html(), view.answer_html(), metrics, chart, view)

    def as_tuple(self):
        return self.reasoning, self.draft, self.answer, self.metrics, self.chart


def _interval(view: TraceView) -> float:
    """Seconds between UI updates: 1/12 s, stretched for long traces so that re-sending the
    panes never costs the run more than a few percent (4 updates a second at 5,000 tokens)."""
    tokens = len(view.reasoning) + len(view.answer) + sum(len(d) for d in view.drafts.values())
    return max(1.0 / UPDATES_PER_S, tokens / 20_000)


class Studio:
    def __init__(self, model: str | None = None, db: str = "runs.db", device: str | None = None,
                 draft_model: str = DEFAULT_DRAFT, prm: str = DEFAULT_PRM) -> None:
        self.default_model = model or "tiny-reasoner"
        self.default_draft, self.default_prm = draft_model, prm
        self.device = device
        self.log = RunLog(db)
        self.jobs = Jobs()
        self._models: dict[str, LoadedModel] = {}
        self._scorers: dict[str, object] = {}
        self._lock = threading.Lock()  # one run on the model at a time

    def model(self, name: str) -> LoadedModel:
        name = (name or self.default_model).strip()
        if name not in self._models:
            lm = load_model(name, device=self.device)
            lm.warm_up()
            self._models[name] = lm
        return self._models[name]

    def scorer(self, name: str):
        name = (name or self.default_prm).strip()
        if name not in self._scorers:
            self._scorers[name] = make_scorer(name, self.device)
        return self._scorers[name]

    def config(self, model_name: str, **settings) -> RunConfig:
        """The run's config: the model's recommended settings under what the user set."""
        return RunConfig(**{**recommended_settings(model_name or self.default_model), **settings})

    # ------------------------------------------------------------------ the streaming handler
    def run(self, prompt: str, method: str = "SSR", model_name: str = "", draft_model: str = "",
            prm: str = "", job: Job | None = None, **settings) -> Iterator[Frame]:
        """Stream a run (or, for "Compare", baseline, SSR and RSD in turn) as UI frames; errors
        become a message in the metrics strip, never an exception in the page. A ``job`` marked
        cancelled stops the run at its next event (logged ``cancelled``, shown "stopped"); one
        cancelled before it started runs nothing and logs nothing."""
        job = job or Job(None, None)
        view = TraceView()
        if job.cancelled:
            return
        try:
            if not prompt or not prompt.strip():
                raise ValueError("type a prompt first")
            if method not in MODES:
                raise ValueError(f"unknown method {method!r}; choose one of {', '.join(MODES)}")
            cfg = self.config(model_name, **settings)
            if method in ("SSR", "Compare"):
                cfg.check_ssr()
            yield Frame.of(view, '<div class="metrics">loading the model…</div>')
            with self._lock:
                lm = self.model(model_name)
                runs = ["Baseline", "SSR", "RSD"] if method == "Compare" else [method]
                rsd = {}
                if "RSD" in runs:
                    draft_model, prm = draft_model or self.default_draft, prm or self.default_prm
                    rsd = {"draft": self.model(draft_model), "scorer": self.scorer(prm),
                           "draft_name": draft_model, "prm_name": prm}
                    check_pair(lm, rsd["draft"])
                finals = {}
                for name in runs:
                    if job.cancelled:
                        break
                    view = TraceView()
                    yield from self._stream(lm, prompt, name, cfg, view, rsd, job)
                    finals[name] = last = self._frame(view, name, lm, prompt, cfg, final=True)
                if not finals:  # stopped while the model loaded: nothing ran, nothing logged
                    yield Frame.of(TraceView(phase="stopped"), metrics_html(TraceView(phase="stopped"), method))
                    return
                if method != "Compare" or job.cancelled:
                    yield dataclasses.replace(last, runs=finals if len(finals) > 1 else None)
                    return
                latencies = {name: f.view.stats.wall_s if f.view.stats else None for name, f in finals.items()}
                yield dataclasses.replace(finals[COMPARE_SHOWS], chart=charts.latency_bars(latencies), runs=finals)
        except (ValueError, ModelLoadError, SSRUnsupportedError) as err:
            yield Frame.of(view, error_html(str(err)))

    def _stream(self, lm, prompt, name, cfg, view, rsd: dict | None = None, job: Job | None = None) -> Iterator[Frame]:
        """Run one method into ``view``, yielding throttled frames. A cancelled ``job`` stops it
        (the engine stream is closed, so the run is logged ``cancelled``); a run log that cannot
        be written leaves the run on screen with a "not saved" notice."""
        method = METHOD_NAMES[name]
        if method == "ssr":
            lm.require_markers()
        rsd = rsd or {}
        meta = RunMeta(method, lm.model_id, prompt, cfg.to_dict(), device=str(lm.device),
                       draft_model=rsd.get("draft_name") if method == "rsd" else None,
                       prm=rsd.get("prm_name") if method == "rsd" else None)
        last = 0.0
        events = self.log.record(decoder(method, lm, rsd.get("draft"), rsd.get("scorer"))(prompt, cfg), meta)
        try:
            try:
                for ev in events:
                    view.apply(ev)
                    if job is not None and job.cancelled:
                        view.phase = "stopped"
                        break
                    now = time.perf_counter()
                    if now - last >= _interval(view):
                        last = now
                        yield self._frame(view, name, lm, prompt, cfg)
            finally:
                events.close()  # a stop, or a client gone, logs the run as cancelled
        except RunLogError as err:
            view.notice = f"not saved: {err}"
        if self.log.notice and not view.notice:
            view.notice = self.log.notice
            self.log.notice = None

    def _frame(self, view, name, lm, prompt, cfg, final=False, chart=None) -> Frame:
        compare = None
        if final and name != "Baseline" and view.phase != "stopped":
            try:
                compare = self.compare_to_baseline(view, lm.model_id, prompt, cfg)
            except RunLogError as err:
                view.notice = view.notice or f"history unavailable: {err}"
        return Frame.of(view, metrics_html(view, name, compare), chart)

    def compare_to_baseline(self, view: TraceView, model_id: str, prompt: str, cfg: RunConfig) -> dict | None:
        """Latency ratio to the latest baseline run of the same prompt and model, and (greedy)
        whether the answer is identical."""
        if view.done is None:
            return None
        rows = [r for r in self.log.runs(limit=50, method="baseline", prompt_hash=prompt_hash(prompt), model=model_id)
                if r["status"] == "ok"]
        if not rows or not rows[0]["wall_s"]:
            return None
        base = rows[0]
        identical = view.done.answer_text == base["answer_text"] if cfg.greedy else None
        return {"ratio": view.done.stats.wall_s / base["wall_s"], "identical": identical}

    def sweep(self, prompt: str, model_name: str = "", start: int = 0, stop: int = 200, step: int = 20,
              job: Job | None = None, **settings) -> Iterator[tuple[str, object]]:
        """Run baseline once, then SSR at draft starts ``start, start + step, ... <= stop``; yield
        (status HTML, chart) after each run. Every run is logged like any other; a cancelled ``job``
        stops at once (the run in flight logged ``cancelled``), keeping the finished points."""
        job = job or Job(None, None)
        try:
            if not prompt or not prompt.strip():
                raise ValueError("type a prompt first")
            if step < 1 or start < 0 or stop < start:
                raise ValueError(f"sweep range {start}..{stop} step {step} is empty or negative")
            starts = list(range(int(start), int(stop) + 1, int(step)))
            if len(starts) > 50:
                raise ValueError(f"{len(starts)} draft starts is too many for one sweep (at most 50)")
            configs = [self.config(model_name, **{**settings, "draft_start": d}).check_ssr() for d in starts]
            with self._lock:
                lm = self.model(model_name)
                base = TraceView()
                for _ in self._stream(lm, prompt, "Baseline", configs[0], base, job=job):
                    pass
                points = []
                for d, cfg in zip(starts, configs):
                    if job.cancelled:
                        break
                    view = TraceView()
                    for _ in self._stream(lm, prompt, "SSR", cfg, view, job=job):
                        pass
                    if job.cancelled:
                        break
                    s = view.stats
                    points.append({"draft_start": d, "ratio": s.wall_s / base.stats.wall_s, "accepted": s.accepted,
                                   "recovered": s.recovered})
                    yield (f'<div class="metrics">sweep: {len(points)} / {len(starts)} draft starts done</div>',
                           charts.sweep_chart(points))
                if job.cancelled:
                    yield (f'<div class="metrics">sweep stopped after {len(points)} of {len(starts)} draft starts '
                           '(the run in flight is logged as cancelled)</div>', charts.sweep_chart(points))
        except (ValueError, ModelLoadError, SSRUnsupportedError) as err:
            yield error_html(str(err)), None

    # ------------------------------------------------------------------ history
    def history(self, method: str = "all", limit: int = 200) -> list[dict]:
        filters = {} if method in ("", "all", None) else {"method": method}
        return self.log.runs(limit=limit, **filters)

    def export(self, run_id: int | None, kind: str) -> str:
        """Write run ``run_id`` (``kind`` "json" or "html") or the runs table ("csv") to a file in
        a temporary folder; returns its path."""
        import tempfile  # noqa: PLC0415
        from pathlib import Path  # noqa: PLC0415

        from ssr_ui.export import run_to_html, run_to_json, runs_to_csv  # noqa: PLC0415

        folder = Path(tempfile.mkdtemp(prefix="ssr-studio-"))
        if kind == "csv":
            path = folder / "runs.csv"
            path.write_text(runs_to_csv(self.log.runs(limit=100_000)), encoding="utf-8")
            return str(path)
        if run_id is None:
            raise ValueError("enter a run id from the table first")
        row, events = self.log.run(int(run_id)), self.log.events(int(run_id))
        if kind == "json":
            text = run_to_json(row, events)
        elif kind == "html":
            from ssr_ui.layout import CSS  # noqa: PLC0415

            text = run_to_html(row, events, CSS)
        else:
            raise ValueError(f"unknown export format {kind!r}")
        path = folder / f"run-{int(run_id)}.{kind}"
        path.write_text(text, encoding="utf-8")
        return str(path)

    def import_trace(self, path: str) -> Frame:
        """Render a JSON trace file exported from any studio."""
        from pathlib import Path  # noqa: PLC0415

        from ssr_ui.export import run_from_json  # noqa: PLC0415

        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"cannot read {Path(path).name}: {err}") from None
        row, events = run_from_json(text)
        view = TraceView()
        for ev in events:
            view.apply(ev)
        view.phase = str(row.get("status", "imported"))
        return Frame.of(view, metrics_html(view, str(row.get("method", "?"))))

    def replay(self, run_id: int) -> Frame:
        """Re-render a past run from its logged events."""
        view = TraceView()
        row = self.log.run(int(run_id))
        for ev in self.log.events(int(run_id)):
            view.apply(ev)
        view.phase = row["status"]
        return Frame.of(view, metrics_html(view, row["method"]))
