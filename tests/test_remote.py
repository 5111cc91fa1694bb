"""SSR and plain decoding against a vLLM server, here a fake one (``tests/fake_vllm.py``) that
answers with vLLM's exact JSON shapes from a local model: greedy results equal the in-process
engine's on the same weights, and every server fault is a clear error."""

from __future__ import annotations

import httpx
import pytest
import torch

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.registry import decoder
from engine.remote.client import BackendError, VllmClient
from engine.remote.decode import decode_remote_baseline, decode_remote_ssr
from engine.remote.model import RemoteModel, connect
from tests.fake_vllm import FakeVllm
from tests.numeric import MARGIN, forward_depth, softmax_depth, tolerance
from tests.tiny import make_model

PROMPTS = ["hello world", "class Garden: rose", "Start with 7. 7 plus 5"]


def final(events):
    return list(events)[-1]


def remote(lm, fail=None, timeout=30.0):
    server = FakeVllm(lm, fail=fail)
    client = VllmClient("http://vllm.test/v1", "tiny", timeout=timeout, transport=server.transport)
    return RemoteModel(client, lm.tokenizer, lm.model_id, lm.markers, lm.eos_ids), server


@pytest.fixture(scope="module")
def lm():
    return make_model("qwen3", seed=2, style="open", init_scale=3.0)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("budgets", [dict(max_think=40, max_answer=30), dict(max_think=6, max_answer=12)])
def test_remote_baseline_equals_in_process(lm, prompt, budgets):
    cfg = RunConfig(**budgets)
    here = final(decode_baseline(lm, prompt, cfg))
    rm, server = remote(lm)
    there = final(decode_remote_baseline(rm, prompt, cfg))
    assert (there.reasoning_ids, there.answer_ids) == (here.reasoning_ids, here.answer_ids)
    assert there.stats.step_mode == "vllm http://vllm.test" and all(r["return_token_ids"] for r in server.requests)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("settings", [dict(draft_start=0), dict(draft_start=5), dict(draft_start=2, max_draft=1),
                                      dict(draft_start=1, num_drafts=3, draft_interval=4),
                                      dict(draft_start=3, suffix_recovery=False, context_lookup=False)])
def test_remote_ssr_equals_plain_decoding(lm, prompt, settings):
    cfg = RunConfig(**{"max_think": 24, "max_answer": 30, "max_draft": 16, **settings})
    here = final(decode_baseline(lm, prompt, cfg))
    rm, server = remote(lm)
    events = list(decode_remote_ssr(rm, prompt, cfg))
    there = events[-1]
    assert (there.reasoning_ids, there.answer_ids) == (here.reasoning_ids, here.answer_ids)
    forks = [e for e in events if getattr(e, "phase", None) == "drafting"]
    assert len(forks) == there.stats.drafts
    if len(here.reasoning_ids) > cfg.draft_start + 1:  # the reasoning reached the fork point
        assert forks and there.drafts[0][: len(lm.markers.tail_ids)] == list(lm.markers.tail_ids)
    verifies = [r for r in server.requests if r.get("prompt_logprobs") is not None]
    if there.stats.accepted + there.stats.recovered:
        assert verifies  # something was proposed and verified in one request


def test_the_client_reads_vllms_shapes(lm):
    rm, _ = remote(lm)
    ids = lm.prompt_ids("hello world")
    streamed = list(rm.client.stream(ids, 8))
    picks = rm.client.verify(ids, streamed[:5])
    assert picks == streamed[:6]  # greedy: each candidate is the server's own pick, then the next
    assert rm.client.check() == "tiny"


@pytest.mark.parametrize("fail, decode, message", [
    ("down", decode_remote_baseline, "cannot reach http://vllm.test: is the vLLM server running?"),
    ("http500", decode_remote_baseline, "answered HTTP 500: engine dead"),
    ("cut", decode_remote_baseline, "cut the stream before it finished"),
    ("no-prompt-logprobs", decode_remote_ssr, "returned no prompt_logprobs"),
])
def test_server_faults_are_clear_errors(lm, fail, decode, message):
    rm, _ = remote(lm, fail=fail)
    with pytest.raises(BackendError, match=message.replace("?", r"\?")):
        list(decode(rm, "class Garden: rose", RunConfig(max_think=24, max_answer=30, draft_start=2)))


