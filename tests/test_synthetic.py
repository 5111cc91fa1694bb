"""Task suites: determinism, held-out seeds, and the checkers on right and wrong answers."""

from __future__ import annotations

import json

import pytest

from engine.synthetic import EVAL_SEED_BASE, check, extract_code, last_boxed, main, make_example
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


def test_prm_sequences_carry_running_verdicts():
    """The PRM's targets: at each tag the step's label; at each result digit, whether the chain is
    right up to that digit; no language modelling after the first wrong step. The input is exactly
    math-shepherd's text as the RSD scorer builds it."""
    import random

    from transformers import AutoTokenizer

    from engine.training.data import IGNORE, prm_sequence, prm_text
    from engine.training.tokenizer import STEP_TAG

    tok = AutoTokenizer.from_pretrained("assets/models/tiny-reasoner")
    plus, minus, tag = (tok.convert_tokens_to_ids(t) for t in ("+", "-", STEP_TAG))
    digits = {tok.convert_tokens_to_ids(str(d)) for d in range(10)}
    for seed in range(60):
        ids, targets = prm_sequence(tok, seed, random.Random(seed))
        ex = make_example("arithmetic", seed)
        verdicts = [t for t in targets if t in (plus, minus)]
        tags = [targets[i] for i, t in enumerate(ids) if t == tag]
        assert len(tags) == len(ex.reasoning_steps) + 1
        assert all(targets[i] in (plus, minus) for i, t in enumerate(ids) if t in digits and targets[i] != IGNORE
                   and (i + 1 == len(ids) or targets[i] != ids[i + 1]))
        if minus in tags:
            first_bad = tags.index(minus)
            assert tags[first_bad:] == [minus] * (len(tags) - first_bad), "every step after an error is bad"
            # the first wrong step's digits: right ones first, then wrong from the first mismatch on
            step_verdicts = verdicts[: verdicts.index(minus) + 1]
            assert step_verdicts[-1] == minus and all(v == plus for v in step_verdicts[:-1])
            last_good_tag = [i for i, t in enumerate(ids) if t == tag][first_bad - 1]
            lm_after = [t for t in targets[last_good_tag + 1:] if t not in (plus, minus, IGNORE)]
            assert lm_after == [], "no language modelling on wrong arithmetic"
            assert plus not in verdicts[verdicts.index(minus):]
        else:
            assert set(verdicts) == {plus}
        assert tok.decode(ids).startswith(ex.prompt)
    steps = list(make_example("arithmetic", 0).reasoning_steps)
    assert tok.encode(prm_text("q?", steps), add_special_tokens=False)[-1] == tag
