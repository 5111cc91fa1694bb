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

from engine.runtime.model import resolve_model_path
from engine.methods.rsd.prm import STEP_TAG, MathShepherdScorer, _single_token
from engine.remote.client import BackendError, VllmClient


class ServedPRMScorer(MathShepherdScorer):
    name = "math-shepherd on vllm"

    def __init__(self, tokenizer, client: VllmClient, model_id: str) -> None:
        self.tokenizer, self.client, self.model_id = tokenizer, client, model_id
        self.tag = _single_token(tokenizer, STEP_TAG, model_id)
        self.tokens: list[int] = []
        self._started = False
        self.seconds, self.calls = 0.0, 0

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def start(self, question: str) -> None:
        self.tokens = self.tokenizer.encode(question, add_special_tokens=True)
        self._started = False

    def score(self, candidate: str, seq: list[int] | None = None, step_tokens: list[int] | None = None) -> float:
        ids = self.tokens + self._piece(candidate)
        start = time.perf_counter()
        rows = self.client.pool(ids)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        if len(rows) != ids.count(self.tag) or len(rows[-1]) != 1:
            raise BackendError(f"{self.client.base_url} does not score {self.model_id} at its step tags (serve it with "
                               f"STEP pooling at step_tag_id {self.tag} as a two-way classifier; engine/remote/prm.py)")
        return float(rows[-1][0])


def connect_prm(name: str, base_url: str, api_key: str | None = None, served_name: str | None = None,
                transport=None) -> ServedPRMScorer:
    """The PRM ``name`` (its tokenizer, loaded here) on a vLLM server at ``base_url``."""
    from transformers import AutoTokenizer  # noqa: PLC0415

    path, _ = resolve_model_path(name)
    client = VllmClient(base_url, served_name, api_key, transport=transport)
    client.check()
    return ServedPRMScorer(AutoTokenizer.from_pretrained(path), client, name)
