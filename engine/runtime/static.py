"""The preallocated ("static") KV cache every decode loop runs on.

Each attention layer keeps its keys and values in one buffer ``[rows, heads, capacity, dim]``
allocated once per run and sized from the run's budgets (prompt + every token the run may add), not
from the model's context length. A forward writes its slots in place; nothing is concatenated.
The operations the decode loops need become cheap:

* **rollback**: move a length (no copy);
* **fork** (a draft row): copy the used prefix of one row into a spare row of the same buffer;
* **drop rows**: copy the kept rows' used prefixes down; the buffer stays where it is;
* **holes** (slots a row rejected): hidden by the attention mask, as with any cache.

Two ways to read it, one buffer:

* **eager** (``fixed=False``): attention reads the used prefix (a view), so a step costs what its
  tokens cost; shapes change every step, which is fine without a compiler.
* **fixed** (``fixed=True``): attention reads the whole ``capacity`` and the mask hides what is not
  there yet, and the write position is a device tensor, so every step of one ``(rows, width)``
  has the same shapes and addresses: what ``torch.compile`` and CUDA graphs need
  (``engine.runtime.compiled``).

Sliding-window layers keep their full K/V for the run and the model's mask does the windowing (a
rollback past the window stays a move of the length); recurrent states (linear attention, state
space) live beside the buffers unchanged, with their checkpoints (``engine.runtime.cache``).
Layers of kinds this module does not know stay transformers' dynamic layers. The buffers are
made inside forwards (inference mode), so every in-place change outside one runs in inference mode.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import (
    Cache,
    CacheLayerMixin,
    DynamicCache,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndSlidingWindowAttentionLayer,
    LinearAttentionLayer,
)


class Cursor:
    """The slots in use, as a device tensor that every slot layer of one fixed cache reads (so a
    step or a rollback moves it with one kernel, not one per layer)."""

    tensor: torch.Tensor | None = None


class SlotLayer(CacheLayerMixin):
    """One attention layer's K/V in a preallocated buffer; ``length`` slots in use in every row."""

    is_sliding = False
    is_croppable = True

    def __init__(self, capacity: int, rows: int = 1, fixed: bool = False, cursor: Cursor | None = None) -> None:
        super().__init__()
        self.capacity, self.rows_capacity, self.fixed = capacity, rows, fixed
        self.length = 0  # slots in use (the host's count; for fixed steps the cursor is the device's)
        self.rows = 1  # rows in use
        self.cursor = cursor or Cursor()

    @property
    def is_compileable(self) -> bool:
        return self.fixed

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.rows = max(key_states.shape[0], 1)
        rows = max(self.rows_capacity, self.rows)
        self._k = key_states.new_zeros(rows, key_states.shape[1], self.capacity, key_states.shape[-1])
        self._v = value_states.new_zeros(rows, value_states.shape[1], self.capacity, value_states.shape[-1])
        if self.fixed:  # compiled steps and CUDA graphs read these in place, never copy them
            if self.cursor.tensor is None:
                self.cursor.tensor = torch.tensor(self.length, device=self.device)
                torch._dynamo.mark_static_address(self.cursor.tensor)
            for buf in (self._k, self._v):
                torch._dynamo.mark_static_address(buf)
                # one compiled step serves every capacity: a run whose budgets need a larger cache meets no new
                # graph (the capacity is read from the buffer's shape, :meth:`get_mask_sizes`)
                torch._dynamo.mark_dynamic(buf, 2)
        self.is_initialized = True

    # ---------------------------------------------------------------- what attention sees
    @property
    def keys(self) -> torch.Tensor | None:
        """What the layer holds, for models that read it directly (Dory's loops read the last loop's
        K/V): the used slots when eager, the whole buffer when fixed (the mask hides the rest)."""
        return self._held(self._k) if self.is_initialized else None

    @keys.setter
    def keys(self, value) -> None:  # CacheLayerMixin.__init__ sets None
        assert value is None, "slot layers own their buffers"

    @property
    def values(self) -> torch.Tensor | None:
        return self._held(self._v) if self.is_initialized else None

    def _held(self, buf: torch.Tensor) -> torch.Tensor:
        return buf[: self.rows] if self.fixed else buf[: self.rows, :, : self.length]

    @values.setter
    def values(self, value) -> None:
        assert value is None, "slot layers own their buffers"

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        t = key_states.shape[-2]
        if self.fixed:  # shapes and addresses fixed: the position is a device tensor (moved after the step)
            at = self.cursor.tensor + torch.arange(t, device=self.device)
            self._k[: self.rows].index_copy_(2, at, key_states)
            self._v[: self.rows].index_copy_(2, at, value_states)
            return self._k[: self.rows], self._v[: self.rows]
        end = self.length + t
        if end > self.capacity:
            self._grow(end)
        self._k[: self.rows, :, self.length : end] = key_states
        self._v[: self.rows, :, self.length : end] = value_states
        self.length = end
        return self._k[: self.rows, :, :end], self._v[: self.rows, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        if self.fixed:  # the buffer's size, not the int: a compiled step keeps it symbolic (one graph, any capacity)
            return (self._k.shape[2] if self.is_initialized else self.capacity, 0)
        return (self.length + query_length, 0)

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.capacity

    # ---------------------------------------------------------------- what the decode loops do
    def crop(self, tokens_to_remove: int) -> None:
        """transformers' API (the host's count; a fixed cache's cursor moves with :meth:`SlotCache.crop`)."""
        assert tokens_to_remove <= 0, "crop by a negative number of slots"
        self.length += tokens_to_remove

    @torch.inference_mode()
    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Rows ``beam_idx`` (a row may repeat: a fork), in this order; only rows that change are
        copied, and only their used prefix."""
        rows = [int(r) for r in beam_idx]
        if not self.is_initialized:
            self.rows = len(rows)
            self.rows_capacity = max(self.rows_capacity, self.rows)
            return
        if len(rows) > self._k.shape[0]:
            self._k, self._v = (torch.cat([b, b.new_zeros(len(rows) - b.shape[0], *b.shape[1:])]) for b in (self._k, self._v))
        moved = [(i, r) for i, r in enumerate(rows) if i != r]
        if moved and self.length:
            dst = torch.tensor([i for i, _ in moved], device=self.device)
            src = torch.tensor([r for _, r in moved], device=self.device)
            for buf in (self._k, self._v):
                buf[:, :, : self.length].index_copy_(0, dst, buf[:, :, : self.length].index_select(0, src))
        self.rows = len(rows)

    @torch.inference_mode()
    def compact(self, keep: torch.Tensor) -> None:
        """One row keeps only the slots ``keep`` (its holes go), packed at the start."""
        for buf in (self._k, self._v):
            buf[:1, :, : len(keep)] = buf[:1].index_select(2, keep)
        self.length = len(keep)

    def _grow(self, need: int) -> None:
        """More slots than the run's budgets said (a caller without budgets): double, copy once."""
        self.reserve(max(need, 2 * self.capacity))

    @torch.inference_mode()
    def reserve(self, capacity: int) -> None:
        """Room for at least ``capacity`` slots (the used ones copied once into a larger buffer)."""
        assert not self.fixed, "a fixed cache's shape is its compiled step's"
        if capacity <= self.capacity:
            return
        if not self.is_initialized:
            self.capacity = capacity
            return
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:2], capacity, old.shape[-1])
            new[:, :, : self.length] = old[:, :, : self.length]
            setattr(self, name, new)
        self.capacity = capacity

    @property
    def nbytes(self) -> int:
        return 2 * self._k.numel() * self._k.element_size() if self.is_initialized else 0


