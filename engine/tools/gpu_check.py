"""The GPU check a GPU owner runs in one command (it runs on a CPU too, smaller, for CI).

    python -m engine.tools.gpu_check [--device cuda] [--out gpu_check.json] [--prompts 5] [--tokens 512]
                               [--bandwidth-gbs 4800]

On CUDA it builds the ``qwen3-4b`` preset's architecture with random weights in bf16 (36 layers,
hidden 2560, 32 query / 8 KV heads of 128, MLP 9728, its 151,936-token vocabulary; meaningless
text, real costs; ``engine.runtime.model.random_weights_model``); on the CPU a 4-layer model of the same
family in float32 with the bundled vocabulary. It prints, and writes as JSON:

Speed (the GPU-grade decoding issue):

* ``speed.ms_per_token``: plain decoding (ours), ``generate()`` and ``generate()`` with the static
  cache, and ``bandwidth_limit_ms`` (the weights' bytes over ``--bandwidth-gbs``, H200 by default);
* ``speed.step_2rows_over_1row``: a one-token step of two rows (a draft riding) over one row, and
  ``speed.step_with_draft_row``: the same ratio from SSR runs' own step times;
* ``speed.verify32_over_step1``: a 32-token forward over a 1-token forward at the same length;
* ``speed.step_mode`` and ``speed.compile_s``: compiled steps or the eager static path
  (``--compile``, auto: compiled on CUDA), and the compile time, spent before anything is timed;
* ``bundled``: the bundled ``tiny-reasoner`` on this device, held-out ``classes`` prompts: SSR and
  prompt-lookup ``generate()`` latency over plain decoding, and how many answers are identical;
* ``compiled_vs_eager`` (with ``--vs-eager``): the bundled model's plain decoding with compiled
  steps over the eager static path, at short budgets and at its tuned ones.

Numerics (the exact-mode issue), for the fast path and for exact mode (``engine.runtime.exact``):

* ``rows_max_abs_diff``: row 0's logits beside 1 and 2 other rows vs alone (0 means bitwise equal);
* ``width_max_abs_diff``: a token fed alone vs at every offset of a 4-, 16- and 32-token window;
* ``agreement``: greedy SSR vs plain decoding on ``--prompts`` prompts of ``--tokens`` reasoning
  tokens: how many identical, and where the others diverged with the top-2 logit margin there;
* ``seconds_per_token``: plain decoding, fast vs exact, and their ratio (exact mode's cost).

Exact mode has two routes (``--exact-routes``; both on CUDA, the per-row reference alone on a CPU,
where the fixed route's padded steps cost what 256 tokens cost): ``exact`` is the per-row route
(``engine.runtime.exact``), ``exact_fixed`` the fixed-shape route (``engine.runtime.fixed``), each
with the same invariance and agreement figures, and ``exact_cost_per_token`` /
``exact_fixed_cost_per_token`` over the fast path.

GPU figures not measured on a GPU are written as such in docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.benchmarks.agreement import agreement
from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from engine.presets import BUNDLED_DIR, recommended_settings
from engine.registry import decoder
from engine.runtime.cache import crop, take_rows
from engine.runtime.compiled import COMPILE_MODES
from engine.runtime.exact import beside
from engine.runtime.exact import invariance as exact_invariance
from engine.runtime.model import (
    LoadedModel,
    load_model,
    pick_device,
    random_weights_model,
)
from engine.tools.synthetic import EVAL_SEED_BASE, make_example

SMALL = dict(num_hidden_layers=4, hidden_size=128, intermediate_size=384, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)
PROMPTS = ["Write a Python class Garden. Fields: rose, tulip, daisy.", "Start with 12, then add 30. What is it?",
           "Explain why the sky is blue, step by step.", "List three prime numbers and their squares.",
           "Convert 3 hours 20 minutes into minutes."]


def random_model(device: torch.device) -> LoadedModel:
    """The qwen3-4b preset with random weights on CUDA; a small model of its family on the CPU."""
    if device.type == "cuda":
        return random_weights_model("qwen3-4b", str(device))
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(BUNDLED_DIR / "tiny-reasoner"))
    return random_weights_model("qwen3-4b", str(device), vocab_size=vocab, tie_word_embeddings=False, **SMALL)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_s(fn, device: torch.device, repeat: int = 10) -> float:
    times = []
    for _ in range(repeat):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def speed(lm: LoadedModel, prompts: list[str], tokens: int, bandwidth_gbs: float, compile: str = "auto") -> dict:
    """Per-token cost of plain decoding against generate() (plain and static cache) and the
    bandwidth bound; what a draft row and a 32-token verify add to a step (on the steps
    ``compile`` picks: compiled, or the eager static path)."""
    cfg = RunConfig(max_think=tokens, max_answer=8, draft_start=min(16, tokens - 1), max_draft=64, compile=compile)
    per_token = {}
    for method in ("baseline", "hf", "hf-static"):
        run = decoder(method, lm)
        list(run(prompts[0], cfg))  # warm-up (and, for hf-static on a GPU, its compilation)
        done = [list(run(p, cfg))[-1] for p in prompts]
        per_token[method] = statistics.median(d.stats.wall_s / max(1, d.stats.reasoning_tokens + d.stats.answer_tokens)
                                              for d in done) * 1e3
    weight_bytes = sum(p.numel() * p.element_size() for p in lm.model.parameters())
    ssr = [list(decode_ssr(lm, p, cfg))[-1].stats for p in prompts]
    ratios = [s.step_s_drafting / s.step_s_alone for s in ssr if s.step_s_drafting and s.step_s_alone]
    ids = lm.prompt_ids(" ".join(PROMPTS))[:64]
    lm.begin_run(compile=compile)
    for _ in lm.prepare_steps(128, rows=2):
        pass
    caches = {rows: lm.new_cache(128, rows, role=f"{rows} rows") for rows in (1, 2)}
    for rows, cache in caches.items():
        lm.step_logits(ids[:32], cache, 0)
        take_rows(cache, [0] * rows)

    def step(rows: int, width: int):  # a step at 32 tokens, then rolled back to them
        lm.forward(torch.tensor([ids[32 : 32 + width]] * rows, device=lm.device), caches[rows], 32)
        crop(caches[rows], 32)

    one = _median_s(lambda: step(1, 1), lm.device)
    return {"ms_per_token": per_token, "baseline_over_hf_static_tokens_per_s": per_token["hf-static"] / per_token["baseline"],
            "weights_gb": weight_bytes / 1e9, "bandwidth_limit_ms": weight_bytes / (bandwidth_gbs * 1e9) * 1e3,
            "step_with_draft_row": statistics.median(ratios) if ratios else None,
            "step_2rows_over_1row": _median_s(lambda: step(2, 1), lm.device) / one,
            "verify32_over_step1": _median_s(lambda: step(1, 32), lm.device) / one,
            "step_mode": lm.step_mode, "compile_s": lm.compile_seconds}


def bundled(device: torch.device, n: int, compile: str = "auto") -> dict:
    """The bundled tiny-reasoner on this device, held-out classes prompts, interleaved per prompt."""
    lm = load_model("tiny-reasoner", device=str(device))
    cfg = RunConfig(**recommended_settings("tiny-reasoner"), compile=compile)
    prompts = [make_example("classes", EVAL_SEED_BASE + i).prompt for i in range(n)]
    runs = {m: [] for m in ("baseline", "ssr", "hf-pld")}
    for m in runs:  # warm-up
        list(decoder(m, lm)(prompts[0], cfg))
    for p in prompts:
        for m, done in runs.items():
            done.append(list(decoder(m, lm)(p, cfg))[-1])
    ratio = {m: statistics.median(r.stats.wall_s / b.stats.wall_s
                                  for r, b in zip(runs[m], runs["baseline"], strict=True)) for m in ("ssr", "hf-pld")}
    same = sum(s.answer_ids == b.answer_ids for s, b in zip(runs["ssr"], runs["baseline"], strict=True))
    return {"prompts": n, "ssr_over_baseline": ratio["ssr"], "hf_pld_over_baseline": ratio["hf-pld"],
            "ssr_answers_identical": same, "step_mode": runs["ssr"][0].stats.step_mode, "compile_s": lm.compile_seconds}


def compiled_vs_eager(device: torch.device, n: int, budgets: dict[str, RunConfig] | None = None) -> dict:
    """The bundled tiny-reasoner's plain decoding, compiled steps over the eager static path
    (tokens per second, interleaved per prompt, median of per-prompt ratios), at short budgets and
    at its tuned ones (or ``budgets``, by name): compiled steps attend over the whole fixed
    capacity, so the budgets matter."""
    lm = load_model("tiny-reasoner", device=str(device))
    prompts = [make_example("classes", EVAL_SEED_BASE + 200 + i).prompt for i in range(n)]
    out = {}
    budgets = budgets or {"short (100 + 50)": RunConfig(max_think=100, max_answer=50),
                          "tuned": RunConfig(**recommended_settings("tiny-reasoner"))}
    for name, cfg in budgets.items():
        for mode in ("off", "on"):  # warm-up; "on" compiles here, before anything is timed
            list(decode_baseline(lm, prompts[0], cfg.replace(compile=mode)))
        rate = {p: [list(decode_baseline(lm, p, cfg.replace(compile=m)))[-1].stats.tokens_per_s
                    for m in ("off", "on")] for p in prompts}
        out[name] = {"compiled_over_eager_tokens_per_s": statistics.median(on / off for off, on in rate.values()),
                     "eager_tokens_per_s": statistics.median(off for off, _ in rate.values())}
    out["compile_s"], out["shapes"] = lm.compile_seconds, len(lm.compiled.shapes) if lm.compiled else 0
    return out


def logits_beside(lm: LoadedModel, rows: list[list[int]], prefix: list[int], exact: str | bool) -> torch.Tensor:
    """Logits ``[rows, T, V]`` (float32) of ``rows`` fed together after a shared ``prefix``, in a
    run with ``exact`` off or on (a route; exact mode's self-check runs first)."""
    lm.begin_run(exact)
    return beside(lm, prefix, rows).float()


def invariance(lm: LoadedModel, exact: str | bool) -> dict:
    """Largest logit difference of the same token across row counts and window widths: exact
    mode's own self-check (``engine.runtime.exact.invariance``), with the layer it first appears in."""
    inv = exact_invariance(lm, exact)
    return {"rows_max_abs_diff": inv.rows, "width_max_abs_diff": inv.widths, "first_differing_layer": inv.layer}


def agreements(lm: LoadedModel, prompts: list[str], tokens: int, exact: str | bool) -> dict:
    """Greedy SSR vs plain decoding on each prompt (exact mode off, or on that route); per-token
    seconds of plain decoding."""
    cfg = RunConfig(max_think=tokens, max_answer=32, draft_start=min(64, tokens - 1), max_draft=128,
                    exact=bool(exact), exact_route=exact or "auto")
    results, per_token = [], []
    for prompt in prompts:
        base = list(decode_baseline(lm, prompt, cfg))[-1]
        ssr = list(decode_ssr(lm, prompt, cfg))[-1]
        results.append(str(agreement(lm, prompt, base.reasoning_ids + base.answer_ids,
                                     ssr.reasoning_ids + ssr.answer_ids)))
        per_token.append(base.stats.wall_s / max(1, base.stats.reasoning_tokens + base.stats.answer_tokens))
    return {"identical": sum(r == "identical" for r in results), "of": len(results), "runs": results,
            "seconds_per_token": statistics.median(per_token)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=None, help="reasoning tokens per run (512 on CUDA, 48 on a CPU)")
    ap.add_argument("--bandwidth-gbs", type=float, default=4800.0, help="memory bandwidth for the bound (H200)")
    ap.add_argument("--bundled-prompts", type=int, default=10)
    ap.add_argument("--vs-eager", action="store_true",
                    help="also time the bundled model's plain decoding compiled vs the eager static path")
    ap.add_argument("--compile", choices=COMPILE_MODES, default="auto",
                    help="the speed figures' steps: compiled (auto: on CUDA) or the eager static path")
    ap.add_argument("--exact-routes", default=None,
                    help="exact mode's routes to check, comma-separated: rows, fixed (default: both on CUDA, rows on a CPU)")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    routes = (args.exact_routes or ("rows,fixed" if device.type == "cuda" else "rows")).split(",")
    for route in routes:
        if route not in ("rows", "fixed"):
            raise SystemExit(f"--exact-routes: {route!r} is not a route (rows, fixed)")
    tokens = args.tokens or (512 if device.type == "cuda" else 48)
    start = time.perf_counter()
    lm = random_model(device)
    report: dict = {"device": str(device), "model": lm.model_id, "dtype": lm.dtype, "torch": torch.__version__}
    report["speed"] = speed(lm, PROMPTS[: args.prompts], tokens, args.bandwidth_gbs, args.compile)
    s = report["speed"]
    print(f"speed ({s['step_mode']}, compiling took {s['compile_s']:.0f} s): ms/token {s['ms_per_token']} (bandwidth "
          f"bound {s['bandwidth_limit_ms']:.2f}); a 2-row step {s['step_2rows_over_1row']:.2f}x a 1-row step (in SSR "
          f"runs: {s['step_with_draft_row']}x); 32-token verify {s['verify32_over_step1']:.2f}x a 1-token step", flush=True)
    report["bundled"] = bundled(device, args.bundled_prompts, args.compile)
    print(f"bundled tiny-reasoner: {report['bundled']}", flush=True)
    if args.vs_eager:
        report["compiled_vs_eager"] = compiled_vs_eager(device, args.bundled_prompts)
        print(f"compiled vs eager static steps: {report['compiled_vs_eager']}", flush=True)
    modes = [("fast", False)] + [("exact" if route == "rows" else "exact_fixed", route) for route in routes]
    for mode, exact in modes:
        report[mode] = {**invariance(lm, exact), "agreement": agreements(lm, PROMPTS[: args.prompts], tokens, exact)}
        print(f"{mode:>11}: rows {report[mode]['rows_max_abs_diff']}  width {report[mode]['width_max_abs_diff']}  "
              f"SSR = baseline {report[mode]['agreement']['identical']}/{report[mode]['agreement']['of']}", flush=True)
    fast = report["fast"]["agreement"]["seconds_per_token"]
    for mode, _ in modes[1:]:
        report[f"{mode}_cost_per_token"] = report[mode]["agreement"]["seconds_per_token"] / fast
    report["seconds"] = time.perf_counter() - start
    Path(args.out).write_text(json.dumps(report, indent=1))
    for mode, _ in modes[1:]:
        print(f"{mode} costs {report[f'{mode}_cost_per_token']:.2f}x the fast path per token ({fast * 1e3:.2f} vs "
              f"{report[mode]['agreement']['seconds_per_token'] * 1e3:.2f} ms)")
    print(f"{report['seconds']:.0f} s; written to {args.out}")
    for mode, _ in modes:
        for r in report[mode]["agreement"]["runs"]:
            if r != "identical":
                print(f"  {mode}: {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
