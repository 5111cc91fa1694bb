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
* **the model's own cache** (:class:`OwnCache`): a model whose cache has layer kinds this module
  does not know (DeepSeek-V4's compressor layers, DeepSeek-V3.2's indexer), or that refuses any
  cache but its own class (MiniMax), gets the cache transformers builds for it, as it is: swapping
  some of its layers for slot layers can break what the model assumes of them (DeepSeek-V4 builds
  one mask for every layer from the first sliding layer). Such a cache counts the tokens fed
  itself, and everything a crop cannot roll back (the state of every layer that is not a plain
  K/V layer, and the state the cache class keeps beside its layers) is checkpointed whole and
  restored, then the kept tokens re-read, as for recurrent states.

Rows (SSR's draft rows) fork and leave through ``reorder_cache``, which every layer kind
implements, recurrent states included. Holes (slots a row rejected, hidden by its mask) need
every slot to be one position of one row: not so under a sliding window (transformers windows
slots, not positions) nor with recurrent states (a state cannot un-read a token), so
:attr:`CacheLayout.holes_ok` is false for those models and their rows feed one token a step.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import (
    Cache,
    CacheLayerMixin,
    DummyLayer,
    DynamicLayer,
    DynamicSlidingWindowLayer,
    LinearAttentionAndFullAttentionLayer,
    LinearAttentionAndSlidingWindowAttentionLayer,
    LinearAttentionCacheLayerMixin,
    LinearAttentionLayer,
)

from engine.runtime.static import SlotCache, SlotLayer

# config fields naming a length where a model's cache behaves differently past it
THRESHOLD_KEYS = ("sliding_window", "chunk_size", "mamba_chunk_size", "linear_chunk_size", "block_size",
                  "index_topk", "attention_chunk_size")
# the layer kinds a SlotCache knows how to hold, fork, crop and checkpoint
KNOWN_LAYERS = (DynamicLayer, DynamicSlidingWindowLayer, LinearAttentionLayer, LinearAttentionAndFullAttentionLayer,
                LinearAttentionAndSlidingWindowAttentionLayer, DummyLayer)


@dataclass(frozen=True)
class CacheLayout:
    """What kinds of layer a model's cache has."""

    sliding: bool  # some layers attend within a window
    # some layers carry state a crop cannot roll back (a recurrent state: linear attention, state space;
    # or anything the model's own cache keeps): rollbacks restore a checkpoint and re-read
    recurrent: bool
    own: str | None = None  # the model's own cache class (:class:`OwnCache`), by name; None: a SlotCache

    @property
    def holes_ok(self) -> bool:
        """Whether rows may hold holes (see the module docstring)."""
        return not (self.sliding or self.recurrent)

    @property
    def kind(self) -> str:
        kinds = (("sliding", self.sliding), ("recurrent", self.recurrent), (f"own {self.own}", self.own))
        return "+".join(k for k, on in kinds if on) or "full"


def layout(config, own: type | None = None) -> CacheLayout:
    """The cache layout of a model with this config (read from the cache transformers builds);
    ``own``: the model's own cache class, where the engine runs on it (:func:`own_cache_class`)."""
    layers = DynamicCache(config=config).layers
    sliding = any(isinstance(layer, DynamicSlidingWindowLayer) for layer in layers)
    if own is not None:
        return CacheLayout(sliding=sliding, recurrent=True, own=own.__name__)
    return CacheLayout(sliding=sliding, recurrent=any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers))


def new_cache(config, capacity: int = 256, rows: int = 1, fixed: bool = False, own: type | None = None):
    """An empty cache for a model with this config: preallocated for ``capacity`` slots and
    ``rows`` rows (it grows if a caller without budgets outruns it), sliding layers full (the
    mask windows). ``fixed``: shaped for compiled steps (``engine.runtime.static``). ``own``: the
    model's own cache class instead (:class:`OwnCache`; never fixed: its layers are not slots)."""
    if own is not None:
        return _own_cache(own, config)
    return SlotCache(config, capacity, rows, fixed)


def threshold_length(config) -> int:
    """A sequence long enough to cross every threshold the config names (a sliding window, a chunk
    size, an indexer's top-k): where a cache's behaviour changes."""
    config = config.get_text_config(decoder=True)
    found = [getattr(config, k, None) for k in THRESHOLD_KEYS]
    longest = max((v for v in found if isinstance(v, int) and v > 0), default=0)
    return max(24, min(longest, 512) + 8)


