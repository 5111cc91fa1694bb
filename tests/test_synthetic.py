"""Task suites: determinism, held-out seeds, and the checkers on right and wrong answers."""

from __future__ import annotations

import json

import pytest

from engine.answers import check, extract_code, last_boxed
from engine.tools.synthetic import EVAL_SEED_BASE, main, make_example
from engine.training.data import corrupted_steps, truncated_class_example


def test_examples_are_deterministic_functions_of_the_seed():
    for suite in ("classes", "arithmetic"):
        assert make_example(suite, 7) == make_example(suite, 7)
        assert make_example(suite, 7) != make_example(suite, 8)


def test_class_answer_is_the_reference_and_reasoning_is_longer():
    ex = make_example("classes", EVAL_SEED_BASE + 3)
    assert check("classes", ex.answer, ex.reference)
    assert len(ex.reasoning) > len(ex.reference)
    for step in ex.reasoning_steps[1:]:
        if " has " in step and " letters" in step:
            name, n = step.split(" has ")[0], int(step.split(" has ")[1].split()[0])
            assert len(name) == n


@pytest.mark.parametrize("answer, ok", [
    ("```python\n{ref}\n```", True),
    ("{ref}", True),                                   # no fence: the whole answer is the code
    ("Here it is:\n```python\n{ref}\n```\nDone.", True),
    ("```python\n{ref}\n    pass\n```", False),        # extra line
    ("```python\n{wrong}\n```", False),                # one value off
])
def test_classes_checker(answer, ok):
    ex = make_example("classes", EVAL_SEED_BASE)
    wrong = ex.reference.replace(" = ", " = 1", 1)
    assert check("classes", answer.format(ref=ex.reference, wrong=wrong), ex.reference) is ok


@pytest.mark.parametrize("answer, ok", [
    ("The result is \\boxed{42}.", True),
    ("\\boxed{41} no wait \\boxed{42}", True),          # the last box counts
    ("\\boxed{42} no wait \\boxed{41}", False),
    ("The result is 42.", False),                      # no box, no credit
    ("\\boxed{ 42 }", True),
])
def test_arithmetic_checker(answer, ok):
    assert check("arithmetic", answer, "42") is ok
    assert check(None, answer, "42") is ok              # a numeric reference picks the boxed checker


def test_extractors():
    assert extract_code("x\n```python\nA\nB\n```\ny") == "A\nB"
    assert last_boxed("no box") is None


def test_arithmetic_steps_are_correct_and_corruptions_are_labelled():
    import random

    ex = make_example("arithmetic", EVAL_SEED_BASE + 5)
    value = int(ex.reasoning_steps[0].split()[2].rstrip("."))
    for step in ex.reasoning_steps[1:]:
        a, word, b, _, r = step.rstrip(".").split(" ")
        assert int(a) == value
        value = {"plus": int(a) + int(b), "minus": int(a) - int(b), "times": int(a) * int(b)}[word]
        assert int(r) == value >= 0
    assert ex.reference == str(value) and check("arithmetic", ex.answer, ex.reference)
    steps, labels = corrupted_steps(ex, random.Random(0))
    first_bad = labels.index(False)
    assert all(labels[:first_bad]) and not any(labels[first_bad:])
    assert steps[:first_bad] == list(ex.reasoning_steps)[:first_bad]
    assert not check("arithmetic", steps[-1], ex.reference)


def test_truncated_examples_guess_unworked_fields():
    import random

    for seed in range(20):
        ex = truncated_class_example(seed, random.Random(seed))
        full = make_example("classes", seed)
        init_lines = full.reference.split("\n\n")[0].splitlines()[2:]  # "        self.rose = 16", ...
        last = init_lines[-1].split("self.")[1].split(" =")[0]
        assert f"self.{last} = 0" in ex.answer, "the last field is never worked out in a truncated reasoning"
        assert not ex.reasoning.endswith("Now I write the code.")
        assert not check("classes", ex.answer, ex.reference)


def test_cli_writes_held_out_prompts(tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    main(["--suite", "arithmetic", "--n", "3", "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"arithmetic-{EVAL_SEED_BASE + i}" for i in range(3)]
    assert all(set(r) == {"id", "prompt", "reference", "suite"} for r in rows)
    with pytest.raises(SystemExit):
        main(["--suite", "poetry", "--n", "3", "--out", str(out)])

