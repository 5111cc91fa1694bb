"""SSR over a server that speculates by itself (issue 24), against the fake vLLM server speculating
as vLLM's suffix method does (``tests/fake_vllm.py``): the drafts become the server's material, no
client-side verify is sent, the answer is plain decoding's, and its colours are rebuilt from the
stream and the server's per-request metrics. The real server: ``tests/test_vllm_integration.py``."""

from __future__ import annotations

import pytest

from engine.events import TokenEvent
from engine.methods.baseline import decode_baseline
from engine.registry import decoder
from engine.remote.client import VllmClient
from engine.remote.model import RemoteModel
from engine.remote.speculation import RECONSTRUCTED, engine_steps
from engine.runtime.model import load_model
from engine.tools.synthetic import EVAL_SEED_BASE, make_example
from engine.wiring import run_config
from tests.fake_vllm import FakeVllm

PROMPTS = [make_example("classes", EVAL_SEED_BASE + 70 + i).prompt for i in range(2)]


@pytest.fixture(scope="module")
def lm():
    return load_model("tiny-reasoner")


def served(lm, speculation="suffix", declared="suffix", spec_metrics=True):
    server = FakeVllm(lm, speculation=speculation, spec_metrics=spec_metrics)
    client = VllmClient("http://vllm.test/v1", "tiny", timeout=30, transport=server.transport)
    return RemoteModel(client, lm.tokenizer, lm.model_id, lm.markers, lm.eos_ids, speculation=declared), server


@pytest.mark.parametrize("prompt", PROMPTS[:1])
def test_the_server_verifies_from_the_drafts_and_the_answer_is_plain_decodings(lm, prompt):
    cfg = run_config("tiny-reasoner", {})
    here = decode_baseline(lm, prompt, cfg)
    *_, plain = here
    rm, server = served(lm)
    events = list(decoder("ssr", rm)(prompt, cfg))
    there = events[-1]
    assert (there.reasoning_ids, there.answer_ids) == (plain.reasoning_ids, plain.answer_ids)
    assert not any("prompt_logprobs" in r for r in server.requests), "no client-side verify"
    s = there.stats
    assert s.server.speculation == "suffix" and s.server.note == "" and s.verify.startswith("on the server")
    assert s.server.accepted > 0 and s.server.proposed >= s.server.accepted and s.server.steps > 0
    assert s.accepted == s.server.accepted and s.accepted + s.generated == s.answer_tokens  # every token coloured once
    recoloured = [e for e in events if isinstance(e, TokenEvent) and e.stream == "answer" and e.status == "accepted"]
    assert recoloured and all(e.source.startswith(RECONSTRUCTED) for e in recoloured)
    assert any(": draft 0 at " in e.source for e in recoloured), "the accepted runs are found in the draft"
    answer_requests = [r for r in server.requests if (r.get("stream_options") or {}).get("include_usage")]
    assert len(answer_requests) == 1, "the answer is one plain request that asks for its metrics"


def test_a_server_that_sends_no_metrics_is_said_never_silently_replaced(lm):
    cfg = run_config("tiny-reasoner", {})
    rm, server = served(lm, spec_metrics=False)
    there = list(decoder("ssr", rm)(PROMPTS[0], cfg))[-1]
    *_, plain = decode_baseline(lm, PROMPTS[0], cfg)
    assert there.answer_ids == plain.answer_ids and there.stats.accepted == 0
    assert "sent no per-request speculative metrics" in there.stats.server.note
    assert not any("prompt_logprobs" in r for r in server.requests)  # still no client-side loop
    rm, _ = served(lm, speculation=None)  # declared, but the server does not speculate at all
    there = list(decoder("ssr", rm)(PROMPTS[0], cfg))[-1]
    assert there.answer_ids == plain.answer_ids and "sent no per-request speculative metrics" in there.stats.server.note