def unknown_layer_kinds(config) -> list[str]:
    """The cache layer classes transformers makes for ``config`` that :data:`KNOWN_LAYERS` does not
    list (DeepSeek-V3.2's indexer, DeepSeek-V4's compressor), by name."""
    return sorted({type(layer).__name__ for layer in DynamicCache(config=config).layers
                   if type(layer) not in KNOWN_LAYERS})


def own_cache_class(model, context: int | None = None) -> type | None:
    """The cache class the engine must run ``model`` on instead of a :class:`SlotCache` (None: a
    SlotCache will do). Transformers' cache for the config as it is, where it has a layer kind
    :data:`KNOWN_LAYERS` does not list; else the class the model builds itself, where the model
    decodes differently on a SlotCache (it raises: MiniMax refuses any class but its own; or its
    logits differ: Dory reads its sliding layers' K/V itself, as transformers windows them), measured
    over a prefill past every threshold and two steps. None where the model cannot decode on its own
    cache either: the capability probe then reports the SlotCache's error."""
    config = model.config
    if unknown_layer_kinds(config):
        return DynamicCache
    length = threshold_length(config) if not context else min(threshold_length(config), context - 2)
    ids = [(7919 * i + 13) % model.get_output_embeddings().weight.shape[0] for i in range(length + 2)]
    own = _decoded(model, None, ids)
    if own is None:
        return None
    slot = _decoded(model, SlotCache(config, len(ids)), ids)
    if slot is not None and _close(slot[0], own[0], model):
        return None
    return type(own[1]) if isinstance(own[1], Cache) else None


def _decoded(model, cache, ids: list[int]) -> tuple[torch.Tensor, Cache] | None:
    """Logits ``[3, V]`` after a prefill of all but the last two ``ids`` and after each of those
    two, fed one a forward, on ``cache`` (None: the one the model builds), and that cache; None if
    it raised."""
    device = next(model.parameters()).device
    feeds, at, logits = [ids[:-2], ids[-2:-1], ids[-1:]], 0, []
    try:
        with torch.inference_mode():
            for feed in feeds:
                out = model(input_ids=torch.tensor([feed], device=device), cache=cache, use_cache=True,
                            position_ids=torch.arange(at, at + len(feed), device=device)[None])
                cache, at = out.cache, at + len(feed)
                if getattr(cache, "counts_tokens", False):
                    cache.fed = at
                logits.append(out.logits[0, -1])
    except Exception:  # noqa: BLE001 (any failure: this cache will not do)
        return None
    return torch.stack(logits).double(), cache


def tolerance(dtype: torch.dtype) -> float:
    """Relative logit difference still counted as rounding: ``sqrt(eps)`` of the dtype, and never
    finer than float32's (models compute parts such as MoE routers in float32 whatever their dtype).
    The capability probe's rule, and the own-cache decision's."""
    return max(float(torch.finfo(dtype).eps), float(torch.finfo(torch.float32).eps)) ** 0.5


def _close(a: torch.Tensor, b: torch.Tensor, model) -> bool:
    """Equal within rounding (:func:`tolerance` of the logits' scale)."""
    return float((a - b).abs().max()) <= tolerance(next(model.parameters()).dtype) * max(1.0, float(b.abs().max()))


class OwnCache:
    """Mixed in before the model's own cache class (so the model's ``isinstance`` checks still
    pass), it gives that class what the decode loops need: the cache length is the tokens fed,
    counted here (a custom class may not report one: MiniMax's reads an attention layer that a
    linear layer never fills), and so are the mask sizes where the layer the mask is read from
    holds nothing; a fork also reorders the state the class keeps beside its layers (rows first).
    Rollbacks crop its plain K/V layers; the rest is a :class:`Checkpoint`'s to restore."""

    counts_tokens = True
    fed = 0
    base: type = Cache  # the model's own class (set on each subclass)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.fed

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        layer = self.layers[layer_idx] if layer_idx < len(self.layers) else None
        if not isinstance(layer, CacheLayerMixin) or not layer.is_initialized:
            return self.fed + query_length, 0
        return super().get_mask_sizes(query_length, layer_idx)

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        if self.base.reorder_cache is Cache.reorder_cache:  # the class leaves its own state as it was
            for name in _extra_state(self):
                setattr(self, name, _map(getattr(self, name), lambda t: t.index_select(0, beam_idx.to(t.device))))

    def set_length(self, length: int) -> None:
        """``length`` tokens: the plain K/V layers cropped to them (every other state is restored
        from a checkpoint by :func:`restore`)."""
        for layer in self.layers:
            if type(layer) is DynamicLayer and layer.get_seq_length() > length:
                DynamicLayer.crop(layer, length - layer.get_seq_length())
        self.fed = length


