"""A vLLM server over HTTP: the few calls SSR and plain decoding need, with clear errors.

* :meth:`VllmClient.stream`: ``POST /v1/completions`` with a token-id prompt, ``stream: true`` and
  ``return_token_ids: true``; yields the generated ids as they arrive (a server-side
  ``stop_token_ids`` ends it; closing the generator aborts the request).
* :meth:`VllmClient.verify`: one request whose prompt is a prefix and candidate tokens, with
  ``prompt_logprobs: 1`` and ``max_tokens: 1``; the ``rank == 1`` entry at each candidate's
  position is the greedy token there, and the generated token is the greedy token after the last.
  vLLM does not read its prefix cache for a request with ``prompt_logprobs``, so a verify
  re-prefills its whole prompt on the server (plain requests do reuse the cache).
* :meth:`VllmClient.pool`: ``POST /pooling`` with ``task: token_classify``: a PRM's score at each
  step tag.
* :meth:`VllmClient.check`: ``GET /v1/models`` names the served model, or the error says what is
  served.

Every failure (server down, wrong model, a server without ``prompt_logprobs`` or token ids, a
timeout, a stream cut mid-run, an HTTP error) raises :class:`BackendError` with the URL and the
reason, never a bare traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx


class BackendError(RuntimeError):
    """A serving backend failed; the message names the server and says why."""


class VllmClient:
    def __init__(self, base_url: str, model: str | None = None, api_key: str | None = None, timeout: float = 120.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.base_url = self.base_url.removesuffix("/v1")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout, transport=transport)
        self.model = model

    def __repr__(self) -> str:
        return f"vllm {self.base_url} ({self.model})"

    # ------------------------------------------------------------------ calls
    def check(self) -> str:
        """The served model's name (``model`` if given and served); BackendError otherwise."""
        served = [m["id"] for m in self._json("GET", "/v1/models").get("data", [])]
        if not served:
            raise BackendError(f"{self.base_url} serves no model")
        if self.model is None:
            self.model = served[0]
        elif self.model not in served:
            raise BackendError(f"{self.base_url} does not serve {self.model!r} (it serves {', '.join(served)})")
        return self.model

    def stream(self, prompt: list[int], max_tokens: int, stop_ids: frozenset[int] | set[int] = frozenset(),
               temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None,
               logprobs: bool = False, metrics: dict | None = None, chunks: list | None = None) -> Iterator:
        """The tokens the server generates after ``prompt``, one at a time, up to ``max_tokens``;
        a token in ``stop_ids`` ends the stream and is yielded last. With ``logprobs``, pairs
        ``(token, its log-probability)`` (the model's own, before temperature). With ``metrics``
        (a dict), the request asks for its usage chunk, and the per-request metrics the server sends
        there (``speculative_decoding``, with ``--per-request-spec-decode-metrics``) fill it. With
        ``chunks`` (a list), the number of tokens in each streamed chunk is appended to it: one
        engine step's output, so a speculating server's chunk of k tokens accepted k - 1."""
        body = {"model": self.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature,
                "top_p": top_p, "stream": True, "return_token_ids": True, "skip_special_tokens": False,
                "stop_token_ids": sorted(stop_ids), "ignore_eos": False}
        if metrics is not None:
            body["stream_options"] = {"include_usage": True}
        if seed is not None:
            body["seed"] = seed
        if logprobs:
            body["logprobs"] = 1
        finished = False
        try:
            with self.http.stream("POST", "/v1/completions", json=body) as response:
                self._raise_for(response, read=True)
                for line in response.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        finished = True
                        break
                    doc = json.loads(data)
                    if metrics is not None and isinstance(doc.get("metrics"), dict):
                        metrics.update(doc["metrics"])
                    if metrics is not None and not doc.get("choices"):  # the usage chunk: no tokens
                        continue
                    choice = self._choice(doc)
                    ids = choice.get("token_ids")
                    if ids is None:
                        raise BackendError(f"{self.base_url} returned no token ids (return_token_ids needs vLLM "
                                           ">= 0.10.2)")
                    if chunks is not None and ids:
                        chunks.append(len(ids))
                    if logprobs:
                        yield from zip(ids, (choice.get("logprobs") or {}).get("token_logprobs") or [], strict=False)
                    else:
                        yield from ids
                    if choice.get("finish_reason") is not None:
                        finished = True
        except httpx.HTTPError as err:
            raise BackendError(self._why(err)) from None
        if not finished:
            raise BackendError(f"{self.base_url} cut the stream before it finished")

    def verify(self, prefix: list[int], candidate: list[int]) -> list[int]:
        """The server's greedy token at each candidate position and one after: ``[k + 1]`` ids."""
        body = {"model": self.model, "prompt": prefix + candidate, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 1, "return_token_ids": True, "skip_special_tokens": False}
        choice = self._choice(self._json("POST", "/v1/completions", json=body))
        rows = choice.get("prompt_logprobs")
        if rows is None:
            raise BackendError(f"{self.base_url} returned no prompt_logprobs (a vLLM server is needed, with "
                               "--max-logprobs >= 1)")
        picks = []
        # the row at position len(prefix) + j scores candidate j given everything before it; the
        # greedy token there is the entry of rank 1
        for j in range(len(candidate)):
            row = rows[len(prefix) + j] or {}
            best = next((int(t) for t, e in row.items() if e.get("rank") == 1), None)
            if best is None:
                raise BackendError(f"{self.base_url} returned a prompt_logprobs row without a rank-1 entry")
            picks.append(best)
        out = choice.get("token_ids")
        if not out:
            raise BackendError(f"{self.base_url} returned no generated token id")
        return [*picks, int(out[0])]

    def token_logprobs(self, prefix: list[int], tokens: list[int]) -> list[float]:
        """The server's log-probability of each of ``tokens`` after ``prefix`` and those before it."""
        body = {"model": self.model, "prompt": prefix + tokens, "max_tokens": 1, "temperature": 0.0,
                "prompt_logprobs": 1, "return_token_ids": True}
        rows = self._choice(self._json("POST", "/v1/completions", json=body)).get("prompt_logprobs")
        if rows is None:
            raise BackendError(f"{self.base_url} returned no prompt_logprobs (a vLLM server is needed)")
        return [float(rows[len(prefix) + j][str(t)]["logprob"]) for j, t in enumerate(tokens)]

    def pool(self, ids: list[int]) -> list[list[float]]:
        """``POST /pooling`` (``token_classify``): one row of scores per pooled position (for a
        PRM served with STEP pooling, one per step tag)."""
        doc = self._json("POST", "/pooling", json={"model": self.model, "input": ids, "task": "token_classify"})
        try:
            return [list(row) for row in doc["data"][0]["data"]]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{self.base_url}/pooling answered without pooled rows") from None

    # ------------------------------------------------------------------ plumbing
    def _json(self, method: str, path: str, **kwargs) -> dict:
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as err:
            raise BackendError(self._why(err)) from None
        self._raise_for(response)
        try:
            return response.json()
        except ValueError:
            raise BackendError(f"{self.base_url}{path} did not answer with JSON") from None

    def _raise_for(self, response: httpx.Response, read: bool = False) -> None:
        if response.status_code < 400:
            return
        if read:
            response.read()
        try:
            detail = response.json().get("error", {})
            message = detail.get("message") if isinstance(detail, dict) else str(detail)
        except ValueError:
            message = response.text[:200]
        raise BackendError(f"{self.base_url} answered HTTP {response.status_code}: {message}")

    def _choice(self, doc: dict) -> dict:
        choices = doc.get("choices") or []
        if not choices:
            raise BackendError(f"{self.base_url} answered without choices")
        return choices[0]

    def _why(self, err: httpx.HTTPError) -> str:
        if isinstance(err, httpx.TimeoutException):
            return f"{self.base_url} timed out ({type(err).__name__})"
        if isinstance(err, httpx.ConnectError):
            return f"cannot reach {self.base_url}: is the vLLM server running? ({err})"
        return f"{self.base_url}: {type(err).__name__}: {err}"