def test_a_slow_server_times_out(lm):
    server = FakeVllm(lm)

    def slow(request):  # what httpx raises when the server answers nothing within the timeout
        if request.url.path == "/v1/completions":
            raise httpx.ReadTimeout("timed out", request=request)
        return server.handle(request)

    client = VllmClient("http://vllm.test", "tiny", timeout=0.5, transport=httpx.MockTransport(slow))
    rm = RemoteModel(client, lm.tokenizer, lm.model_id, lm.markers, lm.eos_ids)
    with pytest.raises(BackendError, match="http://vllm.test timed out \\(ReadTimeout\\)"):
        list(decode_remote_baseline(rm, "hi", RunConfig(max_think=4, max_answer=4)))


def test_wrong_model_name_and_unsupported_settings(lm):
    server = FakeVllm(lm)
    with pytest.raises(BackendError, match="does not serve 'big' \\(it serves tiny\\)"):
        VllmClient("http://vllm.test", "big", transport=server.transport).check()
    rm, _ = remote(lm)
    for cfg, why in ((RunConfig(temperature=0.7, draft_start=2, max_think=8), "greedy only"),
                     (RunConfig(exact=True, draft_start=2, max_think=8), "exact mode runs in process only")):
        with pytest.raises(ValueError, match=why):
            list(decode_remote_ssr(rm, "hi", cfg))


def test_reasoning_lookups_are_set_aside_on_a_server_and_the_run_says_so(lm):
    rm, _ = remote(lm)
    cfg = RunConfig(think_spec=4, draft_start=2, max_think=8, max_answer=6)
    there = final(decode_remote_ssr(rm, "hi", cfg))
    here = final(decode_baseline(lm, "hi", cfg))
    assert (there.reasoning_ids, there.answer_ids) == (here.reasoning_ids, here.answer_ids)
    assert there.stats.lookups.startswith("off on a server") and "Reasoning lookup 4 applies in process" in \
        there.stats.lookups
    assert final(decode_remote_ssr(rm, "hi", cfg.replace(think_spec=0))).stats.lookups == ""


def test_connect_loads_the_tokenizer_and_checks_the_server():
    from engine.runtime.model import load_model

    lm = load_model("tiny-reasoner", device="cpu")
    server = FakeVllm(lm, name="tiny-reasoner")
    rm = connect("tiny-reasoner", "http://vllm.test", transport=server.transport)
    assert rm.client.model == "tiny-reasoner" and rm.markers == lm.markers
    cfg = RunConfig(max_think=60, max_answer=40, draft_start=10)
    here = final(decode_baseline(lm, "Write a Python class Island. Fields: amber.", cfg))
    there = final(decode_remote_ssr(rm, "Write a Python class Island. Fields: amber.", cfg))
    assert (there.reasoning_ids, there.answer_ids) == (here.reasoning_ids, here.answer_ids)


def test_the_studio_runs_the_default_model_on_the_server(tmp_path):
    from engine.runtime.model import load_model
    from ssr_ui.handlers import Studio

    server = FakeVllm(load_model("tiny-reasoner", device="cpu"), name="tiny-reasoner")
    studio = Studio("tiny-reasoner", str(tmp_path / "runs.db"),
                    servers={"tiny-reasoner": {"base_url": "http://vllm.test", "transport": server.transport}})
    prompt = "Write a Python class Island. Fields: amber."
    frames = list(studio.run(prompt, "Compare", max_think=60, max_answer=40, draft_start=10))
    assert set(frames[-1].runs) == {"Baseline", "SSR lookups alone", "SSR", "SSR early exit", "RSD"}  # RSD: the target on the server
    skipped = frames[-1].runs["SSR early exit"]  # in process only: skipped with the reason, nothing ran
    assert skipped.view.phase == "skipped" and "not offered on a vLLM server" in skipped.metrics
    assert "runs in process only" in frames[-1].runs["SSR lookups alone"].metrics
    assert "backend" in frames[-1].metrics and "vllm http://vllm.test" in frames[-1].metrics
    rows = studio.log.runs(limit=10)
    assert {(r["method"], r["device"], r["status"]) for r in rows} == {
        ("baseline", "vllm http://vllm.test", "ok"), ("ssr", "vllm http://vllm.test", "ok"),
        ("rsd", "vllm http://vllm.test", "ok")}
    server.fail = "http500"
    assert "answered HTTP 500: engine dead" in list(studio.run(prompt, "SSR", max_think=60, draft_start=10))[-1].metrics


