"""Compiled steps compile before the clock: timed runs after a warm-up meet no new graph (issue 56).

A bench warms each method up on its first prompt, then times every prompt. A later prompt may be
longer, so its run's fixed cache is larger (the capacity is rounded up to a power of two): that
capacity is symbolic in the compiled step (``engine.runtime.static``), so the larger cache runs
the graphs the warm-up made. The count covers everything a timed run does, its ``prepare_steps``
included: the same for 1 prompt and for 3, and that number is zero.
"""

from __future__ import annotations

import pytest

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.loop import decode_ssr
from tests.tiny import counting_compiles

# the second prompt is long enough that its runs' fixed cache is twice the first's (256 -> 512 slots)
PROMPTS = ("hello world", "class Garden: rose " * 8, "the lazy dog " * 12)
CFG = RunConfig(max_think=24, max_answer=30, max_draft=14, draft_start=3, think_spec=4, drafting="always",
                compile="on")


@pytest.fixture
def counted(monkeypatch):
    return counting_compiles(monkeypatch)


def _timed_compiles(lm, compiles, prompts) -> int:
    """Compiles during timed runs of ``prompts`` (each method in turn), after a warm-up of each
    method on the first prompt, as the bench runs them; also checks the runs are compiled."""
    for decode in (decode_baseline, decode_ssr):
        list(decode(lm, prompts[0], CFG))
    before = len(compiles)
    for prompt in prompts:
        for decode in (decode_baseline, decode_ssr):
            assert list(decode(lm, prompt, CFG))[-1].stats.step_mode == "compiled"
    return len(compiles) - before


def test_no_compiles_inside_timed_runs_for_one_prompt_or_three(counted):
    lm, compiles = counted
    assert _timed_compiles(lm, compiles, PROMPTS[:1]) == 0
    capacities = {shape[2] for shape in lm.compiled.shapes}
    assert _timed_compiles(lm, compiles, PROMPTS) == 0
    assert {shape[2] for shape in lm.compiled.shapes} > capacities  # a larger cache ran, on the same graphs
    assert compiles  # the warm-up compiled
