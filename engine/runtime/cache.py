"""KV caches of every kind the engine meets, behind the few operations the decode loops need.

A cache is a list of layers (the ones transformers would build for the config, attention layers
swapped for preallocated ones), and each kind needs its own care:

* **full attention** (:class:`~engine.runtime.static.SlotLayer`): K/V in a buffer sized from the
  run's budgets; a rollback moves its length, nothing is copied.
* **sliding-window attention**: transformers keeps only the last ``window - 1`` tokens of such a
  layer, so a rollback after the window has filled cannot bring back what fell out (the crash in
  issue 13). Here every sliding layer is a full slot layer and the model's own sliding-window
  mask does the windowing, so a rollback is a crop as for full layers. Cost: K/V for the run's
  tokens (its budgets), not for the window; measured against recording the past and cropping
  after every forward, it is also the simpler path (one kind of rollback, no per-forward trim).
* **recurrent state** (linear attention, state space: Qwen3.5, Qwen3-Next, LFM2, Nemotron-H): a
  conv state and a recurrent state updated in place, which nothing can crop. A forward that may
  be rolled back first takes a :class:`Checkpoint` (a copy of those states, small and fixed in
  size); a rollback restores it and re-feeds the tokens kept since, in one forward.
* **KV-shared** layers (``DummyLayer``, Gemma 4): nothing stored, nothing to do.

Rows (SSR's draft rows) fork and leave through ``reorder_cache``, which every layer kind
implements, recurrent states included. Holes (slots a row rejected, hidden by its mask) need
every slot to be one position of one row: not so under a sliding window (transformers windows
slots, not positions) nor with recurrent states (a state cannot un-read a token), so
:attr:`CacheLayout.holes_ok` is false for those models and their rows feed one token a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

from engine.runtime.static import SlotCache, SlotLayer


@dataclass(frozen=True)
class CacheLayout:
    """What kinds of layer a model's cache has."""

    sliding: bool  # some layers attend within a window
    recurrent: bool  # some layers carry a recurrent (linear attention / state-space) state

    @property
    def holes_ok(self) -> bool:
        """Whether rows may hold holes (see the module docstring)."""
        return not (self.sliding or self.recurrent)

    @property
    def kind(self) -> str:
        return "+".join(k for k, on in (("sliding", self.sliding), ("recurrent", self.recurrent)) if on) or "full"


def layout(config) -> CacheLayout:
    """The cache layout of a model with this config (read from the cache transformers builds)."""
    layers = DynamicCache(config=config).layers
    return CacheLayout(sliding=any(isinstance(layer, DynamicSlidingWindowLayer) for layer in layers),
                       recurrent=any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers))


def new_cache(config, capacity: int = 256, rows: int = 1, fixed: bool = False) -> SlotCache:
    """An empty cache for a model with this config: preallocated for ``capacity`` slots and
    ``rows`` rows (it grows if a caller without budgets outruns it), sliding layers full (the
    mask windows). ``fixed``: shaped for compiled steps (``engine.runtime.static``)."""
    return SlotCache(config, capacity, rows, fixed)


def available_bytes(device: torch.device) -> int | None:
    """Memory a run's caches may take: the GPU's free memory, or the RAM the OS says is available
    (Linux's MemAvailable); None where neither can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
        return kib * 1024
    except (OSError, StopIteration, ValueError):
        return None


def cache_mb(*caches) -> float:
    """MiB the caches' preallocated attention buffers hold."""
    return sum(getattr(c, "nbytes", 0) for c in caches) / 2**20


def _attention(cache) -> list:
    """The layers that hold K/V by slot (slot layers, and any dynamic kind left as it was)."""
    return [layer for layer in cache.layers if isinstance(layer, (SlotLayer, DynamicLayer))]


def seq_length(cache) -> int:
    """Slots in the cache (the longest attention layer; a recurrent-only slot cache counts the
    tokens fed itself)."""
    if getattr(cache, "counts_tokens", False):
        return cache.fed
    return max((layer.get_seq_length() for layer in _attention(cache)), default=0)


def crop(cache, length: int) -> None:
    """Cut every attention layer back to ``length`` slots. Recurrent states are left alone: a
    rollback past them is :func:`rewind`'s job."""
    extra = seq_length(cache) - length
    assert extra >= 0, f"cannot crop a cache of {seq_length(cache)} tokens to {length}"
    if not extra:
        return
    if isinstance(cache, SlotCache):
        cache.set_length(length)  # every slot layer, the attention part of hybrid layers too
    for layer in _attention(cache):
        if isinstance(layer, DynamicLayer) and layer.get_seq_length() > length:  # a kind left as transformers made it
            DynamicLayer.crop(layer, length - layer.get_seq_length())


def take_rows(cache, rows: list[int]) -> None:
    """Rebuild the batch from these rows, in this order (a row may repeat: that is a fork). The
    indices stay on the host: each layer moves them where it needs them, nothing syncs back."""
    cache.reorder_cache(torch.as_tensor(rows))


def compact(cache, keep: torch.Tensor) -> None:
    """Keep only the slots ``keep`` (1-D indices, in order) of a one-row cache: the row's holes go."""
    if isinstance(cache, SlotCache):
        cache.compact(keep)
    for layer in _attention(cache):
        if isinstance(layer, DynamicLayer) and layer.is_initialized and layer.keys.numel():
            layer.keys = layer.keys.index_select(-2, keep)
            layer.values = layer.values.index_select(-2, keep)


@dataclass
class Checkpoint:
    """The recurrent states of a cache at ``length`` tokens (empty for attention-only caches)."""

    length: int
    states: list[tuple[int, dict, dict, dict]]  # (layer index, conv, recurrent, has_previous_state)


def checkpoint(cache, length: int) -> Checkpoint:
    """Remember what a rollback to ``length`` needs: for attention nothing (a crop will do), for
    recurrent layers a copy of their states."""
    states = []
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            states.append((i, _copy(layer.conv_states), _copy(layer.recurrent_states), dict(layer.has_previous_state)))
    return Checkpoint(length, states)


def restore(cache, ckpt: Checkpoint) -> None:
    """Put the cache back as it was at ``ckpt``: attention cropped, recurrent states copied back."""
    crop(cache, ckpt.length)
    for i, conv, recurrent, previous in ckpt.states:
        layer = cache.layers[i]
        layer.conv_states, layer.recurrent_states = _copy(conv), _copy(recurrent)
        layer.has_previous_state = dict(previous)
        for k in conv:
            layer.is_conv_states_initialized[k] = conv[k] is not None
            layer.is_recurrent_states_initialized[k] = recurrent[k] is not None


def _copy(states: dict) -> dict:
    return {k: None if v is None else v.clone() for k, v in states.items()}

