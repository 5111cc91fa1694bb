"""The numerics check a GPU owner runs in one command (it runs on a CPU too, smaller, for CI).

    python -m engine.gpu_check [--device cuda] [--out gpu_check.json] [--prompts 5] [--tokens 512]

On CUDA it builds a Qwen3-4B-shaped model (36 layers, hidden 2560, 32 query / 8 KV heads of 128,
MLP 9728) with random weights in bf16 (meaningless text, real numerics; the bundled tokenizer, so
the vocabulary is the bundled one's); on the CPU a 4-layer model of the same family in float32.
It prints, and writes as JSON, for the fast path and for exact mode (``engine.runtime.exact``):

* ``rows_max_abs_diff``: row 0's logits beside 1 and 2 other rows vs alone (0 means bitwise equal);
* ``width_max_abs_diff``: a token fed alone vs at every offset of a 4-, 16- and 32-token window;
* ``agreement``: greedy SSR vs plain decoding on ``--prompts`` prompts of ``--tokens`` reasoning
  tokens: how many identical, and where the others diverged with the top-2 logit margin there;
* ``seconds_per_token``: plain decoding, fast vs exact, and their ratio (exact mode's cost).

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

from engine.agreement import agreement
from engine.baseline import decode_baseline
from engine.config import RunConfig
from engine.model import LoadedModel, find_markers, pick_device
from engine.presets import BUNDLED_DIR
from engine.ssr import decode_ssr

QWEN3_4B = dict(num_hidden_layers=36, hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, max_position_embeddings=40960)
SMALL = dict(num_hidden_layers=4, hidden_size=128, intermediate_size=384, num_attention_heads=4,
             num_key_value_heads=2, head_dim=32, max_position_embeddings=4096)
PROMPTS = ["Write a Python class Garden. Fields: rose, tulip, daisy.", "Start with 12, then add 30. What is it?",
           "Explain why the sky is blue, step by step.", "List three prime numbers and their squares.",
           "Convert 3 hours 20 minutes into minutes."]


def random_model(device: torch.device, seed: int = 0) -> LoadedModel:
    """A Qwen3-shaped model with random weights (Qwen3-4B's shapes on CUDA, small on the CPU)."""
    from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM  # noqa: PLC0415

    tok = AutoTokenizer.from_pretrained(BUNDLED_DIR / "tiny-reasoner")
    shape = QWEN3_4B if device.type == "cuda" else SMALL
    config = Qwen3Config(vocab_size=len(tok), eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, **shape)
    torch.manual_seed(seed)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = Qwen3ForCausalLM(config).to(device=device, dtype=dtype).eval()
    return LoadedModel(model, tok, f"random-qwen3-{'4b' if device.type == 'cuda' else 'small'}", find_markers(tok))


def _logits(lm: LoadedModel, rows: list[list[int]], prefix: list[int], exact: bool) -> torch.Tensor:
    lm.begin_run(exact)
    cache = lm.new_cache()
    lm.step_logits(prefix, cache, 0)
    cache.reorder_cache(torch.zeros(len(rows), dtype=torch.long, device=lm.device))
    return lm.forward(torch.tensor(rows, device=lm.device), cache, len(prefix)).float()


def invariance(lm: LoadedModel, exact: bool) -> dict:
    """Largest logit difference of the same token across row counts and window widths."""
    ids = lm.prompt_ids(" ".join(PROMPTS))
    prefix, mine = ids[:24], ids[24:30]
    alone = _logits(lm, [mine], prefix, exact)[0]
    others = [[(t * 7 + 3) % len(lm.tokenizer) for t in mine], [(t * 13 + 1) % len(lm.tokenizer) for t in mine]]
    rows = {n + 1: float((_logits(lm, [mine, *others[:n]], prefix, exact)[0] - alone).abs().max()) for n in (1, 2)}
    width = {}
    for k in (4, 16, 32):
        window = ids[24 : 24 + k]
        together = _logits(lm, [window], prefix, exact)[0]
        width[k] = max(float((together[j] - _logits(lm, [window[j : j + 1]], prefix + window[:j], exact)[0, 0])
                             .abs().max()) for j in range(k))
    return {"rows_max_abs_diff": rows, "width_max_abs_diff": width}


def agreements(lm: LoadedModel, prompts: list[str], tokens: int, exact: bool) -> dict:
    """Greedy SSR vs plain decoding on each prompt; per-token seconds of plain decoding."""
    cfg = RunConfig(max_think=tokens, max_answer=32, draft_start=min(64, tokens - 1), max_draft=128, exact=exact)
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
    ap = argparse.ArgumentParser(prog="python -m engine.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--device", default=None, help="cuda (default when present) or cpu")
    ap.add_argument("--out", default="gpu_check.json")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=None, help="reasoning tokens per run (512 on CUDA, 48 on a CPU)")
    args = ap.parse_args(argv)
    device = pick_device(args.device)
    tokens = args.tokens or (512 if device.type == "cuda" else 48)
    start = time.perf_counter()
    lm = random_model(device)
    report: dict = {"device": str(device), "model": lm.model_id, "dtype": str(next(lm.model.parameters()).dtype),
                    "torch": torch.__version__}
    for mode, exact in (("fast", False), ("exact", True)):
        report[mode] = {**invariance(lm, exact), "agreement": agreements(lm, PROMPTS[: args.prompts], tokens, exact)}
        print(f"{mode:>5}: rows {report[mode]['rows_max_abs_diff']}  width {report[mode]['width_max_abs_diff']}  "
              f"SSR = baseline {report[mode]['agreement']['identical']}/{report[mode]['agreement']['of']}", flush=True)
    fast, exact_s = report["fast"]["agreement"]["seconds_per_token"], report["exact"]["agreement"]["seconds_per_token"]
    report["exact_cost_per_token"] = exact_s / fast
    report["seconds"] = time.perf_counter() - start
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(f"exact mode costs {report['exact_cost_per_token']:.2f}x the fast path per token "
          f"({fast * 1e3:.2f} vs {exact_s * 1e3:.2f} ms); {report['seconds']:.0f} s; written to {args.out}")
    for mode in ("fast", "exact"):
        for r in report[mode]["agreement"]["runs"]:
            if r != "identical":
                print(f"  {mode}: {r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
