"""Cost-aware lookup widths (engine.methods.ssr.widths): the controller's decisions on a scripted
cost model, then end to end on the bundled model: greedy identity whatever the widths, the strip and
the run log saying what was verified."""

from __future__ import annotations

import re

import pytest

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.methods.ssr.evidence import Evidence
from engine.methods.ssr.loop import decode_ssr
from engine.methods.ssr.widths import Costs, RunCosts, Timings, Widths
from engine.runtime.model import load_model
from engine.tools.synthetic import EVAL_SEED_BASE, make_example


def _timings(table: dict[int, float]) -> Timings:
    timings = Timings()
    for tokens, seconds in table.items():
        timings.record(tokens, seconds)
    return timings


def scripted(table: dict[int, float]) -> RunCosts:
    """A cost model that is told, not measured: forwards cost ``table[tokens]`` (interpolated), and
    the run learns nothing of its own."""
    return RunCosts([_timings(table)], own=None, ages=[0.0])


class ScriptedCosts(Costs):
    """A route's costs that are told: every run prices its widths by ``table`` alone."""

    def __init__(self, table: dict[int, float]) -> None:
        super().__init__()
        self.table = table

    def view(self, learn: bool = True, now: float | None = None) -> RunCosts:
        return scripted(self.table)


def _scripted_store(cfg: RunConfig, table: dict[int, float]) -> Evidence:
    store = Evidence()
    store.costs[store.route(cfg)] = ScriptedCosts(table)
    return store


def _accepting(widths: Widths, rate_first: int, of: int) -> None:
    """``of`` verifies of one token, ``rate_first`` of them accepted."""
    for i in range(of):
        widths.observe(1, int(i < rate_first))


def test_before_any_forward_is_measured_the_whole_proposal_is_verified():
    assert Widths(RunCosts()).choose(6, 1) == 6


def test_free_widths_verify_everything_proposed():
    assert Widths(scripted({1: 1.0, 16: 1.0})).choose(7, 1) == 7


def test_a_lookup_that_cannot_pay_is_not_verified_at_all():
    w = Widths(scripted({1: 1.0, 2: 2.0, 8: 8.0}))  # every extra token costs a whole step
    _accepting(w, rate_first=3, of=10)  # and a lookup's first token is accepted a third of the time
    assert w.choose(5, 1) == 0
    assert w.skipped == 1 and "1 proposals not at all" in w.said()


def test_the_width_stops_where_acceptance_falls_below_the_cost_of_a_token():
    # SmolLM2-like: 2 and 3 tokens nearly free, a cliff at 4 (the small-M matmul path)
    w = Widths(scripted({1: 1.0, 2: 1.05, 3: 1.14, 4: 1.6, 9: 2.0}))
    for _ in range(20):  # first two positions almost always accepted, the third rarely
        w.observe(4, 2)
    assert w.p(0) > 0.9 and w.p(1) > 0.9 and w.p(2) < 0.1
    assert w.choose(8, 1) == 2  # 1 + 2 tokens for 1.14x; a third costs 1.6x for almost nothing


def test_drafts_riding_make_a_wide_verify_dearer_or_cheaper_by_what_the_step_computes_anyway():
    table = {1: 1.0, 2: 1.05, 3: 1.14, 4: 1.6, 6: 1.8, 12: 2.2}
    w = Widths(scripted(table))
    for _ in range(20):
        w.observe(2, 1)  # the first token accepted always, the second never
    alone = w.choose(2, 1)
    assert alone == 1
    assert w.choose(2, 3) == 1  # beside two drafts the step computes 3 tokens: the 4th still pays for one


def test_costs_interpolate_and_hold_past_the_widest_measured():
    c = _timings({1: 1.0, 5: 3.0})
    assert c.of(3) == pytest.approx(2.0) and c.of(9) == 3.0 and c.of(1) == 1.0


def test_a_proposal_verified_not_at_all_still_teaches_its_first_tokens_odds():
    """On costs like llama.cpp's on a CPU (each token verified costs most of a step), the prior's
    1/2 never pays; a proposal whose first token keeps being what the model chose then does."""
    w = Widths(scripted({1: 1.0, 2: 1.74, 3: 2.37, 4: 2.92}))
    assert w.choose(3, 1) == 0
    for _ in range(12):
        w.observe_unverified(True)
    assert w.choose(3, 1) >= 1
    w2 = Widths(scripted({1: 1.0, 2: 1.74, 3: 2.37, 4: 2.92}))
    for _ in range(12):
        w2.observe_unverified(False)
    assert w2.choose(3, 1) == 0 and w2.tries == [12] and w2.hits == [0]