@pytest.mark.parametrize("where", ["target", "both"])
@pytest.mark.parametrize("scorer", ["prm", "target-likelihood"])
def test_rsd_with_its_models_on_servers_equals_in_process(where, scorer):
    """RSD whose target (and draft) are on servers: the same steps, verdicts and tokens as in
    process (the PRM in process, or the target-likelihood reward from the target's server)."""
    from engine.methods.rsd.loop import decode_rsd
    from engine.methods.rsd.prm import MathShepherdScorer

    target, draft = make_model("llama", seed=1, init_scale=2.0), make_model("qwen2", seed=2, init_scale=2.0)
    prm = MathShepherdScorer(make_model("llama", seed=3)) if scorer == "prm" else scorer
    cfg = RunConfig(max_think=40, max_answer=20, max_step_tokens=12, threshold=0.5, draft_confidence=0.2)
    here = final(decode_rsd(target, draft, prm, "Start with 7", cfg))  # in process: the loop's default writers
    t_remote, _ = remote(target)
    d_remote = remote(draft)[0] if where == "both" else draft
    there = final(decoder("rsd", t_remote, d_remote, prm)("Start with 7", cfg))  # the registry picks each writer
    assert (there.reasoning_ids, there.answer_ids) == (here.reasoning_ids, here.answer_ids)
    assert (there.stats.rsd.steps_accepted, there.stats.rsd.steps_rejected) == (here.stats.rsd.steps_accepted,
                                                                        here.stats.rsd.steps_rejected)
    assert there.stats.rsd.steps_accepted + there.stats.rsd.steps_rejected > 1 and there.stats.step_mode.startswith("vllm ")


def test_the_bench_on_a_server_prints_the_usual_table(tmp_path, monkeypatch, capsys):
    import json

    from engine.remote import model as remote_model
    from engine.runtime.model import load_model
    from engine.tools import bench

    server = FakeVllm(load_model("tiny-reasoner", device="cpu"), name="tiny-reasoner")
    monkeypatch.setattr("engine.wiring.connect", lambda *a, **k: remote_model.connect(*a, transport=server.transport))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "prompt": "Start with 7, then add 5.", "reference": "12",
                                   "suite": "arithmetic"}) + "\n")
    out = tmp_path / "o.json"
    code = bench.main(["--model", "tiny-reasoner", "--base-url", "http://vllm.test", "--methods", "baseline,ssr,rsd,target",
                       "--prm", "target-likelihood", "--prompts", str(prompts), "--out", str(out), "--max-think", "80",
                       "--max-answer", "30", "--draft-start", "10", "--db", str(tmp_path / "runs.db")])
    result = json.loads(out.read_text())
    assert code == 0 and {r["method"] for r in result["summary"]} == {"baseline", "ssr", "rsd", "target"}
    from engine.runlog import RunLog

    assert {r["device"] for r in RunLog(tmp_path / "runs.db").runs(limit=10)} == {"vllm http://vllm.test"}
    assert "steps kept" in capsys.readouterr().out
    code = bench.main(["--model", "tiny-reasoner", "--base-url", "http://vllm.test", "--methods", "hf",
                       "--prompts", str(prompts), "--out", str(out)])
    assert code == 2 and "method 'hf' runs in process only" in capsys.readouterr().err


def served_prm_bound(prm_lm) -> float:
    """How far a served math-shepherd PRM's p(+) may be from the in-process one's: float64 forwards
    both (the server's from scratch, ours cached or from scratch), then a two-way softmax in float64
    there and in float32 here; scale 1: this scale-1 model's "+"/"-" logits are below 1 (0.27 measured)."""
    return (tolerance(torch.float64, 1.0, forward_depth(prm_lm.model.config))
            + tolerance(torch.float32, 1.0, softmax_depth(2)))


def served_prm(prm_lm):
    from engine.remote.prm import ServedPRMScorer

    server = FakeVllm(prm_lm, name="prm")
    return ServedPRMScorer(prm_lm.tokenizer, VllmClient("http://vllm.test", "prm", transport=server.transport), "prm")


