"""Sampled SSR against the *exact* distribution of plain decoding, enumerated on an 8-word model.

Plain decoding's law over whole outputs (reasoning ids, answer ids) is computed by walking every
branch of its decode tree with the model's probabilities (branches below 1e-6 are lumped together
an outcome is one path, so no outcome
expected often enough to get its own cell loses any mass). SSR is then sampled under many seeds and a chi-square goodness-of-fit
test compares its outputs to that law. The model ends drafts and answers often (end of sequence
scores as "a"), so the tests reach a draft that ends by sampling end of sequence: the corner that
was not exact before (the draft's end was dropped instead of proposed with its q).

Power: the same test must reject two broken rules, accepting every proposal and dropping a
draft's sampled end.
"""

from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare

from engine.config import RunConfig
from engine.methods import sampling
from engine.methods.sampling import target_probs
from engine.methods.ssr import proposers
from engine.methods.ssr.loop import decode_ssr
from tests.tiny import make_small_vocab_model

PROMPT = "a b c"
PRUNE = 1e-4  # a path this unlikely is lumped; any outcome with a cell of its own is far above it


@functools.cache
def _lm():
    return make_small_vocab_model(seed=2, init_scale=5.0)  # peaky and context-dependent: the fit has power


def exact_law(lm, cfg: RunConfig) -> tuple[dict, float]:
    """{(reasoning ids, answer ids): probability} of plain decoding, and the pruned mass."""
    law: Counter = Counter()
    pruned = [0.0]
    markers, stop = lm.markers, lm.eos_ids

    @torch.inference_mode()
    def dist(ids):
        logits = lm.model(torch.tensor([ids])).logits[0, -1]
        return target_probs(logits, cfg.temperature, cfg.top_p).tolist()

    def answer(ids, reasoning, ans, p):
        if len(ans) == cfg.max_answer:
            law[(reasoning, ans)] += p
            return
        for tok, q in enumerate(dist(ids)):
            if q == 0:
                continue
            if p * q < PRUNE:
                pruned[0] += p * q
            elif tok in stop:
                law[(reasoning, ans)] += p * q
            else:
                answer([*ids, tok], reasoning, (*ans, tok), p * q)

    def reason(ids, reasoning, p):
        if len(reasoning) == cfg.max_think - 1:  # budget forcing: the marker is the budget's last token
            tail = markers.tail_ids
            return answer([*ids, *markers.close_ids], (*reasoning, *markers.marker_ids), tuple(tail), p)
        for tok, q in enumerate(dist(ids)):
            if q == 0:
                continue
            if p * q < PRUNE:
                pruned[0] += p * q
            elif tok in stop:  # ended inside the reasoning: no answer
                law[(reasoning, ())] += p * q
            elif tok == markers.marker_ids[0]:
                answer([*ids, *markers.close_ids], (*reasoning, tok), tuple(markers.tail_ids), p * q)
            else:
                reason([*ids, tok], (*reasoning, tok), p * q)

    reason(lm.prompt_ids(PROMPT), (), 1.0)
    return dict(law), pruned[0]


def fit_pvalue(cfg: RunConfig, runs: int) -> float:
    """Chi-square p-value of ``runs`` seeded SSR outputs against the exact law (outcomes expected
    fewer than 5 times, and the pruned mass, pooled into one cell)."""
    lm = _lm()
    law, pruned = exact_law(lm, cfg)
    assert abs(sum(law.values()) + pruned - 1) < 1e-5 and PRUNE * runs < 5  # float32 probabilities
    seen = Counter()
    for seed in range(runs):
        done = list(decode_ssr(lm, PROMPT, cfg.replace(seed=seed)))[-1]
        seen[(tuple(done.reasoning_ids), tuple(done.answer_ids))] += 1
    big = [k for k, p in law.items() if p * runs >= 5]
    observed = [seen[k] for k in big] + [runs - sum(seen[k] for k in big)]
    expected = [law[k] * runs for k in big] + [runs - sum(law[k] for k in big) * runs]
    return float(chisquare(observed, expected).pvalue)


# draft at reasoning token 0 (the draft never saw the reasoning), short drafts that often end by
# sampling end of sequence, answers of up to 3 tokens, one token per reasoning step (think-spec-2:
# reasoning lookups)
BASE = RunConfig(max_think=2, max_answer=3, draft_start=0, max_draft=3, temperature=1.0, think_spec=0)
CONFIGS = {
    "temperature-1": BASE,
    "top-p-0.8": BASE.replace(top_p=0.8),
    "think-spec-default": BASE.replace(think_spec=RunConfig().think_spec),
    "think-spec-2": BASE.replace(max_think=3, think_spec=2, min_match=1, temperature=0.8, num_drafts=2,
                                 draft_interval=1),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_ssr_sampling_fits_the_exact_baseline_law(name):
    assert fit_pvalue(CONFIGS[name], runs=1000) > 1e-3  # its power at 1000 runs: test_the_fit_detects_a_broken_rule


def _always_accept(target, tokens, q, g):
    return len(tokens), sampling.sample(target[len(tokens)], g)


def _drop_the_end(self, answer, max_tokens):
    """The old proposer: a draft's sampled end of sequence is never proposed."""
    if self.draft is None:
        return _propose(self, answer, max_tokens)
    end, self.draft.end = self.draft.end, None
    try:
        return _propose(self, answer, max_tokens)
    finally:
        self.draft.end = end


_propose = proposers.DraftPrefixProposer.propose


@pytest.mark.parametrize("broken", ["always-accept", "drop-the-draft-end"])
def test_the_fit_detects_a_broken_rule(broken, monkeypatch):
    if broken == "always-accept":
        monkeypatch.setattr(sampling, "verify_sampled", _always_accept)
    else:
        monkeypatch.setattr(proposers.DraftPrefixProposer, "propose", _drop_the_end)
    # 1,000 runs reject both at p ~ 4e-10 (1,500 gave 8e-22): six orders of magnitude inside the bound
    assert fit_pvalue(CONFIGS["temperature-1"], runs=1000) < 1e-4