def test_a_server_not_declared_speculating_gets_the_client_side_verify(lm):
    rm, server = served(lm, declared=None)
    there = list(decoder("ssr", rm)(PROMPTS[1], run_config("tiny-reasoner", {})))[-1]
    assert there.stats.verify.startswith("client-side") and any("prompt_logprobs" in r for r in server.requests)


def test_engine_steps_from_chunks_and_per_step_figures():
    assert engine_steps([1, 3, 1, 2], [2, 0, 1]) == [0, 2, 0, 1]  # one chunk a step
    assert engine_steps([1, 1, 3], [2]) == [0, 0, 2]  # a step with no proposal is not in the figures
    assert engine_steps([1, 4], [2]) == [0, 2, 0]  # two steps merged into one chunk (a slow reader)
    assert engine_steps([2, 2], [1]) == [0, 0, 1]  # the prefill's chunk merged with the next step
    assert engine_steps([1, 2], [3]) == [0, 1]  # the last step cut by the stop token inside what it accepted
    assert engine_steps([1, 2], [3, 1]) is None  # the figures do not fit the stream: no colours are guessed
    assert engine_steps([1, 2], None) is None


def test_the_studio_shows_the_servers_figures_and_logs_its_method(lm, tmp_path):
    from ssr_ui.handlers import Studio

    studio = Studio("served", db=str(tmp_path / "runs.db"))
    rm, _ = served(lm)
    studio.add_model("served", rm)
    frame = list(studio.run(PROMPTS[0], "SSR", "served"))[-1]
    assert "server speculation" in frame.metrics and "proposed tokens accepted" in frame.metrics
    assert "colours reconstructed" in frame.metrics and 'class="tok st-accepted"' in frame.answer
    row = studio.history()[0]
    assert row["server_speculation"] == "suffix" and row["server_accepted"] > 0
    assert studio.replay(row["id"]).answer == frame.answer  # the recoloured answer replays as it was shown
    rm, _ = served(lm, spec_metrics=False)
    studio.add_model("quiet", rm)
    frame = list(studio.run(PROMPTS[0], "SSR", "quiet"))[-1]
    assert "sent no per-request speculative metrics" in frame.metrics


def test_the_flag_needs_a_server(tmp_path, capsys):
    from engine.tools import bench

    assert bench.main(["--server-speculation", "suffix", "--dataset", "bundled-classes", "--limit", "1",
                       "--out", str(tmp_path / "o.json")]) == 2
    assert "--server-speculation describes the --base-url server" in capsys.readouterr().err


def test_the_answer_waits_for_the_drafts_so_its_passes_do_not_race_them(lm):
    """Issue 33: on a real server the answer's passes went 56, 19, 19 on one prompt, depending on
    how far a draft had got when the answer needed it. The answer now starts once the drafts are
    whole: with drafts slowed (a busy server: still running when the reasoning ends) it takes as
    many passes as with drafts that finished long before, and the same answer."""
    prompt = PROMPTS[1]
    cfg = run_config("tiny-reasoner", {})
    figures = []
    for delay in (0.0, 0.02, 0.0):
        server = FakeVllm(lm, speculation="suffix", draft_delay=delay)
        client = VllmClient("http://vllm.test/v1", "tiny", timeout=30, transport=server.transport)
        rm = RemoteModel(client, lm.tokenizer, lm.model_id, lm.markers, lm.eos_ids, speculation="suffix")
        done = list(decoder("ssr", rm)(prompt, cfg))[-1]
        figures.append((done.stats.server.steps, done.stats.server.accepted, done.answer_ids))
        close = list(lm.markers.close_ids)
        drafts = [(r, out) for r, out in server.streams if r["prompt"][-len(close):] == close]
        whole = [len(out) == r["max_tokens"] or (out and out[-1] in lm.eos_ids) for r, out in drafts]
        assert drafts and all(whole), "every draft ran to its end before the answer started"
    assert figures[0] == figures[1] == figures[2]