@pytest.mark.numeric
def test_a_prm_on_a_server_scores_as_in_process():
    """The math-shepherd PRM served with STEP pooling gives the in-process PRM's rewards, so RSD
    with all three models on servers keeps the same steps."""
    from engine.methods.rsd.loop import decode_rsd
    from engine.methods.rsd.prm import MathShepherdScorer
    from engine.remote.prm import connect_prm
    from engine.runtime.model import load_model

    prm_lm = make_model("llama", seed=3)
    here_prm = MathShepherdScorer(prm_lm)
    served = served_prm(prm_lm)
    for scorer in (here_prm, served):
        scorer.start("What is 7 plus 5?")
        scorer.commit("7 plus 5 is 12.")
    bound = served_prm_bound(prm_lm)
    assert served.score("The result is 12.") == pytest.approx(here_prm.score("The result is 12."), abs=bound)
    target, draft = make_model("llama", seed=1, init_scale=2.0), make_model("qwen2", seed=2, init_scale=2.0)
    cfg = RunConfig(max_think=40, max_answer=20, max_step_tokens=12, threshold=0.5)
    here = final(decode_rsd(target, draft, here_prm, "Start with 7", cfg))
    there = final(decoder("rsd", remote(target)[0], remote(draft)[0], served)("Start with 7", cfg))
    assert (there.reasoning_ids, there.answer_ids, there.stats.rsd.steps_accepted) == \
        (here.reasoning_ids, here.answer_ids, here.stats.rsd.steps_accepted)
    assert there.stats.rsd.steps_accepted + there.stats.rsd.steps_rejected > 1
    # connect_prm: the bundled PRM by name, its tokenizer loaded here, the server checked
    bundled = connect_prm("tiny-prm", "http://vllm.test",
                          transport=FakeVllm(load_model("tiny-prm", device="cpu"), name="tiny-prm").transport)
    bundled.start("What is 7 plus 5?")
    assert 0 < bundled.score("7 plus 5 is 12.") < 1
    bundled.client.pool = lambda ids: [[0.4, 0.6]]  # a server that pools every token, or not as a 2-way classifier
    with pytest.raises(BackendError, match="does not score tiny-prm at its step tags"):
        bundled.score("7 plus 5 is 12.")


@pytest.mark.numeric
def test_a_served_prm_scores_every_step_at_once_as_in_process():
    """``score_all`` on the served PRM (one pooling request over the whole input) gives the in-process
    PRM's ``score_all``, step by step; the companion, p(+) read one token before each tag, is caught."""
    from engine.methods.rsd.prm import MathShepherdScorer

    prm_lm = make_model("llama", seed=3)
    here, served = MathShepherdScorer(prm_lm), served_prm(prm_lm)
    question, steps = "What is 7 plus 5?", ["7 plus 5 is 12.", "<think>So the sum is 12.</think>", "The result is 12."]
    expected = here.score_all(question, steps)
    got = served.score_all(question, steps)
    bound = served_prm_bound(prm_lm)
    assert served.calls == 1 and len(got) == len(expected) == len(steps)
    assert got == pytest.approx(expected, abs=bound)
    assert served.format.tokens == here.format.tokens  # one input format, committed alike
    ids = torch.tensor([here.format.tokens])
    with torch.no_grad():
        logits = prm_lm.model(ids).logits[0]  # [T, V]
    early = (ids[0] == here.format.tag).nonzero().flatten() - 1
    misread = torch.softmax(logits[early][:, [here.plus, here.minus]].float(), -1)[:, 0].tolist()
    assert max(abs(g - m) for g, m in zip(got, misread, strict=True)) > MARGIN * bound
    assert served.score_all(question, []) == [] and served.calls == 2


def test_the_backend_flag_and_the_url_agree(tmp_path, capsys):
    import subprocess
    import sys

    from engine.tools import bench
    from tests.apps import ROOT

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    assert bench.main(["--backend", "vllm", "--prompts", str(prompts), "--out", str(tmp_path / "o.json")]) == 2
    assert "--backend vllm needs --base-url" in capsys.readouterr().err
    out = subprocess.run([sys.executable, "app.py", "--backend", "transformers", "--base-url", "http://x:8000"],
                         cwd=ROOT, capture_output=True, text=True, check=False, timeout=120)
    assert out.returncode == 2 and "--base-url runs the model on a vLLM server" in out.stderr


def test_a_studio_whose_server_is_down_says_so_and_keeps_working(tmp_path, lm):
    from ssr_ui.handlers import Studio

    down = FakeVllm(lm, name="tiny-reasoner", fail="down")
    studio = Studio("tiny-reasoner", str(tmp_path / "runs.db"),
                    servers={"tiny-reasoner": {"base_url": "http://vllm.test", "transport": down.transport}})
    frame = list(studio.run("hello", "SSR", max_think=20, draft_start=2))[-1]
    assert "cannot reach http://vllm.test: is the vLLM server running?" in frame.metrics
    assert studio.log.runs(limit=5) == []  # nothing ran, nothing logged
    assert list(studio.run("hello", "Baseline", "tiny-reasoner-draft", max_think=8, max_answer=4))[-1].view.phase == "done"
