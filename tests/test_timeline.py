"""The timeline and the acceptance statistics (issue 31), as pure HTML builders: every method's
lanes, bars that name their forwards, tokens that name the forward that chose them, grouping on
long runs, and the same pictures after the run log and a JSON round trip (the HTML export too)."""

from __future__ import annotations

import functools
import re

from engine.config import RunConfig
from engine.events import ForwardEvent, RowWork
from engine.methods.rsd.prm import MathShepherdScorer
from engine.registry import decoder
from engine.runlog import RunLog, RunMeta
from engine.runtime.model import load_model
from engine.tools.synthetic import EVAL_SEED_BASE, make_example
from engine.wiring import run_config
from ssr_ui import charts
from ssr_ui.export import logged_view, run_from_json, run_to_html, run_to_json
from ssr_ui.frame import where_time_goes
from ssr_ui.render import CSS, TraceView
from ssr_ui.timeline import MAX_BARS, lanes, timeline_html
from tests.tiny import make_model

PROMPT = make_example("classes", EVAL_SEED_BASE + 93).prompt


@functools.cache
def bundled():
    return load_model("tiny-reasoner")


def view_of(method: str, lm=None, cfg: RunConfig | None = None, **roles) -> tuple[TraceView, list]:
    lm = lm or bundled()
    events = list(decoder(method, lm, roles.get("draft"), roles.get("scorer"))(
        roles.get("prompt", PROMPT), cfg or run_config("tiny-reasoner", {})))
    view = TraceView(method=method)
    for ev in events:
        view.apply(ev)
    return view, events


def _lanes_drawn(html: str) -> list[str]:
    return re.findall(r'aria-label="([^"]+) lane"', html)


def test_ssr_draws_the_main_row_and_its_drafts_with_forks_and_the_end_of_thinking():
    view, events = view_of("ssr", cfg=RunConfig(max_think=40, max_answer=30, draft_start=6, num_drafts=2,
                                                 draft_interval=8))
    html = where_time_goes(view)
    assert _lanes_drawn(html) == ["main", "draft 0", "draft 1"]
    assert "draft 0 forked after 6 reasoning tokens" in html and "end of thinking" in html
    forwards = [e for e in events if isinstance(e, ForwardEvent)]
    bars = set(map(int, re.findall(r'class="tl-bar" data-f="(\d+)"', html)))
    assert bars == {f.index for f in forwards}, "a bar per forward (no grouping on a short run)"
    assert "verified" in html and "proposed by draft prefix" in html
    assert "Where the time went" in html and "Acceptance per verify" in html
    # each token names the forward that chose it, and that forward kept a token of the token's row
    for tok in view.reasoning + view.answer:
        assert tok.fwd is not None and any(r.row == "main" and r.kept + r.forced for r in forwards[tok.fwd].rows)
    for d, toks in view.drafts.items():  # the opening tail is written at the fork, and fed by the draft's first forward
        tail = len(bundled().markers.tail_ids)
        first = next(f for f in forwards if any(r.row == f"draft {d}" for r in f.rows))
        assert [t.fwd for t in toks[:tail]] == [first.index] * tail
        for tok in toks[tail:]:
            assert any(r.row == f"draft {d}" and r.kept for r in forwards[tok.fwd].rows)
    assert f'data-f="{view.answer[-1].fwd}"' in view.answer_html()


def test_baseline_has_one_lane_and_no_verifies():
    view, _ = view_of("baseline")
    html = where_time_goes(view, "forward")
    assert _lanes_drawn(html) == ["main"] and "forward index" in html
    assert "no verifies in this run" in html


def test_rsd_draws_the_draft_the_prm_and_the_target_with_each_steps_verdict():
    target, draft, prm = (make_model("llama", seed=1, init_scale=2.0), make_model("qwen2", seed=2, init_scale=2.0),
                          make_model("llama", seed=3))
    cfg = RunConfig(max_think=30, max_answer=10, max_step_tokens=5, max_steps=8, threshold=0.5)
    view, _ = view_of("rsd", target, cfg, draft=draft, scorer=MathShepherdScorer(prm), prompt="Start with 7")
    html = timeline_html(view)
    assert _lanes_drawn(html)[:2] == ["draft", "prm"] and "PRM: step kept" in html
    assert re.search(r"step \d+: reward 0\.\d{3}, (kept|rejected)", html)


