"""Measure what the studio costs a run: tokens/s through the UI handler vs the engine alone.

    python -m ssr_ui.tools.overhead --prompts classes.jsonl --repeat 3 [--model tiny-reasoner] [--method ssr]

For each prompt and repeat, the same run is made twice, interleaved: once consumed by nothing
but ``list()`` (the engine alone), once through :meth:`Studio.run`, which folds every event into
the trace view, renders the panes at the throttled rate and writes the run log, exactly as the
app does. Each run's own ``tokens_per_s`` (wall time measured by the engine, consumer time
included) is compared; the median ratio is printed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from engine.benchmarks.problems import Source, load_problems
from engine.registry import decoder
from ssr_ui.handlers import METHOD_NAMES, Studio


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m ssr_ui.tools.overhead", description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--model", default="tiny-reasoner")
    ap.add_argument("--method", default="SSR", choices=["Baseline", "SSR"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    studio = Studio(args.model, db=str(Path(tempfile.mkdtemp()) / "runs.db"))
    lm = studio.model(args.model)
    cfg = studio.config(args.model)
    decode = decoder(METHOD_NAMES[args.method], lm)
    prompts = load_problems(Source(args.prompts))
    list(decode(prompts[0].prompt, cfg))  # warm-up, untimed
    ratios = []
    for prompt in prompts:
        for _ in range(args.repeat):
            alone = list(decode(prompt.prompt, cfg))[-1].stats.tokens_per_s
            list(studio.run(prompt.prompt, args.method, args.model))
            through_ui = studio.history(limit=1)[0]["tokens_per_s"]
            ratios.append(through_ui / alone)
            print(f"{prompt.id}: engine {alone:.1f} tok/s, studio {through_ui:.1f} tok/s, "
                  f"ratio {through_ui / alone:.3f}", flush=True)
    print(f"median tokens/s ratio, studio / engine alone: {statistics.median(ratios):.3f} over {len(ratios)} pairs")


if __name__ == "__main__":
    main()
