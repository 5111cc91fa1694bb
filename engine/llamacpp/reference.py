"""llama.cpp's own generation on the same file, for the bench's comparison: llama-cpp-python's
``Llama.create_completion`` (its own decode loop and sampler), greedy, on the same threads and
load settings as the runtime (extra buffer types as ``engine.llamacpp.lib`` sets them), with
llama.cpp's own context defaults (an f16 KV cache, no flash attention: what its users run), or
with the runtime's (``same_settings``: the same numerics, so the same tokens).

>>> own = OwnGeneration(lm)               # a second load of lm's file, by llama-cpp-python's Llama
>>> count, seconds = own.generate(prompt_ids, max_tokens=224)
"""

from __future__ import annotations

import contextlib
import os
import time

from engine.llamacpp import lib


class OwnGeneration:
    def __init__(self, lm, cells: int = 4096, same_settings: bool = False) -> None:
        lib.api()
        import llama_cpp.llama_cpp as low
        from llama_cpp import Llama

        kwargs = dict(type_k=lib.KV_TYPES[lm.kv], type_v=lib.KV_TYPES[lm.kv], flash_attn=lm.flash,
                      n_ubatch=lib.UBATCH) if same_settings else {}
        with _load_settings(low):
            self.llm = Llama(model_path=lm.native.path, n_ctx=cells, n_threads=lm.threads, n_threads_batch=lm.threads,
                             verbose=False, **kwargs)
        self.eos_ids = lm.eos_ids

    def tokens(self, prompt_ids: list[int], max_tokens: int) -> list[int]:
        """The greedy token ids llama.cpp's own loop writes after ``prompt_ids`` (``Llama.generate``)."""
        self.llm.reset()
        out = []
        for t in self.llm.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0, reset=True):
            if t in self.eos_ids or len(out) == max_tokens:
                break
            out.append(t)
        return out

    def generate(self, prompt_ids: list[int], max_tokens: int) -> tuple[int, float]:
        """How many greedy tokens ``create_completion`` wrote after ``prompt_ids`` (at most
        ``max_tokens``, stopping at an end of sequence) and the seconds it took, its prefill included; its prompt
        cache is emptied first, so every call computes the whole prompt as a run does."""
        self.llm.reset()  # its next eval removes every cell from position 0 on
        t0 = time.perf_counter()
        out = self.llm.create_completion(prompt_ids, max_tokens=max_tokens, temperature=0.0, top_k=1, top_p=1.0,
                                         min_p=0.0, repeat_penalty=1.0, logprobs=None)
        seconds = time.perf_counter() - t0
        return out["usage"]["completion_tokens"], seconds

    def close(self) -> None:
        self.llm.close()


@contextlib.contextmanager
def _load_settings(L):
    """Llama() takes no extra-buffer-types argument: it reads its model params from the low-level
    module's ``llama_model_default_params``, set here for the load."""
    defaults = L.llama_model_default_params

    def params():
        p = defaults()
        p.use_extra_bufts = os.environ.get("SSR_LLAMA_EXTRA_BUFTS") == "1"
        return p

    L.llama_model_default_params = params
    try:
        yield
    finally:
        L.llama_model_default_params = defaults


def compare(lm, problems, runs: list[dict], max_tokens: int, repeat: int = 1) -> dict:
    """llama.cpp's own generation on each of ``problems`` (as many tokens as the bench's baseline
    wrote there, else ``max_tokens``), ``repeat`` times after one untimed call, beside the
    baseline runs of the same problems: tokens per second of each (tokens over seconds, all
    problems together) and per problem the ratio baseline / own."""
    wrote = {}
    for r in runs:
        if r["method"] == "baseline":
            wrote.setdefault(r["prompt_id"], []).append(r)
    todo = []  # (problem id, prompt ids, tokens to write)
    for p in problems:
        base = wrote.get(p.id, [])
        todo.append((p.id, lm.prompt_ids(p.prompt),
                     len(base[0]["reasoning_token_ids"]) + len(base[0]["answer_token_ids"]) if base else max_tokens))
    own = OwnGeneration(lm, cells=max(len(ids) + n for _, ids, n in todo) + 16)
    try:
        own.generate(todo[0][1], 16)  # warm-up: not a measurement
        rows = []
        for pid, ids, n in todo:
            for _ in range(repeat):
                count, seconds = own.generate(ids, n)
                rows.append((pid, count, seconds))
    finally:
        own.close()
    own_rate = sum(n for _, n, _ in rows) / sum(s for _, _, s in rows)
    out = {"own_tokens_per_s": own_rate, "threads": lm.threads, "file": lm.native.path, "runs": len(rows)}
    base_runs = [r for rs in wrote.values() for r in rs]
    if base_runs:
        base_rate = sum(len(r["reasoning_token_ids"]) + len(r["answer_token_ids"]) for r in base_runs) / \
            sum(r["latency_s"] for r in base_runs)
        per = sorted((r["tokens_per_s"] / (n / s)) for r in base_runs for pid, n, s in rows if pid == r["prompt_id"])
        out.update(baseline_tokens_per_s=base_rate, ratio=base_rate / own_rate,
                   ratio_iqr=(per[len(per) // 4], per[(3 * len(per)) // 4]) if per else None)
    return out


def said(result: dict) -> str:
    """The comparison in one line, for the bench's output."""
    line = (f"llama.cpp's own generation (create_completion, same file, {result['threads']} threads): "
            f"{result['own_tokens_per_s']:.1f} tokens/s")
    if "ratio" in result:
        lo, hi = result["ratio_iqr"] or (None, None)
        line += (f"; baseline on this runtime: {result['baseline_tokens_per_s']:.1f} tokens/s = {result['ratio']:.2f}x "
                 f"llama.cpp's own" + (f" (per problem IQR {lo:.2f}-{hi:.2f})" if lo is not None else ""))
    return line
