"""One token, one proposer, one count (issue 55, build items 2 and 9).

For every run here (the bundled model: SSR with its drafts always forked on classes examples, plain
decoding and SSR's lookups alone; SmolLM2 where it is installed), the answer's counts by the proposer
that won each token (draft prefix, suffix in a draft, lookup in the prompt / reasoning / answer,
generated) are the token events' latest statuses and sources counted directly, and so are the run
log's columns, the strip's cells and the panes' colours; no draft token is taken twice (a second
verdict would recolour a green prefix token amber). Per proposer, the acceptance figures the strip
and the log give (vLLM's num_drafts, num_draft_tokens, num_accepted_tokens) are the forwards' records.
"""

from __future__ import annotations

import functools
import re
from collections import Counter

import pytest

from engine.config import RunConfig
from engine.events import DoneEvent, ForwardEvent, RunStats, TokenEvent, proposer
from engine.registry import decoder
from engine.runlog import RunLog, RunMeta
from engine.runtime.model import load_model
from engine.tools.synthetic import EVAL_SEED_BASE, make_example
from ssr_ui.charts import token_composition
from ssr_ui.render import TraceView, metrics_html
from tests.test_real_models import smollm2

CFG = RunConfig(drafting="always", max_think=64, max_answer=48, draft_start=16, draft_interval=16, num_drafts=2,
                max_draft=40)
# SmolLM2 repeats its list in the answer: lookups win most of it (the strip's "repeating" cell)
SMOL = RunConfig(drafting="always", max_think=64, max_answer=40, draft_start=8, draft_interval=16, num_drafts=2,
                 max_draft=40)


@functools.cache
def bundled():
    return load_model("tiny-reasoner")


def won_directly(events: list) -> Counter:
    """Each answer token's proposer by its latest verdict, counted from the events alone."""
    latest: dict[int, TokenEvent] = {}
    for e in events:
        if isinstance(e, TokenEvent) and e.stream == "answer":
            latest[e.position] = e
    return Counter(proposer(e.status, e.source) or ("draft prefix" if e.status == "accepted" else "generated")
                   for e in latest.values())


def acceptance_directly(events: list) -> dict[str, tuple[int, int, int]]:
    """Per proposer, (verifies, tokens proposed, tokens accepted) from the forwards' own rows."""
    out: dict[str, list[int]] = {}
    for f in events:
        if isinstance(f, ForwardEvent):
            for r in f.rows:
                if r.proposed > 0:
                    mine = out.setdefault(r.proposer or "lookup", [0, 0, 0])
                    mine[0], mine[1], mine[2] = mine[0] + 1, mine[1] + r.proposed, mine[2] + r.accepted
    return {who: tuple(v) for who, v in out.items()}


def assert_credited_once(events: list, tmp_path) -> RunStats:
    done = events[-1]
    assert isinstance(done, DoneEvent)
    s = done.stats
    direct = won_directly(events)
    won = s.won()
    assert {k: v for k, v in won.items() if v} == {k: v for k, v in direct.items() if v}, "the stats are the events"
    assert sum(won.values()) == s.answer_tokens == len(done.answer_ids), "each answer token counted once"
    # no draft token is taken twice, nor given a verdict after it was taken
    verdicts: dict[tuple, list[str]] = {}
    for e in events:
        if isinstance(e, TokenEvent) and e.stream == "draft":
            verdicts.setdefault((e.draft, e.position), []).append(e.status)
    for key, seq in verdicts.items():
        taken = [i for i, st in enumerate(seq) if st in ("accepted", "recovered")]
        assert len(taken) <= 1 and (not taken or taken[0] == len(seq) - 1), f"draft token {key}: {seq}"
    # per proposer acceptance: the stats' figures are the forwards'
    rates = {p.proposer: (p.num_drafts, p.num_draft_tokens, p.num_accepted_tokens) for p in s.by_proposer()}
    assert rates == acceptance_directly(events)
    # the run log's row: the same counts, column by column, and the same acceptance
    log = RunLog(tmp_path / f"runs-{s.method}.db")
    row = log.run(log.save(RunMeta(s.method, "m", "p"), events, "ok"))
    logged = RunStats.from_dict({k: v for k, v in row.items() if v is not None})
    assert logged.won() == won and [p.words() for p in logged.by_proposer()] == [p.words() for p in s.by_proposer()]
    chart = {t.name: t.y[0] for t in token_composition([row]).data}
    assert chart == {"accepted": s.accepted, "recovered": s.recovered, "lookups": sum(
        n for k, n in won.items() if k.startswith("lookup")), "generated": s.generated}
    # the panes' colours and the strip's cells: the same numbers
    view = TraceView(method=s.method)
    for e in events:
        view.apply(e)
    colours = Counter("lookups" if "src-lookup" in t.span() else re.search(r"st-(\w+)", t.span()).group(1)
                      for t in view.answer)
    assert colours == Counter({"accepted": s.accepted, "recovered": s.recovered, "generated": s.generated,
                               "lookups": s.lookup_prompt + s.lookup_reasoning + s.lookup_answer}) - Counter()
    strip = metrics_html(view, s.method)
    cells = dict(re.findall(r'<div class="k"[^>]*>([^<]+)</div><div class="v">(?:<span[^>]*>)?([^<]*)', strip))
    for name, n in (("accepted", s.accepted), ("recovered", s.recovered), ("generated", s.generated)):
        assert cells[name].split()[0] == str(n), (name, cells[name])
    assert int(cells.get("lookups", "0").split()[0]) == colours["lookups"]
    for p in s.by_proposer():
        assert f"{p.proposer} {p.acceptance_rate:.0%}, {p.per_verify()}" in cells["acceptance"]
        assert p.per_verify() == f"{p.num_accepted_tokens / p.num_drafts:.1f} of {p.num_draft_tokens / p.num_drafts:.1f}/verify"
    assert ("repeating" in cells) == (2 * colours["lookups"] > s.answer_tokens)
    return s


@pytest.mark.parametrize("k", [0, 3])
def test_bundled_model_credits_each_token_once(k, tmp_path):
    lm = bundled()
    prompt = make_example("classes", EVAL_SEED_BASE + k).prompt
    for method in ("ssr", "baseline", "ssr-lookups"):
        s = assert_credited_once(list(decoder(method, lm)(prompt, CFG)), tmp_path)
        if method == "baseline":
            assert s.generated == s.answer_tokens and not s.by_proposer()


def test_smollm2_credits_each_token_once(tmp_path):
    lm = smollm2()
    for method in ("ssr", "ssr-lookups"):
        assert_credited_once(list(decoder(method, lm)("List four fruits, one per line.", SMOL)), tmp_path)


def test_lookups_are_not_recovered_and_a_repeating_answer_is_said():
    """The strip's "recovered 40" that was 21 suffix tokens and 19 lookups: now 21 and 19, and lookups that
    won most of the answer are named as the model repeating itself."""
    s = RunStats(answer_tokens=50, recovered=21, lookup_reasoning=19, lookup_prompt=8, generated=2)
    assert s.won()["suffix in drafts"] == 21 and s.won()["lookup in reasoning"] == 19
    assert s.repetition() == "lookups won 54% of the answer: the model repeats its reasoning and the prompt"
    assert RunStats(answer_tokens=50, lookup_answer=25, generated=25).repetition() == ""
