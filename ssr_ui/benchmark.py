"""The studio's Benchmark tab behind the page: a dataset slice (an uploaded file, or a dataset name
when the Hub is reachable) run with the chosen methods through the bench's own loop
(``engine.benchmarks.runner``), warm-up included, so the tab and ``python -m engine.tools.bench`` give
the same answers, grades and verdicts. Each finished run updates a progress bar, the summary table
(``engine.benchmarks.summary``), one verdict per method against baseline in the bench's own words
(``summary.verdict_lines``), the per-run table (with each run's log id) and the charts History
draws (their x axis: the same ids); Stop ends it at the next event (the run in flight is logged
``cancelled``); every run is logged with its dataset, which History filters by.

On a shared studio (``ssr_ui.public``) a benchmark is at most ``max_benchmark_runs`` runs, refused
before anything is read, and it takes turns for the model (``ssr_ui.waiting``): before each run,
when other visitors' jobs wait, it gives them the model and queues again behind them, so a job
submitted while a benchmark runs waits for one run of it, not for all of them.
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from engine.benchmarks.problems import BUNDLED_SETS, TASKS, Source, load_problems, reach_hub
from engine.benchmarks.runner import Bench
from engine.benchmarks.summary import summarize, table_cells, tokens_per_forward, verdict_lines
from engine.config import number
from engine.methods.exit.budget import NAME as EXIT
from engine.methods.seams import check_pair
from engine.presets import with_exit_probes
from engine.registry import methods as registered
from engine.registry import on_ssr_loop, uses
from engine.remote.client import BackendError
from engine.runtime.model import ModelLoadError, SSRUnsupportedError
from ssr_ui import charts
from ssr_ui.jobs import Job, claimed
from ssr_ui.render import error_html
from ssr_ui.waiting import Ticket

# what the tab offers: the registry's methods with a "benchmark" place ("target": RSD's target alone; "ssr-exit": SSR
# early exit, lossy; "ssr-lookups": the ablation, SSR's lookups alone: what the drafts add is SSR against it)
BENCH_METHODS = tuple(m.name for m in registered("benchmark"))
MAX_ROWS = 200  # problems per benchmark in the studio (the bench CLI has no bound)
MAX_REPEAT = 5
RUN_COLUMNS = ["run id", "problem", "repeat", "method", "correct", "latency s", "answer tokens", "tok / forward", "answer"]


# while runs stream, the status line moves on every run, the tables redraw at most every REDRAW_S seconds and the
# charts (four plotly figures: the page's heaviest redraw) every CHARTS_S; everything at the end
REDRAW_S, CHARTS_S = 2.0, 10.0


@dataclass
class BenchFrame:
    """What the tab shows after each step: status (with the progress bar), the two tables, charts.
    ``summary``, ``runs`` or ``figures`` None: unchanged since the last frame (the page keeps them:
    redrawing three charts and a growing table on every run froze it for seconds)."""

    status: str
    summary: dict | None = field(default_factory=lambda: {"headers": ["method"], "data": []})
    runs: dict | None = field(default_factory=lambda: {"headers": RUN_COLUMNS, "data": []})
    figures: tuple | None = (None,) * 5  # accuracy, latency, answer tokens, acceptance, early exit by k
    verdicts: list[str] = field(default_factory=list)  # the verdict lines in ``status`` (kept by the frames between)

    def as_tuple(self) -> tuple:
        return (self.status, self.summary, self.runs, *(self.figures or (None,) * 5))

    @property
    def unchanged(self) -> tuple[bool, ...]:
        """Which of :meth:`as_tuple`'s outputs the page keeps as they are."""
        return (False, self.summary is None, self.runs is None, *(self.figures is None,) * 5)


