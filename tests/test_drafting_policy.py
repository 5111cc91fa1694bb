"""SSR's cost-aware drafting (``engine.methods.ssr.policy``): the decisions on scripted ledgers,
then end to end on the bundled model under a scripted cost model (a forward carrying drafts made
slow, or a lone step made slow): the drafts are dropped where they cost more than they saved,
kept where they pay, measured again every few runs, and the tokens never change. As the studio
and the bench do, each model's first (cold) run is a warm-up that teaches nothing (``_warm``)."""

from __future__ import annotations

import time

import pytest

from engine.config import RunConfig
from engine.events import ForwardEvent, RunStats
from engine.methods.baseline import decode_baseline
from engine.methods.ssr import policy
from engine.methods.ssr.evidence import Evidence
from engine.methods.ssr.loop import decode_ssr
from engine.methods.ssr.policy import RECHECK, Ledger, ledger, plan
from engine.runtime.batch import RowBatch
from engine.runtime.model import load_model
from engine.tools.synthetic import EVAL_SEED_BASE, make_example

CFG = RunConfig(max_think=96, max_answer=48, draft_start=16, num_drafts=4, draft_interval=16, max_draft=32,
                think_spec=4)


def _ledger(*runs: tuple[float, float, int], undrafted: int = 0) -> Ledger:
    book = Ledger()
    book.runs.extend(policy.Drafted(*r, None, time.monotonic()) for r in runs)
    book.undrafted = undrafted
    return book


def test_no_run_with_drafts_yet_forks_as_planned_to_measure():
    decision = plan(Ledger(), CFG)
    assert decision.drafts == 4 and "no run with drafts on this model yet" in decision.why


def test_drafts_that_saved_more_than_they_cost_are_forked():
    decision = plan(_ledger((0.20, 0.15, 15), (0.10, 0.25, 25)), CFG)
    assert decision.drafts == 4 and decision.why.startswith("as planned: in the last 2 runs")
    assert "cost 0.30 s" in decision.why and "saved 0.40 s (40 answer forwards" in decision.why


def test_drafts_that_cost_more_are_dropped_with_the_numbers_and_measured_again_every_few_runs():
    book = _ledger((0.50, 0.10, 10), (0.40, 0.05, 5))
    decision = plan(book, CFG)
    assert decision.drafts == 0
    assert decision.why.startswith("none of 4: in the last 2 runs with drafts on this model they cost 0.90 s")
    assert "saved 0.15 s (15 answer forwards no lookup would have saved)" in decision.why
    assert f"measured again in {RECHECK - 1} runs" in decision.why and "Drafting: always" in decision.why
    for _ in range(RECHECK - 2):  # undrafted runs, counted
        book.record(RunStats(drafts=0), planned=0)
        assert plan(book, CFG).drafts == 0
    book.record(RunStats(drafts=0), planned=0)
    again = plan(book, CFG)
    assert again.drafts == 4 and again.why.startswith("as planned, to measure again")


def test_always_forks_as_planned_whatever_the_ledger_says():
    assert plan(_ledger((9.0, 0.0, 0)), CFG.replace(drafting="always")) == policy.DraftPlan(4, "")


def test_the_ledger_prices_a_saved_forward_at_a_lone_step_and_keeps_a_window():
    book = Ledger()
    book.record(RunStats(drafts=3, drafting_s=0.3, draft_saved=20, step_s_alone=0.01), planned=3)
    assert tuple(book.runs[-1][:3]) == pytest.approx((0.3, 0.2, 20)) and book.undrafted == 0
    for _ in range(policy.WINDOW + 3):
        book.record(RunStats(drafts=1, drafting_s=0.1, draft_saved=1, step_s_alone=0.01), planned=1)
    assert len(book.runs) == policy.WINDOW


def test_a_bad_drafting_value_is_refused_by_name():
    with pytest.raises(ValueError, match="Drafting .drafting."):
        RunConfig(drafting="sometimes")


# ---------------------------------------------------------------- end to end, on a scripted cost model

PROMPTS = [make_example("classes", EVAL_SEED_BASE + i).prompt for i in range(3)]


@pytest.fixture
def lm():
    return load_model("tiny-reasoner")  # a fresh model object: an empty ledger


