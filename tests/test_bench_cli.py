"""The bench CLI on a local model folder: interface, results.json, runs table, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.runlog import RunLog
from engine.runtime.model import ModelLoadError, load_model
from engine.tools import bench
from tests.tiny import make_model


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    lm = make_model("qwen3", seed=2, init_scale=3.0)
    lm.model.float().save_pretrained(path)
    lm.tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [
        {"id": "a", "prompt": "hello world"},
        {"id": "b", "prompt": "Start with 7", "reference": "12", "suite": "arithmetic"},
    ]))
    return path


def test_bench_end_to_end(model_dir, prompts, tmp_path, capsys):
    out, db = tmp_path / "results.json", tmp_path / "runs.db"
    code = bench.main(["--model", str(model_dir), "--methods", "baseline,ssr,hf,hf-pld", "--prompts", str(prompts),
                       "--out", str(out), "--db", str(db), "--draft-start", "3", "--max-think", "12",
                       "--max-draft", "8", "--max-answer", "10", "--repeat", "2", "--warmup", "0"])
    assert code == 0
    result = json.loads(out.read_text())
    assert len(result["runs"]) == 2 * 2 * 4
    required = {"method", "prompt_id", "repeat", "latency_s", "ttft_s", "reasoning_tokens", "answer_tokens", "accepted",
                "recovered", "rejected", "answer_text", "answer_token_ids", "reasoning_token_ids"}
    for run in result["runs"]:
        assert required <= set(run)
    assert [r["method"] for r in result["runs"][:8]] == ["baseline", "ssr", "hf", "hf-pld"] * 2  # interleaved
    assert "correct" in next(r for r in result["runs"] if r["prompt_id"] == "b")
    summary = {row["method"]: row for row in result["summary"]}
    assert summary["baseline"]["median_latency_ratio_to_baseline"] == 1.0
    assert summary["ssr"]["answers_equal_baseline"] == 2
    logged = RunLog(db).runs(limit=100)
    assert len(logged) == 16 and {r["origin"] for r in logged} == {"bench"}
    printed = capsys.readouterr().out
    # the compact table (issue 43 b): labelled, the ratio with its spread, lines a terminal holds
    lines = printed.splitlines()
    table = lines[lines.index(next(line for line in lines if line.startswith("  method"))):][:1 + 4]  # 4 methods
    assert "/ baseline (IQR)" in table[0] and "verdict" in table[0] and max(map(len, table)) <= 100, table
    assert any(line.startswith(("ssr vs baseline: ", "hf vs baseline: ")) for line in printed.splitlines())
    lo, hi = summary["ssr"]["latency_iqr_s"]
    ssr = sorted(r["latency_s"] for r in result["runs"] if r["method"] == "ssr")
    assert ssr[0] <= lo <= summary["ssr"]["median_latency_s"] <= hi <= ssr[-1]


def test_the_lookups_alone_ablation_is_a_row_of_its_own_and_ssr_is_measured_against_it(model_dir, prompts, tmp_path,
                                                                                        capsys):
    """Issue 41's ablation: ``ssr-lookups`` (SSR's loop, no drafts) runs beside SSR, token-identical to
    baseline; SSR's row gives its latency over the ablation's (what the drafts added), in the JSON and
    the compact table."""
    out = tmp_path / "results.json"
    assert bench.main(["--model", str(model_dir), "--methods", "baseline,ssr-lookups,ssr", "--prompts", str(prompts),
                       "--out", str(out), "--draft-start", "3", "--max-think", "12", "--max-draft", "8",
                       "--max-answer", "10", "--warmup", "0"]) == 0
    result = json.loads(out.read_text())
    summary = {row["method"]: row for row in result["summary"]}
    assert summary["ssr-lookups"]["answers_equal_baseline"] == 2 and summary["ssr"]["answers_equal_baseline"] == 2
    assert all(r["drafts"] == 0 for r in result["runs"] if r["method"] == "ssr-lookups")
    ssr, alone = ([r["latency_s"] for r in result["runs"] if r["method"] == m] for m in ("ssr", "ssr-lookups"))
    expect = sorted(a / b for a, b in zip(ssr, alone, strict=True))
    assert summary["ssr"]["median_latency_ratio_to_lookups"] == pytest.approx(sum(expect) / 2)  # two problems
    assert "median_latency_ratio_to_lookups" not in summary["ssr-lookups"]
    assert "/ lookups alone (IQR)" in capsys.readouterr().out


def test_vs_dtype_runs_baseline_in_the_other_precision_interleaved(model_dir, prompts, tmp_path, capsys, monkeypatch):
    """``--vs-dtype``: baseline in another precision is a row of its own (``baseline@bfloat16``), run
    on every problem beside the others, logged as baseline in that precision; the numerics the
    target runs in are printed and kept in results.json."""
    monkeypatch.setenv("SSR_STUDIO_CACHE", str(tmp_path / "cache"))
    out, db = tmp_path / "results.json", tmp_path / "runs.db"
    assert bench.main(["--model", str(model_dir), "--methods", "baseline,ssr", "--prompts", str(prompts), "--out",
                       str(out), "--db", str(db), "--dtype", "float32", "--vs-dtype", "bfloat16", "--max-think", "12",
                       "--draft-start", "3", "--max-answer", "8", "--warmup", "0"]) == 0
    result = json.loads(out.read_text())
    assert [r["method"] for r in result["runs"][:3]] == ["baseline", "ssr", "baseline@bfloat16"]
    assert {r["dtype"] for r in result["runs"] if r["method"] == "baseline@bfloat16"} == {"bfloat16"}
    assert "baseline@bfloat16" in {row["method"] for row in result["summary"]}
    assert result["numerics"] == "float32: as asked (--dtype)"
    assert {(r["method"], r["dtype"]) for r in RunLog(db).runs(limit=100)} == {
        ("baseline", "float32"), ("ssr", "float32"), ("baseline", "bfloat16")}
    assert "numerics: float32: as asked (--dtype)" in capsys.readouterr().out


def test_the_llama_server_comparison_reads_the_servers_own_timings(monkeypatch):
    """The report's arithmetic on a scripted server (a real one needs a llama-server binary): end to end
    against the baseline's latency, the generation alone against its time after the prefill."""
    from types import SimpleNamespace

    from engine.llamacpp import server

    class Scripted:
        settings = "llama.cpp's defaults"

        def __init__(self, binary, lm, cells, same_settings):
            pass

        def generate(self, ids, n):
            return {"prompt_ms": 100.0, "predicted_ms": 900.0, "predicted_n": n, "wall_s": 1.0}

        def close(self):
            pass

    monkeypatch.setattr(server, "LlamaServer", Scripted)
    lm = SimpleNamespace(threads=2, prompt_ids=lambda text: [1, 2, 3])
    problems = [SimpleNamespace(id="a", prompt="x"), SimpleNamespace(id="b", prompt="y")]
    runs = [{"method": "baseline", "prompt_id": pid, "reasoning_token_ids": [0] * 60, "answer_token_ids": [0] * 30,
             "latency_s": 1.25, "prefill_s": 0.25} for pid in ("a", "b")]
    got = server.compare("llama-server", lm, problems, runs, 224)
    assert got["server_tokens_per_s"] == pytest.approx(90.0) and got["server_generation_tokens_per_s"] == pytest.approx(100)
    assert got["ratio"] == pytest.approx(72 / 90) and got["generation_ratio"] == pytest.approx(0.9)
    assert "= 0.80x, 90.0 after its prefill = 0.90x llama-server's" in server.said(got)


