"""The RSD breakdown reads a chain against its reference: where the first wrong paragraph came from."""

from __future__ import annotations

import pytest

from engine.events import StepEvent
from engine.tools.rsd_breakdown import classify, wilson

REF = ("Start with 5.", "5 plus 3 is 8.", "8 times 2 is 16.", "The result is \\boxed{16}.")


def step(text, source="draft", reward=0.9, accepted=True):
    return StepEvent(0, text, source, reward if source == "draft" else None, accepted if source == "draft" else None, 0.0)


@pytest.mark.parametrize("events, where", [
    # the draft slips by a carry and the PRM keeps it. Tempting wrong: "answer-slip" (the answer is wrong too)
    ([step("<think>\nStart with 5.\n\n"), step("5 plus 3 is 8.\n\n"), step("8 times 2 is 26.\n\n", reward=0.8),
      step("</think>\n\nThe result is \\boxed{26}.")], "prm-miss"),
    # the PRM rejects the slip and the target rewrites it wrongly. Tempting wrong: "prm-miss" (a draft step was wrong)
    ([step("Start with 5.\n\n"), step("5 plus 3 is 8.\n\n"), step("8 times 2 is 26.\n\n", reward=0.1, accepted=False),
      step("8 times 2 is 18.\n\n", source="target"), step("The result is \\boxed{18}.")], "target-slip"),
    # every reasoning paragraph right, the answer not
    ([step("Start with 5.\n\n5 plus 3 is 8.\n\n"), step("8 times 2 is 16.\n\n"), step("The result is \\boxed{61}.")],
     "answer-slip"),
])
def test_the_first_wrong_paragraph_says_where_rsd_lost(events, where):
    assert classify(events, REF)["where"] == where


def test_prm_counts_separate_caught_missed_and_false_alarms():
    events = [step("Start with 5.\n\n"), step("5 plus 3 is 9.\n\n", reward=0.2, accepted=False),
              step("5 plus 3 is 8.\n\n", source="target"), step("8 times 2 is 16.\n\n", reward=0.3, accepted=False),
              step("8 times 2 is 16.\n\n", source="target"), step("The result is \\boxed{61}.", reward=0.75)]
    prm = classify(events, REF)["prm"]
    assert prm["wrong_rejected"] == 1 and prm["right_rejected"] == 1 and prm["wrong_kept"] == [0.75]
    assert prm["right_kept"] == 1


@pytest.mark.numeric
def test_wilson_interval():
    low, high = wilson(93, 100)
    # the closed form with z = 1.96 worked by hand to 4 decimals: half a unit of the last one
    assert low == pytest.approx(0.8625, abs=5e-5) and high == pytest.approx(0.9657, abs=5e-5)
    assert wilson(0, 0) == (0.0, 1.0)
