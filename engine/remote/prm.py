"""A math-shepherd-format PRM on a vLLM server: the same input as in process (``engine.methods.rsd.prm``), the
score at each step tag computed by the server's STEP pooling. Serve it as a two-way classifier
read from the LM head's "-" and "+" rows (p(+) = softmax over the two), pooled at the step tag:

    vllm serve PRM --runner pooling --convert classify \\
        --hf-overrides '{"classifier_from_token": ["-", "+"], "method": "from_2_way_softmax"}' \\
        --pooler-config '{"task": "token_classify", "tok_pooling_type": "STEP", "step_tag_id": TAG_ID}'

(TAG_ID: the id of the step tag "ки" in the PRM's tokenizer; the error below names it.)
"""

from __future__ import annotations

import time

from engine.methods.rsd.prm import MathShepherdFormat
from engine.remote.client import BackendError, VllmClient
from engine.runtime.model import resolve_model_path


class ServedPRMScorer:
    """``engine.methods.rsd.prm.StepScorer`` over a served math-shepherd PRM: the input is built as
    in process (:class:`MathShepherdFormat`); the server scores every step tag of it in one pooling
    request. No cache here: each request carries the whole input (the server's prefix cache shares it)."""

    name = "math-shepherd on vllm"

    def __init__(self, tokenizer, client: VllmClient, model_id: str) -> None:
        self.format = MathShepherdFormat(tokenizer, model_id)
        self.client, self.model_id = client, model_id
        self.seconds, self.calls = 0.0, 0

    def start(self, question: str) -> None:
        self.format.start(question)

    def score(self, candidate: str, seq: list[int] | None = None, step_tokens: list[int] | None = None) -> float:
        return self._pool(self.format.tokens + self.format.piece(candidate))[-1]  # the candidate's tag is the last

    def commit(self, step: str) -> None:
        self.format.commit(step)

    def score_all(self, question: str, steps: list[str]) -> list[float]:
        """Every step's score from one pooling request over the whole input (evaluation)."""
        self.start(question)
        for step in steps:
            self.commit(step)
        return self._pool(self.format.tokens)

    def _pool(self, ids: list[int]) -> list[float]:
        """p(+) at each step tag of ``ids``, in order."""
        start = time.perf_counter()
        rows = self.client.pool(ids)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        if len(rows) != ids.count(self.format.tag) or any(len(row) != 1 for row in rows):
            raise BackendError(f"{self.client.base_url} does not score {self.model_id} at its step tags (serve it with "
                               f"STEP pooling at step_tag_id {self.format.tag} as a two-way classifier; "
                               "engine/remote/prm.py)")
        return [float(row[0]) for row in rows]


def connect_prm(name: str, base_url: str, api_key: str | None = None, served_name: str | None = None,
                transport=None) -> ServedPRMScorer:
    """The PRM ``name`` (its tokenizer, loaded here) on a vLLM server at ``base_url``."""
    from transformers import AutoTokenizer

    path, _ = resolve_model_path(name)
    client = VllmClient(base_url, served_name, api_key, transport=transport)
    client.check()
    return ServedPRMScorer(AutoTokenizer.from_pretrained(path), client, name)
