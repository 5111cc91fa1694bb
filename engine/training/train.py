"""Train the bundled tiny models on the CPU, reproducibly and resumably.

    python -m engine.training.train --model tiny-reasoner --minutes 60

    python -m engine.training.train --model tiny-reasoner --export    # checkpoint -> assets/models

Each model is a small Llama-architecture causal LM in Hugging Face format. Checkpoints go to
``build/train/NAME`` (weights, ``training_state.json`` with step, tokens seen, data RNG state and
eval history, and the optimizer state); ``--export`` copies the latest one to
``assets/models/NAME``, the bundled copy. Training resumes from the checkpoint, else from the
bundled copy (a fresh machine), else from scratch. The learning-rate schedule is a function of
the step, so a resumed run continues the same schedule. Held-out accuracy is measured as it trains.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from engine.presets import BUNDLED_DIR
from engine.training.data import IGNORE, prm_tokenizer_corpus, sample_sequence, tokenizer_corpus
from engine.training.evaluate import accuracy
from engine.training.specs import SPECS
from engine.training.tokenizer import build_prm_tokenizer, build_tokenizer

ROOT = Path(__file__).resolve().parents[2]
MODELS = BUNDLED_DIR
BUILD = ROOT / "build" / "train"


REWARM = 100  # steps of warm-up after resuming without the optimizer state
ROW_LEN = 512  # sequences (all under 500 tokens) are packed into rows this long, each attending only to
# itself; 512 rather than 1024 makes a step ~20% cheaper for the same tokens (attention is quadratic in it).
# The target trained its first 1,300 steps with 6 rows of 1024, the draft 4 rows of 1024.


def load_or_build_tokenizer(kind: str):
    """The reasoners share the target's tokenizer; the PRM has its own (engine.training.tokenizer)."""
    tok_dir = MODELS / ("tiny-prm" if kind == "prm" else "tiny-reasoner")
    if (tok_dir / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(tok_dir)
    tok = build_prm_tokenizer(prm_tokenizer_corpus()) if kind == "prm" else build_tokenizer(tokenizer_corpus())
    tok_dir.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(tok_dir)
    return AutoTokenizer.from_pretrained(tok_dir)


def new_model(arch: dict, tokenizer) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        rope_theta=10000.0, **arch,
    )
    return LlamaForCausalLM(config)


def lr_at(step: int, peak: float, total: int, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def arithmetic_share(step: int) -> float:
    """The target's curriculum: until ``classes`` is learned (held-out 100% at step 4000) a third of
    its sequences are arithmetic; then arithmetic, the slower of the two, gets most of them."""
    return 0.35 if step < 4103 else 0.6


def weighted_loss(logits, targets, verdicts: list[int], verdict_weight: float) -> torch.Tensor:
    """Mean cross-entropy over the targets, the PRM's verdict targets counting ``verdict_weight``
    times (a step has one verdict or two and a dozen LM targets)."""
    flat = targets.flatten()
    losses = F.cross_entropy(logits.flatten(0, 1), flat, ignore_index=IGNORE, reduction="none")
    weights = (flat != IGNORE).float()
    if verdicts and verdict_weight != 1.0:
        weights[torch.isin(flat, torch.tensor(verdicts))] *= verdict_weight
    return (losses * weights).sum() / weights.sum()


def make_batch(tokenizer, kind: str, rows: int, rng: random.Random, share: float):
    """Pack whole sequences into ``rows`` rows of ROW_LEN tokens. A block-diagonal causal mask and
    per-sequence position ids keep every sequence blind to its neighbours (no cross-example copying)."""
    input_ids = torch.full((rows, ROW_LEN), tokenizer.pad_token_id)
    targets = torch.full((rows, ROW_LEN), IGNORE)
    positions = torch.zeros((rows, ROW_LEN), dtype=torch.long)
    doc = torch.full((rows, ROW_LEN), -1)
    for r in range(rows):
        used, d = 0, 0
        while True:
            ids, labels, aligned = sample_sequence(tokenizer, kind, rng, share)
            n = len(ids)
            if used + n > ROW_LEN:
                break
            input_ids[r, used : used + n] = torch.tensor(ids)
            positions[r, used : used + n] = torch.arange(n)
            doc[r, used : used + n] = d
            if aligned:  # targets already sit at the position whose logits are read
                targets[r, used : used + n] = torch.tensor(labels)
            else:  # next-token prediction: position j predicts labels[j + 1]
                targets[r, used : used + n - 1] = torch.tensor(labels[1:])
            used, d = used + n, d + 1
    causal = torch.tril(torch.ones(ROW_LEN, ROW_LEN, dtype=torch.bool))
    mask = (doc[:, :, None] == doc[:, None, :]) & causal & (doc[:, :, None] >= 0)
    mask |= torch.eye(ROW_LEN, dtype=torch.bool)  # padding rows attend to themselves: no NaNs
    return input_ids, mask[:, None], positions, targets


def save(model, tokenizer, name: str, state: dict, optimizer) -> None:
    out = BUILD / name
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "training_state.json").write_text(json.dumps(state, indent=1))
    torch.save(optimizer.state_dict(), BUILD / f"{name}-optim.pt")


