"""Every forward of a run is recorded once, and the records add up (issue 31).

For every method, in process and over the fake vLLM server: each stream's tokens are the ``kept``
and ``forced`` of the forwards of its row; the number of forward records is the run's forward
count; the forwards never overlap on one row, lie inside the run, and their wall times sum to at
most the run's wall time (the rest is the loops' bookkeeping); each forward is yielded before the
tokens it chose. The same after the run log and a JSON export and import.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections import Counter

import pytest

from engine.config import RunConfig
from engine.events import DoneEvent, ForwardEvent, PhaseEvent, RunStats, TokenEvent
from engine.forwards import acceptance, merge, time_split
from engine.methods.rsd.prm import MathShepherdScorer
from engine.registry import decoder
from engine.remote.client import VllmClient
from engine.remote.model import RemoteModel
from engine.runlog import RunLog, RunMeta
from engine.runtime.model import load_model
from engine.tools.synthetic import EVAL_SEED_BASE, make_example
from engine.wiring import run_config
from ssr_ui.export import run_from_json, run_to_json
from tests.fake_vllm import FakeVllm
from tests.tiny import make_model

PROMPT = make_example("classes", EVAL_SEED_BASE + 91).prompt
SINGLE = ("baseline", "ssr", "hf", "hf-pld", "hf-static")


@functools.cache
def bundled():
    return load_model("tiny-reasoner")


@functools.cache
def trio():
    return (make_model("llama", seed=1, init_scale=2.0), make_model("qwen2", seed=2, init_scale=2.0),
            make_model("llama", seed=3))


def _streams(events) -> Counter:
    """Tokens per row: the main row's reasoning and answer, each draft's tokens (new positions only)."""
    seen, out = set(), Counter()
    for e in events:
        key = (e.stream, e.draft if e.stream == "draft" else None, e.position) if isinstance(e, TokenEvent) else None
        if key is not None and key not in seen:
            seen.add(key)
            out["main" if e.stream != "draft" else f"draft {e.draft}"] += 1
    return out


def assert_adds_up(events: list, rsd: bool = False, server: bool = False) -> None:
    done = events[-1]
    assert isinstance(done, DoneEvent)
    s = done.stats
    forwards = [e for e in events if isinstance(e, ForwardEvent)]
    assert forwards, "a run without forward records"
    assert [f.index for f in forwards] == list(range(len(forwards)))
    assert len(forwards) == s.forward_calls, "one record per forward (request, over a server)"
    # the tokens: every token of every stream is one forward's kept or forced
    made = Counter()
    for f in forwards:
        for r in f.rows:
            assert r.fed >= 0 and r.kept >= 0 and r.forced >= 0 and 0 <= r.accepted <= r.proposed
            made["main" if r.row in ("target", "draft") and rsd else r.row] += r.kept + r.forced
    made.pop("prm", None)
    streams = _streams(events)
    if rsd:  # RSD's rejected steps are draft-stream tokens its draft model wrote
        streams = Counter({"main": sum(streams.values())})
    assert made == streams, "the forwards' kept and forced tokens are the streams' tokens"
    assert s.reasoning_tokens + s.answer_tokens + s.draft_tokens == sum(streams.values())
    # the time: inside the run, in order on each row, summing to at most the wall time
    for f in forwards:
        assert 0 <= f.start <= f.end <= s.wall_s + 1e-6
    if not server:  # over a server, requests of different rows overlap (the drafts stream beside the reasoning)
        assert all(a.end <= b.start + 1e-9 for a, b in itertools.pairwise(forwards)), "forwards overlap"
        assert s.forward_s <= s.wall_s + 1e-6
    assert s.forward_s == pytest.approx(sum(f.wall_s for f in forwards))
    split = time_split(forwards, s.wall_s)
    assert sum(split.values()) == pytest.approx(s.wall_s, abs=1e-6) or server
    assert min(split.values()) >= 0
    # each forward comes before the tokens it chose (a request's record when the request ends)
    if not server:
        last = None
        for e in events:
            if isinstance(e, ForwardEvent):
                last = e
            elif isinstance(e, TokenEvent) and e.stream in ("reasoning", "answer") and e.status == "generated":
                assert last is not None, "a token before any forward"
    # the verifies
    a = acceptance(forwards)
    assert s.verifies == sum(sum(p["hist"]) for p in a.values())
    assert s.verify_accepted == sum(i * c for p in a.values() for i, c in enumerate(p["hist"]))
    for p in a.values():
        assert all(t <= r for t, r in zip(p["taken"], p["reached"], strict=True))
        assert p["reached"] == sorted(p["reached"], reverse=True), "a k-th token is proposed only after a (k-1)-th"


@pytest.mark.parametrize("method", SINGLE)
def test_the_forwards_add_up(method):
    events = list(decoder(method, bundled())(PROMPT, run_config("tiny-reasoner", {})))
    assert_adds_up(events)
    if method == "ssr":
        forwards = [e for e in events if isinstance(e, ForwardEvent)]
        assert any(len(f.rows) > 1 for f in forwards), "the drafts ride in the reasoning's forwards"
        assert any(r.proposer == "draft prefix" for f in forwards for r in f.rows)
        assert events[-1].stats.verifies > 0 and events[-1].stats.drafting_s >= 0


@pytest.mark.parametrize("cfg", [
    dict(max_think=6, max_answer=5, draft_start=2),  # both budgets cut: the forced marker and tail
    dict(max_think=40, max_answer=30, num_drafts=3, draft_interval=4, draft_start=2, think_spec=4),
    dict(max_think=40, max_answer=30, temperature=0.8, seed=5, num_drafts=2, draft_start=3),
])
def test_the_forwards_add_up_in_corners(cfg):
    for method in ("baseline", "ssr", "hf"):
        assert_adds_up(list(decoder(method, bundled())(PROMPT, RunConfig(**cfg))))


@pytest.mark.parametrize("mode, threshold", [("rsd", 0.7), ("rsd", 0.0), ("target", 0.7), ("draft", 0.7)])
def test_the_forwards_add_up_for_rsd(mode, threshold):
    target, draft, prm = trio()
    cfg = RunConfig(max_think=30, max_answer=10, max_step_tokens=5, max_steps=8, threshold=threshold)
    events = list(decoder(mode, target, draft, MathShepherdScorer(prm))("Start with 7", cfg))
    assert_adds_up(events, rsd=True)
    lanes = {r.row for e in events if isinstance(e, ForwardEvent) for r in e.rows}
    assert lanes == {"rsd": {"draft", "target", "prm"}, "target": {"target"}, "draft": {"draft"}}[mode] or \
        (mode == "rsd" and lanes == {"draft", "prm"})  # (every step kept: the target never ran)
    if mode == "rsd":
        notes = [r.note for e in events if isinstance(e, ForwardEvent) for r in e.rows if r.row == "prm"]
        assert notes and all(n and n.startswith("step ") and "reward" in n for n in notes)


@pytest.mark.parametrize("method", ["baseline", "ssr"])
@pytest.mark.parametrize("speculation", [None, "suffix"])
def test_the_requests_add_up_over_a_server(method, speculation):
    lm = bundled()
    server = FakeVllm(lm, speculation=speculation)
    client = VllmClient("http://vllm.test/v1", "tiny", timeout=30, transport=server.transport)
    rm = RemoteModel(client, lm.tokenizer, lm.model_id, lm.markers, lm.eos_ids, speculation=speculation)
    events = list(decoder(method, rm)(PROMPT, run_config("tiny-reasoner", {})))
    assert_adds_up(events, server=True)
    if speculation:
        answer = [r for e in events if isinstance(e, ForwardEvent) for r in e.rows if e.phase == "answer"]
        # the server's totals, said in a note: not one verify's figures (no per-step proposal is reported)
        assert answer[-1].note.startswith("the server's suffix speculation: ") and answer[-1].proposed == 0


def test_the_forwards_survive_the_log_and_a_json_round_trip(tmp_path):
    events = list(decoder("ssr", bundled())(PROMPT, run_config("tiny-reasoner", {})))
    log = RunLog(tmp_path / "runs.db")
    run_id = log.save(RunMeta("ssr", "tiny-reasoner", PROMPT, {}), events, "ok")
    logged = log.events(run_id)
    forwards = [e for e in events if isinstance(e, ForwardEvent)]
    assert [e for e in logged if isinstance(e, ForwardEvent)] == forwards
    row = log.run(run_id)
    assert json.loads(row["acceptance"]) == acceptance(forwards)
    assert row["verifies"] == events[-1].stats.verifies and row["forward_s"] == pytest.approx(events[-1].stats.forward_s)
    back_row, back = run_from_json(run_to_json(row, logged))
    assert back == logged
    assert_adds_up([*back, DoneEvent(RunStats.from_dict(back_row), "", "")])


def test_a_run_stopped_midway_keeps_its_forwards(tmp_path):
    events = list(decoder("ssr", bundled())(PROMPT, run_config("tiny-reasoner", {})))
    cut = next(i for i, e in enumerate(events) if isinstance(e, PhaseEvent) and e.phase == "answer")
    log = RunLog(tmp_path / "runs.db")
    run_id = log.save(RunMeta("ssr", "tiny-reasoner", PROMPT, {}), events[:cut], "cancelled")
    row = log.run(run_id)
    assert row["forward_calls"] == sum(isinstance(e, ForwardEvent) for e in events[:cut]) > 0


def test_a_malformed_forward_in_a_trace_is_refused_by_number():
    events = list(decoder("baseline", bundled())(PROMPT, run_config("tiny-reasoner", {})))
    doc = json.loads(run_to_json({"id": 1, "config": "{}"}, events[:-1]))
    i = next(i for i, e in enumerate(doc["events"]) if e["kind"] == "forward")
    del doc["events"][i]["rows"]
    with pytest.raises(ValueError, match=f"event {i} is malformed"):
        run_from_json(json.dumps(doc))


def test_acceptance_by_position_and_merge():
    from engine.events import RowWork

    def fw(i, proposed, accepted, who="draft prefix"):
        return ForwardEvent(i, "answer", i, i + 0.5, (RowWork("main", proposed + 1, accepted + 1, 0, proposed,
                                                              accepted, who),))

    a = acceptance([fw(0, 3, 3), fw(1, 3, 1), fw(2, 2, 0), fw(3, 1, 1, "suffix in drafts")])
    assert a["draft prefix"] == {"hist": [1, 1, 0, 1], "reached": [3, 3, 2], "taken": [2, 1, 1]}
    assert a["suffix in drafts"] == {"hist": [0, 1], "reached": [1], "taken": [1]}
    both = merge([a, a])
    assert both["draft prefix"]["reached"] == [6, 6, 4] and both["suffix in drafts"]["hist"] == [0, 2]


# ----------------------------------------------------------------------------- real pretrained models

@pytest.mark.parametrize("method", ["baseline", "ssr", "hf-pld"])
def test_the_forwards_add_up_on_smollm2(method):
    """A prompted model: its marker is written over three tokens, forced at the budget (Max think 24)."""
    from tests.test_real_models import PROMPTS, smollm2

    lm = smollm2()
    for cfg in (RunConfig(max_think=24, max_answer=16, draft_start=8, max_draft=16),
                RunConfig(max_think=64, max_answer=24, draft_start=12, max_draft=24, num_drafts=2, draft_interval=16)):
        assert_adds_up(list(decoder(method, lm)(PROMPTS[1], cfg)))


@pytest.mark.parametrize("method", ["baseline", "hf"])
def test_the_forwards_add_up_on_gemma3(method):
    """A base model: no reasoning, every forward in the answer (sliding windows, a 262k vocabulary)."""
    from tests.test_real_models import gemma3

    events = list(decoder(method, gemma3())("The three primary colors are", RunConfig(max_think=8, max_answer=12)))
    assert_adds_up(events)
    assert {f.phase for f in events if isinstance(f, ForwardEvent)} <= {"prefill", "answer"}
