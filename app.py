"""Launch the SSR Studio.

    python app.py [--model NAME_OR_PATH] [--draft-model NAME] [--prm NAME] [--host 127.0.0.1]
                  [--port 7860] [--share] [--db runs.db] [--device cuda|mps|cpu]

With no flags it runs offline on the bundled tiny models. Nothing heavy happens at import:
the model loads on the first run and stays cached.
"""

from __future__ import annotations

import argparse
import os
import sys

from starlette.middleware import Middleware

from engine.remote.model import check_backend
from engine.remote.speculation import SPECULATIONS
from engine.runlog import RunLogError
from engine.runtime.compiled import COMPILE_MODES
from ssr_ui.export import MAX_TRACE_BYTES
from ssr_ui.handlers import DEFAULT_DRAFT, DEFAULT_PRM, LOAD_TIMEOUT_S, MAX_RUN_S, Studio
from ssr_ui.jobs import CancelRoute
from ssr_ui.layout import build_app
from ssr_ui.render import CSS


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
    ap.add_argument("--load-timeout", type=float, default=LOAD_TIMEOUT_S, help="seconds before a model load is given up")
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
    ap.add_argument("--max-run-seconds", type=float, default=MAX_RUN_S, help="a run still going after this is stopped")
    ap.add_argument("--max-cache-gb", type=float, default=None, help="refuse a run whose KV cache would take more "
                    "(a Space's guard; the memory available is always checked)")
    return ap.parse_args(argv)


def servers(args: argparse.Namespace) -> dict:
    """The models given a vLLM server, by name: what ``engine.remote.model.connect`` needs."""
    return {name: {"base_url": url, "api_key": args.api_key, "served_name": served, "speculation": speculation}
            for name, url, served, speculation in (
                (args.model, args.base_url, args.served_model, args.server_speculation),
                (args.draft_model, args.draft_base_url, args.draft_served_model, None),
                (args.prm, args.prm_base_url, args.prm_served_model, None)) if url}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        check_backend(args.backend, args.base_url)
        if args.server_speculation and not args.base_url:
            raise ValueError("--server-speculation describes the --base-url server: give --base-url too")
        studio = Studio(args.model, args.db, args.device, args.draft_model, args.prm, args.load_timeout,
                        args.max_run_seconds, args.compile, servers(args), args.max_cache_gb)
    except (ValueError, RunLogError) as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    demo = build_app(studio)
    demo.queue(default_concurrency_limit=1).launch(
        server_name=args.host, server_port=args.port, share=args.share, css=CSS, max_file_size=MAX_TRACE_BYTES,
        app_kwargs={"middleware": [Middleware(CancelRoute, jobs=studio.jobs)]})  # per-job cancel (ssr_ui/jobs.py)


if __name__ == "__main__":
    main()