def _warm(lm, cfg: RunConfig = CFG) -> None:
    """The route's first run, untimed, as the studio's and the bench's warm-up: cold, it teaches nothing."""
    list(decode_ssr(lm, "warm up", cfg.replace(max_think=cfg.draft_start + 8, max_answer=4, drafting="always")))


def _slow(monkeypatch, rows_at_least: int, seconds: float) -> None:
    """Every forward over at least ``rows_at_least`` rows takes ``seconds`` longer. The machine's own
    load is kept out of the decisions under test: no run is flagged slow (a busy CI runner slowed one
    run's lone steps past twice the next run's, and its drafts' evidence was left out; that rule has
    its own tests, tests/test_warm_evidence.py)."""
    monkeypatch.setattr("engine.methods.ssr.evidence.SLOW_FACTOR", float("inf"))
    forward = RowBatch.forward

    def slowed(self, fed, *args, **kwargs):
        if len(fed) >= rows_at_least:
            time.sleep(seconds)
        return forward(self, fed, *args, **kwargs)

    monkeypatch.setattr(RowBatch, "forward", slowed)


def _run(lm, prompt: str, cfg: RunConfig = CFG) -> RunStats:
    events = list(decode_ssr(lm, prompt, cfg))
    base = list(decode_baseline(lm, prompt, cfg))
    assert events[-1].stats.reasoning_tokens == base[-1].stats.reasoning_tokens
    mine = [e.token_id for e in events if getattr(e, "stream", None) in ("reasoning", "answer")]
    theirs = [e.token_id for e in base if getattr(e, "stream", None) in ("reasoning", "answer")]
    assert mine == theirs, "the drafts' plan changed a token"
    return events[-1].stats


def _token_s(lm) -> float:
    """Seconds a plain decoding token takes on this machine now (a busy CI runner's step can be ten
    times an idle one's): a scripted cost is scaled by it, so the test's premise holds at any load."""
    stats = list(decode_baseline(lm, PROMPTS[0], CFG))[-1].stats
    return stats.wall_s / max(1, stats.reasoning_tokens + stats.answer_tokens)


def test_drafts_that_cost_a_lot_are_dropped_then_measured_again(lm, monkeypatch):
    _warm(lm)
    # a forward carrying drafts costs five plain tokens more (at least 20 ms): never worth it here, however busy
    _slow(monkeypatch, rows_at_least=2, seconds=max(0.02, 5 * _token_s(lm)))
    first = _run(lm, PROMPTS[0])
    assert first.drafts > 0 and "this one measures them" in first.drafting
    assert first.drafting_s > first.draft_saved * first.step_s_alone
    second = _run(lm, PROMPTS[1])
    assert second.drafts == 0 and second.drafting.startswith("none of 4") and second.drafting_s == 0
    book = ledger(Evidence.of(lm), CFG)
    book.undrafted = RECHECK - 1  # as after RECHECK - 1 runs without drafts
    third = _run(lm, PROMPTS[2])
    assert third.drafts > 0 and third.drafting.startswith("as planned, to measure again")


def test_drafts_that_pay_are_kept(lm, monkeypatch):
    _slow(monkeypatch, rows_at_least=1, seconds=0.02)  # every forward 20 ms: a row rides for free, a saved step pays
    runs = [_run(lm, p) for p in PROMPTS]
    assert all(r.drafts > 0 for r in runs), [r.drafting for r in runs]
    assert sum(r.draft_saved for r in runs) > 0
    assert all(r.drafting.startswith("as planned") for r in runs)


def _drafts_won(events) -> int:
    """The answer forwards the drafts' proposals saved: what their verifies accepted (draft prefix,
    suffix in drafts) in the answer phase (a draft row's own lookups in the reasoning save no forward)."""
    return sum(r.accepted for e in events if isinstance(e, ForwardEvent) and e.phase == "answer" for r in e.rows
               if r.proposer in ("draft prefix", "suffix in drafts"))


