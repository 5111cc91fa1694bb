"""llama.cpp's own server (``llama-server``) on the same file, for the bench's llama.cpp report: what
a token costs when no Python runs between two ``llama_decode`` calls.

llama-cpp-python ships no ``llama-server``; build it from the llama.cpp its wheel vendors (the same
source as the runtime's library), e.g. for llama-cpp-python 0.3.36::

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
    cmake --build build --target llama-server -j 2      # build/bin/llama-server

and pass it as ``bench --llama-server build/bin/llama-server``. The server runs with the runtime's
threads and, by default, llama.cpp's own context defaults (what its users run); with
``same_settings`` the runtime's numerics (a q8_0 KV cache, flash attention, micro-batches of 32:
``engine.llamacpp.lib``), so the same tokens. Each problem is one ``/completion`` request of the
prompt's token ids, greedy, ``cache_prompt`` off (every request computes its prompt, as a run
does), as many tokens as the bench's baseline wrote there (``ignore_eos``: the same count). The
server's own timings split each request into its prompt and its generation, so the report gives
both rates: end to end (tokens over prompt plus generation, as the baseline's tokens/s) and the
generation alone (against the baseline's time after its prefill).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx

from engine.llamacpp import lib


class LlamaServer:
    """``llama-server`` at ``binary`` serving ``lm``'s file on ``lm``'s threads (a context of
    ``cells`` cells, one slot), started here and stopped by :meth:`close`."""

    def __init__(self, binary: str, lm, cells: int = 4096, same_settings: bool = False, timeout_s: float = 120.0) -> None:
        path = Path(binary).expanduser()
        if not path.is_file():
            raise ValueError(f"--llama-server {binary!r} is not a file (build it: engine/llamacpp/server.py says how)")
        with socket.socket() as s:  # a free port on this machine
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        args = [str(path), "-m", lm.native.path, "-t", str(lm.threads), "-tb", str(lm.threads), "-c", str(cells),
                "--parallel", "1", "--host", "127.0.0.1", "--port", str(self.port), "--no-webui"]
        if same_settings:
            args += ["--cache-type-k", lm.kv, "--cache-type-v", lm.kv, "--flash-attn", "on" if lm.flash else "off",
                     "--ubatch-size", str(lib.UBATCH)]
        self.settings = "the runtime's (q8_0 KV, flash attention)" if same_settings else "llama.cpp's defaults"
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:  # ready when /health answers 200 (503 while the model loads)
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}): {self.proc.stderr.read()[-400:]}")
            try:
                if self.client.get("/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"llama-server did not answer /health within {timeout_s:.0f} s")
            time.sleep(0.2)

    def generate(self, prompt_ids: list[int], n: int) -> dict:
        """One greedy completion of exactly ``n`` tokens after ``prompt_ids``: the server's timings
        (``prompt_ms``, ``predicted_ms``, ``predicted_n``, ...) and the request's own ``wall_s``."""
        t0 = time.perf_counter()
        reply = self.client.post("/completion", json={
            "prompt": prompt_ids, "n_predict": n, "temperature": 0.0, "top_k": 1, "top_p": 1.0, "min_p": 0.0,
            "repeat_penalty": 1.0, "cache_prompt": False, "ignore_eos": True, "stream": False})
        wall = time.perf_counter() - t0
        reply.raise_for_status()
        return {**reply.json()["timings"], "wall_s": wall}

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def compare(binary: str, lm, problems, runs: list[dict], max_tokens: int, repeat: int = 1,
            same_settings: bool = False) -> dict:
    """``llama-server`` on each of ``problems`` (as many tokens as the bench's baseline wrote
    there, else ``max_tokens``), ``repeat`` times after one untimed request, beside the baseline
    runs of the same problems: tokens per second end to end and in the generation alone, each side."""
    base = {}
    for r in runs:
        if r["method"] == "baseline":
            base.setdefault(r["prompt_id"], []).append(r)
    todo = [(p.id, lm.prompt_ids(p.prompt), _tokens(base[p.id][0]) if p.id in base else max_tokens) for p in problems]
    server = LlamaServer(binary, lm, cells=max(len(ids) + n for _, ids, n in todo) + 16, same_settings=same_settings)
    try:
        server.generate(todo[0][1], 16)  # warm-up: not a measurement
        timed = [server.generate(ids, n) for _, ids, n in todo for _ in range(repeat)]
    finally:
        server.close()
    tokens = sum(t["predicted_n"] for t in timed)
    out = {"settings": server.settings, "threads": lm.threads, "runs": len(timed),
           "server_tokens_per_s": tokens / (sum(t["prompt_ms"] + t["predicted_ms"] for t in timed) / 1000),
           "server_generation_tokens_per_s": tokens / (sum(t["predicted_ms"] for t in timed) / 1000)}
    ours = [r for rs in base.values() for r in rs]
    if ours:
        made = sum(_tokens(r) for r in ours)
        out["baseline_tokens_per_s"] = made / sum(r["latency_s"] for r in ours)
        out["baseline_generation_tokens_per_s"] = made / sum(r["latency_s"] - r["prefill_s"] for r in ours)
        out["ratio"] = out["baseline_tokens_per_s"] / out["server_tokens_per_s"]
        out["generation_ratio"] = out["baseline_generation_tokens_per_s"] / out["server_generation_tokens_per_s"]
    return out


def _tokens(run: dict) -> int:
    return len(run["reasoning_token_ids"]) + len(run["answer_token_ids"])


def said(result: dict) -> str:
    """The comparison in one line, for the bench's output."""
    line = (f"llama-server (same file, {result['threads']} threads, {result['settings']}): "
            f"{result['server_tokens_per_s']:.1f} tokens/s end to end, {result['server_generation_tokens_per_s']:.1f} "
            "in its generation alone")
    if "ratio" in result:
        line += (f"; baseline on this runtime: {result['baseline_tokens_per_s']:.1f} end to end = {result['ratio']:.2f}x, "
                 f"{result['baseline_generation_tokens_per_s']:.1f} after its prefill = "
                 f"{result['generation_ratio']:.2f}x llama-server's")
    return line