def progress_html(done: int, total: int, note: str, verdicts: list[str] | None = None) -> str:
    """The progress bar and note, then one cell per verdict line ("ssr vs baseline" over "faster: ...")."""
    share = done / total if total else 0.0
    cells = "".join(f'<div class="metric"><div class="k">{html.escape(who)}</div><div class="v">{html.escape(what)}</div></div>'
                    for who, what in (line.split(": ", 1) for line in verdicts or []))
    return (f'<div class="metrics bench-status"><div class="bench-bar" role="progressbar" aria-valuenow="{done}" '
            f'aria-valuemax="{total}"><span style="width:{share:.1%}"></span></div>'
            f'<span class="bench-note">{html.escape(note)}</span></div>'
            + (f'<div class="metrics bench-verdicts">{cells}</div>' if cells else ""))


def _run_row(r: dict) -> list:
    correct = {True: "✓", False: "✗"}.get(r.get("correct"), "-")
    per = tokens_per_forward(r)
    answer = " ".join(r["answer_text"].split())
    return ["-" if r.get("run_id") is None else r["run_id"], r["prompt_id"], r["repeat"], r["method"], correct, round(r["latency_s"], 3), r["answer_tokens"],
            "-" if per is None else round(per, 2), answer[:80] + ("…" if len(answer) > 80 else "")]


def _as_logged(runs: list[dict], configs: dict | None = None) -> list[dict]:
    """The benchmark's runs as History's charts read runs-table rows (the newest first), each with its
    log id (the one History's "run id" box takes; its place in the benchmark for a run not logged);
    ``configs``: each method's settings (the early-exit chart groups by them)."""
    configs = configs or {}
    return [{"config": configs.get(r["method"]), **r, "id": r.get("run_id") or n, "status": "ok",
             "correct": r.get("correct")} for n, r in enumerate(runs, 1)][::-1]


class StoppedInLine(ValueError):
    """A benchmark stopped while it waited for its next turn: that run never began (a ``ValueError``
    before a run's first event: the run log keeps no row of it)."""


def _returned(steps: Iterator):
    """Drain a generator (its status lines unread) and return what it returns."""
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