class LinearSlotLayer(LinearAttentionLayer, SlotLayer):
    """A hybrid layer: recurrent states (kept as transformers keeps them) and attention slots."""

    def __init__(self, capacity: int, rows: int = 1, fixed: bool = False, cursor: Cursor | None = None,
                 number_of_states: int = 1) -> None:
        SlotLayer.__init__(self, capacity, rows, fixed, cursor)
        LinearAttentionLayer.__init__(self, number_of_states=number_of_states)

    def lazy_initialization(self, *args, **kwargs) -> None:
        if len(args) == 2 and not kwargs:
            SlotLayer.lazy_initialization(self, *args)
        else:
            LinearAttentionLayer.lazy_initialization(self, **kwargs)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        LinearAttentionLayer.reorder_cache(self, beam_idx)
        SlotLayer.reorder_cache(self, beam_idx)

    def crop(self, tokens_to_remove: int) -> None:
        SlotLayer.crop(self, tokens_to_remove)

    def get_seq_length(self) -> int:
        # the slots (transformers >= 5.25 gives linear layers a token counter of their own, first in this MRO)
        return SlotLayer.get_seq_length(self)


def _set_linear_count(layer, length: int) -> None:
    """A linear layer's own token counter (transformers >= 5.25's ``cumulative_length_linear``, a
    device tensor its forwards add to) set to ``length``: a rollback moves it with the slots, as it
    moves the length of every attention layer. Nothing where the layer keeps no counter (5.24)."""
    counter = getattr(layer, "cumulative_length_linear", None)
    if isinstance(counter, torch.Tensor):
        counter.fill_(length)


