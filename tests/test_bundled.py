"""The bundled models load offline and reproduce their known greedy outputs.

The expected outputs are written by ``python -m engine.training.evaluate --write-expected
tests/data/bundled_expected.json`` whenever the bundled checkpoints change.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.runtime.model import load_model
from engine.training.evaluate import KNOWN_BUDGET
from tests.numeric import (
    Gap,
    assert_within,
    distance,
    float64_copy,
    forward_depth,
    gap_to_reference,
    softmax_depth,
    tolerance,
)

EXPECTED = json.loads((Path(__file__).parent / "data" / "bundled_expected.json").read_text())


def test_the_default_model_is_bundled():
    assert "tiny-reasoner" in EXPECTED
    lm = load_model()  # no name: the bundled tiny-reasoner, offline
    assert lm.markers is not None and lm.model_id == "tiny-reasoner"


@pytest.mark.parametrize("name", [n for n in EXPECTED if n != "tiny-prm"])
def test_known_greedy_output(name):
    lm = load_model(name)
    done = list(decode_baseline(lm, EXPECTED[name]["prompt"], RunConfig(**KNOWN_BUDGET)))[-1]
    assert done.reasoning_ids == EXPECTED[name]["reasoning_ids"]
    assert done.answer_ids == EXPECTED[name]["answer_ids"]


@pytest.mark.numeric
@pytest.mark.skipif("tiny-prm" not in EXPECTED, reason="no bundled PRM exported yet")
def test_known_prm_scores():
    """Our scores and the written ones (a float32 run on whichever CPU wrote them) are each within
    float32's rounding of the same weights' scores in float64."""
    from engine.methods.rsd.prm import MathShepherdScorer

    lm = load_model("tiny-prm")
    scorer, exact = MathShepherdScorer(lm), MathShepherdScorer(float64_copy(lm))
    exp = EXPECTED["tiny-prm"]
    for kind in ("good", "bad"):
        truth = torch.tensor(exact.score_all(exp["question"], exp[f"{kind}_steps"]))
        with torch.no_grad():
            logits = exact.lm.model(input_ids=torch.tensor([exact.tokens])).logits[0]  # [T, V]
        tags = logits[torch.tensor(exact.tokens) == exact.tag][:, [exact.plus, exact.minus]]
        ours = torch.tensor(scorer.score_all(exp["question"], exp[f"{kind}_steps"]))
        # ours: a float32 forward, then a two-way softmax (p(+) moves by at most half the logits' error)
        forward = tolerance(torch.float32, tags, forward_depth(lm.model.config) + softmax_depth(2))
        assert_within(Gap(distance(ours, truth), forward, "a float32 forward and softmax"), "scores")
        # the written ones: another float32 run of the same weights, SLACK x as far from float64 as ours at
        # most, or the final softmax's own rounding (a machine whose forward happens to be exact)
        written = torch.tensor(exp[f"{kind}_scores"])
        assert_within(gap_to_reference(written, ours, truth, floor=tolerance(torch.float32, 1.0, softmax_depth(2))),
                      "scores")


def test_prm_on_the_drafts_own_steps():
    # the evaluation of the PRM on real slips: the draft's greedy chains, labelled step by step
    from engine.training.evaluate import draft_steps_auroc

    prm, draft = load_model("tiny-prm"), load_model("tiny-reasoner-draft")
    result = draft_steps_auroc(prm.model, prm.tokenizer, draft.model, draft.tokenizer, 12)
    assert result["right_steps"] > 0 and result["wrong_steps"] > 0  # held-out seeds 0-11 include slips
    # 0.77 on these 12 prompts (two wrong chains); 0.97 on the 100 of docs/BENCHMARKS.md. Labels
    # turned around or scores read off the wrong token would put it below 0.5.
    assert result["first_error"] > 0.7 and result["all"] > 0.7