def test_the_answer_says_its_widths_per_proposer_after_the_reasoning():
    from engine.methods.ssr.widths import said

    costs = scripted({1: 1.0, 9: 1.5})
    reasoning, answer = Widths(costs), Widths(costs, phase="answer", what="draft prefix")
    reasoning.choose(4, 1)
    answer.choose(6, 1)
    text = said([reasoning, answer, Widths(costs, phase="answer", what="lookup in prompt")])
    assert re.fullmatch(r"verified \d of 4 lookup tokens proposed in the reasoning \(0 proposals not at all: no width "
                        r"paid\); verified \d of 6 draft prefix tokens proposed in the answer \(0 proposals not at all: "
                        r"no width paid\); a 9-token forward cost 1.50x a 1-token one here; reproducible: widths frozen "
                        r"from 1 stored run \(0 s old\)", text), text
    assert text.count("forward cost") == 1 and "lookup in prompt" not in text  # said once; nothing proposed: nothing


def test_observe_counts_each_position_reached():
    w = Widths(RunCosts())
    w.observe(4, 2)  # positions 0 and 1 accepted, 2 reached and rejected, 3 never reached
    assert w.tries == [1, 1, 1] and w.hits == [1, 1, 0]


# ---------------------------------------------------------------- end to end on the bundled model

PROMPTS = [make_example("classes", EVAL_SEED_BASE + i).prompt for i in range(2)]
CFG = RunConfig(max_think=96, max_answer=48, draft_start=16, num_drafts=2, draft_interval=32, max_draft=32, think_spec=8,
                drafting="always")


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-reasoner")


def _tokens(events) -> list[int]:
    return [e.token_id for e in events if getattr(e, "stream", None) in ("reasoning", "answer")]


# dear: every token a forward computes costs 50x the forward without it, so no width pays beside any number of drafts
DEAR = {n: 50.0 ** (n - 1) for n in range(1, 65)}


@pytest.mark.parametrize("table, verified", [(DEAR, "verified 0 of"), ({1: 1.0, 64: 1.0}, None)], ids=["dear", "free"])
def test_greedy_identity_whatever_the_widths(lm, table, verified):
    store = _scripted_store(CFG, table)
    for prompt in PROMPTS:
        events = list(decode_ssr(lm, prompt, CFG, evidence=store))
        assert _tokens(events) == _tokens(decode_baseline(lm, prompt, CFG))
        said = events[-1].stats.lookups
        assert said.startswith("verified")
        if verified:
            assert said.startswith(verified)
            reasoning = [e for e in events if getattr(e, "stream", None) == "reasoning"]
            assert not [e for e in reasoning if e.status == "recovered"], "a lookup token was taken unverified"
        else:  # free widths: every token proposed is verified
            n = said.split()[1], said.split()[3]
            assert n[0] == n[1]


def test_reasoning_proposals_verified_not_at_all_still_count_their_first_token(lm):
    """Widths too dear for any lookup: none is verified, yet each one's first token is compared with
    the token the model then chose, and the run says how often it was right."""
    said = list(decode_ssr(lm, PROMPTS[0], CFG, evidence=_scripted_store(CFG, DEAR)))[-1].stats.lookups
    m = re.match(r"verified 0 of (\d+) lookup tokens proposed in the reasoning \((\d+) proposals not at all: no width "
                 r"paid, their first token right (\d+) of (\d+) times\)", said)
    assert m, said
    assert int(m.group(4)) == int(m.group(2)) > 0 and int(m.group(3)) <= int(m.group(4))


def test_the_strip_and_the_log_say_what_was_verified(tmp_path, lm):
    from engine.runlog import RunLog, RunMeta
    from ssr_ui.export import logged_view
    from ssr_ui.render import TraceView, metrics_html

    log = RunLog(tmp_path / "runs.db")
    view = TraceView(method="ssr")
    for ev in log.record(decode_ssr(lm, PROMPTS[0], CFG), RunMeta("ssr", "tiny-reasoner", PROMPTS[0], CFG.to_dict())):
        view.apply(ev)
    row = log.runs(limit=1)[0]
    assert row["lookups"] == view.stats.lookups and row["lookups"].startswith("verified")
    for v in (view, logged_view(row, log.events(row["id"]))):
        assert "reasoning lookups" in metrics_html(v, "SSR") and "lookup tokens proposed in the reasoning" in \
            metrics_html(v, "SSR")


def test_early_exit_verifies_every_proposal_whole_whatever_the_costs(lm):
    """ssr-exit checks its drafts at step ends, so widths that followed the measured costs would move
    where (and whether) it exits from one run of a prompt to the next: it verifies every proposal whole,
    and two runs on opposite cost models are the same run, event for event."""
    from engine.registry import decoder

    cfg = CFG.replace(exit_k=2, exit_confidence=0, num_drafts=4, draft_interval=8)
    runs = []
    for table in (DEAR, {1: 1.0, 64: 1.0}):
        route, store = Evidence.route(cfg), Evidence.of(lm)  # (the decoder reads the model's own store)
        store.costs[route] = ScriptedCosts(table)
        try:
            events = list(decoder("ssr-exit", lm)(PROMPTS[0], cfg))
        finally:
            del store.costs[route]
        said = events[-1].stats.lookups.split()
        assert said[1] == said[3], "a proposal was trimmed"
        runs.append([(e.stream, e.status, e.token_id) for e in events if getattr(e, "stream", None)])
    assert runs[0] == runs[1]