def test_a_long_run_is_drawn_in_groups_that_cover_every_forward():
    forwards = [ForwardEvent(i, "reasoning" if i < 2500 else "answer", i * 0.01, i * 0.01 + 0.008,
                             (RowWork("main", 1, 1),)) for i in range(3000)]
    view = TraceView(method="baseline", forwards=forwards, phase="done")
    html = timeline_html(view)
    groups = re.findall(r'data-f="(\d+)"(?: data-g="(\d+)")?', html)
    assert len(groups) <= MAX_BARS
    covered = [i for lo, hi in groups for i in range(int(lo), int(hi or lo) + 1)]
    assert covered == list(range(3000)), "the groups cover every forward once, in order"
    assert "neighbours grouped" in html and len(html) < 200_000


def test_a_run_logged_before_the_timeline_says_so():
    assert "logged before the timeline existed" in timeline_html(TraceView(phase="done"))
    assert "fills as the run" in timeline_html(TraceView(phase="reasoning"))
    assert lanes([]) == []


def test_the_log_the_json_trace_and_the_html_export_show_the_same_timeline(tmp_path):
    view, events = view_of("ssr")
    log = RunLog(tmp_path / "runs.db")
    run_id = log.save(RunMeta("ssr", "tiny-reasoner", PROMPT, {}), events, "ok")
    row, logged = log.run(run_id), log.events(run_id)
    replayed = logged_view(row, logged)
    assert timeline_html(replayed) == timeline_html(view)
    back_row, back = run_from_json(run_to_json(row, logged))
    assert timeline_html(logged_view(back_row, back)) == timeline_html(view)
    page = run_to_html(row, logged, CSS)
    assert 'id="timeline"' in page and "by forward index" in page and "Acceptance per verify" in page
    assert "scrollIntoView" in page, "the export's bars highlight their tokens too"


def test_history_aggregates_acceptance_per_method_and_model(tmp_path):
    log = RunLog(tmp_path / "runs.db")
    for method in ("ssr", "ssr", "baseline"):
        _, events = view_of(method)
        log.save(RunMeta(method, "tiny-reasoner", PROMPT, {}), events, "ok")
    fig = charts.acceptance_by_method(log.runs())
    names = {t.name for t in fig.data}
    assert "ssr · tiny-reasoner" in names and not any(n.startswith("baseline") for n in names)
    assert any(n.endswith(": draft prefix") for n in names)
    empty = charts.acceptance_by_method([r for r in log.runs() if r["method"] == "baseline"])
    assert "No verifies logged yet" in empty.layout.annotations[0].text


def test_tokens_over_a_server_name_the_request_that_wrote_them():
    """A request's record comes when it ends, after its tokens: they are named when it comes (a
    streamed reasoning, a draft, the answer), and a later request's tokens are not charged to it."""
    from engine.remote.client import VllmClient
    from engine.remote.model import RemoteModel
    from tests.fake_vllm import FakeVllm

    lm = bundled()
    for method, speculation in (("baseline", None), ("ssr", None), ("ssr", "suffix")):
        server = FakeVllm(lm, speculation=speculation)
        client = VllmClient("http://vllm.test/v1", "tiny", timeout=30, transport=server.transport)
        rm = RemoteModel(client, lm.tokenizer, lm.model_id, lm.markers, lm.eos_ids, speculation=speculation)
        view = TraceView(method=method)
        events = list(decoder(method, rm)(PROMPT, run_config("tiny-reasoner", {})))
        for ev in events:
            view.apply(ev)
        forwards = [e for e in events if isinstance(e, ForwardEvent)]
        reasoning = {t.fwd for t in view.reasoning}
        assert len(reasoning) == 1 and forwards[reasoning.pop()].phase == "reasoning", method
        answer = {t.fwd for t in view.answer if t.fwd is not None}
        assert answer and all(forwards[f].phase == "answer" for f in answer), (method, speculation)
        for d, toks in view.drafts.items():  # each draft's request, its opening tail included
            assert {t.fwd for t in toks} == {f.index for f in forwards if f.rows[0].row == f"draft {d}"}