def test_hf_peer_splits_at_the_marker_and_matches_baseline(model_dir, prompts, tmp_path):
    """generate() and our loop write the same tokens (tests/test_peers_budget.py: with the budget in play too)."""
    out = tmp_path / "r.json"
    assert bench.main(["--model", str(model_dir), "--methods", "baseline,hf", "--prompts", str(prompts), "--out",
                       str(out), "--max-think", "40", "--draft-start", "3", "--max-answer", "6", "--warmup", "0"]) == 0
    runs = json.loads(out.read_text())["runs"]
    for base, hf in zip(runs[::2], runs[1::2], strict=True):
        n = len(base["reasoning_token_ids"])
        if n <= 40:  # the model closed its thoughts by itself: generate() must agree exactly
            assert hf["reasoning_token_ids"][:n] == base["reasoning_token_ids"]


@pytest.mark.parametrize("args, message", [
    (["--methods", "baseline,warp"], "unknown method 'warp'"),
    (["--max-think", "0"], "Max think (max_think) must be a whole number in 1..1000000; got 0"),
    (["--draft-start", "5000"], "Draft start (draft_start) must be a whole number in 0.."),
    (["--repeat", "0"], "--repeat=0"),
    (["--llama-server", "/no/such/llama-server"], "add --runtime llama.cpp"),
])
def test_bad_arguments_fail_cleanly(model_dir, prompts, tmp_path, capsys, args, message):
    code = bench.main(["--model", str(model_dir), "--prompts", str(prompts), "--out", str(tmp_path / "o.json"), *args])
    assert code == 2 and message in capsys.readouterr().err