@functools.cache
def _own_class(cls: type) -> type:
    return type(f"Own{cls.__name__}", (OwnCache, cls), {"base": cls})


def _own_cache(cls: type, config) -> OwnCache:
    """An empty cache of the model's own class (built from the config where its class takes one)."""
    own = _own_class(cls)
    try:
        return own(config=config)
    except TypeError:
        return own()


_BASE_STATE = frozenset(vars(DynamicCache())) | {"fed", "only_non_sliding", "prefetch_stream"}


def _extra_state(cache) -> list[str]:
    """The attributes a cache class keeps beside its layers (MiniMax's ``linear_cache``)."""
    return [name for name in vars(cache) if name not in _BASE_STATE]


def _map(value, fn):
    """``value`` with ``fn`` applied to every tensor inside it (dicts, lists and tuples walked)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_map(v, fn) for v in value)
    return value


def _clone(value):
    return _map(value, torch.Tensor.clone)


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
    """The layers that hold K/V by slot (slot layers, and plain dynamic layers in a model's own cache)."""
    return [layer for layer in cache.layers if isinstance(layer, SlotLayer) or type(layer) is DynamicLayer]


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
    cache.set_length(length)  # every slot layer (the attention part of hybrid layers too), or an own cache's K/V


def take_rows(cache, rows: list[int]) -> None:
    """Rebuild the batch from these rows, in this order (a row may repeat: that is a fork). The
    indices stay on the host: each layer moves them where it needs them, nothing syncs back."""
    cache.reorder_cache(torch.as_tensor(rows))


def compact(cache, keep: torch.Tensor) -> None:
    """Keep only the slots ``keep`` (1-D indices, in order) of a one-row cache: the row's holes go."""
    assert isinstance(cache, SlotCache), "only a SlotCache holds holes (an own cache's layout says recurrent)"
    cache.compact(keep)


@dataclass
class Checkpoint:
    """The recurrent states of a cache at ``length`` tokens (empty for attention-only caches)."""

    length: int
    states: list[tuple[int, dict, dict, dict]]  # (layer index, conv, recurrent, has_previous_state)
    # an own cache's: (layer index, or None for the cache itself; a copy of its attributes)
    wholes: list[tuple[int | None, dict]] = field(default_factory=list)

    @property
    def crop_only(self) -> bool:
        """Nothing to restore: a rollback to here is a crop."""
        return not self.states and not self.wholes


def checkpoint(cache, length: int) -> Checkpoint:
    """Remember what a rollback to ``length`` needs: for attention nothing (a crop will do), for
    recurrent layers a copy of their states; in a model's own cache, a copy of everything but its
    plain K/V layers."""
    if isinstance(cache, OwnCache):
        wholes = [(i, _clone(vars(layer))) for i, layer in enumerate(cache.layers) if type(layer) is not DynamicLayer]
        wholes.append((None, {name: _clone(getattr(cache, name)) for name in _extra_state(cache)}))
        return Checkpoint(length, [], wholes)
    states = []
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            states.append((i, _copy(layer.conv_states), _copy(layer.recurrent_states), dict(layer.has_previous_state)))
    return Checkpoint(length, states)


def restore(cache, ckpt: Checkpoint) -> None:
    """Put the cache back as it was at ``ckpt``: attention cropped, recurrent states copied back."""
    crop(cache, ckpt.length)
    for i, attrs in ckpt.wholes:
        vars(cache if i is None else cache.layers[i]).update(_clone(attrs))
    for i, conv, recurrent, previous in ckpt.states:
        layer = cache.layers[i]
        layer.conv_states, layer.recurrent_states = _copy(conv), _copy(recurrent)
        layer.has_previous_state = dict(previous)
        for k in conv:
            layer.is_conv_states_initialized[k] = conv[k] is not None
            layer.is_recurrent_states_initialized[k] = recurrent[k] is not None


def _copy(states: dict) -> dict:
    return {k: None if v is None else v.clone() for k, v in states.items()}

