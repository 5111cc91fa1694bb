"""Synthetic task suites with exact references (their checker: ``engine.answers.check``).

Two suites, each a deterministic function of a seed:

* ``classes``: the SSR showcase (shaped like ClassEval). The user asks for a Python class from a
  short spec; the reasoning works through the spec in order and *computes* every value the code
  needs (each field's start value = its letter count times the scale), so the answer is a pure
  function of the prompt. An answer drafted after part of the reasoning gets the worked-out
  fields right and the others wrong, while the code around them still matches.
* ``arithmetic``: the RSD showcase. Multi-step integer arithmetic, one operation per reasoning
  paragraph (steps separated by a blank line), the answer ends with ``\\boxed{N}``.

CLI::

    python -m engine.tools.synthetic --suite classes --n 50 --seed 1000 --out classes.jsonl

Each line is ``{"id", "prompt", "reference", "suite"}``; ``reference`` is the exact expected
answer (the code for ``classes``, the number for ``arithmetic``). Training uses seeds below
``EVAL_SEED_BASE``; evaluation uses seeds at or above it, so the two never overlap.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass

EVAL_SEED_BASE = 1_000_000  # training seeds are < this, held-out evaluation seeds are >= this

# Names come from small fixed lists: with a byte-level BPE, " tiger" (prose) and "tiger" (after
# "self.") are different tokens, so a model must learn that pairing for every name it copies. Lists
# of 34 field words and 13 class names keep that learnable for the bundled 2.9M model on a CPU
# budget (the first 2,000 training steps drew from 136 and 50).
FIELD_WORDS = ["apple", "cloud", "flame", "ivory", "mango", "ocean", "plum", "robin", "shell", "stone", "tulip", "wheat", "amber", "basil", "blade", "candle", "cherry", "cobalt", "crane", "fern", "ginger", "iris", "lark", "lotus", "mint", "oak", "paper", "pollen", "radish", "saffron", "shadow", "spruce", "thunder", "velvet"]

CLASS_NAMES = ["Garden", "Market", "Bakery", "Forest", "Island", "Tower", "Atlas", "Palette", "Window", "Camera", "Jungle", "Needle", "Tablet"]

METHODS = ("reset", "total", "describe", "double", "count", "largest")


@dataclass(frozen=True)
class Example:
    """One task instance: the user prompt, the reasoning a model should write, the answer."""

    id: str
    suite: str
    prompt: str
    reasoning_steps: tuple[str, ...]  # paragraphs of the chain of thought
    answer: str  # the text after the end-of-thinking marker
    reference: str  # what the checker compares against

    @property
    def reasoning(self) -> str:
        return "\n\n".join(self.reasoning_steps)

    @property
    def steps(self) -> list[str]:
        """The steps a PRM judges: each reasoning paragraph, then the answer."""
        return [*self.reasoning_steps, self.answer]


# ----------------------------------------------------------------------------- classes


def _join_names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _method_code(method: str, cls: str, fields: list[str], values: dict[str, int]) -> list[str]:
    head = f"    def {method}(self):"
    if method == "reset":
        return [head] + [f"        self.{f} = {values[f]}" for f in fields]
    if method == "double":
        return [head] + [f"        self.{f} = self.{f} * 2" for f in fields]
    if method == "total":
        return [head, "        return " + " + ".join(f"self.{f}" for f in fields)]
    if method == "describe":
        return [head, f'        return "{cls}"']
    if method == "count":
        return [head, f"        return {len(fields)}"]
    if method == "largest":
        return [head, "        return max(" + ", ".join(f"self.{f}" for f in fields) + ")"]
    raise ValueError(f"unknown method {method!r}")


def _method_reasoning(method: str, cls: str, fields: list[str], values: dict[str, int]) -> str:
    if method == "reset":
        return f"{method} puts " + _join_names([f"{f} back to {values[f]}" for f in fields]) + "."
    if method == "double":
        return f"{method} doubles {_join_names(fields)}."
    if method == "total":
        return f"{method} adds {_join_names(fields)}."
    if method == "describe":
        return f"{method} gives the name {cls}."
    if method == "count":
        return f"{method} gives {len(fields)} because there are {len(fields)} fields."
    if method == "largest":
        return f"{method} takes the max of {_join_names(fields)}."
    raise ValueError(f"unknown method {method!r}")


def class_code(cls: str, fields: list[str], methods: list[str], values: dict[str, int]) -> str:
    """The reference code: fields in prompt order, then methods in prompt order."""
    lines = [f"class {cls}:", "    def __init__(self):"]
    lines += [f"        self.{f} = {values[f]}" for f in fields]
    for m in methods:
        lines.append("")
        lines += _method_code(m, cls, fields, values)
    return "\n".join(lines)


def make_class_example(seed: int, worked_fields: int | None = None) -> Example:
    """A ``classes`` instance. ``worked_fields`` (training only) truncates the reasoning after that
    many field paragraphs; the answer then writes 0 for every field not yet worked out, the way a
    model forced to answer early guesses what it has not computed."""
    rng = random.Random(f"classes-{seed}")
    cls = rng.choice(CLASS_NAMES)
    fields = rng.sample(FIELD_WORDS, rng.randint(2, 5))
    methods = rng.sample(METHODS, rng.randint(2, 4))
    scale = rng.randint(2, 9)
    values = {f: len(f) * scale for f in fields}
    prompt = (
        f"Write a Python class {cls}. Fields: {', '.join(fields)}. "
        f"Each field starts at its letter count times {scale}. Methods: {', '.join(methods)}."
    )
    steps = [f"The class {cls} needs {len(fields)} fields and the scale is {scale}."]
    for f in fields:
        n = len(f)
        steps.append(f"{f} has {n} letters. {n} times {scale} is {n * scale}, so {f} starts at {n * scale}.")
    steps += [_method_reasoning(m, cls, fields, values) for m in methods]
    steps.append("Now I write the code.")
    code = class_code(cls, fields, methods, values)
    reference = code
    if worked_fields is not None:
        steps = steps[: 1 + worked_fields]
        guessed = {f: (values[f] if i < worked_fields else 0) for i, f in enumerate(fields)}
        code = class_code(cls, fields, methods, guessed)
    answer = f"```python\n{code}\n```"
    return Example(f"classes-{seed}", "classes", prompt, tuple(steps), answer, reference)


# ----------------------------------------------------------------------------- arithmetic

_OPS = {"add": ("plus", lambda a, b: a + b), "sub": ("minus", lambda a, b: a - b), "mul": ("times", lambda a, b: a * b)}
_OP_WORDS = {"add": "add {b}", "sub": "subtract {b}", "mul": "multiply by {b}"}


def make_arithmetic_example(seed: int) -> Example:
    """An ``arithmetic`` instance: 3 to 6 operations on non-negative integers below 1000."""
    rng = random.Random(f"arithmetic-{seed}")
    value = rng.randint(2, 60)
    steps = [f"Start with {value}."]
    words = []
    for _ in range(rng.randint(3, 6)):
        choices = ["add", "sub"] + (["mul"] if value < 100 else [])
        op = rng.choice(choices)
        if op == "add":
            b = rng.randint(1, 60)
        elif op == "sub":
            if value < 2:
                op, b = "add", rng.randint(1, 60)
            else:
                b = rng.randint(1, min(value - 1, 60))
        else:
            b = rng.randint(2, 9)
        word, fn = _OPS[op]
        result = fn(value, b)
        steps.append(f"{value} {word} {b} is {result}.")
        words.append(_OP_WORDS[op].format(b=b))
        value = result
    prompt = f"Start with {steps[0].split()[2][:-1]}, then " + ", then ".join(words) + ". What is the result?"
    answer = f"The result is \\boxed{{{value}}}."
    return Example(f"arithmetic-{seed}", "arithmetic", prompt, tuple(steps), answer, str(value))


SUITES = {"classes": make_class_example, "arithmetic": make_arithmetic_example}


def make_example(suite: str, seed: int) -> Example:
    if suite not in SUITES:
        raise ValueError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    return SUITES[suite](seed)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m engine.tools.synthetic", description=__doc__.split("\n")[0])
    ap.add_argument("--suite", required=True, choices=sorted(SUITES))
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--seed", type=int, default=EVAL_SEED_BASE, help="first seed (held-out seeds start at %(default)s)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.n < 1:
        ap.error("--n must be at least 1")
    with open(args.out, "w", encoding="utf-8") as fh:
        for i in range(args.n):
            ex = make_example(args.suite, args.seed + i)
            fh.write(json.dumps({"id": ex.id, "prompt": ex.prompt, "reference": ex.reference, "suite": ex.suite}) + "\n")
    print(f"wrote {args.n} {args.suite} prompts to {args.out}")


if __name__ == "__main__":
    main()
