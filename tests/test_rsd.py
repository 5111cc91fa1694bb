"""RSD: acceptance rules, PRM scorers, plumbing exactness at the extremes, accounting, bad input."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from engine.config import RunConfig
from engine.methods.rsd.acceptance import WEIGHTINGS, accept, weight
from engine.methods.rsd.loop import decode_rsd
from engine.methods.rsd.prm import MathShepherdScorer, TargetLikelihoodScorer
from engine.methods.rsd.writer import Step, read_step
from engine.runtime.cached import CachedModel
from tests.numeric import MARGIN, forward_depth, softmax_depth, tolerance
from tests.tiny import make_model, make_tokenizer

CFG = dict(max_think=30, max_answer=10, max_step_tokens=5, max_steps=8)


# ----------------------------------------------------------------------------- acceptance rules

@pytest.mark.parametrize("weighting, reward, threshold, param, expected", [
    ("binary", 0.7, 0.7, 1.0, 1.0),       # at the threshold: kept (>=). Tempting wrong: 0 with a strict >
    ("binary", 0.69, 0.7, 1.0, 0.0),
    ("binary", 0.0, 0.0, 1.0, 1.0),       # threshold 0 keeps every reward in [0, 1]
    ("binary", 1.0, 1.01, 1.0, 0.0),      # above 1 keeps nothing
    ("constant", 0.1, 0.7, 0.3, 0.3),     # ignores the reward
    ("clipping", 1.7, 0.7, 1.0, 1.0),
    ("clipping", -0.2, 0.7, 1.0, 0.0),
    ("clipping", 0.42, 0.7, 1.0, 0.42),
    ("sigmoidal", 1.0, 0.7, 1.0, 0.5),    # r / (1 + r). Tempting wrong: the logistic sigmoid 0.73
    ("sigmoidal", -0.5, 0.7, 1.0, 0.0),
    ("logistic", 0.7, 0.7, 5.0, 0.5),     # centred on the threshold
    ("logistic", 0.9, 0.7, 10.0, 1 / (1 + math.exp(-2.0))),
])
def test_weights(weighting, reward, threshold, param, expected):
    assert weight(weighting, reward, threshold, param) == pytest.approx(expected)


def test_soft_rules_are_stochastic_binary_is_not():
    assert accept("clipping", 0.4, 0.39) and not accept("clipping", 0.4, 0.41)
    assert all(accept("binary", 0.8, u) for u in (0.0, 0.5, 0.999))


@pytest.mark.parametrize("weighting, threshold, param, message", [
    ("warp", 0.7, 1.0, "Weighting (weighting) must be one of binary, constant, clipping, sigmoidal, logistic; got 'warp'"),
    ("constant", 0.7, 1.5, "Weight parameter (weight_param) must be a probability in 0..1 (the constant rule's p); got 1.5"),
    ("logistic", 0.7, 0.0, "Weight parameter (weight_param) must be a number above 0 (the logistic rule's slope); got 0.0"),
    ("binary", float("inf"), 1.0, "Threshold (threshold) must be a number in 0..2 (above 1: every draft step rewritten); got inf"),
])
def test_rule_parameters_are_checked(weighting, threshold, param, message):
    with pytest.raises(ValueError) as err:
        RunConfig(weighting=weighting, threshold=threshold, weight_param=param)
    assert str(err.value) == message


def test_the_binary_threshold_spans_every_rule_from_draft_alone_to_target_alone():
    for t in (0.0, 0.7, 1.0, 1.05, 2.0):  # 0 keeps every step, above 1 (a PRM scores in [0, 1]) none
        RunConfig(threshold=t)
    for t in (-3.0, 2.5, 42.0):  # refused, not clamped (before: any real number ran)
        with pytest.raises(ValueError, match="Threshold \\(threshold\\) must be a number in 0..2"):
            RunConfig(threshold=t)
    assert set(WEIGHTINGS) == {"binary", "constant", "clipping", "sigmoidal", "logistic"}


# ----------------------------------------------------------------------------- the step-end rule

class _Pieces:
    """A tokenizer stand-in: token ids decode to fixed pieces (0 is the end of sequence)."""

    def decode(self, ids):
        return "".join({1: "a", 2: "\n\n", 3: " ", 4: "\n"}[i] for i in ids)


@pytest.mark.parametrize("picks, max_step_tokens, budget, expected, reads", [
    ([1, 2, 1], 10, 10, Step([1, 2], False, 0.8), 2),         # ends at the delimiter. Tempting wrong: runs on
    ([2, 1, 2], 10, 10, Step([2, 1, 2], False, 0.7), 3),      # a leading blank delimiter does not end it
    ([3, 2, 1, 2], 10, 10, Step([3, 2, 1, 2], False, 0.5), 4),  # nor whitespace then a delimiter: still blank
    ([1, 4, 4], 10, 10, Step([1, 4, 4], False, 0.7), 3),      # a delimiter spread over two tokens ends it too
    ([1, 0, 1], 10, 10, Step([1], True, 0.8), 2),             # an end of sequence: not in the step; its doubt counts
    ([1, 1, 1], 2, 10, Step([1, 1], False, 0.8), 2),          # max_step_tokens: the step ends, the run does not
    ([1, 1, 1], 10, 2, Step([1, 1], True, 0.8), 2),           # the budget: the run ends. Tempting wrong: ended False
    ([1], 10, 10, Step([1], False, 0.9), 1),                  # the source ran dry (a server stopped by itself)
])
def test_the_step_end_rule(picks, max_step_tokens, budget, expected, reads):
    read = []

    def source():  # lazy, as a model's picks are: each pick read is counted
        for t, prob in zip(picks, (0.9, 0.8, 0.7, 0.5), strict=False):
            read.append(t)
            yield t, prob

    assert read_step(source(), _Pieces(), {0}, max_step_tokens, budget) == expected
    assert len(read) == reads  # nothing read past the step's end (no forward, no streamed token wasted)


# ----------------------------------------------------------------------------- scorers

@functools.cache
def trio():
    return (make_model("llama", seed=1, init_scale=2.0), make_model("qwen2", seed=2, init_scale=2.0),
            make_model("llama", seed=3))


def _two_way(logits: torch.Tensor, prm: MathShepherdScorer) -> float:
    """p(+) from a row of logits, as the scorer reads it (a float32 softmax over "+" and "-")."""
    return float(torch.softmax(logits[[prm.plus, prm.minus]].float(), -1)[0])


@pytest.mark.numeric
def test_math_shepherd_scores_in_unit_interval_and_incrementally():
    prm = MathShepherdScorer(trio()[2])
    prm.start("What is 7 plus 5?")
    first = prm.score("7 plus 5 is 12.")
    prm.commit("7 plus 5 is 12.")
    second = prm.score("The result is \\boxed{12}.")
    assert 0.0 <= first <= 1.0 and 0.0 <= second <= 1.0
    # from scratch, the same input: the tag is read at the same position, the score agrees
    tok = prm.lm.tokenizer
    ids = prm.tokens + tok.encode("\nThe result is \\boxed{12}. ки", add_special_tokens=False)
    with torch.no_grad():
        logits = prm.lm.model(torch.tensor([ids])).logits[0]  # [T, V]
    # two float64 forwards (cached, from scratch), then a float32 two-way softmax of each
    pair = logits[-1, [prm.plus, prm.minus]]
    bound = (tolerance(torch.float64, pair, forward_depth(prm.lm.model.config))
             + tolerance(torch.float32, pair, softmax_depth(2)))
    assert ids[-1] == prm.tag and second == pytest.approx(_two_way(logits[-1], prm), abs=bound)
    assert abs(second - _two_way(logits[-2], prm)) > MARGIN * bound  # the companion: read one token early, caught
    # piece-by-piece encoding equals encoding math-shepherd's whole input at once
    whole = tok.encode("What is 7 plus 5? 7 plus 5 is 12. ки\nThe result is \\boxed{12}. ки", add_special_tokens=False)
    assert ids == whole


def test_prm_without_step_tag_does_not_fit():
    lm = make_model("llama")
    lm.tokenizer = make_tokenizer()  # same tokenizer...
    lm.tokenizer.encode = lambda text, add_special_tokens=False: [1, 2]  # ...where the tag is not one token
    with pytest.raises(ValueError, match="does not fit the 'ки' step format"):
        MathShepherdScorer(lm)


@pytest.mark.numeric
def test_target_likelihood_is_mean_token_probability():
    target = CachedModel(trio()[0])
    seq, step = [5, 6, 7], [8, 9]
    score = TargetLikelihoodScorer(target).score("", seq, step)
    with torch.no_grad():
        logits = trio()[0].model(torch.tensor([seq + step])).logits[0]
    probs = torch.softmax(logits.float(), -1)
    expected = (probs[2, 8] + probs[3, 9]) / 2
    # two float64 forwards, then a float32 softmax over the vocabulary and a mean of two (2 roundings); a
    # softmax's errors are relative to each probability: |dp| <= p (2 |dz| + its own roundings)
    p = float(probs[[2, 3], [8, 9]].max())
    bound = p * (2 * tolerance(torch.float64, logits, forward_depth(trio()[0].model.config))
                 + tolerance(torch.float32, logits, softmax_depth(logits.shape[-1]) + 2))
    assert score == pytest.approx(float(expected), abs=bound) and target.length == len(seq)
    early = (probs[1, 8] + probs[2, 9]) / 2  # the companion: each token's prediction read one position early
    assert abs(score - float(early)) > MARGIN * bound


# ----------------------------------------------------------------------------- the loop

def run(mode, threshold=0.7, scorer=None, prompt="Start with 7", **kw):
    target, draft, prm_lm = trio()
    prm = scorer if scorer is not None else MathShepherdScorer(prm_lm)
    return list(decode_rsd(target, draft, prm, prompt, RunConfig(**{**CFG, **kw}, threshold=threshold), mode=mode))


@pytest.mark.parametrize("prompt", ["Start with 7", "hello world", "héllo 😀"])
def test_threshold_zero_equals_draft_alone(prompt):
    rsd, alone = run("rsd", threshold=0.0, prompt=prompt)[-1], run("draft", prompt=prompt)[-1]
    assert rsd.reasoning_ids + rsd.answer_ids == alone.reasoning_ids + alone.answer_ids
    assert rsd.stats.rsd.steps_rejected == 0 and rsd.stats.rsd.steps_accepted > 0


@pytest.mark.parametrize("prompt", ["Start with 7", "hello world", "héllo 😀"])
def test_threshold_above_one_equals_target_alone(prompt):
    rsd, alone = run("rsd", threshold=1.01, prompt=prompt)[-1], run("target", prompt=prompt)[-1]
    assert rsd.reasoning_ids + rsd.answer_ids == alone.reasoning_ids + alone.answer_ids
    assert rsd.stats.rsd.steps_accepted == 0 and rsd.stats.rsd.steps_rejected > 0


def test_target_likelihood_scorer_runs_the_loop():
    done = run("rsd", threshold=0.0, scorer="target-likelihood")[-1]
    assert done.stats.rsd.steps_accepted > 0 and done.stats.target_tokens > 0


def test_events_and_accounting():
    events = run("rsd", threshold=0.5, weighting="clipping")
    done = events[-1]
    steps = [e for e in events if e.kind == "step"]
    kept = [e for e in steps if e.accepted is not False]
    assert len(kept) == done.stats.rsd.steps_accepted + done.stats.rsd.steps_rejected
    assert all(0 <= e.reward <= 1 for e in steps if e.reward is not None)
    rejected_draft = [e for e in events if e.kind == "token" and e.stream == "draft" and e.status == "rejected"]
    assert len(rejected_draft) == done.stats.rejected
    target, draft, prm = trio()
    s = done.stats
    assert s.target_flops == 2 * target.num_parameters * s.target_tokens
    assert s.draft_flops == 2 * draft.num_parameters * s.draft_model_tokens
    assert s.prm_flops == 2 * prm.num_parameters * s.prm_tokens
    assert s.flops == s.target_flops + s.draft_flops + s.prm_flops
    # each model sees every shared token once, plus what it wrote and threw away: no re-encoding
    total = s.prompt_tokens + s.reasoning_tokens + s.answer_tokens
    assert s.target_tokens <= total + s.rsd.steps_accepted + s.rsd.steps_rejected + 1
    assert s.draft_model_tokens <= total + s.rejected + s.rsd.steps_accepted + s.rsd.steps_rejected + 1


def test_incompatible_pair_is_refused_before_anything_runs():
    target = make_model("llama")
    other = make_model("qwen2")
    other.tokenizer = make_tokenizer()
    other.tokenizer.add_tokens(["<extra>"])
    with pytest.raises(ValueError, match="do not share a tokenizer"):
        list(decode_rsd(target, other, None, "hi", RunConfig(**CFG), mode="rsd"))
    with pytest.raises(ValueError, match="needs a process reward model"):
        list(decode_rsd(target, make_model("qwen2"), None, "hi", RunConfig(**CFG), mode="rsd"))


# ----------------------------------------------------------------------------- the draft's doubt (beyond the paper)

def test_draft_doubt_rewrites_steps_the_prm_would_keep():
    """At PRM threshold 0 every step passes the PRM; a doubt threshold of 1 rejects every step whose
    least likely token the draft gave less than certainty: then RSD is the target alone."""
    doubting = run("rsd", threshold=0.0, draft_confidence=1.0)
    assert doubting[-1].reasoning_ids + doubting[-1].answer_ids == \
        run("target")[-1].reasoning_ids + run("target")[-1].answer_ids
    rejected = [e for e in doubting if e.kind == "step" and e.accepted is False]
    assert rejected and all(0.0 <= e.confidence < 1.0 and e.reward is not None for e in rejected)
    trusting = run("rsd", threshold=0.0, draft_confidence=0.0)[-1]  # off: the paper's rule alone
    assert trusting.stats.rsd.steps_rejected == 0


def test_steps_carry_the_drafts_confidence_into_the_log(tmp_path):
    from engine.runlog import RunLog, RunMeta

    log = RunLog(tmp_path / "runs.db")
    target, draft, prm_lm = trio()
    events = list(log.record(decode_rsd(target, draft, MathShepherdScorer(prm_lm), "Start with 7",
                                        RunConfig(**CFG, draft_confidence=0.5), mode="rsd"),
                             RunMeta("rsd", "t", "Start with 7")))
    steps = [e for e in events if e.kind == "step" and e.source == "draft"]
    assert steps and all(e.confidence is not None for e in steps)
    assert log.events(log.runs()[0]["id"]) == events[:-1]
    with pytest.raises(ValueError, match=r"Draft doubt \(draft_confidence\) must be a number in 0..1 \(0: off\); got 1.5"):
        RunConfig(draft_confidence=1.5)