class SlotCache(Cache):
    """A model's cache with every attention layer a :class:`SlotLayer`."""

    def __init__(self, config, capacity: int, rows: int = 1, fixed: bool = False) -> None:
        self.cursor = Cursor()
        super().__init__(layers=[_slot(layer, capacity, rows, fixed, self.cursor)
                                 for layer in DynamicCache(config=config).layers])
        self.capacity, self.fixed = capacity, fixed
        self._rows = rows
        # a cache with no attention layer at all (Mamba) has no layer that counts tokens: it does here
        self.counts_tokens = not any(isinstance(layer, CacheLayerMixin) for layer in self.layers)
        self.fed = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """The slots in use: every attention layer holds the same number. A recurrent layer's index
        reads the first attention layer (as transformers 5.24 did; 5.25 reads that layer's own token
        counter, which a rollback here keeps equal but which is the layer's, not the cache's)."""
        if self.counts_tokens:
            return self.fed
        if layer_idx < len(self.layers) and not isinstance(self.layers[layer_idx], CacheLayerMixin):
            layer_idx = next(i for i, layer in enumerate(self.layers) if isinstance(layer, CacheLayerMixin))
        return super().get_seq_length(layer_idx)

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        """Without any attention layer (every layer recurrent: a mask only the model's bookkeeping
        reads), the tokens fed; transformers' own raises there."""
        return (self.fed + query_length, 0) if self.counts_tokens else super().get_mask_sizes(query_length, layer_idx)

    @property
    def rows_capacity(self) -> int:
        """Rows the buffers hold: part of a compiled step's shape (dynamo's guards see it)."""
        return max((layer.rows_capacity for layer in self.slot_layers), default=self._rows)

    @property
    def slot_layers(self) -> list[SlotLayer]:
        return [layer for layer in self.layers if isinstance(layer, SlotLayer)]

    def get_query_offset(self, layer_idx: int = 0):
        """Where this forward's queries sit: a device tensor for fixed steps (no recompiles)."""
        return self.cursor.tensor if self.fixed and self.cursor.tensor is not None else super().get_query_offset(layer_idx)

    @torch.inference_mode()
    def set_length(self, length: int) -> None:
        """Every slot layer holds ``length`` slots (a rollback: nothing moves but the count)."""
        for layer in self.slot_layers:
            layer.length = length
        for layer in self.layers:
            _set_linear_count(layer, length)
        self.fed = length
        if self.cursor.tensor is not None:
            self.cursor.tensor.fill_(length)

    def crop(self, tokens_to_remove: int) -> None:
        self.set_length(self.get_seq_length() + tokens_to_remove)

    def compact(self, keep: torch.Tensor) -> None:
        """A one-row cache keeps only the slots ``keep`` (its holes go)."""
        for layer in self.slot_layers:
            if layer.is_initialized:
                layer.compact(keep)
        self.set_length(len(keep))

    def empty(self) -> None:
        """Back to no slots and one row, buffers kept (a fixed cache handed to the next run)."""
        self.set_length(0)
        for layer in self.slot_layers:
            layer.rows = 1

    @torch.inference_mode()
    def advanced(self, t: int) -> None:
        """A fixed step wrote ``t`` slots in every layer: the host's counts and the cursor move."""
        for layer in self.slot_layers:
            layer.length += t
        self.cursor.tensor.add_(t)

    @property
    def ready(self) -> bool:
        """Every buffer exists (made by a first, eager, forward)."""
        return all(layer.is_initialized for layer in self.slot_layers)

    @property
    def nbytes(self) -> int:
        """Bytes held by the attention buffers (recurrent states are small and fixed)."""
        return sum(layer.nbytes for layer in self.slot_layers)


def _slot(layer, capacity: int, rows: int, fixed: bool, cursor: Cursor):
    if type(layer) in (DynamicLayer, DynamicSlidingWindowLayer):
        return SlotLayer(capacity, rows, fixed, cursor)
    if type(layer) in (LinearAttentionAndFullAttentionLayer, LinearAttentionAndSlidingWindowAttentionLayer):
        return LinearSlotLayer(capacity, rows, fixed, cursor, number_of_states=layer.number_of_states)
    return layer  # recurrent-only, KV-shared (nothing stored) or a kind we do not know: as transformers made it
