"""The PRM's tokenizer and training sequences, and the training loss."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from engine.tools.synthetic import make_arithmetic_example
from engine.training.data import IGNORE, corrupted_steps, prm_sequence, prm_text, prm_tokenizer_corpus
from engine.training.tokenizer import STEP_TAG, build_prm_tokenizer
from engine.training.train import weighted_loss


@pytest.fixture(scope="module")
def tok():
    return build_prm_tokenizer(prm_tokenizer_corpus(300))


def test_numbers_are_single_tokens_and_unknown_words_unk(tok):
    pieces = tok.convert_ids_to_tokens(tok.encode("38 plus 42 is 80. ки", add_special_tokens=False))
    assert pieces == ["38", "plus", "42", "is", "80", ".", STEP_TAG]
    assert tok.convert_ids_to_tokens(tok.encode("\\boxed{969}", add_special_tokens=False)) == ["\\", "boxed", "{", "969", "}"]
    for verdict in ("+", "-", STEP_TAG):
        assert len(tok.encode(verdict, add_special_tokens=False)) == 1
    assert tok.encode("zebra", add_special_tokens=False) == [tok.unk_token_id]


def test_step_by_step_encoding_equals_whole_encoding(tok):
    # the incremental scorer encodes the question, then each "\nstep ки" piece on its own
    ex = make_arithmetic_example(11)
    steps = ex.steps
    pieces = tok.encode(ex.prompt, add_special_tokens=False)
    for k, s in enumerate(steps):
        pieces += tok.encode(("\n" if k else " ") + f"{s} {STEP_TAG}", add_special_tokens=False)
    assert pieces == tok.encode(prm_text(ex.prompt, steps), add_special_tokens=False)


def test_prm_sequence_puts_verdicts_at_results_and_tags(tok):
    plus, minus, tag = (tok.convert_tokens_to_ids(t) for t in ("+", "-", STEP_TAG))
    for seed in range(40):
        ids, targets = prm_sequence(tok, seed, random.Random(seed))
        replay = random.Random(seed)  # the draws prm_sequence makes: clean or corrupted, then where
        clean = replay.random() < 0.5
        labels = None if clean else corrupted_steps(make_arithmetic_example(seed), replay)[1]
        assert len(ids) == len(targets)
        tags = [i for i, t in enumerate(ids) if t == tag]
        verdicts = [i for i, t in enumerate(targets) if t in (plus, minus)]
        assert set(tags) <= set(verdicts) and len(verdicts) == 2 * len(tags)  # tag + the step's last number
        for i in verdicts:
            if ids[i] != tag:
                assert tok.convert_ids_to_tokens(ids[i]).isdigit()
        tag_verdicts = [targets[i] == plus for i in tags]
        if labels is None:
            assert all(tag_verdicts)
        else:
            assert tag_verdicts == labels and not all(labels)
            # no next-token targets from the first wrong step on
            first_wrong = tags[labels.index(False) - 1] + 1
            assert all(t in (IGNORE, plus, minus) for t in targets[first_wrong:])


def test_weighted_loss_counts_verdicts_more():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    targets = torch.tensor([[1, 2, IGNORE, 5, 6], [0, IGNORE, 3, 4, 5]])
    plain = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE)
    assert weighted_loss(logits, targets, [5, 6], 1.0) == pytest.approx(float(plain))
    per = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="none")
    valid = targets.flatten() != IGNORE
    w = valid.float() + 2.0 * torch.isin(targets.flatten(), torch.tensor([5, 6])).float()
    assert weighted_loss(logits, targets, [5, 6], 3.0) == pytest.approx(float((per * w).sum() / w.sum()))

