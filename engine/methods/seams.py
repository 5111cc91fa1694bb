"""What the decode loops need of a model, declared: the seam between the methods and the backends.

* :class:`ModelBackend`: what every loop reads of a model, wherever it runs: its tokenizer and
  markers, the prompt template, the run's setup (``check_fits``, ``begin_run``, ``prepare_steps``)
  and what its stats report. ``engine.runtime.model.LoadedModel`` and
  ``engine.llamacpp.model.LlamaModel`` (in process) and ``engine.remote.model.RemoteModel`` (a vLLM
  server) provide it.
* :class:`StepModel`: what the in-process loops also need: forwards on caches they own (through
  the runtime's ``CachedModel`` and the model's row batches), rollbacks, and the transformers
  module itself for the peers that call its ``generate``. ``LoadedModel`` (torch) and
  ``engine.llamacpp.model.LlamaModel`` (llama.cpp; no transformers module: the peers are refused
  there) provide it; the remote loops (``engine.remote.decode``) stream and verify through their
  server instead.

:func:`check_pair`: a draft model and its target share one tokenizer.

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

    def prompt_ids(self, user_text: str, thinking: bool = True) -> list[int]:
        """The user message templated, think block opened; ``thinking`` False: templated for an answer
        alone (ValueError where the model always reasons: ``engine.runtime.markers.chat_prompt_ids``)."""
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


def check_pair(target: ModelBackend, draft: ModelBackend) -> None:
    """A draft model's proposals are the target's tokens only where the two share a tokenizer: same
    vocabulary, same ids (ValueError naming both otherwise). Every method with a draft model checks it
    before its first forward (sd, RSD, hf-assisted), and so do the studio and the bench when they pair them."""
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ValueError(f"draft model {draft.model_id} and target model {target.model_id} do not share a "
                         "tokenizer: a draft model's proposals need identical vocabularies")


@runtime_checkable
class Rows(Protocol):
    """The rows of one batch in one cache: the seam every in-process runtime gives SSR's loop
    (``StepModel.row_batch``: ``engine.runtime.batch.RowBatch`` on transformers, ``engine.llamacpp.rows.SeqRows``
    on llama.cpp; the architecture test checks both against it). Row 0 is the row the others fork from.
    A step is :meth:`forward` then :meth:`keep`; :meth:`fork` adds a copy of row 0, :meth:`select` keeps
    some rows."""

    positions: list[int]  # per row: the tokens it holds (its next position)
    last_tokens: int  # tokens the last forward computed (padding and any re-encode included)

    @property
    def rows(self) -> int:
        """How many rows the batch has."""
        ...

    def fork(self) -> None:
        """Append a row that sees what row 0 sees."""
        ...

    def limits(self, owed: int) -> list[int] | None:
        """Per row, the most tokens it may be fed this step (None: no limit), ``owed`` already owed by row 0."""
        ...

    def forward(self, feeds: list[list[int]]) -> torch.Tensor:
        """Logits ``[rows, width, V]`` for each row's feed (padded to the widest)."""
        ...

    def keep(self, kept: list[int]) -> None:
        """How many of its fed tokens each row keeps (the rest are rolled back or hidden)."""
        ...

    def select(self, keep: list[int]) -> None:
        """Keep the rows ``keep`` (in that order); a lone row left goes on as a plain one-row cache."""
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

    learned_positions: bool  # positions are learned and bounded: a cache whose forks share the prefix must fit them
    forks_stay: bool  # a departed row's slots stay in the cache until the run ends (a shared cache holds every draft's)

    def step_logits(self, tokens: list[int], cache: Any, start: int, last_only: bool = False) -> torch.Tensor:
        """Logits ``[T, V]`` for one row's ``tokens`` appended to ``cache`` (``[1, V]`` with ``last_only``)."""
        ...

    def row_batch(self, cache: Any, length: int, ids: list[int] | None = None, shared: bool = False) -> Rows:
        """The rows of ``cache``, one row holding ``length`` tokens (``ids``): :class:`Rows`; ``shared``: forks
        share the prefix."""
        ...

    def unshared(self) -> str | None:
        """Why a run's drafts must each copy the prefix instead of sharing it (None: they can share it)."""
        ...

    def rewind(self, cache: Any, ckpt: Checkpoint, kept: list[int]) -> None:
        """Roll ``cache`` back to ``ckpt`` plus the ``kept`` tokens fed since."""
        ...

    def forwards(self) -> Any:
        """A context manager for forwards made outside :meth:`forward` (exact mode's, if on)."""
        ...
