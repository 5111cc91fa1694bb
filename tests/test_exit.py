"""Early exit (method ``ssr-exit``, engine.methods.exit): the rule stops the reasoning exactly when
``exit_k`` consecutive finished drafts agree (scripted drafts), never before ``exit_min_think``; on
real weights the run is exactly plain decoding cut at its exit point (greedy); with ``exit_k``
above the drafts a run can fork it is SSR token for token; the log, the export and the sweep keep
what it did; a vLLM server refuses it with the reason."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from engine.config import RunConfig
from engine.events import PhaseEvent, RunStats, TokenEvent
from engine.methods.exit.budget import ExitBudget
from engine.methods.exit.rule import ExitRule, Probe, answer_key
from engine.methods.ssr.proposers import Draft
from engine.registry import METHODS, decoder, method_of, methods
from engine.runlog import RunLog, RunMeta
from engine.runtime.model import ThinkMarkers, load_model
from engine.tools.synthetic import make_example

# drafting "always": SSR, compared with ssr-exit event for event, forks as planned (auto may drop its drafts
# after earlier runs on this model)
CFG = RunConfig(max_think=400, max_answer=300, draft_start=20, max_draft=300, num_drafts=12, draft_interval=8,
                exit_k=2, exit_confidence=0, drafting="always")


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-reasoner", device="cpu")


def run(lm, method, prompt, cfg):
    return list(decoder(method, lm)(prompt, cfg))


def test_the_method_is_registered_once_and_called_lossy():
    lossy = [m.name for m in methods() if not m.exact and not m.steps]  # (RSD's step writers are lossy too)
    assert "ssr-exit" in METHODS and method_of("ssr-exit").drafts and lossy == ["ssr-exit"]


# ------------------------------------------------------------------ the rule, on scripted drafts

def test_answer_key_reads_the_final_answer_then_code_then_text():
    assert answer_key("so \\boxed{1}, no: The result is \\boxed{ 2 + {3} }.") == "boxed:2+{3}"
    assert answer_key("```python\nclass A:\n    x = 1   \n\n```\nthat is all") == answer_key("```py\nclass A:\n    x = 1\n```")
    assert answer_key("  The  Capital is Rome. ") == answer_key("the capital is rome") == "text:the capital is rome"
    assert answer_key("  \n ") is None and answer_key("\\boxed{7") == "text:\\boxed{7"
    assert answer_key("```") is None and answer_key("```python\n```") is None and answer_key("\\boxed{ }") is None


def test_the_rule_takes_the_newest_k_consecutive_agreeing_drafts():
    rule = ExitRule(k=3)
    a, b = "boxed:1", "boxed:2"
    assert rule.check([Probe(0, a, None), Probe(1, a, None), Probe(3, a, None)], 100) is None  # 2 unfinished: not consecutive
    ex = rule.check([Probe(i, k, None) for i, k in enumerate([b, a, a, a, b, b, b])], 100)
    assert ex.drafts == [4, 5, 6] and ex.key == b and ex.at == 100
    assert ExitRule(k=2).check([Probe(0, None, None), Probe(1, None, None)], 9) is None  # empty drafts never agree
    assert ExitRule(k=2, min_think=50).check([Probe(0, a, None), Probe(1, a, None)], 49) is None
    assert ExitRule(k=2, min_think=50).check([Probe(0, a, None), Probe(1, a, None)], 50).drafts == [0, 1]
    sure = ExitRule(k=2, confidence=0.8)
    assert sure.check([Probe(0, a, 0.9), Probe(1, a, 0.6)], 9) is None  # mean 0.75
    assert sure.check([Probe(0, a, 0.9), Probe(1, a, 0.7)], 9).confidence == pytest.approx(0.8)


class _Tok:
    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def _budget(cfg, drafts):
    markers = ThinkMarkers(open_ids=(), marker_ids=(99,), tail_ids=())
    state = SimpleNamespace(drafts=drafts, rec=SimpleNamespace(tokenizer=_Tok(), stats=RunStats()))
    return ExitBudget(markers, cfg, state), state


@pytest.mark.parametrize("k,min_think", [(1, 0), (2, 0), (3, 0), (2, 30), (4, 0)])
def test_a_scripted_run_exits_at_the_step_the_kth_agreeing_draft_finishes(k, min_think):
    """Drafts fork every 4 tokens and finish 6 tokens later; answers 5, 7, 7, 7, 7 ...: the exit
    comes at the first step after which k consecutive finished drafts agree (and not before min)."""
    cfg = RunConfig(max_think=100, draft_start=4, draft_interval=4, num_drafts=20, exit_k=k, exit_min_think=min_think,
                    exit_confidence=0)
    drafts: list[Draft] = []
    budget, _ = _budget(cfg, drafts)
    answers = [[5], *[[7]] * 19]
    exited = None
    for thought in range(1, 100):
        if thought >= 4 and (thought - 4) % 4 == 0:
            drafts.append(Draft(len(drafts), thought, tokens=list(answers[len(drafts)])))
        for d in drafts:
            d.finished = thought >= d.forked_at + 6
            d.end = 0 if d.finished else None  # ended by its end of sequence
        if budget.spent(thought):
            exited = thought
            break
    finish = [d.forked_at + 6 for d in drafts]  # draft i finishes at 10 + 4 i
    expect = finish[0] if k == 1 else finish[k]  # drafts 1..k answer 7: the k-th of them (index k) finishes last
    assert exited == max(expect, min_think)
    newest = max(i for i, f in enumerate(finish) if f <= exited)  # the newest finished draft leads the window
    assert budget.exit.at == exited and budget.exit.drafts == list(range(newest - k + 1, newest + 1))
    assert budget.lead(drafts) is drafts[budget.exit.drafts[-1]]


def test_a_draft_cut_short_is_no_probe():
    """A draft stopped at max_draft (or longrope's switch point) wrote no whole answer."""
    cfg = RunConfig(max_think=100, draft_start=1, draft_interval=1, num_drafts=3, exit_k=2, exit_confidence=0)
    drafts = [Draft(0, 1, tokens=[7], finished=True, end=0), Draft(1, 2, tokens=[7], finished=True)]
    budget, _ = _budget(cfg, drafts)
    assert not budget.spent(10)
    drafts.append(Draft(2, 3, tokens=[7], finished=True, end=0))
    assert not budget.spent(11)  # drafts 0 and 2 agree, but they are not consecutive
    drafts.append(Draft(3, 4, tokens=[7], finished=True, end=0))
    assert budget.spent(12) and budget.exit.drafts == [2, 3]


def test_k_above_the_drafts_never_exits_and_the_budget_still_holds():
    cfg = RunConfig(max_think=10, draft_start=1, draft_interval=1, num_drafts=3, exit_k=4, exit_confidence=0)
    drafts = [Draft(i, i + 1, tokens=[7], finished=True, end=0) for i in range(3)]
    budget, _ = _budget(cfg, drafts)
    assert [budget.spent(t) for t in range(1, 10)] == [False] * 8 + [True]  # the marker is the 10th token
    assert budget.exit is None and budget.lead(drafts) is drafts[-1]


def test_a_run_that_never_exits_says_why_with_the_counts():
    """No exit: the strip's sentence (RunStats.exit.why) names each reason with its count: drafts
    still writing when the reasoning ended, cut short, with no answer, too few or disagreeing ones,
    drafts that never forked, the rule's floor, a confidence bar not reached."""
    cfg = RunConfig(max_think=100, draft_start=1, draft_interval=1, num_drafts=6, exit_k=3, exit_confidence=0)
    drafts = [Draft(0, 1, tokens=[5], finished=True, end=0), Draft(1, 2, tokens=[7], finished=True, end=0),
              Draft(2, 3, tokens=[7], finished=True, end=0), Draft(3, 4, tokens=[7], finished=True),  # cut short
              Draft(4, 5, tokens=[7])]  # still writing
    budget, _ = _budget(cfg, drafts)
    assert not budget.spent(40)
    why = budget.why_not()
    assert "5 of 6 drafts forked" in why and "1 of 5 still writing when the reasoning ended" in why
    assert "1 cut short" in why and "3 finished with 2 different answers: at most 2 in a row agree, the rule needs 3" in why
    few, _ = _budget(dataclasses.replace(cfg, num_drafts=2), drafts[:2])
    assert not few.spent(40) and "2 finished with an answer: too few, the rule needs 3 in a row" in few.why_not()
    floor, _ = _budget(dataclasses.replace(cfg, exit_min_think=50, exit_k=2, num_drafts=3), drafts[1:3])
    assert not floor.spent(30) and "the reasoning ended at 30 tokens, before the rule's floor of 50" in floor.why_not()
    sure, _ = _budget(dataclasses.replace(cfg, exit_k=2, num_drafts=3, exit_confidence=0.9), drafts[1:3])
    assert not sure.spent(30) and "2 in a row agreed, but their mean token probability stayed below 0.9" in sure.why_not()


def test_the_strip_gives_the_reason_live_and_replayed(tmp_path, lm):
    """On the bundled model, a run whose rule cannot hold (exit_k above the drafts) logs its reason;
    the live strip and a replay from the log both show it."""
    from ssr_ui.export import logged_view
    from ssr_ui.render import TraceView, metrics_html

    prompt = make_example("classes", 1500004).prompt
    cfg = dataclasses.replace(CFG, num_drafts=2, exit_k=3)
    log = RunLog(tmp_path / "runs.db")
    view = TraceView(method="ssr-exit")
    for ev in log.record(decoder("ssr-exit", lm)(prompt, cfg), RunMeta("ssr-exit", "tiny-reasoner", prompt, cfg.to_dict())):
        view.apply(ev)
    assert "too few, the rule needs 3 in a row" in view.stats.exit.why
    row = log.runs(limit=1)[0]
    assert row["exit_why"] == view.stats.exit.why
    replayed = logged_view(row, log.events(row["id"]))
    for v in (view, replayed):
        assert f"no exit: {view.stats.exit.why}" in metrics_html(v, "SSR early exit").replace("&#x27;", "'")


# ------------------------------------------------------------------ on the bundled model

def _exit(events):
    found = [e for e in events if isinstance(e, PhaseEvent) and e.phase == "exit"]
    return found[0] if found else None


@pytest.mark.parametrize("suite,seed", [("classes", 1500004), ("classes", 1500006), ("arithmetic", 1500006)])
def test_an_exit_is_plain_decoding_cut_where_the_drafts_agreed(lm, suite, seed):
    """Greedy: the reasoning up to the exit is baseline's, and the answer is what baseline writes
    when its reasoning is cut at the same point (the agreeing draft verified, not trusted)."""
    prompt = make_example(suite, seed).prompt
    events = run(lm, "ssr-exit", prompt, CFG)
    done, ex = events[-1], _exit(events)
    assert ex is not None, "these problems exit (their drafts agree early)"
    s = done.stats
    assert s.method == "ssr-exit" and s.exit.at == ex.at_token and s.exit.rule.startswith("2 consecutive drafts agree")
    assert s.reasoning_tokens == s.exit.at + len(lm.markers.marker_ids) and s.cut == ""
    agreeing = [int(i) for i in s.exit.drafts.split(",")]
    assert len(agreeing) == 2 and agreeing[-1] == ex.draft and agreeing[1] == agreeing[0] + 1
    texts = {i: lm.tokenizer.decode([e.token_id for e in events if isinstance(e, TokenEvent) and e.stream == "draft"
                                     and e.draft == i and e.status == "generated"]) for i in agreeing}
    assert len({answer_key(t) for t in texts.values()}) == 1
    forks = {e.draft: e.at_token for e in events if isinstance(e, PhaseEvent) and e.phase == "drafting"}
    assert all(forks[i] < s.exit.at for i in agreeing)
    plain = run(lm, "baseline", prompt, CFG)[-1]
    assert done.reasoning_ids[: s.exit.at] == plain.reasoning_ids[: s.exit.at]
    cut = run(lm, "baseline", prompt, CFG.replace(max_think=s.reasoning_tokens))[-1]
    assert done.reasoning_ids == cut.reasoning_ids and done.answer_ids == cut.answer_ids


def test_the_confidence_bar_is_measured_on_the_drafts_and_holds(lm):
    """With a bar, an exit's agreeing drafts have a mean token probability at or above it, as
    recomputed here from the model's own logits for each draft token; a bar of 1 never exits."""
    import torch

    prompt = make_example("arithmetic", 1500006).prompt
    free = run(lm, "ssr-exit", prompt, CFG)[-1].stats
    assert free.exit.at is not None and free.exit.score is None  # no bar: nothing measured
    events = run(lm, "ssr-exit", prompt, CFG.replace(exit_confidence=0.5))
    s = events[-1].stats
    assert s.exit.at is not None and s.exit.score >= 0.5
    ids = lm.prompt_ids(prompt)
    forks = {e.draft: e.at_token for e in events if isinstance(e, PhaseEvent) and e.phase == "drafting"}
    means = []
    for i in map(int, s.exit.drafts.split(",")):
        draft = [e.token_id for e in events if isinstance(e, TokenEvent) and e.stream == "draft" and e.draft == i
                 and e.status == "generated"]
        opened = len(lm.markers.tail_ids)  # the template tail opens a draft: forced, not chosen
        seq = ids + events[-1].reasoning_ids[: forks[i]] + list(lm.markers.marker_ids) + draft
        with torch.no_grad():
            logits = lm.model(torch.tensor([seq])).logits[0].double()
        start = len(seq) - len(draft) + opened
        probs = [torch.softmax(logits[j - 1], -1)[seq[j]].item() for j in range(start, len(seq))]
        end = torch.softmax(logits[-1], -1)
        if int(end.argmax()) in lm.eos_ids:  # the draft's end of sequence is one of its choices too
            probs.append(end.max().item())
        means.append(sum(probs) / len(probs))
    assert s.exit.score == pytest.approx(sum(means) / len(means), abs=1e-3)
    assert run(lm, "ssr-exit", prompt, CFG.replace(exit_confidence=1.0))[-1].stats.exit.at is None


def test_no_exit_before_the_minimum(lm):
    prompt = make_example("arithmetic", 1500006).prompt
    early = _exit(run(lm, "ssr-exit", prompt, CFG))
    events = run(lm, "ssr-exit", prompt, CFG.replace(exit_min_think=early.at_token + 5))
    late = _exit(events)
    assert late is not None and late.at_token >= early.at_token + 5  # later drafts agree too: it exits, later


def _same_run(a: list, b: list) -> None:
    """The same reasoning event for event (statuses included: run with ``think_spec=0``, since the
    main row's lookup widths follow the forwards' measured costs, which differ between two runs),
    the same drafts and the same answer. The answer's statuses are not compared: plain SSR verifies
    as many of each proposal's tokens as pay on this machine (``engine.methods.ssr.widths``), early
    exit every proposal whole, so which answer tokens a proposal won may differ, never the tokens."""
    strip = lambda evs: [(e.status, e.token_id, e.position) for e in evs
                         if isinstance(e, TokenEvent) and e.stream == "reasoning"]
    assert strip(a) == strip(b)
    assert a[-1].answer_ids == b[-1].answer_ids and a[-1].reasoning_ids == b[-1].reasoning_ids
    assert a[-1].drafts == b[-1].drafts


@pytest.mark.parametrize("suite", ["classes", "arithmetic"])
def test_k_above_the_drafts_possible_is_ssr_token_for_token(lm, suite):
    prompt = make_example(suite, 1500004).prompt
    cfg = CFG.replace(num_drafts=3, exit_k=4, think_spec=0)
    exit_run = run(lm, "ssr-exit", prompt, cfg)
    assert _exit(exit_run) is None and exit_run[-1].stats.exit.at is None
    _same_run(exit_run, run(lm, "ssr", prompt, cfg))


def test_on_smollm2_an_exit_is_plain_decoding_cut_and_k_above_the_drafts_is_ssr():
    from tests.test_real_models import smollm2

    lm = smollm2()
    cfg = RunConfig(max_think=64, max_answer=24, draft_start=4, max_draft=24, num_drafts=6, draft_interval=4, exit_k=1,
                    exit_confidence=0, drafting="always", think_spec=0)
    prompt = "What is 12 plus 30? Answer with the number."  # its prompted reasoning runs ~20 tokens; a draft ends first
    events = run(lm, "ssr-exit", prompt, cfg)
    s = events[-1].stats
    assert s.exit.at is not None and s.reasoning_tokens == s.exit.at + len(lm.markers.marker_ids)  # "</think>" as text
    cut = run(lm, "baseline", prompt, cfg.replace(max_think=s.reasoning_tokens))[-1]
    assert events[-1].answer_ids == cut.answer_ids and events[-1].reasoning_ids == cut.reasoning_ids
    _same_run(run(lm, "ssr-exit", prompt, cfg.replace(exit_k=7)), run(lm, "ssr", prompt, cfg.replace(exit_k=7)))


# ------------------------------------------------------------------ the log, the export, the server, the sweep

def test_the_log_and_the_export_keep_the_rule_and_the_exit(tmp_path, lm):
    from ssr_ui.export import run_from_json, run_to_json

    prompt = make_example("arithmetic", 1500006).prompt
    log = RunLog(tmp_path / "runs.db")
    events = list(log.record(decoder("ssr-exit", lm)(prompt, CFG), RunMeta("ssr-exit", lm.model_id, prompt, CFG.to_dict())))
    [row] = log.runs()
    s = events[-1].stats
    assert (row["exit_at"], row["exit_drafts"], row["exit_rule"], row["exit_answer"]) == \
        (s.exit.at, s.exit.drafts, s.exit.rule, s.exit.answer) and isinstance(row["exit_at"], int)
    assert json.loads(row["config"])["exit_k"] == 2 if isinstance(row["config"], str) else row["config"]["exit_k"] == 2
    logged = log.events(row["id"])
    assert _exit(logged) == _exit(events)
    again_row, again = run_from_json(run_to_json(row, logged))
    assert _exit(again) == _exit(events) and again_row["exit_at"] == s.exit.at and isinstance(again_row["exit_at"], int)


def test_a_vllm_server_refuses_it_with_the_reason(lm):
    from engine.remote.model import connect
    from tests.fake_vllm import FakeVllm

    rm = connect("tiny-reasoner", "http://vllm.test", transport=FakeVllm(lm, name="tiny-reasoner").transport)
    with pytest.raises(ValueError, match="server's timing"):
        decoder("ssr-exit", rm)


def test_the_sweep_reports_each_setting_beside_baseline_and_ssr(tmp_path, capsys):
    from engine.tools import exit_sweep, synthetic

    prompts = tmp_path / "p.jsonl"
    synthetic.main(["--suite", "arithmetic", "--n", "3", "--seed", "1500006", "--out", str(prompts)])
    out = tmp_path / "sweep.json"
    assert exit_sweep.main(["--prompts", str(prompts), "--ks", "2,5", "--intervals", "8", "--num-drafts", "4",
                            "--out", str(out), "--html", str(tmp_path / "s.html")]) == 0
    rows = json.loads(out.read_text())["summary"]
    assert [r["setting"] for r in rows] == ["baseline", "ssr", "k=2 every 8", "k=5 every 8"]
    assert rows[0]["reasoning_ratio"] == 1 and rows[1]["reasoning_ratio"] == 1  # SSR is lossless: same reasoning
    assert rows[3]["exited"] == 0 and rows[3]["reasoning_ratio"] == 1 and rows[3]["lost"] == rows[3]["gained"] == 0
    assert rows[2]["exited"] >= 1 and rows[2]["reasoning_ratio"] < 1
    assert all(r["problems"] == 3 for r in rows)
    assert "k=2 every 8" in capsys.readouterr().out and (tmp_path / "s.html").stat().st_size > 1000
    assert exit_sweep.main(["--prompts", str(prompts), "--ks", "x", "--out", str(out)]) == 2
    # a sweep in two parts, merged, is the same summary as the sweep made whole
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    lines = prompts.read_text().splitlines(keepends=True)
    first.write_text("".join(lines[:2]))
    second.write_text(lines[2])
    for part in (first, second):
        assert exit_sweep.main(["--prompts", str(part), "--ks", "2,5", "--intervals", "8", "--num-drafts", "4",
                                "--out", str(part) + ".json"]) == 0
    whole = tmp_path / "whole.json"
    assert exit_sweep.main(["--merge", f"{first}.json", f"{second}.json", "--out", str(whole)]) == 0
    again = json.loads(whole.read_text())["summary"]
    same = ("setting", "problems", "accuracy", "lost", "gained", "reasoning_ratio", "exited")
    assert [{k: r[k] for k in same} for r in again] == [{k: r[k] for k in same} for r in rows]
    assert exit_sweep.main(["--merge", f"{first}.json", f"{first}.json", "--out", str(whole)]) == 2


def test_the_bench_runs_it_with_the_models_probes_and_calls_an_exit_lossy(tmp_path, capsys):
    from engine.tools import bench, synthetic

    prompts = tmp_path / "p.jsonl"
    synthetic.main(["--suite", "arithmetic", "--n", "2", "--seed", "1500006", "--out", str(prompts)])
    out = tmp_path / "r.json"
    assert bench.main(["--prompts", str(prompts), "--methods", "baseline,ssr,ssr-exit", "--exit-k", "2",
                       "--out", str(out), "--warmup", "0"]) == 0
    result = json.loads(out.read_text())
    assert result["config"]["num_drafts"] == 1 and result["method_configs"]["ssr-exit"]["num_drafts"] == 12
    assert "ssr-exit probes the answer with 12 drafts, one every 16" in capsys.readouterr().out
    for r in (r for r in result["runs"] if r["method"] == "ssr-exit"):  # no exit: SSR, identical to baseline
        assert r["agreement"] == "identical" if r["exit_at"] is None else r["agreement_kind"] == "exit"
    rows = {r["method"]: r for r in result["summary"]}
    assert set(rows) == {"baseline", "ssr", "ssr-exit"} and len(rows["ssr-exit"]["accuracy_ci95"]) == 2
    # drafts the user set are kept as set (one agreeing draft is enough at k = 1)
    assert bench.main(["--prompts", str(prompts), "--methods", "baseline,ssr-exit", "--exit-k", "1",
                       "--num-drafts", "4", "--draft-interval", "8", "--out", str(out), "--warmup", "0"]) == 0
    result = json.loads(out.read_text())
    exits = [r for r in result["runs"] if r["method"] == "ssr-exit"]
    assert result["method_configs"] == {} and all(r["exit_at"] is not None for r in exits)
    assert all(r["agreement_kind"] == "exit" and "lossy by design" in r["agreement"] for r in exits)
    assert "lossy by design" in capsys.readouterr().out


def test_the_benchmark_tab_gives_it_the_models_probes_like_the_bench(tmp_path):
    from ssr_ui.handlers import Studio

    rows = [{"id": f"a{i}", "prompt": make_example("arithmetic", 1500006 + i).prompt,
             "reference": make_example("arithmetic", 1500006 + i).reference, "suite": "arithmetic"} for i in range(2)]
    path = tmp_path / "two.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    studio = Studio(db=str(tmp_path / "studio.db"))
    frames = list(studio.benchmark(upload=str(path), methods=["baseline", "ssr-exit"], limit=2, exit_k=2))
    assert "done: 4 runs on 2 problems" in frames[-1].status
    exits = [r for r in studio.log.runs(dataset="two.jsonl") if r["method"] == "ssr-exit"]
    configs = [r["config"] if isinstance(r["config"], dict) else json.loads(r["config"]) for r in exits]
    assert len(exits) == 2 and all(c["num_drafts"] == 12 and c["draft_interval"] == 16 for c in configs)
    assert all("a draft every 16 tokens" in r["exit_rule"] for r in exits)
    chart = frames[-1].figures[4]
    assert chart is not None and "Early exit" in chart.layout.title.text
