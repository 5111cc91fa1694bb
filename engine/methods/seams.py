"""What the decode loops need of a model, declared: the seam between the methods and the backends.

* :class:`ModelBackend`: what every loop reads of a model, wherever it runs: its tokenizer and
  markers, the prompt template, the run's setup (``check_fits``, ``begin_run``, ``prepare_steps``)
  and what its stats report. ``engine.runtime.model.LoadedModel`` (in process) and
  ``engine.remote.model.RemoteModel`` (a vLLM server) both provide it.
* :class:`StepModel`: what the in-process loops also need: forwards on caches they own (through
  the runtime's ``CachedModel`` and ``RowBatch``), rollbacks, and the transformers module itself
  for the peers that call its ``generate``. Only ``LoadedModel`` provides it; the remote loops
  (``engine.remote.decode``) stream and verify through their server instead.

The composition root (``engine.registry``) pairs a method with a backend; no method imports one.
``tests/test_architecture.py`` checks both classes against these declarations.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import torch

from engine.runtime.cache import CacheLayout, Checkpoint
from engine.runtime.model import Compiling, ThinkMarkers
from engine.runtime.rope import Rope


@runtime_checkable
class ModelBackend(Protocol):
    tokenizer: Any  # a transformers tokenizer: templates and text
    model_id: str
    markers: ThinkMarkers | None  # the think markers; None: the model does not think
    eos_ids: frozenset[int]
    device: torch.device  # where the loops' tensors live

    @property
    def step_mode(self) -> str:
        """How the current run's steps run, for its stats ("compiled", "eager: <why>", "vllm <url>")."""
        ...

    def prompt_ids(self, user_text: str) -> list[int]:
        """The user message templated, think block opened."""
        ...

    def require_markers(self) -> ThinkMarkers:
        """The think markers, or SSRUnsupportedError saying the model has none."""
        ...

    def check_fits(self, prompt_tokens: int, new_tokens: int) -> None:
        """ValueError before a run that would not fit the model's context."""
        ...

    def begin_run(self, exact: str | bool = False, compile: str = "off") -> None:
        """Set up a run's numerics (exact mode and its route, compiled steps), or refuse them with a reason."""
        ...

    def prepare_steps(self, capacity: int, rows: int = 1, row_width: int = 1) -> Iterator[Compiling]:
        """Make ready, before the run's clock starts, every step shape a run of these sizes can
        meet, yielding progress as it goes (nothing when there is nothing to do)."""
        ...


@runtime_checkable
class StepModel(ModelBackend, Protocol):
    model: torch.nn.Module  # the transformers module, used only through its public forward / generate
    num_parameters: int
    layout: CacheLayout  # which cache kinds the model has (sliding windows, recurrent states)
    rope: Rope  # position-scaled RoPE, if any: where re-encoding or a refusal is needed
    holes_ok: bool  # this run's rows may hold holes (the cache kinds allow them, and so does the exact route)

    def new_cache(self, capacity: int = 256, rows: int = 1, role: str = "") -> Any:
        """A cache for ``capacity`` slots and ``rows`` rows."""
        ...

    def forward(self, input_ids: torch.Tensor, cache: Any, start: int, positions: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, T, V]`` for ``input_ids`` ``[B, T]`` appended to a cache of ``start`` slots."""
        ...

    def step_logits(self, tokens: list[int], cache: Any, start: int) -> torch.Tensor:
        """Logits ``[T, V]`` for one row's ``tokens`` appended to ``cache``."""
        ...

    def rewind(self, cache: Any, ckpt: Checkpoint, kept: list[int]) -> None:
        """Roll ``cache`` back to ``ckpt`` plus the ``kept`` tokens fed since."""
        ...

    def forwards(self) -> Any:
        """A context manager for forwards made outside :meth:`forward` (exact mode's, if on)."""
        ...
