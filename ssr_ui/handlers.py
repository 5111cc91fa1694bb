"""Plain-function handlers behind the studio, testable without a server.

:class:`Studio` holds the lazily loaded models (``ssr_ui.shelf``), the run log, the job registry,
the past runs (``ssr_ui.history``) and, here, the streaming ``run`` and ``sweep`` handlers: they
consume an engine event stream, log it, and yield pane HTML (``ssr_ui.frame.Frame``) at most
``UPDATES_PER_S`` times a second.

Limits, each stated in the UI and the API docs: a model loads outside the line for the model (other
runs go on meanwhile) and gives up after ``load_timeout`` seconds; one run at a time uses the model
(the others wait in arrival order, each told its place: ``ssr_ui.waiting``); a run stops after
``max_run_s`` seconds; a prompt must fit the model's
context with the run's budgets (``LoadedModel.check_fits``); every setting is validated
(``RunConfig.coerce``) before anything runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import statistics
import time
from collections.abc import Iterator

from engine.benchmarks.agreement import agreement
from engine.config import RunConfig, number
from engine.llamacpp import lib as llama_lib
from engine.llamacpp.model import RUNTIME as LLAMA
from engine.methods.exit.budget import NAME as EXIT
from engine.methods.seams import StepModel, check_pair
from engine.methods.ssr.evidence import Evidence
from engine.presets import provenance, recommended_settings, with_exit_probes
from engine.registry import decoder, is_lossy, method_of, not_answer_only, not_on_a_server
from engine.registry import methods as registered
from engine.remote.client import BackendError
from engine.remote.model import RemoteModel
from engine.runlog import RunLog, RunLogError, RunMeta, prompt_hash
from engine.runlog.compare import finished, matched_on, matching_baselines, pool, run_time, slow_runs
from engine.runtime.markers import Conversation, check_history
from engine.runtime.model import LoadedModel, ModelLoadError, SSRUnsupportedError
from engine.wiring import run_config
from ssr_ui import charts
from ssr_ui.benchmark import BenchmarkRuns
from ssr_ui.frame import Frame
from ssr_ui.history import PastRuns
from ssr_ui.jobs import Job, Jobs, claimed
from ssr_ui.public import Public
from ssr_ui.render import TraceView, error_html, esc, html_note, metrics_html
from ssr_ui.shelf import ModelShelf
from ssr_ui.waiting import ModelLine, Ticket

log = logging.getLogger(__name__)

UPDATES_PER_S = 12  # at most; long traces update less often (see _interval)
EXIT_MODE = method_of(EXIT).label  # lossy: SSR that stops reasoning once its drafts agree (engine.methods.exit)
BASELINE = method_of("baseline").label  # every run's reference
LOOKUPS_MODE = method_of("ssr-lookups").label  # the ablation: SSR's loop without drafts (what the drafts add)
# the studio's methods by label, from the registry: each on the Run tab (its "run" place) and in a Compare ("compare")
METHOD_NAMES = {m.label: m.name for m in registered() if {"run", "compare"} & set(m.studio)}
MODES = (*(m.label for m in registered("run")), "Compare")
# a Compare's runs, each against its own baseline run, in the registry's order (the ablation before SSR: SSR's strip
# says what its drafts added)
COMPARE_RUNS = tuple(m.label for m in registered("compare"))
DEFAULT_DRAFT, DEFAULT_PRM = "tiny-reasoner-draft", "tiny-prm"
COMPARE_SHOWS = "SSR"  # the run whose panes a finished comparison shows first
LOAD_TIMEOUT_S = 600.0  # a model that takes longer to load is given up on (the UI says so)
MAX_RUN_S = 900.0  # a run still going after this long is stopped (logged cancelled, shown why)
RANGE_SETTERS = ("max_think", "num_drafts", "weighting")  # checked first: other settings' ranges depend on them
TIMELINE_EVERY_S = 1.0  # while a run streams, the timeline is redrawn at most this often (its final frame always)
REPEATS_FIELD, MAX_REPEATS = "Compare repeats (compare_repeats)", 5  # a Compare runs its set 1..5 times
RSD_MOSTLY_REWRITTEN = 0.5  # above this share of rejected draft steps, RSD's panes say why it is slow


@dataclasses.dataclass
class _Plan:
    """One request's runs, decided before any runs: its prompt, settings, the runs by label (a Compare's set, or
    one), those skipped with the reason, the rounds, the model and the side models (draft, PRM) it uses."""

    prompt: str
    cfg: RunConfig
    runs: list[str]
    compare: bool
    repeats: int
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)
    model_name: str = ""
    lm: object = None
    side: dict = dataclasses.field(default_factory=dict)  # the draft model and the PRM, for the runs that use them

    def cannot(self, names: list[str], err: Exception) -> None:
        """``names`` cannot run here: a Compare skips them with the reason; a run alone is refused."""
        if not self.compare:
            raise err
        for name in names:
            self.skipped.setdefault(name, str(err))


def _interval(view: TraceView) -> float:
    """Seconds between UI updates: 1/12 s, stretched for long traces so that re-sending the
    panes never costs the run more than a few percent (4 updates a second at 5,000 tokens)."""
    tokens = len(view.reasoning) + len(view.answer) + sum(len(d) for d in view.drafts.values())
    return max(1.0 / UPDATES_PER_S, tokens / 20_000)


def runtime_of(value: str | None) -> str:
    """The runtime a run asked for: "" (transformers, the default) or "llama.cpp" (ValueError for
    anything else, and for llama.cpp where llama-cpp-python is not installed, saying how to get it)."""
    value = (value or "").strip()
    if value in ("", "transformers"):
        return ""
    if value != LLAMA:
        raise ValueError(f"unknown runtime {value!r}; choose transformers or {LLAMA}")
    if why := llama_lib.missing():
        raise ValueError(f"the {LLAMA} runtime is not available here: {why}")
    return value


class Studio(ModelShelf, PastRuns, BenchmarkRuns):
    """The studio behind the page: its models (:class:`~ssr_ui.shelf.ModelShelf`), the runs it
    streams (here: a run, a comparison, a sweep), its past runs (:class:`~ssr_ui.history.PastRuns`),
    its benchmarks (:class:`~ssr_ui.benchmark.BenchmarkRuns`), the run log and the job registry."""

    def __init__(self, model: str | None = None, db: str = "runs.db", device: str | None = None,
                 draft_model: str = DEFAULT_DRAFT, prm: str = DEFAULT_PRM, load_timeout: float = LOAD_TIMEOUT_S,
                 max_run_s: float = MAX_RUN_S, compile: str = "auto", servers: dict | None = None,
                 max_cache_gb: float | None = None, public: Public | None = None, drafting: str = "auto",
                 runtime: str = "", random_weights: dict[str, str | None] | None = None, dtype: str | None = None) -> None:
        # models on vLLM servers, by name: a Server's fields (app --base-url, --draft-base-url, --prm-base-url);
        # presets built with random weights, by name: their tokenizer folder or None (app --random-weights, --tokenizer)
        ModelShelf.__init__(self, model or "tiny-reasoner", prm, device, load_timeout, servers, max_cache_gb,
                            random_weights, dtype)
        self.compile = RunConfig(compile=compile).compile  # the runs' compiled-steps default (app --compile)
        self.drafting = RunConfig(drafting=drafting).drafting  # SSR's drafting default (app --drafting)
        self.runtime = runtime_of(runtime)  # the runtime a run gets when it names none (app --runtime)
        self.default_draft, self.max_run_s = draft_model, max_run_s
        self.log = RunLog(db)
        self.jobs = Jobs()
        self.line = ModelLine()  # one job on the model at a time, the others in line (ssr_ui.waiting)
        self.public = public or Public()  # a shared studio's rules (ssr_ui.public); off: none
        self._ledgers: dict[tuple, dict] = {}  # a shared studio's drafting ledgers, per (visitor, model) (evidence)

    def visitor(self, session: str | None) -> str | None:
        """Whose runs a browser or API session sees and logs (None: everyone's, public mode off)."""
        return self.public.visitor(session)

    def in_line(self, job: Job, note) -> Iterator:
        """Wait for the model in its line (``ssr_ui.waiting``), yielding ``note(status)`` meanwhile;
        returns the ticket: held (the caller releases it), or not when the job was stopped in line."""
        ticket = Ticket()
        for words in self.line.wait(ticket, lambda: job.cancelled):
            yield note(words)
        return ticket

    def evidence(self, job: Job, lm) -> Evidence | None:
        """The store SSR's loop learns in for ``job``'s runs of ``lm`` (None: the model's own). On a shared
        studio, the visitor's: their own drafting ledgers beside the model's forward costs
        (``Evidence.apart``), so another visitor's runs neither decide whether theirs draft nor appear
        in the numbers their strip gives."""
        if not self.public.on or isinstance(lm, RemoteModel):
            return None
        return Evidence.of(lm).apart(self._ledgers.setdefault((self.visitor(job.session), lm.model_id), {}))

    def vet(self, model: str | None = None, draft_model: str | None = None, prm: str | None = None) -> None:
        """On a shared studio, the names a visitor sent must be on the operator's list (one message,
        whatever the name: ``Public.vet``); before anything reads a path or loads a model."""
        for field_name, name in (("model", model), ("draft model", draft_model), ("PRM", prm)):
            self.public.vet(field_name, name)

    def config(self, model_name: str, **settings) -> RunConfig:
        """The run's config: the model's recommended settings under what the user set (values as a
        form or an API client sends them; ValueError naming the field and its range when one is
        not valid, an empty box included: ``engine.config.invalid``). A model not on a shared
        studio's list is refused first (:meth:`vet`)."""
        self.vet(model_name)
        model = model_name or self.default_model
        defaults = {"compile": self.compile, "drafting": self.drafting}
        known = run_config(model, defaults).to_dict()  # what a setting's range depends on
        given = {}
        for name in sorted(settings, key=lambda k: k not in RANGE_SETTERS):  # a box left empty is an error too
            given[name] = RunConfig.coerce(name, settings[name], {**known, **given})
        return run_config(model, {**defaults, **given})

    # ------------------------------------------------------------------ the streaming handler
    def run(self, prompt: str, method: str = "SSR", model_name: str = "", draft_model: str = "",
            prm: str = "", job: Job | None = None, history=None, repeats=1, **settings) -> Iterator[Frame]:
        """Stream a run (or, for "Compare", baseline, SSR, SSR early exit and RSD in turn) as UI frames; errors
        become a message in the metrics strip, never an exception in the page. A ``job`` marked
        cancelled stops the run at its next event (logged ``cancelled``, shown "stopped"); one
        cancelled before it started runs nothing and logs nothing. ``history``: the chat's earlier
        turns (a list of ``{"role", "content"}`` messages or its JSON text, ``check_history``), so
        ``prompt`` is the conversation's next turn, templated after them (``Conversation``; the run log
        keeps every turn). ``repeats``: how many times a Compare runs its set (:func:`compare_repeats`),
        each run's ratio to baseline then the median of its pairs."""
        job = job or Job(None, None)
        if job.cancelled:
            return
        try:
            yield from self._run(prompt, method, model_name, draft_model, prm, job, settings, history, repeats)
        except (ValueError, ModelLoadError, SSRUnsupportedError, BackendError) as err:
            yield Frame.of(TraceView(phase="error"), error_html(str(err)))
        except Exception as err:  # the page never shows a bare "Error": say what broke, keep the app up
            log.exception("run failed")
            yield Frame.of(TraceView(phase="error"), error_html(f"the run failed: {type(err).__name__}: {err}"))

    def _run(self, prompt, method, model_name, draft_model, prm, job: Job, settings: dict,
             history=None, repeats=1) -> Iterator[Frame]:
        plan = yield from self._plan(prompt, method, model_name, draft_model, prm, settings, history, repeats)
        ticket = yield from self.in_line(job, Frame.note)
        if not ticket.held:  # stopped while in line: it leaves the line, nothing ran, nothing is logged
            yield Frame.of(TraceView(phase="stopped"), html_note("stopped while in line for the model: nothing ran"))
            return
        try:
            finals = yield from self._run_set(plan, job)
        finally:
            self.line.release(ticket)
        if not finals:  # stopped before anything ran: nothing logged
            yield Frame.of(TraceView(phase="stopped"), metrics_html(TraceView(phase="stopped"), method))
        elif not plan.compare:
            yield finals[method]
        else:
            yield self._compared(plan, finals)

    def _plan(self, prompt, method, model_name, draft_model, prm, settings: dict, history, repeats) -> Iterator[Frame]:
        """A request checked and its models loaded (frames say how loading goes): the :class:`_Plan` of the runs
        to make, where a Compare's runs that cannot run here are skipped with the reason (a run alone is
        refused)."""
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("type a prompt first")
        if history and (turns := check_history(history)):
            prompt = Conversation(turns, prompt)
        if method not in MODES:
            raise ValueError(f"unknown method {method!r}; choose one of {', '.join(MODES)}")
        self.vet(model_name, draft_model, prm)
        runtime = runtime_of(settings.pop("runtime", "") or self.runtime)
        cfg = self.config(model_name, **settings)
        compare = method == "Compare"
        plan = _Plan(prompt, cfg, list(COMPARE_RUNS) if compare else [method], compare,
                     compare_repeats(repeats) if compare else 1)
        ssr_family = [name for name in plan.runs if method_of(METHOD_NAMES[name]).ssr_loop]
        try:
            if ssr_family:
                cfg.check_ssr()
        except ValueError as err:
            plan.cannot(ssr_family, err)
        plan.model_name = (model_name or self.default_model).strip()
        on = f" on {runtime}" if runtime else ""
        yield _loading(f"loading {plan.model_name}{on}…")
        for status in self.loading(plan.model_name, runtime=runtime):  # a first load (a GGUF file's conversion) says how
            yield _loading(f"loading {plan.model_name}{on}… {status}")
        plan.lm = lm = self.model(plan.model_name, runtime)
        for name in plan.runs if isinstance(lm, RemoteModel) else []:  # early exit, the ablation: in process only
            if why := not_on_a_server(METHOD_NAMES[name]):
                plan.cannot([name], ValueError(why))
        try:  # refused before anything runs, in the engine's words (a base model has no reasoning to fork from)
            if ssr_family:
                lm.require_markers()
        except SSRUnsupportedError as err:
            plan.cannot(ssr_family, err)
        for name in plan.runs if not cfg.thinking else []:  # thinking off (Run settings' Thinking): refused before the run
            if why := not_answer_only(METHOD_NAMES[name], lm):
                plan.cannot([name], ValueError(why))
        if drafted := [name for name in plan.runs if "draft" in method_of(METHOD_NAMES[name]).uses]:
            judged = any("prm" in method_of(METHOD_NAMES[name]).uses for name in drafted)
            try:
                plan.side = yield from self._side_models(lm, draft_model, prm if judged else None)
            except (ValueError, ModelLoadError) as err:
                plan.cannot(drafted, ValueError(
                    f"{err}. To run {' and '.join(drafted)} here, set Draft model (RSD settings; draft_model in the "
                    f"API) to a model with {plan.model_name}'s tokenizer"
                    + (", and Process reward model to one that loads (or target-likelihood)" if judged else "")))
        plan.runs = [name for name in plan.runs if name not in plan.skipped]
        return plan

    def _run_set(self, plan: _Plan, job: Job) -> Iterator[Frame]:
        """Run ``plan``'s runs (``plan.repeats`` rounds of them), streaming each; returns each run's final frame
        by name (the last round's), a Compare's measured against its round's own baseline run."""
        deadline = time.perf_counter() + self.max_run_s
        finals, trials, lm, runs = {}, Trials(), plan.lm, plan.runs
        for name in [name for _ in range(plan.repeats) for name in runs]:
            if job.cancelled:
                break
            cfg = with_exit_probes(plan.cfg, plan.model_name) if name == EXIT_MODE else plan.cfg  # drafts enough to agree
            method = method_of(METHOD_NAMES[name])
            if not self.is_warm(lm, method.name, cfg):
                yield Frame.note(f"warming up {name} on {plan.model_name} (once per kind of run, untimed, not logged)…")
                self.warm(lm, method.name, cfg, plan.side, self.evidence(job, lm))
            view = TraceView(method=method.name, think_end=_think_end(lm), thinking=_thinking(lm), exact=cfg.exact,
                             # a step writer's budget is the whole response: its cut is known from its final stats
                             budgets=None if method.steps else (cfg.max_think, cfg.max_answer),
                             rule=self.rsd_rule(plan.model_name, cfg) if "prm" in method.uses else None,
                             dtypes=_dtypes(lm, plan.side if method.uses else {}), skipped=plan.skipped,
                             draft_start=cfg.draft_start, thinking_off=not cfg.thinking)
            yield from self._stream(lm, plan.prompt, name, cfg, view, plan.side, job, deadline,
                                    last=name == runs[-1] and trials.round == plan.repeats - 1)
            # a Compare's runs are measured against its own baseline run (the pair its chart shows)
            pair = finals[BASELINE].view.done if plan.compare and BASELINE in finals else None
            alone = finals[LOOKUPS_MODE].view.done if name == "SSR" and LOOKUPS_MODE in finals else None
            finals[name] = self._frame(view, name, lm, plan.prompt, cfg, final=True, pair=pair, job=job,
                                       lookups=alone, trials=trials if plan.compare else None)
            trials.round += name == runs[-1]
        return finals

    def _compared(self, plan: _Plan, finals: dict[str, Frame]) -> Frame:
        """A finished Compare: the run it shows first, its latency chart (with what did not finish or run) and
        every run in the run picker, those not run saying why."""
        latencies = {name: f.view.stats.wall_s if f.view.done is not None else None for name, f in finals.items()}
        done = sum(v is not None for v in latencies.values())
        notes = [f"stopped: {done} of {len(plan.runs)} finished"] if done < len(plan.runs) else []
        notes += [f"{plan.repeats} rounds: the panes and the bars show the last"] if plan.repeats > 1 else []
        notes += [f"not run: {', '.join(plan.skipped)}"] if plan.skipped else []
        for name in plan.skipped:  # each in the run picker, its panes saying why it did not run
            view = TraceView(method=METHOD_NAMES[name], phase="skipped", skipped=plan.skipped)
            finals[name] = Frame.of(view, metrics_html(view, name), timeline=True)
        finals = {name: finals[name] for name in COMPARE_RUNS if name in finals}  # in the comparison's order
        chart = charts.latency_bars(latencies, note="; ".join(notes)) if done else None
        return dataclasses.replace(finals[compare_shows(finals)], chart=chart, runs=finals if len(finals) > 1 else None)

    def _side_models(self, lm, draft_model: str, prm: str | None) -> Iterator[Frame]:
        """Load the draft model and, unless ``prm`` is None, the PRM (each named by its field when it will
        not load) and check the draft against ``lm``; returns what the decoders take."""
        draft_model = (draft_model or self.default_draft).strip()
        prm = None if prm is None else (prm or self.default_prm).strip()
        yield _loading(f"loading the draft model {draft_model}" + (f" and the PRM {prm}…" if prm else "…"))
        with _field("Draft model (draft_model)"):
            for status in self.loading(draft_model):
                yield _loading(f"loading the draft model {draft_model}… {status}")
            draft_lm = self.model(draft_model)
        scorer = None
        if prm is not None:
            with _field("Process reward model (prm)"):
                scorer = self.scorer(prm)
        check_pair(lm, draft_lm)  # (models load once, by name: the pair is checked per run)
        return {"draft": draft_lm, "scorer": scorer, "draft_name": draft_model, "prm_name": prm}

    def _stream(self, lm, prompt, name, cfg, view, rsd: dict | None = None, job: Job | None = None,
                deadline: float | None = None, last: bool = True) -> Iterator[Frame]:
        """Run one method into ``view``, yielding throttled frames. A cancelled ``job`` or the
        ``deadline`` stops it (the engine stream is closed, so the run is logged ``cancelled``); the
        run's end is claimed from ``job`` before its final event is logged (``last``: the job's last
        run; ssr_ui/jobs.py's cancel contract). A run log that cannot be written leaves the run on
        screen with a "not saved" notice."""
        job = job or Job(None, None)
        method = METHOD_NAMES[name]
        used = method_of(method).uses
        if method_of(method).ssr_loop:
            lm.require_markers()
        rsd = rsd or {}
        meta = RunMeta(method, lm.model_id, prompt, cfg.to_dict(), device=_device(lm), dtype=getattr(lm, "dtype", None),
                       think_end=_think_end(lm), visitor=self.visitor(job.session),
                       draft_model=rsd.get("draft_name") if "draft" in used else None,
                       prm=rsd.get("prm_name") if "prm" in used else None)
        shown_at = drawn_at = 0.0
        run = decoder(method, lm, rsd.get("draft"), rsd.get("scorer"), self.evidence(job, lm))(prompt, cfg)
        events = self.log.record(claimed(run, job, last), meta)
        try:
            try:
                for ev in events:
                    view.apply(ev)
                    now = time.perf_counter()
                    if view.done is None and (job.cancelled or (deadline is not None and now > deadline)):
                        view.phase = "stopped"
                        if not job.cancelled:
                            view.notice = f"stopped after {self.max_run_s:.0f} s, the limit per run (--max-run-seconds)"
                        break
                    if now - shown_at >= _interval(view):
                        shown_at = now
                        draw = now - drawn_at >= TIMELINE_EVERY_S  # the timeline is redrawn less often than the panes
                        drawn_at = now if draw else drawn_at
                        yield self._frame(view, name, lm, prompt, cfg, timeline=draw)
                if view.done is None and job.cancelled:  # cancelled while its final event was held back
                    view.phase = "stopped"
            finally:
                events.close()  # a stop, or a client gone, logs the run as cancelled
        except RunLogError as err:
            view.notice = f"not saved: {err}"
        if self.log.notice and not view.notice:
            view.notice, self.log.notice = self.log.notice, None
        s = view.stats
        if s and s.server.note:  # the server contradicted its declared speculation: said, never hidden
            view.notice = view.notice or s.server.note
        steps = s.rsd.steps_accepted + s.rsd.steps_rejected if s else 0
        if "prm" in used and s and s.rsd.steps_rejected > RSD_MOSTLY_REWRITTEN * steps:
            view.notice = view.notice or (
                f"the PRM rejected {s.rsd.steps_rejected} of {steps} draft steps, so the "
                f"target rewrote most of them: RSD pays off only where the draft model ({rsd.get('draft_name')}) is "
                "usually right (the bundled draft knows arithmetic prompts only)")

    def _frame(self, view, name, lm, prompt, cfg, final=False, chart=None, pair=None, timeline=True,
               job: Job | None = None, lookups=None, trials: Trials | None = None) -> Frame:
        """A frame of ``view``; a final one is compared with its baseline (``pair``: a Compare's own,
        judged over its rounds in ``trials``: :meth:`_judge_pair`) and, for a Compare's SSR run that
        forked drafts, with the same Compare's lookups-alone run (``lookups``, its final event): what
        the drafts added."""
        compare = None
        if final and (name != BASELINE or trials is not None):
            try:
                row = _live_row(view, METHOD_NAMES[name], lm, prompt, cfg, self.visitor(job.session if job else None))
                if trials is not None and view.done is not None:
                    trials.slow[name] = self._slow(row, view.done.stats)
                if name != BASELINE:
                    compare = self.compare_to_baseline(row, view.done, cfg, pair)
            except RunLogError as err:
                view.notice = view.notice or f"history unavailable: {err}"
            if compare is not None and trials is not None and pair is not None:
                compare = _judge_pair(compare, name, view, trials)
            if compare is not None and lookups is not None and lookups.stats.wall_s and view.done.stats.drafts:
                compare["vs_lookups"] = view.done.stats.wall_s / lookups.stats.wall_s
        return Frame.of(view, metrics_html(view, name, compare), chart, timeline=timeline or final)

    def compare_to_baseline(self, run: dict, done, cfg: RunConfig, pair=None) -> dict | None:
        """``run`` (a runs-table row, or :func:`_live_row` of a run just finished) against a baseline:
        ``None`` for a run that did not finish. ``pair``: the baseline run a Compare made seconds
        before (its final event): that pair is the ratio, as the Compare's chart shows it. Else the
        logged baseline runs that match it (``engine.runlog.compare``), pooled (flagged slow ones and
        stale ones left out: ``compare.pool``): ``{"baselines": 0, "matched_on": ...}`` when none is
        left; else the latency ratio to their median, the pool (how many, spread, age, what it
        left out) and how they match, and (greedy) whether the answer equals the latest one's.
        ``done`` is the run's final event (its stats and texts)."""
        if done is None or not finished(run):
            return None
        lm = self._models.get(run["model"])
        if pair is not None:
            out = {"baselines": 1, "pair": True, "matched_on": "this comparison's own baseline run, just before",
                   "ratio": done.stats.wall_s / pair.stats.wall_s}
            base_answer, base_flops = pair.answer_text, [pair.stats.flops] if pair.stats.flops else []
            out["base_reasoning"] = pair.stats.reasoning_tokens
            base_ids = lambda: pair.reasoning_ids + pair.answer_ids
        else:
            mine = {"visitor": run.get("visitor")} if self.public.on else {}  # a shared studio: the visitor's own
            logged = self.log.runs(limit=200, method="baseline", prompt_hash=run["prompt_hash"], model=run["model"],
                                   **mine)
            peers = self.log.runs(limit=200, method="baseline", model=run["model"], **mine)  # the flag's: any prompt
            judged = {r["id"]: r for r in [*peers, *logged]}.values()  # each run once (most are in both)
            rows, pooled = pool(matching_baselines(run, logged), slow_runs(judged), run_time(run))
            out = {"baselines": len(rows), "matched_on": matched_on(run), "pool": pooled}
            if not rows:
                return out
            out["ratio"] = done.stats.wall_s / statistics.median(r["wall_s"] for r in rows)
            base_answer, base_flops = rows[0]["answer_text"], [r["flops"] for r in rows if r.get("flops")]
            thought = [r["reasoning_tokens"] for r in rows if r.get("reasoning_tokens") is not None]
            if thought:  # what the matching baselines reasoned (an early exit's tokens saved are against it)
                out["base_reasoning"] = statistics.median(thought)
            base_ids = lambda: [e.token_id for e in self.log.events(rows[0]["id"])
                                if e.kind == "token" and e.stream in ("reasoning", "answer")]
        out["identical"] = done.answer_text == base_answer if cfg.greedy else None
        if done.stats.flops and base_flops:
            out["flops_ratio"] = done.stats.flops / statistics.median(base_flops)
        exited = is_lossy(run["method"]) and done.stats.exit.at is not None  # it parts from baseline by design there
        if cfg.greedy and not exited and getattr(done, "reasoning_ids", None) is not None:  # token by token
            out["agreement"] = agreement(lm if isinstance(lm, StepModel) else None, run["prompt"], base_ids(),
                                         done.reasoning_ids + done.answer_ids)
        return out

    def _slow(self, row: dict, stats) -> str:
        """Why the run just finished (``row``: :func:`_live_row`, ``stats``: its RunStats) is flagged
        slow against the logged runs of its kind, as History flags runs (``compare.slow_runs``); "" when not."""
        peers = self.log.runs(limit=200, method=row["method"], model=row["model"])
        me = {**row, "id": -1, "wall_s": stats.wall_s, "forward_calls": stats.forward_calls}
        return slow_runs([*peers, me]).get(-1, "")

    def rsd_rule(self, model_name: str, cfg: RunConfig) -> str:
        """RSD's acceptance rule as run, and where each number came from."""
        tuned = recommended_settings(model_name or self.default_model)
        default = RunConfig()

        def source(field: str) -> str:
            value = getattr(cfg, field)
            if field in tuned and tuned[field] == value:
                return provenance(model_name or self.default_model, field) or "tuned for this model"
            if value == getattr(default, field):
                return "the released code's default" if field == "threshold" else "off"
            return "set here"

        rule = f"PRM score >= {cfg.threshold:g} ({source('threshold')})" if cfg.weighting == "binary" \
            else f"{cfg.weighting} weighting ({cfg.threshold:g}, {cfg.weight_param:g})"
        if cfg.draft_confidence:
            rule += f"; draft's least likely token >= {cfg.draft_confidence:g} ({source('draft_confidence')})"
        return rule

    def sweep(self, prompt: str, model_name: str = "", start: int = 0, stop: int = 200, step: int = 20,
              job: Job | None = None, **settings) -> Iterator[tuple[str, object]]:
        """Run baseline once, then SSR at draft starts ``start, start + step, ... <= stop``; yield
        (status HTML, chart) after each run. Every run is logged like any other; a cancelled ``job``
        stops at once (the run in flight logged ``cancelled``), keeping the finished points."""
        job = job or Job(None, None)
        try:
            if not prompt or not prompt.strip():
                raise ValueError("type a prompt first")
            start, stop, step = (number(n, v, whole=True) for n, v in (("from", start), ("to", stop), ("step", step)))
            if step < 1 or start < 0 or stop < start:
                raise ValueError(f"sweep range {start}..{stop} step {step} is empty or negative")
            starts = list(range(int(start), int(stop) + 1, int(step)))
            if len(starts) > 50:
                raise ValueError(f"{len(starts)} draft starts is too many for one sweep (at most 50)")
            configs = [self.config(model_name, **{**settings, "draft_start": d}).check_ssr() for d in starts]
            name = (model_name or self.default_model).strip()
            yield load_html(f"sweep of {len(starts)} draft starts: loading {name}…"), None
            for status in self.loading(model_name, runtime=self.runtime):
                yield load_html(f"loading {name}… {status}"), None
            lm = self.model(model_name, self.runtime)
            lm.require_markers()  # SSR on a model that does not reason: refused before the baseline runs
            ticket = yield from self.in_line(job, lambda words: (html_note(words), None))
            if not ticket.held:
                yield html_note("sweep stopped while in line for the model: nothing ran"), None
                return
            try:
                if not (self.is_warm(lm, "baseline", configs[0]) and self.is_warm(lm, "ssr", configs[0])):
                    yield html_note("sweep: warming up baseline and SSR once (untimed, not logged)…"), None
                self.warm(lm, "baseline", configs[0])
                self.warm(lm, "ssr", configs[0], evidence=self.evidence(job, lm))
                yield html_note(f"sweep: the baseline run (1 of {len(starts) + 1} runs)…"), None
                base = TraceView()
                for _ in self._stream(lm, prompt, BASELINE, configs[0], base, job=job, last=False):
                    pass
                points, view = [], base
                for k, (d, cfg) in enumerate(zip(starts, configs, strict=True), 1):
                    if job.cancelled or base.stats is None:
                        break
                    yield (html_note(f"sweep: point {k} of {len(starts)} (draft start {d}) running; "
                                     f"{k - 1} done…"), charts.sweep_chart(points) if points else None)
                    view = TraceView()
                    for _ in self._stream(lm, prompt, "SSR", cfg, view, job=job, last=d == starts[-1]):
                        pass
                    if view.phase == "stopped":  # a run that finished before the stop still counts
                        break
                    s = view.stats
                    points.append({"draft_start": d, "ratio": s.wall_s / base.stats.wall_s, "accepted": s.accepted,
                                   "recovered": s.recovered})
                    yield (f'<div class="metrics">sweep: {len(points)} of {len(starts)} points done</div>',
                           charts.sweep_chart(points))
            finally:
                self.line.release(ticket)
            if job.cancelled:
                in_flight = " (the run in flight is logged as cancelled)" if view.phase == "stopped" else ""
                yield ((f'<div class="metrics">sweep stopped after {len(points)} of {len(starts)} draft '
                       f'starts{in_flight}. {esc(sweep_summary(points))}</div>'), charts.sweep_chart(points))
            elif points:
                yield (f'<div class="metrics">sweep done: {esc(sweep_summary(points))}</div>',
                       charts.sweep_chart(points))
        except (ValueError, ModelLoadError, SSRUnsupportedError, BackendError) as err:
            yield error_html(str(err)), None

def load_html(message: str) -> str:
    """A model load's line for the strip: a moving bar (how long a load takes is not known before it
    ends) and ``message``, its stage as :meth:`ssr_ui.shelf.ModelShelf.loading` reports it."""
    return f'<div class="metrics status loading"><span class="load-bar"><span></span></span>{esc(message)}</div>'


def compare_repeats(value) -> int:
    """How many rounds a Compare runs: a whole number in 1..:data:`MAX_REPEATS`; ValueError naming the field."""
    n = number(REPEATS_FIELD, value, whole=True)
    if not 1 <= n <= MAX_REPEATS:
        raise ValueError(f"{REPEATS_FIELD} must be a whole number in 1..{MAX_REPEATS}; got {n}")
    return int(n)


@dataclasses.dataclass
class Trials:
    """A Compare's rounds so far: each run's ratios to its round's own baseline run, and why a run
    of each kind was flagged slow (the latest round's)."""

    round: int = 0
    ratios: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    slow: dict[str, str] = dataclasses.field(default_factory=dict)


def _judge_pair(compare: dict, name: str, view: TraceView, trials: Trials) -> dict | None:
    """A Compare's run against its round's own baseline run: None (no ratio, no verdict) where it did
    baseline's work, an SSR-family run that forked no draft and verified no proposal (its
    RunStats.drafts and .verifies: a time that differs from baseline's by noise alone), and
    ``view.notice`` says so; else the ratio is the median of its rounds' pair ratios, and
    ``matched_on`` says their spread and which of the pair was flagged slow (``compare.slow_runs``)."""
    s = view.done.stats
    if method_of(view.method).ssr_loop and not s.drafts and not s.verifies:
        view.notice = view.notice or (
            f"same work as baseline: {name} forked no draft and verified no proposal, so it ran baseline's steps "
            f"and its time differs from baseline's by noise alone (no speed verdict)"
            + (f"; drafting: {s.drafting}" if s.drafting else ""))
        return None
    ratios = trials.ratios.setdefault(name, [])
    ratios.append(compare["ratio"])
    words = ["this comparison's own baseline run, just before"]
    if len(ratios) > 1:
        compare["ratio"] = statistics.median(ratios)
        words = [(f"median of this comparison's {len(ratios)} rounds, each against its own baseline run "
                  f"({min(ratios):.2f}-{max(ratios):.2f}x)")]
    flagged = {f"this {name}": trials.slow.get(name), "the baseline": trials.slow.get(BASELINE)}
    words += [f"{who} run {why}" for who, why in flagged.items() if why]
    compare["matched_on"] = "; ".join(words)
    return compare


def _loading(message: str) -> Frame:
    """Empty panes and a model load's line in the strip (:func:`load_html`)."""
    return Frame.of(TraceView(), load_html(message))


def sweep_summary(points: list[dict]) -> str:
    """A sweep's outcome in a sentence: the best draft start, its ratio, and the spread of all
    points (one run each: their spread is what a single point's noise can look like)."""
    if not points:
        return "no draft start finished"
    best = min(points, key=lambda p: p["ratio"])
    ratios = [p["ratio"] for p in points]
    spread = (f"; the {len(points)} points ranged {min(ratios):.2f}-{max(ratios):.2f}x, one run each (a difference "
              "within that range may be noise: repeat with the Benchmark tab)") if len(points) > 1 else ""
    verdict = "faster than" if best["ratio"] < 1 else "no faster than"
    return (f"best draft start {best['draft_start']}: {best['ratio']:.2f}x baseline's latency ({verdict} baseline)"
            f"{spread}")


def continued(on: bool, history: str, prompt: str, view: TraceView | None) -> tuple[str, str]:
    """The studio's conversation after a run, as (the next run's ``history``, as JSON; its HTML): while
    ``on`` ("Continue the conversation"), the earlier turns and, when the run finished, its question and
    answer (the reasoning as the answer's ``reasoning_content``, up to its end-of-thinking marker: the
    template decides whether a later turn sees it); off, no conversation."""
    if not on:
        return "", ""
    turns = list(check_history(history)) if history else []
    if view is not None and view.phase == "done":
        reasoning = "".join(t.text for t in view.reasoning)
        if view.think_end and view.think_end in reasoning:
            reasoning = reasoning[: reasoning.rfind(view.think_end)]
        turns += [{"role": "user", "content": prompt}, {"role": "assistant", "reasoning_content": reasoning.strip(),
                                                        "content": "".join(t.text for t in view.answer).strip()}]
    shown = "".join(f'<div class="turn"><b>{esc(m["role"])}</b>: {esc(m["content"])}</div>' for m in turns)
    return (json.dumps(turns), f'<div id="conversation-turns">{shown}</div>') if turns else ("", "")


def compare_shows(runs: dict[str, Frame]) -> str:
    """Which of a Compare's runs its panes show first: SSR, else the last that ran (not a skipped one)."""
    ran = [name for name, frame in runs.items() if frame.view is None or frame.view.phase != "skipped"]
    return COMPARE_SHOWS if COMPARE_SHOWS in ran else (ran or list(runs))[-1]


@contextlib.contextmanager
def _field(name: str) -> Iterator[None]:
    """A model that will not load, named by the field that asked for it ("Process reward model
    (prm): model folder 'nope' does not exist ...")."""
    try:
        yield
    except ModelLoadError as err:
        raise ModelLoadError(f"{name}: {err}") from None


def _device(lm) -> str:
    """Where a model runs, as the run log records it: "cpu", "cuda:0", or its server's URL."""
    return getattr(lm, "backend", str(lm.device))


def _live_row(view: TraceView, method: str, lm, prompt: str, cfg: RunConfig, visitor: str | None = None) -> dict:
    """The runs-table row a run just streamed into ``view`` is logged as, as far as comparing it
    needs (``engine.runlog.compare.match_key``, and whose run it is); ``ok`` only when it reached its
    final event."""
    return {"method": method, "visitor": visitor, "status": "ok" if view.done is not None and view.phase == "done" else "cancelled",
            "prompt": prompt, "prompt_hash": prompt_hash(prompt), "model": lm.model_id,
            "dtype": getattr(lm, "dtype", None), "device": _device(lm), "config": cfg.to_dict(),
            "step_mode": view.stats.step_mode if view.stats else ""}


def _dtypes(lm: LoadedModel, rsd: dict) -> str:
    """The precision of each model a run uses: "float32", or "target bfloat16 · draft float32 · PRM ..."."""
    prm = getattr(rsd.get("scorer"), "lm", None)
    if not rsd:
        return lm.dtype
    return " · ".join(f"{who} {m.dtype}" for who, m in (("target", lm), ("draft", rsd.get("draft")), ("PRM", prm))
                      if m is not None)


def _think_end(lm: LoadedModel) -> str | None:
    return lm.markers.close_text if lm.markers else None


def _thinking(lm: LoadedModel) -> str | None:
    """How ``lm`` reasons, as the panes and the strip say it (``TraceView.thinking``): None (an
    end-of-thinking token), "prompted" (a chat model asked to reason, ``</think>`` as text) or
    "none" (no markers: a base model, whose whole output is the answer)."""
    if lm.markers is None:
        return "none"
    return "prompted" if lm.markers.prompted else None

