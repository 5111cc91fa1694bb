"""Training sequences for the bundled models, built from the synthetic suites.

Every sequence is a list of token ids with a parallel list of loss targets (-100 where no loss
applies). Seeds come from ``range(EVAL_SEED_BASE)`` only, so held-out evaluation never overlaps.
"""

from __future__ import annotations

import random

from engine.tools.synthetic import EVAL_SEED_BASE, Example, make_arithmetic_example, make_class_example
from engine.training.tokenizer import STEP_TAG

THINK_CLOSE = "</think>\n\n"  # what the template puts between the reasoning and the answer
IGNORE = -100


def prompt_text(tokenizer, prompt: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
    )


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def chat_sequence(tokenizer, ex: Example, truncated: bool = False) -> tuple[list[int], list[int]]:
    """Prompt + reasoning + close + answer + end. Loss on everything after the prompt, except
    that a truncated reasoning (a forced early answer) is context only: the model must never learn
    to stop thinking mid-sentence, only how to answer after being stopped."""
    prompt_ids = _encode(tokenizer, prompt_text(tokenizer, ex.prompt))
    reasoning = ex.reasoning if truncated else ex.reasoning + "\n"
    reasoning_ids = _encode(tokenizer, reasoning)
    answer_ids = _encode(tokenizer, THINK_CLOSE + ex.answer) + [tokenizer.eos_token_id]
    ids = prompt_ids + reasoning_ids + answer_ids
    if truncated:
        labels = [IGNORE] * (len(prompt_ids) + len(reasoning_ids)) + answer_ids
    else:
        labels = [IGNORE] * len(prompt_ids) + reasoning_ids + answer_ids
    return ids, labels


def truncated_class_example(seed: int, rng: random.Random) -> Example:
    """A ``classes`` example whose reasoning stops after k field paragraphs, sometimes in the middle
    of the next paragraph, as when a draft forks at an arbitrary reasoning token."""
    full = make_class_example(seed)
    n_fields = full.reasoning_steps[0].split(" needs ")[1].split()[0]
    k = rng.randint(0, int(n_fields) - 1)
    ex = make_class_example(seed, worked_fields=k)
    steps = list(ex.reasoning_steps)
    if rng.random() < 0.5:
        words = full.reasoning_steps[1 + k].split(" ")
        steps.append(" ".join(words[: rng.randint(1, len(words) - 1)]))
    return Example(ex.id, ex.suite, ex.prompt, tuple(steps), ex.answer, ex.reference)


# ----------------------------------------------------------------------------- PRM (math-shepherd)


def prm_text(question: str, steps: list[str]) -> str:
    """math-shepherd's input format: the question, then each step followed by the step tag."""
    return question + " " + "\n".join(f"{s} {STEP_TAG}" for s in steps)


# How far a corrupted result is off, modelled on the bundled draft's own slips: on 100 held-out
# prompts 25 of its 33 first errors were a carry dropped or added (off by 10), the rest off by
# 30-90, 5, 2 or 1. Half of the corruptions are off by 10, in either direction.
SLIPS = (10,) * 6 + (1, 2, 20, 30, 100, 5)


def slip(value: int, rng: random.Random) -> int:
    """``value`` made wrong by one of SLIPS, up or down (down only while it stays non-negative)."""
    off = rng.choice(SLIPS)
    return value - off if rng.random() < 0.5 and value >= off else value + off


def corrupted_steps(ex: Example, rng: random.Random) -> tuple[list[str], list[bool]]:
    """The example's steps (reasoning operations, then the answer) with one result made wrong at a
    random step (see SLIPS); later steps carry the wrong value on, as a model that slipped would. Labels:
    True up to the error, False from it on (math-shepherd labels a step by whether the answer can
    still be reached)."""
    steps = ex.steps
    bad = rng.randint(1, len(steps) - 1)
    out, labels = list(steps[:bad]), [True] * bad
    value = None
    for i in range(bad, len(steps)):
        s = steps[i]
        if i == len(steps) - 1:  # the answer step
            if value is None:
                value = slip(int(ex.reference), rng)
            out.append(f"The result is \\boxed{{{value}}}.")
        else:
            a, word, b, _, _ = s.rstrip(".").split(" ")
            a = int(a) if value is None else value
            true = {"plus": a + int(b), "minus": a - int(b), "times": a * int(b)}[word]
            result = slip(true, rng) if value is None else true
            out.append(f"{a} {word} {b} is {result}.")
            value = result
        labels.append(False)
    return out, labels


