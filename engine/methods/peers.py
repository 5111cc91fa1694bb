"""The peers a user could pick instead: ``transformers`` ``generate()``: plain, prompt-lookup, static.

Methods ``hf`` (greedy or sampled ``generate()`` on the same templated input, with
``max_new_tokens = max_think + max_answer``), ``hf-pld`` (the same with
``prompt_lookup_num_tokens=10``) and ``hf-static`` (the same with the static cache,
``cache_implementation="static"``, which transformers compiles by itself on a GPU: what a
transformers user picks for speed; the bench's warm-up run absorbs that compilation). Their output is split at the end-of-thinking marker into the
reasoning and answer streams; the events are emitted after ``generate()`` returns, each with the
time the token was produced (recorded by a streamer), so latency and time to first answer token
are measured the same way as for our own loops. ``generate()`` does no budget forcing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import torch
from transformers.generation.streamers import BaseStreamer

from engine.config import RunConfig
from engine.events import Event
from engine.methods.recorder import Recorder
from engine.methods.seams import StepModel

PLD_TOKENS = 10


class _Clock(BaseStreamer):
    """Records when each generated token arrives (the first ``put`` is the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.times.extend([time.perf_counter()] * value.numel())

    def end(self) -> None:
        pass


def decode_hf(lm: StepModel, prompt: str, cfg: RunConfig, prompt_lookup: bool = False,
              static: bool = False) -> Iterator[Event]:
    """Yield the events of one ``generate()`` call (``prompt_lookup``: with prompt-lookup decoding;
    ``static``: with the static cache)."""
    prompt_ids = lm.prompt_ids(prompt)
    lm.check_fits(len(prompt_ids), cfg.max_think + cfg.max_answer)
    rec = Recorder(lm.tokenizer, "hf-pld" if prompt_lookup else "hf-static" if static else "hf", len(prompt_ids),
                   lm.device)
    calls = [0]
    hook = lm.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    clock = _Clock()
    kwargs = dict(max_new_tokens=cfg.max_think + cfg.max_answer, eos_token_id=sorted(lm.eos_ids),
                  pad_token_id=lm.tokenizer.pad_token_id or min(lm.eos_ids), streamer=clock)
    if cfg.greedy:
        kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    else:
        torch.manual_seed(cfg.seed)
        kwargs.update(do_sample=True, temperature=cfg.temperature, top_p=cfg.top_p, top_k=0)
    if prompt_lookup:
        kwargs["prompt_lookup_num_tokens"] = PLD_TOKENS
    if static:
        kwargs["cache_implementation"] = "static"
    lm.begin_run("rows" if cfg.exact else False)  # generate() runs the model's own forward: only the per-row route reaches it
    start = time.perf_counter()
    try:
        with torch.inference_mode(), lm.forwards():
            out = lm.model.generate(torch.tensor([prompt_ids], device=lm.device), **kwargs)[0, len(prompt_ids):]
    finally:
        hook.remove()
    wall = time.perf_counter() - start
    rec.t0 = start
    if cfg.exact:
        rec.stats.step_mode = lm.step_mode  # the route it ran on: matched so, like every exact run
    yield rec.phase("prefill")
    generated = [t for t in out.tolist() if t not in lm.eos_ids]
    close = lm.markers.close_id if lm.markers else None
    cut = generated.index(close) + 1 if close in generated else (0 if close is None else len(generated))
    for stream, ids, offset in (("reasoning", generated[:cut], 0), ("answer", generated[cut:], cut)):
        if stream == "answer":
            yield rec.phase("answer")
        for i, tok in enumerate(ids):
            ev = rec.token(stream, tok)
            stamp = clock.times[offset + i] - start if offset + i < len(clock.times) else ev.t
            if stream == "answer" and i == 0:
                rec.stats.ttft_s = stamp
            yield replace(ev, t=stamp)
    rec.forward(calls[0])
    yield rec.phase("done")
    stamps = [t - start for t in clock.times] or [wall]
    s = rec.stats
    s.prefill_s = stamps[0]
    s.reasoning_s = stamps[max(cut - 1, 0)] - stamps[0] if cut else 0.0
    s.answer_s = wall - (stamps[cut - 1] if cut else stamps[0])
    yield rec.done(wall_s=wall)
