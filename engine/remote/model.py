"""A model served by vLLM, seen from here: its tokenizer (loaded locally, for templates and text)
and a client for the server. It offers what the decode loops read of a model (``prompt_ids``,
``markers``, ``eos_ids``, ``tokenizer``, ``model_id``) but no forward: the remote loops
(``engine.remote.decode``) stream and verify through the client."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from engine.remote.client import VllmClient
from engine.runtime.model import (
    Compiling,
    ModelLoadError,
    ThinkMarkers,
    chat_prompt_ids,
    find_markers,
    require_markers,
    resolve_model_path,
)
from engine.steps import VLLM


class RemoteModel:
    device = torch.device("cpu")  # where the loops' small tensors live (the weights are on the server)
    dtype = "as served"  # the server's precision (its --dtype)

    def __init__(self, client: VllmClient, tokenizer, model_id: str, markers: ThinkMarkers | None,
                 eos_ids: frozenset[int] | None = None, speculation: str | None = None) -> None:
        self.client, self.tokenizer, self.model_id, self.markers = client, tokenizer, model_id, markers
        # the server's own speculative method as its operator declared it ("suffix"; None: it does not
        # speculate), which vLLM's API does not expose: SSR then lets the server verify (engine.remote.served)
        self.speculation = speculation
        eos = tokenizer.eos_token_id
        self.eos_ids = eos_ids if eos_ids is not None else frozenset({int(eos)} if eos is not None else set())

    @property
    def backend(self) -> str:
        return f"{VLLM} {self.client.base_url}"

    step_mode = backend  # what a run's stats say its steps ran on

    def begin_run(self, exact: str | bool = False, compile: str = "off") -> None:
        if exact:
            raise ValueError("exact mode runs in process only: a vLLM server has its own kernels")

    def check_fits(self, prompt_tokens: int, new_tokens: int) -> None:
        """The server checks its own context length (``--max-model-len``) and says so."""

    def prepare_steps(self, capacity: int, rows: int = 1, row_width: int = 1) -> Iterator[Compiling]:
        """Nothing to prepare: the server runs its own kernels."""
        return iter(())

    def prompt_ids(self, user_text: str, thinking: bool = True) -> list[int]:
        return chat_prompt_ids(self.tokenizer, self.markers, user_text, thinking, self.model_id)

    def require_markers(self) -> ThinkMarkers:
        return require_markers(self.markers, self.model_id)


def check_backend(backend: str | None, base_url: str | None) -> None:
    """``--backend vllm`` needs a server's URL; a URL means the vLLM backend (ValueError otherwise)."""
    if backend == "vllm" and not base_url:
        raise ValueError("--backend vllm needs --base-url (the vLLM server's URL, e.g. http://gpu-host:8000)")
    if backend == "transformers" and base_url:
        raise ValueError("--base-url runs the model on a vLLM server: drop it, or use --backend vllm")


def connect(name: str, base_url: str, api_key: str | None = None, served_name: str | None = None,
            timeout: float = 120.0, transport=None, speculation: str | None = None) -> RemoteModel:
    """A model on a vLLM server at ``base_url``; ``name`` (a bundled name, preset, local folder or
    Hub id) gives the tokenizer, ``served_name`` the server's name for it (default: what the server
    serves, if one model). Checks the server before anything runs."""
    from transformers import AutoTokenizer

    path, preset = resolve_model_path(name)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not load the tokenizer of {path!r}: {str(err).splitlines()[0]}") from None
    client = VllmClient(base_url, served_name, api_key, timeout, transport)
    client.check()
    return RemoteModel(client, tokenizer, name, find_markers(tokenizer, preset), speculation=speculation or None)