class BenchmarkRuns:
    """The Benchmark tab's handler, over the studio's models (``self.model``, ``self.scorer``), run
    log, settings (``self.config``), line for the model (``self.in_line``, ``self.line``) and shared-studio rules
    (``self.vet``, ``self.visitor``)."""

    def benchmark(self, dataset: str = "", upload: str | None = None, methods=("baseline", "ssr"), limit=20,
                  repeat=1, sample_seed="", question_field: str = "", answer_field: str = "", task: str = "auto",
                  model_name: str = "", draft_model: str = "", prm: str = "", job: Job | None = None,
                  **settings) -> Iterator[BenchFrame]:
        job = job or Job(None, None)
        try:
            yield from self._benchmark(dataset, upload, methods, limit, repeat, sample_seed, question_field,
                                       answer_field, task, model_name, draft_model, prm, job, settings)
        except (ValueError, ModelLoadError, SSRUnsupportedError, BackendError) as err:
            yield BenchFrame(error_html(str(err)))

    def _benchmark(self, dataset, upload, methods, limit, repeat, sample_seed, question_field, answer_field, task,
                   model_name, draft_model, prm, job: Job, settings: dict) -> Iterator[BenchFrame]:
        methods, repeat, source, shown = self._request(dataset, upload, methods, limit, repeat, sample_seed,
                                                       question_field, answer_field, task)
        spec, limit = source.spec, source.limit
        self.vet(model_name, draft_model, prm)  # a shared studio's list, before any setting is read
        cfg = self.config(model_name, **settings)  # every setting checked before anything is read or loaded
        if on_ssr_loop(methods):
            cfg.check_ssr()
        self.public.check_benchmark(int(limit), int(repeat), len(set(methods)))  # a shared studio's bound
        if not upload and source.file is None:  # a Hub dataset
            for status in reach_hub():
                yield BenchFrame(progress_html(0, 1, f"{status}…"))
        yield BenchFrame(progress_html(0, 1, f"reading {shown or spec}…"))
        problems = load_problems(source, display_name=shown)
        label = shown or source.label
        name = (model_name or self.default_model).strip()
        yield BenchFrame(progress_html(0, 1, f"{label}: {len(problems)} problems read; loading {name}…"))
        for status in self.loading(name, runtime=self.runtime):  # a first load (a GGUF file's conversion) says how it goes
            yield BenchFrame(progress_html(0, 1, f"loading {name}… {status}"))
        lm = self.model(model_name, self.runtime)
        models = {**self._bench_models(lm, methods, draft_model, prm), "evidence": self.evidence(job, lm)}
        configs = {EXIT: with_exit_probes(cfg, name)} if EXIT in methods else {}  # drafts enough to agree
        bench = Bench(models, methods, cfg, configs, log=self.log, dataset=label, origin="app",
                      visitor=self.visitor(job.session))
        settings_used = {m: bench.config(m).to_dict() for m in bench.methods}  # the charts group runs by them
        total = bench.total(problems, int(repeat))
        ticket = yield from self.in_line(job, lambda words: BenchFrame(progress_html(0, total, words)))
        if not ticket.held:
            yield BenchFrame(progress_html(0, total, "stopped while in line for the model: nothing ran"))
            return
        runs: list[dict] = []
        try:  # the bench CLI's warm-up (each method once on the first problem), so both time the same way
            yield BenchFrame(progress_html(0, total, f"{label}: {len(problems)} problems; warming up "
                                                     f"{', '.join(bench.methods)} once on the first problem "
                                                     "(untimed, not logged)…"))
            if not bench.warm_up(problems[0], stop=lambda: job.cancelled):
                yield BenchFrame(progress_html(0, total, "stopped during the warm-up: no run was timed or logged"))
                return
            history = bench.history()  # the log's earlier runs of the model: their steady time per forward
            yield BenchFrame(progress_html(0, total, f"run 1 of {total} in flight ({label}; timed)…"))
            drawn = charted = -CHARTS_S
            said: list[str] = []  # the verdicts of the last redraw, on the progress line's frames between

            def in_turn(events):
                """A run's events, once the model is this job's turn (a shared studio: :meth:`_turn`)."""
                nonlocal ticket
                if self.public.on:
                    ticket = self._turn(ticket, job)
                yield from events

            for r in bench.runs(problems, int(repeat), stop=lambda: job.cancelled,
                                wrap=lambda events, last: claimed(in_turn(events), job, last)):
                runs.append(r)
                note = f"{len(runs)} of {total} runs ({label})"
                now = time.monotonic()
                if now - drawn < REDRAW_S:  # the progress bar moves on every run; the rest at its next redraw
                    yield BenchFrame(progress_html(len(runs), total, note, said), None, None, None)
                    continue
                frame, drawn = self._bench_frame(runs, total, note, cfg.greedy, settings_used, history), now
                said = frame.verdicts
                if now - charted >= CHARTS_S:
                    charted = now
                else:
                    frame.figures = None
                yield frame
        except StoppedInLine:
            in_flight = "stopped while in line for its next turn: no run was in flight"
        else:
            in_flight = "the run in flight is logged as cancelled"
        finally:
            if ticket.held:
                self.line.release(ticket)
        if len(runs) < total:
            yield self._bench_frame(runs, total, f"stopped after {len(runs)} of {total} runs ({in_flight})",
                                    cfg.greedy, settings_used, history)
        else:
            yield self._bench_frame(runs, total, f"done: {total} runs on {len(problems)} problems of {label}, "
                                                 "every run logged", cfg.greedy, settings_used, history)

    def _request(self, dataset, upload, methods, limit, repeat, sample_seed, question_field, answer_field,
                 task) -> tuple[list[str], int, Source, str | None]:
        """The tab's fields checked (ValueError naming the first that is wrong): the methods, the repeats, the
        problems' source and the name an upload is shown by."""
        methods = [methods] if isinstance(methods, str) else list(methods or [])
        unknown = [m for m in methods if m not in BENCH_METHODS]
        if not methods or unknown:
            raise ValueError(f"choose methods from {', '.join(BENCH_METHODS)}" + (f" (not {', '.join(unknown)})" if unknown else ""))
        limit = number("problems", limit, whole=True)
        if not 1 <= limit <= MAX_ROWS:
            raise ValueError(f"problems must be in 1..{MAX_ROWS} here (the bench CLI runs any number)")
        repeat = number("repeats", repeat, whole=True)
        if not 1 <= repeat <= MAX_REPEAT:
            raise ValueError(f"repeats must be in 1..{MAX_REPEAT}")
        seed = None if str(sample_seed or "").strip() == "" else number("sample seed", sample_seed, whole=True)
        if task not in ("auto", *TASKS):
            raise ValueError(f"unknown task {task!r}; choose auto or one of {', '.join(TASKS)}")
        spec, shown = (upload, Path(upload).name) if upload else ((dataset or "").strip(), None)
        if not spec:
            raise ValueError("upload a file or name a dataset first")
        self.public.vet_source(spec, uploaded=bool(upload))  # a shared studio's visitor: the Hub or their upload
        source = Source(spec, question_field.strip() or None, answer_field.strip() or None,
                        None if task == "auto" else task, None, int(limit), seed, hub_only=self.public.on and not upload)
        if not upload and spec not in BUNDLED_SETS and source.file:  # the server's files are not the user's
            raise ValueError(f"{spec!r} looks like a file: upload it above (this box takes a dataset name or "
                             f"{' / '.join(BUNDLED_SETS)})")
        return methods, int(repeat), source, shown

    def _bench_models(self, lm, methods: list[str], draft_model: str, prm: str) -> dict:
        """The models the benchmark's ``methods`` use: the target ``lm`` (with think markers, for SSR's loop),
        and the draft model and the PRM where a method uses them (``Method.uses``; the draft checked against the
        target's tokenizer)."""
        if on_ssr_loop(methods):
            lm.require_markers()
        models = {"target": lm}
        if uses(methods, "draft"):
            models["draft"] = self.model((draft_model or self.default_draft).strip())
            check_pair(lm, models["draft"])
        if uses(methods, "prm"):
            prm = (prm or self.default_prm).strip()
            models.update(scorer=self.scorer(prm), prm_name=prm)
        return models

    def _turn(self, ticket: Ticket, job: Job) -> Ticket:
        """Before a benchmark's run on a shared studio: when other jobs wait for the model, give it
        to them and queue again behind them (a new ticket, once held; :class:`StoppedInLine` when the
        job is stopped meanwhile); else count what the job did since its hold or last lap began (its
        warm-up, a run) as one hold (``ModelLine.lap``: the estimate's unit)."""
        if not self.line.waiting:
            self.line.lap(ticket)
            return ticket
        self.line.release(ticket)
        ticket = _returned(self.in_line(job, str))
        if not ticket.held:
            raise StoppedInLine("stopped while in line for the model's next turn")
        return ticket

    @staticmethod
    def _bench_frame(runs: list[dict], total: int, note: str, greedy: bool, configs: dict | None = None,
                     history: list[dict] | None = None) -> BenchFrame:
        if not runs:
            return BenchFrame(progress_html(0, total, note))
        summary = summarize(runs, greedy, history)
        heads, cells = table_cells(summary)
        rows = _as_logged(runs, configs)
        said = verdict_lines(summary)
        return BenchFrame(progress_html(len(runs), total, note, said), {"headers": heads, "data": cells},
                          {"headers": RUN_COLUMNS, "data": [_run_row(r) for r in runs]},
                          (charts.accuracy_by_method(rows), charts.latency_by_method(rows), charts.token_composition(rows),
                           charts.acceptance_by_method(rows), charts.exit_by_k(rows)), said)