def test_what_the_drafts_won_that_a_lookup_would_have_is_not_theirs(lm):
    """With the context lookup off, every forward a draft's proposal saved is the drafts' own; with it
    on, at most that many, and on these prompts fewer (the reasoning already holds part of the answer)."""
    cfg = CFG.replace(drafting="always")
    own = []
    for prompt in PROMPTS:
        alone = list(decode_ssr(lm, prompt, cfg.replace(context_lookup=False)))
        assert alone[-1].stats.draft_saved == _drafts_won(alone) > 0
        beside = list(decode_ssr(lm, prompt, cfg))
        assert beside[-1].stats.draft_saved <= _drafts_won(beside)
        own.append((beside[-1].stats.draft_saved, _drafts_won(beside)))
    assert sum(a for a, _ in own) < sum(b for _, b in own), own


def test_the_strip_says_what_drafting_decided_live_and_replayed(tmp_path, lm, monkeypatch):
    """The decision and the drafts' own forwards are logged with the run; the live strip and a
    replay from the log show both, with the numbers."""
    from engine.runlog import RunLog, RunMeta
    from ssr_ui.export import logged_view
    from ssr_ui.render import TraceView, metrics_html

    _slow(monkeypatch, rows_at_least=2, seconds=0.02)
    _warm(lm)
    log = RunLog(tmp_path / "runs.db")
    views = []
    for prompt in PROMPTS[:2]:
        view = TraceView(method="ssr")
        for ev in log.record(decode_ssr(lm, prompt, CFG), RunMeta("ssr", "tiny-reasoner", prompt, CFG.to_dict())):
            view.apply(ev)
        views.append(view)
    first, second = views
    live = metrics_html(first, "SSR").replace("&#x27;", "'")
    assert f"drafts' own</div><div class=\"v\">{first.stats.draft_saved} forward" in live
    rows = log.runs(limit=2)
    dropped = next(r for r in rows if r["drafts"] == 0)
    assert dropped["drafting"] == second.stats.drafting and dropped["drafting"].startswith("none of 4")
    replayed = logged_view(dropped, log.events(dropped["id"]))
    for v in (second, replayed):
        strip = metrics_html(v, "SSR").replace("&#x27;", "'")
        assert "drafting" in strip and "none of 4: in the last 1 run with drafts on this model they cost" in strip
        assert "drafts' own" not in strip  # it forked none


def test_the_studio_drafts_by_cost_by_default_and_always_when_asked(tmp_path, monkeypatch):
    """Through the studio's handler (its Drafting setting, auto by default; app --drafting): under a
    scripted cost that makes drafts a loss, the second SSR run forks none and its strip says why;
    Drafting "always" forks them whatever the ledger holds."""
    from ssr_ui.handlers import Studio

    _slow(monkeypatch, rows_at_least=2, seconds=0.02)
    studio = Studio("tiny-reasoner", db=str(tmp_path / "runs.db"))
    settings = dict(max_think=96, max_answer=48, draft_start=16, num_drafts=4, draft_interval=16, max_draft=32,
                    think_spec=4)
    first = list(studio.run(PROMPTS[0], "SSR", **settings))[-1]
    assert first.view.stats.drafts > 0 and "this one measures them" in first.metrics
    second = list(studio.run(PROMPTS[1], "SSR", **settings))[-1]
    assert second.view.stats.drafts == 0 and "none of 4: in the last 1 run with drafts" in second.metrics
    forced = list(studio.run(PROMPTS[1], "SSR", **settings, drafting="always"))[-1]
    assert forced.view.stats.drafts > 0 and not forced.view.stats.drafting
    assert [r["drafts"] > 0 for r in reversed(studio.log.runs(limit=3))] == [True, False, True]
    assert Studio("tiny-reasoner", db=str(tmp_path / "b.db"), drafting="always").config("").drafting == "always"


def test_a_run_that_ends_before_the_draft_start_says_none_forked_and_measures_nothing(lm):
    cfg = CFG.replace(max_think=200, draft_start=190)  # the bundled model's reasoning ends long before
    _warm(lm, cfg)
    stats = _run(lm, PROMPTS[0], cfg)
    assert stats.drafts == 0 and stats.drafting.startswith("none forked: the reasoning ended before the draft start")
    book = ledger(Evidence.of(lm), cfg)
    assert not book.runs and book.undrafted == 1
    assert plan(book, cfg).why.startswith("as planned: no run with drafts on this model yet")
