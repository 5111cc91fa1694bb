"""The benchmark loop the bench CLI and the studio's Benchmark tab share: on every problem and
repeat the methods run one after another (baseline first, so agreement can grade the others), so
ratios hold on a noisy machine; every run is logged with its dataset and grade (a result carries
its log id, ``run_id``). A warm-up runs each method once on the first problem, unlogged, before
anything is timed (warm-up is not a measurement): both callers run it the same way
(:meth:`Bench.warm_up`). ``watch`` sees every event of every run (warm-up included) as it comes:
the CLI's live "tokens so far". :meth:`Bench.history` is the log's earlier runs of the model, the
steady time per forward a benchmark's verdicts are judged against (``engine.benchmarks.summary``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from engine.benchmarks.agreement import agreement
from engine.benchmarks.grading import Grader
from engine.benchmarks.problems import Problem
from engine.config import RunConfig
from engine.events import DoneEvent, Event
from engine.methods.seams import StepModel
from engine.registry import decoder, is_lossy, method_of, writes_steps
from engine.runlog import RunLog, RunMeta, prompt_hash

ARM = "@"  # "baseline@float32": a method run on another of ``Bench.models`` than the target (the bench's --vs-dtype)


def arm(method: str) -> tuple[str, str]:
    """``(method, models key)`` of a bench arm: "baseline@float32" -> ("baseline", "float32"); a plain
    method runs on the target."""
    name, _, key = method.partition(ARM)
    return name, key or "target"


# the studio wraps each run's events (its job's claim on the run's end): (events, last run) -> events
Wrap = Callable[[Iterable, bool], Iterable]
# sees each event as it comes: (the run's label, e.g. "a r0 hf" or "a warm-up hf", event); it must be quick
Watch = Callable[[str, Event], None]


@dataclass
class Bench:
    """``models``: ``target`` (and RSD's ``draft``, ``scorer``, ``prm_name``); ``dataset``: the
    label runs are logged under; ``origin``: "bench" or "app"; ``visitor``: whose runs they are on a
    shared studio (``RunMeta.visitor``)."""

    models: dict
    methods: list[str]
    cfg: RunConfig
    configs: dict[str, RunConfig] = field(default_factory=dict)  # a method's own settings, where not ``cfg``
    grader: Grader = field(default_factory=Grader)
    log: RunLog | None = None
    dataset: str | None = None
    origin: str = "bench"
    watch: Watch | None = None
    visitor: str | None = None

    def __post_init__(self) -> None:
        self.methods = sorted(dict.fromkeys(self.methods), key=lambda m: m != "baseline")

    def total(self, problems: list[Problem], repeat: int) -> int:
        return len(problems) * repeat * len(self.methods)

    def warm_up(self, problem: Problem, stop: Callable[[], bool] | None = None) -> bool:
        """Each method once on ``problem``, unlogged and untimed (compiles, caches, first-call costs,
        the allocations of a full-length run); False when ``stop()`` turned true first."""
        for m in self.methods:  # SSR's drafts as planned: a warm-up's costs are no measure of what drafts are worth
            events = self._decode(m)(problem.prompt, self.config(m).replace(drafting="always"))
            try:
                for ev in events:
                    if self.watch is not None:
                        self.watch(f"{problem.id} warm-up {m}", ev)
                    if stop is not None and stop():
                        return False
            finally:
                getattr(events, "close", lambda: None)()
        return True

    def history(self, limit: int = 200) -> list[dict]:
        """The log's latest runs of the target model (none without a log), read before the timed
        runs: what its steady time per forward was (``summary.slow_bench_runs``)."""
        return self.log.runs(limit=limit, model=self.models["target"].model_id) if self.log else []

    def config(self, method: str) -> RunConfig:
        """The settings ``method`` runs with."""
        return self.configs.get(method, self.cfg)

    def _decode(self, method: str):
        m = self.models
        name, key = arm(method)
        return decoder(name, m[key], m.get("draft"), m.get("scorer"), m.get("evidence"))

    def runs(self, problems: list[Problem], repeat: int = 1, stop: Callable[[], bool] | None = None,
             wrap: Wrap | None = None) -> Iterator[dict]:
        """Every run's result, as it finishes; stops (the run in flight logged ``cancelled``, not
        yielded) when ``stop()`` turns true."""
        last = (len(problems) - 1, repeat - 1, self.methods[-1])
        for i, problem in enumerate(problems):
            for rep in range(repeat):
                batch: list[dict] = []
                base = None
                for m in self.methods:
                    run = self.run_one(m, problem, rep, base, stop, wrap, last=(i, rep, m) == last)
                    if run is None:
                        return
                    base = run["answer_text"] if m == "baseline" else base
                    batch.append(run)
                if self.cfg.greedy and isinstance(self.models["target"], StepModel):  # agreement reads logits here (in process)
                    add_agreement(self.models["target"], problem.prompt, batch, self.cfg.max_think)
                yield from batch

    def run_one(self, method: str, problem: Problem, repeat: int, baseline_answer: str | None = None,
                stop: Callable[[], bool] | None = None, wrap: Wrap | None = None, last: bool = True) -> dict | None:
        name, key = arm(method)
        models, lm = self.models, self.models[key]
        used = method_of(name).uses

        graded: dict[str, bool | None] = {}  # the log's grade and the result's: graded once

        def grade(answer: str) -> bool | None:
            if answer not in graded:
                graded[answer] = self.grader.grade(problem, method, answer, baseline_answer)
            return graded[answer]

        meta = RunMeta(name, lm.model_id, problem.prompt, self.config(method).to_dict(), prompt_id=problem.id, grade=grade,
                       draft_model=models["draft"].model_id if "draft" in used else None,
                       prm=models.get("prm_name") if "prm" in used else None, reference=problem.reference,
                       origin=self.origin, visitor=self.visitor, device=getattr(lm, "backend", str(lm.device)), dtype=lm.dtype,
                       think_end=lm.markers.close_text if lm.markers else None,
                       dataset=self.dataset)
        stream = self._decode(method)(problem.prompt, self.config(method))
        if wrap is not None:
            stream = wrap(stream, last)
        events = self.log.record(stream, meta) if self.log else iter(stream)
        done: DoneEvent | None = None
        try:
            for ev in events:
                if self.watch is not None:
                    self.watch(f"{problem.id} r{repeat} {method}", ev)
                if isinstance(ev, DoneEvent):
                    done = ev
                elif stop is not None and stop():
                    break
        finally:
            getattr(events, "close", lambda: None)()  # a stop logs the run in flight as cancelled
        if done is None:
            return None
        stats = done.stats.to_dict()  # every RunStats field, named as in the runs table
        run = {"prompt_id": problem.id, "repeat": repeat, "latency_s": stats["wall_s"], **stats, "method": method,
               "model": lm.model_id, "device": meta.device, "dtype": meta.dtype, "config": meta.config,
               "run_id": self._logged_id(meta),
               "dataset": self.dataset, "task": problem.task, "graded_by": self.grader.how(problem),
               "reference": problem.reference, "answer_text": done.answer_text, "answer_token_ids": done.answer_ids,
               "reasoning_token_ids": done.reasoning_ids}
        if (correct := grade(done.answer_text)) is not None:
            run["correct"] = correct
        return run

    def _logged_id(self, meta: RunMeta) -> int | None:
        """The log's id of the run just recorded under ``meta`` (its newest row of that method, model,
        prompt, dataset, origin and visitor: the benchmark holds the model, so no other run of those
        lands between), None without a log."""
        if self.log is None:
            return None
        keys = {"method": meta.method, "model": meta.model, "prompt_hash": prompt_hash(meta.prompt),
                "prompt_id": meta.prompt_id, "dataset": meta.dataset, "origin": meta.origin, "visitor": meta.visitor}
        newest = self.log.runs(limit=1, **{k: v for k, v in keys.items() if v is not None})
        return newest[0]["id"] if newest else None


def add_agreement(lm, prompt: str, batch: list[dict], max_think: int | None = None) -> None:
    """Greedy runs of one prompt: each single-model method's agreement with ``baseline`` ("identical",
    where it diverged and the top-2 logit margin there, or the budget or length difference it is
    instead), so numerics read as numerics."""
    base = next((r for r in batch if r["method"] == "baseline"), None)
    if base is None:
        return
    base_ids = base["reasoning_token_ids"] + base["answer_token_ids"]
    for r in batch:
        if is_lossy(r["method"]) and r.get("exit_at") is not None:  # it stopped reasoning early by design
            r.update(agreement=f"early exit: reasoning stopped at token {r['exit_at']} (lossy by design)",
                     agreement_kind="exit", diverged_at=None, margin=None)
        elif not writes_steps(r["method"]) and r["method"] != "baseline":  # a method writing tokens, not steps
            a = agreement(lm, prompt, base_ids, r["reasoning_token_ids"] + r["answer_token_ids"], max_think, r["method"])
            r.update(agreement=str(a), agreement_kind=a.kind, diverged_at=a.diverged_at, margin=a.margin)