def export(name: str) -> None:
    """Copy the latest checkpoint's model, tokenizer and training state into assets/models."""
    src, dst = BUILD / name, MODELS / name
    if not (src / "training_state.json").exists():
        raise SystemExit(f"no checkpoint of {name} under {src}")
    if dst.exists():
        shutil.rmtree(dst)  # no stale file of an earlier export (e.g. another tokenizer's template)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        shutil.copy2(f, dst / f.name)
    print(f"exported {name} at step {json.loads((src / 'training_state.json').read_text())['step']} to {dst}")


def resume_dir(name: str) -> Path | None:
    for folder in (BUILD / name, MODELS / name):
        if (folder / "training_state.json").exists():
            return folder
    return None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m engine.training.train", description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, choices=sorted(SPECS))
    ap.add_argument("--minutes", type=float, default=60.0, help="wall-clock budget of this call")
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2)))
    ap.add_argument("--save-every", type=float, default=10.0, help="minutes between checkpoints")
    ap.add_argument("--eval-every", type=int, default=500, help="steps between held-out evaluations")
    ap.add_argument("--export", action="store_true", help="copy the latest checkpoint to assets/models and stop")
    ap.add_argument("--fresh", action="store_true", help="start from scratch, ignoring any checkpoint")
    args = ap.parse_args(argv)
    if args.export:
        return export(args.model)
    torch.set_num_threads(args.threads)
    spec = SPECS[args.model]
    kind, total = spec.kind, spec.total
    start_from = None if args.fresh else resume_dir(args.model)
    # a checkpoint carries the tokenizer it was trained with
    tokenizer = AutoTokenizer.from_pretrained(start_from) if start_from else load_or_build_tokenizer(kind)
    verdicts = [tokenizer.convert_tokens_to_ids(v) for v in "+-"] if kind == "prm" else []
    if start_from is not None:
        state = json.loads((start_from / "training_state.json").read_text())
        model = LlamaForCausalLM.from_pretrained(start_from, dtype=torch.float32)
        print(f"resuming {args.model} at step {state['step']} from {start_from}")
    else:
        torch.manual_seed(1234)
        model = new_model(spec.arch, tokenizer)
        state = {"step": 0, "tokens": 0, "seconds": 0.0, "rng": None, "evals": []}
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{args.model}: {n_params / 1e6:.2f}M parameters, batch {spec.rows}, {total} steps planned")
    rng = random.Random(f"train-{args.model}")
    if state["rng"] is not None:
        rng.setstate(_rng_from_json(state["rng"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.peak_lr, weight_decay=0.05, betas=(0.9, 0.98))
    optim_file = BUILD / f"{args.model}-optim.pt"
    rewarm_from = None  # resuming without Adam's moments (a fresh machine): warm up again briefly
    if optim_file.exists() and state["step"] > 0 and not args.fresh:
        optimizer.load_state_dict(torch.load(optim_file))
    elif state["step"] > 0:
        rewarm_from = state["step"]
    model.train()
    start = last_save = time.time()
    losses = []
    stop = []  # SIGTERM / SIGINT: finish the step, save, exit (a session ending must not lose work)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    while state["step"] < total and time.time() - start < args.minutes * 60 and not stop:
        for group in optimizer.param_groups:
            rewarm = 1.0 if rewarm_from is None else min(1.0, (state["step"] - rewarm_from + 1) / REWARM)
            group["lr"] = lr_at(state["step"], spec.peak_lr, total, spec.warmup) * rewarm
        input_ids, mask, positions, targets = make_batch(tokenizer, kind, spec.rows, rng, arithmetic_share(state["step"]))
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions).logits
        loss = weighted_loss(logits, targets, verdicts, spec.verdict_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        state["step"] += 1
        state["tokens"] += int((targets != IGNORE).sum())
        losses.append(loss.item())
        if state["step"] % 50 == 0:
            elapsed = time.time() - start
            print(f"step {state['step']}/{total} loss {sum(losses) / len(losses):.4f} "
                  f"lr {lr_at(state['step'], spec.peak_lr, total, spec.warmup):.2e} tokens {state['tokens']} "
                  f"[{elapsed / 60:.1f} min]", flush=True)
            losses = []
        if state["step"] % args.eval_every == 0:
            model.eval()
            result = accuracy(model, tokenizer, kind, n=12)
            model.train()
            state["evals"].append({"step": state["step"], **result})
            print(f"eval at step {state['step']}: {result}", flush=True)
        if time.time() - last_save > args.save_every * 60:
            state["seconds"] += time.time() - last_save
            state["rng"] = _rng_to_json(rng.getstate())
            save(model, tokenizer, args.model, state, optimizer)
            last_save = time.time()
    state["seconds"] += time.time() - last_save
    state["rng"] = _rng_to_json(rng.getstate())
    save(model, tokenizer, args.model, state, optimizer)
    print(f"saved {args.model} at step {state['step']}")


def _rng_to_json(s):
    return [s[0], list(s[1]), s[2]]


def _rng_from_json(s):
    return (s[0], tuple(s[1]), s[2])


if __name__ == "__main__":
    main()