def prm_sequence(tokenizer, seed: int, rng: random.Random) -> tuple[list[int], list[int]]:
    """A PRM training sequence with targets aligned to positions, encoded step by step as the
    scorer encodes it. Verdicts (``+`` / ``-``) sit at each step tag, where math-shepherd reads
    them, and at the step's last number, so the check is learned where the written result is read.
    Elsewhere in a step the target is the next token (language modelling keeps the arithmetic
    the verdicts depend on), but only while the steps are right: a slipped step is never a model
    of what comes next."""
    ex = make_arithmetic_example(seed)
    if rng.random() < 0.5:
        steps = ex.steps
        labels = [True] * len(steps)
    else:
        steps, labels = corrupted_steps(ex, rng)
    plus, minus = tokenizer.convert_tokens_to_ids("+"), tokenizer.convert_tokens_to_ids("-")
    ids = _encode(tokenizer, ex.prompt)
    targets = [IGNORE] * len(ids)
    for k, (step, good) in enumerate(zip(steps, labels, strict=True)):
        piece = _encode(tokenizer, (" " if k == 0 else "\n") + f"{step} {STEP_TAG}")
        if k == 0:
            targets[-1] = piece[0]  # the question's last token predicts the first step
        step_targets = piece[1:] + [IGNORE] if good else [IGNORE] * len(piece)
        verdict = plus if good else minus
        numbers = [i for i, t in enumerate(tokenizer.convert_ids_to_tokens(piece)) if t.isdigit()]
        if numbers:
            step_targets[numbers[-1]] = verdict
        step_targets[-1] = verdict  # the tag
        ids += piece
        targets += step_targets
    return ids, targets


def sample_sequence(tokenizer, kind: str, rng: random.Random, arithmetic_share: float
                    ) -> tuple[list[int], list[int], bool]:
    """One training sequence for model ``kind``; the flag says whether targets are already aligned
    to positions (PRM) rather than to next tokens (language modelling). The target draws an
    ``arithmetic`` example with probability ``arithmetic_share``, else a ``classes`` one."""
    seed = rng.randrange(EVAL_SEED_BASE)
    if kind == "prm":
        ids, targets = prm_sequence(tokenizer, seed, rng)
        return ids, targets, True
    if kind == "draft" or rng.random() < arithmetic_share:
        return (*chat_sequence(tokenizer, make_arithmetic_example(seed)), False)
    if rng.random() < 0.2:
        return (*chat_sequence(tokenizer, truncated_class_example(seed, rng), truncated=True), False)
    return (*chat_sequence(tokenizer, make_class_example(seed)), False)


def prm_tokenizer_corpus(n: int = 20000) -> list[str]:
    """Text the PRM's tokenizer takes its words from: right and corrupted PRM inputs. (The
    bundled vocabulary was built before SLIPS took its present form; it is kept with the model.)"""
    rng = random.Random(0)
    texts = []
    for seed in range(n):
        ex = make_arithmetic_example(seed)
        texts.append(prm_text(ex.prompt, ex.steps))
        texts.append(prm_text(ex.prompt, corrupted_steps(ex, rng)[0]))
    return texts


def tokenizer_corpus(n: int = 3000) -> list[str]:
    """Text the tokenizer is trained on: both suites rendered in full, plus PRM inputs."""
    rng = random.Random(0)
    texts = []
    for seed in range(n):
        for ex in (make_class_example(seed), make_arithmetic_example(seed)):
            texts.append(ex.prompt + "\n" + ex.reasoning + "\n" + THINK_CLOSE + ex.answer)
        texts.append(prm_text(make_arithmetic_example(seed).prompt, corrupted_steps(make_arithmetic_example(seed), rng)[0]))
    return texts
