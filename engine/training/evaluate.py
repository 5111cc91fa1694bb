"""Held-out evaluation of the bundled models: exact accuracy per suite, PRM AUROC (on corrupted
steps and on the bundled draft's own steps).

    python -m engine.training.evaluate --n 100

Generation here is plain greedy ``generate()`` on held-out seeds (>= EVAL_SEED_BASE).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

from engine.answers import check
from engine.methods.rsd.prm import MathShepherdScorer
from engine.presets import BUNDLED_DIR
from engine.runtime.model import LoadedModel
from engine.tools.synthetic import EVAL_SEED_BASE, make_arithmetic_example, make_example
from engine.training.data import corrupted_steps, prompt_text
from engine.training.specs import SPECS


@torch.inference_mode()
def suite_accuracy(model, tokenizer, suite: str, n: int, max_new_tokens: int = 700) -> float:
    correct = 0
    for i in range(n):
        ex = make_example(suite, EVAL_SEED_BASE + i)
        _, answer = greedy(model, tokenizer, ex.prompt, max_new_tokens)
        correct += bool(check(suite, answer, ex.reference))
    return correct / n


def greedy(model, tokenizer, prompt: str, max_new_tokens: int = 700) -> tuple[str, str]:
    """The model's greedy (reasoning, answer) for ``prompt``."""
    ids = tokenizer(prompt_text(tokenizer, prompt), return_tensors="pt", add_special_tokens=False).input_ids
    out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    text = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=False).replace(tokenizer.eos_token, "")
    reasoning, closed, answer = text.partition("</think>")
    return (reasoning, answer) if closed else ("", reasoning)  # never closed: all of it is the answer


def _scorer(model, tokenizer) -> MathShepherdScorer:
    """The RSD scorer around a model being trained: evaluation reads the PRM exactly as RSD does."""
    return MathShepherdScorer(LoadedModel(model, tokenizer, "tiny-prm", None))


def auroc(pos: list[float], neg: list[float]) -> float:
    """Probability that a random positive scores above a random negative (ties count half)."""
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def prm_auroc(model, tokenizer, n: int) -> float:
    scorer = _scorer(model, tokenizer)
    rng = random.Random(7)
    good, bad = [], []
    for i in range(n):
        ex = make_arithmetic_example(EVAL_SEED_BASE + i)
        steps, labels = corrupted_steps(ex, rng)
        for score, ok in zip(scorer.score_all(ex.prompt, steps), labels, strict=True):
            (good if ok else bad).append(score)
        clean = ex.steps
        good += scorer.score_all(ex.prompt, clean)
    return auroc(good, bad)


def draft_steps_auroc(prm, prm_tokenizer, draft, draft_tokenizer, n: int) -> dict:
    """The PRM on the draft's own greedy chains for n held-out prompts: each step labelled by
    whether the chain is still right (math-shepherd's labels). ``all``: AUROC over every step;
    ``first_error``: each wrong chain's first wrong step against all right steps (what RSD must
    catch)."""
    scorer = _scorer(prm, prm_tokenizer)
    good, bad, first = [], [], []
    for i in range(n):
        ex = make_arithmetic_example(EVAL_SEED_BASE + i)
        reasoning, answer = greedy(draft, draft_tokenizer, ex.prompt, 300)
        steps = [s.strip() for s in reasoning.split("\n\n") if s.strip()] + [answer.strip()]
        reference = ex.steps
        right = True
        for k, (step, score) in enumerate(zip(steps, scorer.score_all(ex.prompt, steps), strict=True)):
            was_right, right = right, right and k < len(reference) and step == reference[k]
            (good if right else bad).append(score)
            if was_right and not right:
                first.append(score)
    return {"all": round(auroc(good, bad), 4), "first_error": round(auroc(good, first), 4),
            "right_steps": len(good), "wrong_steps": len(bad)}


def accuracy(model, tokenizer, kind: str, n: int = 24) -> dict:
    """The numbers printed while training: per-suite accuracy, or AUROC for the PRM."""
    if kind == "prm":
        return {"auroc": round(prm_auroc(model, tokenizer, n), 4)}
    suites = ["arithmetic"] if kind == "draft" else ["classes", "arithmetic"]
    return {s: round(suite_accuracy(model, tokenizer, s, n), 4) for s in suites}


KNOWN = {"classes": EVAL_SEED_BASE + 42, "arithmetic": EVAL_SEED_BASE + 42}
KNOWN_BUDGET = dict(max_think=300, max_answer=250, draft_start=60)


def known_outputs(models_dir) -> dict:
    """Each bundled model's greedy output on a fixed held-out prompt (the PRM: its scores on a
    fixed correct and a fixed corrupted solution). tests/test_bundled.py checks these."""
    from engine.config import RunConfig
    from engine.methods.baseline import decode_baseline
    from engine.runtime.model import load_model

    out = {}
    for name in ("tiny-reasoner", "tiny-reasoner-draft"):
        if (models_dir / name / "config.json").exists():
            lm = load_model(str(models_dir / name))
            suite = "classes" if name == "tiny-reasoner" else "arithmetic"
            prompt = make_example(suite, KNOWN[suite]).prompt
            done = list(decode_baseline(lm, prompt, RunConfig(**KNOWN_BUDGET)))[-1]
            out[name] = {"prompt": prompt, "reasoning_ids": done.reasoning_ids, "answer_ids": done.answer_ids}
    if (models_dir / "tiny-prm" / "config.json").exists():
        scorer = MathShepherdScorer(load_model(str(models_dir / "tiny-prm")))
        ex = make_arithmetic_example(KNOWN["arithmetic"])
        good = ex.steps
        bad, _ = corrupted_steps(ex, random.Random(0))
        out["tiny-prm"] = {"question": ex.prompt, "good_steps": good, "bad_steps": bad,
                           "good_scores": scorer.score_all(ex.prompt, good),
                           "bad_scores": scorer.score_all(ex.prompt, bad)}
    return out


def main(argv: list[str] | None = None) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer


    ap = argparse.ArgumentParser(prog="python -m engine.training.evaluate")
    ap.add_argument("--n", type=int, default=100)
    ap.add_argument("--models", default=",".join(SPECS))
    ap.add_argument("--write-expected", default=None, help="write the bundled models' known outputs here and stop")
    args = ap.parse_args(argv)
    if args.write_expected:
        Path(args.write_expected).write_text(json.dumps(known_outputs(BUNDLED_DIR), indent=1))
        print(f"wrote {args.write_expected}")
        return
    results = {}
    for name in args.models.split(","):
        path = BUNDLED_DIR / name
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(path)
        results[name] = accuracy(model, tokenizer, SPECS[name].kind, n=args.n)
        if SPECS[name].kind == "prm":
            draft = BUNDLED_DIR / "tiny-reasoner-draft"
            results[name]["draft_steps_auroc"] = draft_steps_auroc(
                model, tokenizer, AutoModelForCausalLM.from_pretrained(draft, dtype=torch.float32).eval(),
                AutoTokenizer.from_pretrained(draft), args.n)
        print(name, results[name], flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