def test_bad_prompt_files(model_dir, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "prompt": "ok"}\n{not json}\n')
    assert bench.main(["--model", str(model_dir), "--prompts", str(bad), "--out", str(tmp_path / "o.json")]) == 2
    assert "bad.jsonl', line 2: not valid JSON" in capsys.readouterr().err
    bad.write_text('{"id": 1}\n')
    assert bench.main(["--model", str(model_dir), "--prompts", str(bad), "--out", str(tmp_path / "o.json")]) == 2
    assert "row 1: no question field (none of prompt, question" in capsys.readouterr().err


def test_missing_models_name_the_id(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(ModelLoadError, match="'someone/not-a-model'"):
        load_model("someone/not-a-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path / "empty"))


def test_model_without_markers_plain_works_ssr_explains(model_dir, tmp_path):
    from engine.config import RunConfig
    from engine.methods.baseline import decode_baseline
    from engine.methods.ssr.loop import decode_ssr
    from engine.runtime.model import SSRUnsupportedError

    lm = load_model(str(model_dir))
    lm.markers = None
    cfg = RunConfig(max_think=5, draft_start=1, max_answer=5)
    done = list(decode_baseline(lm, "hi", cfg))[-1]
    assert done.reasoning_ids == [] and len(done.answer_ids) > 0
    with pytest.raises(SSRUnsupportedError, match="does not reason: it has no end-of-thinking marker token and no chat template"):
        list(decode_ssr(lm, "hi", cfg))


@pytest.fixture(scope="module")
def rsd_dirs(tmp_path_factory):
    out = {}
    for name, arch, seed in (("target", "llama", 1), ("draft", "qwen2", 2), ("prm", "llama", 3)):
        path = tmp_path_factory.mktemp(name)
        lm = make_model(arch, seed=seed, init_scale=2.0)
        lm.model.float().save_pretrained(path)
        lm.tokenizer.save_pretrained(path)
        out[name] = str(path)
    return out


def test_bench_rsd_methods(rsd_dirs, prompts, tmp_path, capsys):
    """RSD's methods through the bench: FLOPs, steps kept, ratios to the target, and (issue 22,
    finding 5: the bench printed correct=True but logged NULL, so History's RSD chart never showed
    accuracy) every run with a reference and a checker logged graded, as the JSON says."""
    from ssr_ui import charts

    out, db = tmp_path / "rsd.json", tmp_path / "runs.db"
    code = bench.main(["--model", rsd_dirs["target"], "--draft-model", rsd_dirs["draft"], "--prm", rsd_dirs["prm"],
                       "--methods", "target,rsd,draft", "--prompts", str(prompts), "--out", str(out), "--db", str(db),
                       "--threshold", "0.5", "--max-think", "20", "--max-answer", "5", "--max-step-tokens", "4",
                       "--warmup", "0"])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    for run in result["runs"]:
        assert {"flops", "steps_accepted", "steps_rejected"} <= set(run) and run["flops"] > 0
    summary = {row["method"]: row for row in result["summary"]}
    assert summary["target"]["median_flops_ratio_to_target"] == 1.0
    assert summary["draft"]["median_flops_ratio_to_target"] > 0
    assert 0.0 <= summary["rsd"]["fraction_steps_accepted"] <= 1.0
    assert summary["rsd"]["median_latency_ratio_to_target"] > 0 and summary["target"]["median_latency_ratio_to_target"] == 1
    printed = capsys.readouterr().out
    assert "steps kept" in printed and " rsd: " in printed and "accepted 0 recovered 0" not in printed.split("rsd:")[1][:40]
    rows = RunLog(db).runs(method="rsd")
    assert rows and rows[0]["prm"] == rsd_dirs["prm"] and rows[0]["flops"] > 0
    graded = {(r["method"], r["prompt_id"]): r["correct"] for r in result["runs"] if "correct" in r}
    every = RunLog(db).runs()
    logged = {(r["method"], r["prompt_id"]): r["correct"] for r in every}
    assert graded and all(logged[k] == int(v) for k, v in graded.items())  # the graded prompt: logged graded
    assert logged[("rsd", "a")] is None  # no reference: nothing to grade
    assert "RSD accuracy" in [t.name for t in charts.rsd_by_threshold(every).data]


def test_a_wide_spread_is_said_not_hidden():
    """Issue 22, finding 7: on a loaded machine a ratio column could contradict the latency column
    unlabelled; now the table labels both and a wide spread is printed as a warning."""
    runs = [{"method": m, "prompt_id": p, "latency_s": t, "tokens_per_s": 1.0, "accepted": 0, "recovered": 0,
             "steps_accepted": 0, "steps_rejected": 0, "step_s_drafting": None, "step_s_alone": None,
             "answer_token_ids": [1]}
            for p, (b, s) in enumerate([(1.0, 0.5), (1.0, 1.5), (1.0, 0.6), (1.0, 1.4)]) for m, t in (("baseline", b), ("ssr", s))]
    summary = bench.summarize(runs, greedy=True)
    warnings = bench.spread_warnings(summary)
    assert any(w.startswith("ssr: per-problem latency ratios spread") for w in warnings)
    calm = bench.summarize([{**r, "latency_s": 1.0 if r["method"] == "baseline" else 0.7} for r in runs], greedy=True)
    assert bench.spread_warnings(calm) == []


def test_bench_rsd_bad_input(rsd_dirs, prompts, tmp_path, capsys):
    base = ["--model", rsd_dirs["target"], "--prompts", str(prompts), "--out", str(tmp_path / "o.json")]
    assert bench.main(base + ["--methods", "rsd", "--draft-model", rsd_dirs["draft"], "--prm", rsd_dirs["prm"],
                              "--weighting", "logistic", "--weight-param", "-1"]) == 2
    assert "must be a number above 0 (the logistic rule's slope); got -1.0" in capsys.readouterr().err
    assert bench.main(base + ["--methods", "rsd", "--draft-model", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_rsd_threshold_sweep(rsd_dirs, tmp_path, capsys):
    from engine.tools import rsd_sweep

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Start with 7", "reference": "12", "suite": "arithmetic"}\n')
    out, page = tmp_path / "sweep.json", tmp_path / "sweep.html"
    code = rsd_sweep.main(["--prompts", str(prompts), "--thresholds", "0,0.5,1.1", "--out", str(out), "--html",
                           str(page), "--model", rsd_dirs["target"], "--draft-model", rsd_dirs["draft"],
                           "--prm", rsd_dirs["prm"], "--max-think", "12", "--max-answer", "4"])
    assert code == 0, capsys.readouterr().err
    rows = {r["setting"]: r for r in json.loads(out.read_text())["summary"]}
    assert rows["target"]["median_flops_ratio_to_target"] == 1.0
    assert rows["rsd 0"]["fraction_steps_accepted"] == 1.0      # threshold 0 keeps every step
    assert rows["rsd 1.1"]["fraction_steps_accepted"] == 0.0    # above 1 keeps none
    assert "plotly" in page.read_text()


def test_bundled_model_gets_its_tuned_settings_by_name_or_folder():
    from engine.presets import BUNDLED_DIR, RECOMMENDED, recommended_settings

    tuned = RECOMMENDED["tiny-reasoner"]
    assert recommended_settings("tiny-reasoner") == tuned
    assert recommended_settings(str(BUNDLED_DIR / "tiny-reasoner")) == tuned
    assert recommended_settings(None) == tuned  # the default model
    assert recommended_settings("Qwen/Qwen3-0.6B") == {}


def test_hf_static_peer_equals_our_plain_loop():
    """generate() with the static cache, as a transformers user picks it for speed, on a tiny model."""
    from engine.config import RunConfig
    from engine.methods.baseline import decode_baseline
    from engine.registry import decoder
    from tests.tiny import make_model

    lm = make_model("qwen3", init_scale=3.0)
    cfg = RunConfig(max_think=12, max_answer=6)
    static = list(decoder("hf-static", lm)("hello world", cfg))[-1]
    plain = list(decode_baseline(lm, "hello world", cfg))[-1]
    # ours picks 11 and forces the marker as the budget's 12th token: the peer forces it too (issue 30)
    assert static.stats.method == "hf-static" and static.reasoning_ids == plain.reasoning_ids
    assert static.answer_ids == plain.answer_ids


def test_random_weights_build_a_presets_architecture_offline():
    import pytest

    from engine.runtime.model import ModelLoadError, random_weights_model

    lm = random_weights_model("deepseek-r1-distill-qwen-1.5b", "cpu", num_hidden_layers=1, hidden_size=48,
                              intermediate_size=96, num_attention_heads=4, num_key_value_heads=2)
    assert type(lm.model).__name__ == "Qwen2ForCausalLM" and lm.model.config.vocab_size == 151936
    assert lm.model.lm_head.weight[len(lm.tokenizer):].abs().sum() == 0  # every id it can pick decodes
    with pytest.raises(ModelLoadError, match="shapes are written in"):
        random_weights_model("tiny-reasoner")
    assert main_exit(["--model", "tiny-reasoner", "--random-weights", "--methods", "baseline"]) == 2


def main_exit(args):
    import tempfile

    from engine.tools import bench

    folder = tempfile.mkdtemp()
    prompts = f"{folder}/p.jsonl"
    Path(prompts).write_text('{"prompt": "hi"}\n')
    return bench.main([*args, "--prompts", prompts, "--out", f"{folder}/out.json"])


def test_bench_compile_flag_reports_the_step_mode(model_dir, prompts, tmp_path, capsys):
    out = tmp_path / "o.json"
    code = bench.main(["--model", str(model_dir), "--methods", "baseline,ssr", "--prompts", str(prompts), "--out",
                       str(out), "--draft-start", "3", "--max-think", "12", "--max-draft", "8", "--max-answer", "10",
                       "--compile", "off"])
    result = json.loads(out.read_text())
    assert code == 0 and result["config"]["compile"] == "off" and result["step_mode"] == "eager: --compile off"
    assert all(r["cache_mb"] > 0 and r["compile_s"] == 0 for r in result["runs"])
    with pytest.raises(SystemExit):
        bench.main(["--model", str(model_dir), "--prompts", str(prompts), "--out", str(out), "--compile", "fast"])
    assert "invalid choice: 'fast'" in capsys.readouterr().err


def test_bench_shows_live_tokens_and_the_model_load_on_stderr(model_dir, prompts, tmp_path, capsys, monkeypatch):
    """Inside a run, stderr says the tokens so far; the engine's load messages are printed; stdout and
    the results are as without them."""
    from engine import wiring

    real = wiring.load_model

    def reporting(name, device=None, progress=None, **kw):
        progress("dequantizing 3 tensors of tiny.gguf (first use)")
        return real(name, device=device, **kw)

    monkeypatch.setattr(wiring, "load_model", reporting)
    out = tmp_path / "r.json"
    assert bench.main(["--model", str(model_dir), "--methods", "baseline,hf", "--prompts", str(prompts), "--out",
                       str(out), "--max-think", "12", "--max-answer", "6", "--warmup", "0"]) == 0
    printed = capsys.readouterr()
    assert "dequantizing 3 tensors of tiny.gguf (first use)" in printed.err
    assert " a r0 baseline: " in printed.err and " tokens so far" in printed.err
    assert "tokens so far" not in printed.out
    runs = json.loads(out.read_text())["runs"]
    assert [r["agreement"] for r in runs if r["method"] == "hf"] == ["identical", "identical"]


def test_live_progress_counts_tokens_and_throttles():
    import io

    from engine.events import PhaseEvent, TokenEvent

    def tok(stream, position, status="generated"):
        return TokenEvent(stream, status, 5, "x", position, 0.0)

    sink = io.StringIO()
    live = bench.LiveProgress(total=4, stream=sink, interval=0.0)
    live.done = 1
    live("a r0 ssr", PhaseEvent("prefill", 0.0))
    for ev in (tok("reasoning", 0), tok("reasoning", 1), tok("draft", 0), tok("answer", 0),
               tok("answer", 0, "accepted")):  # a draft token and a new verdict are no new tokens
        live("a r0 ssr", ev)
    assert live.tokens == 3 and sink.getvalue().splitlines()[-1].endswith("1/4 a r0 ssr: 3 tokens so far")
    live("b r0 ssr", tok("reasoning", 0))
    assert live.tokens == 1  # a new run counts from zero
    throttled = bench.LiveProgress(total=1, stream=io.StringIO(), interval=3600.0)
    for i in range(50):
        throttled("a r0 hf", tok("reasoning", i))
    assert len(throttled.stream.getvalue().splitlines()) == 1 and throttled.tokens == 50
    warming = bench.LiveProgress(stream=io.StringIO(), interval=0.0)  # before the timed runs: no total yet
    warming("a r0 ssr", tok("reasoning", 0))
    assert warming.stream.getvalue().splitlines()[-1] == "warm-up (untimed) a r0 ssr: 1 tokens so far"
