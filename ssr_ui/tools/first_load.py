"""First load: where the time goes between starting the studio on a model and its first run's clock.

    python -m ssr_ui.tools.first_load --model smollm2-135m-instruct [--methods ssr] [--launches 2]
        [--runs 1] [--cache DIR] [--json out.json]

Each launch is a fresh Python process that does what the studio does on its first run: it imports
the engine, loads the model through the studio's own shelf (``ssr_ui.shelf.ModelShelf``: a GGUF
file's conversion, reading the weights, the capability probe or its cached result), warms up each
method of the run once (untimed, as every first run of a kind is), then runs the first run itself
at the model's recommended settings. Each stage is timed from the load's own status messages, so
what is measured is the studio's path, not a copy of it. The first launch starts from an empty
cache (a fresh temporary one unless ``--cache`` names one): what a new user waits for; later
launches keep that cache: what they wait for on every later start. ``--runs N`` runs the first run
N times: the first against the median of the rest says whether the warm-up left a first-run cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _child(model: str, methods: list[str], prompt: str, spawned: float, runs: int) -> None:
    """One launch, in this process (started at ``spawned``, epoch seconds): print one JSON line of
    stages (name, seconds)."""
    from engine.registry import decoder
    from engine.wiring import run_config
    from ssr_ui.shelf import ModelShelf

    started = spawned
    stages: list[list] = [["python and imports (torch, transformers, the engine)", time.time() - started]]
    shelf = ModelShelf(model, "tiny-prm", None, 3600)
    last, since = None, time.time()
    for status in shelf.loading(model, poll_s=0.02):  # "12 s · <the load's latest message>"
        message = status.split(" · ", 1)[1] if " · " in status else "starting the load"
        if message != last:
            if last is not None:
                stages.append([last, time.time() - since])
            last, since = message, time.time()
    lm = shelf.model(model)
    if last is not None:  # the load's last word: how it ended ("loaded; capabilities ...")
        stages.append([last, time.time() - since])
    cfg = run_config(model, {})
    for method in methods:
        since = time.time()
        shelf.warm(lm, method, cfg)
        stages.append([f"warm-up of {method} (untimed in the studio)", time.time() - since])
    waited = time.time() - started
    seconds, stats = [], None
    for _ in range(runs):  # the first run, then (runs > 1) the same again: was the warm-up enough?
        since = time.time()
        for event in decoder(methods[0], lm)(prompt, cfg):
            stats = getattr(event, "stats", None) or stats
        seconds.append(time.time() - since)
    print(json.dumps({"stages": stages, "waited": waited, "first_run": seconds[0], "method": methods[0],
                      "steady": statistics.median(seconds[1:]) if runs > 1 else None,
                      "tokens": None if stats is None else stats.reasoning_tokens + stats.answer_tokens,
                      "status": last or ""}), flush=True)


def launch(model: str, methods: list[str], cache: Path, prompt: str, runs: int = 1) -> dict:
    """One fresh process's stages, with the cache ``cache`` (``$SSR_STUDIO_CACHE``)."""
    env = dict(os.environ, SSR_STUDIO_CACHE=str(cache))
    started = time.time()
    out = subprocess.run([sys.executable, "-m", "ssr_ui.tools.first_load", "--child", str(started), "--model", model,
                          "--methods", ",".join(methods), "--prompt", prompt, "--runs", str(runs)],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the launch failed:\n{out.stderr[-2000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process"], result["runs"] = time.time() - started, runs
    return result


def describe(i: int, result: dict) -> str:
    """Launch ``i`` (from 1; the first started from an empty cache): its stages, one a line."""
    kind = "empty cache: a new user" if i == 1 else "cache kept: a later start"
    lines = [f"launch {i} ({kind})"]
    lines += [f"  {seconds:7.2f} s  {name}" for name, seconds in result["stages"]]
    lines.append(f"  {result['waited']:7.2f} s  in all: the load and the warm-ups, before the first run")
    lines.append(f"  {result['first_run']:7.2f} s  the first run itself ({result['method']}, {result['tokens']} tokens)")
    if result.get("steady"):
        lines.append(f"  {result['steady']:7.2f} s  the same run again, median of {result['runs'] - 1}: the first took "
                     f"{result['first_run'] / result['steady']:.2f}x (above ~1.05: the warm-up left a first-run cost)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-reasoner")
    ap.add_argument("--methods", default="ssr", help="the first run's method first, then any others it warms "
                                                      "(a Compare: baseline,ssr-lookups,ssr,ssr-exit)")
    ap.add_argument("--launches", type=int, default=2)
    ap.add_argument("--runs", type=int, default=1, help="run the first run this many times (more than 1: the first "
                                                        "against the median of the rest, whether the warm-up was enough)")
    ap.add_argument("--cache", type=Path, help="the cache to start from (default: a fresh, empty one)")
    ap.add_argument("--prompt", default="What is 12 plus 30? Answer briefly.")
    ap.add_argument("--json", type=Path, help="write the launches' stages here")
    ap.add_argument("--child", type=float, help=argparse.SUPPRESS)  # one launch, spawned at this epoch time
    args = ap.parse_args(argv)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    from engine.registry import methods as registered  # (a draft's or a PRM's first load is not measured here)

    known = tuple(m.name for m in registered() if not m.uses)
    if not methods or any(m not in known for m in methods):
        ap.error(f"--methods: one or more of {', '.join(known)} (the first is the first run's), not {args.methods!r}")
    if args.launches < 1 or args.runs < 1:
        ap.error("--launches and --runs must be at least 1")
    if args.child is not None:
        _child(args.model, methods, args.prompt, args.child, args.runs)
        return 0
    with tempfile.TemporaryDirectory(prefix="first-load-") as tmp:
        cache = args.cache or Path(tmp)
        launches = []
        for i in range(args.launches):
            launches.append(launch(args.model, methods, cache, args.prompt, args.runs))
            print(describe(i + 1, launches[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"model": args.model, "methods": methods, "launches": launches}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
