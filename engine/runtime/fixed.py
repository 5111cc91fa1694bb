"""Exact mode's fixed route: every forward of a run has one shape, rows x width, on a fixed cache.

Exact mode's first route (``engine.runtime.exact``, "rows") computes every linear layer one token
row at a time and attention one query at a time: the reference, right on any kernel, but one
call per row per layer, which a GPU runs launch-bound. This route gets the same property from
fixed shapes instead: a kernel called with the same shapes reduces in the same order, so a row's
result cannot depend on what the other rows hold or where in the step it sits (measured on this
kind of CPU: ``F.linear`` of a fixed ``[M, K]`` input, SDPA over a fixed block of queries and the
whole key buffer with a mask). So every forward is padded to :data:`SHAPE`:

* **rows**: a step of ``b`` live rows runs :data:`ROWS` rows; the extra rows are padding, written
  into the cache buffer's spare rows, which no live row reads (a fork copies a live row over them);
* **width**: a row's feed is padded to :data:`WIDTH` tokens at its last position; the padding's
  slots are given back after the step (causality hid them inside it); a wider forward (a
  prompt's prefill, a re-encode at longrope's switch point) runs in chunks of :data:`WIDTH`,
  each token seeing the same keys at the same slots as it would one by one;
* **keys**: the fixed cache (``engine.runtime.static``, ``fixed=True``) gives attention the whole
  buffer every step and the mask hides what a row may not see.

A row's tokens must sit at the same slots in every run, or attention would sum the same terms in
another order: on this route rows hold no holes (SSR feeds one token per row per step while
drafts ride, as on a sliding-window model; a lone row still verifies k tokens). Models with
recurrent states cannot pad (a padding token would enter the state): the route is refused there.
So are a model's own cache class, position-scaled RoPE (its frequencies follow each forward's
highest position, and wide forwards run here in chunks) and routed experts (the router routes
the padding too, so an expert's matmul shape follows the data): :func:`unfit`. Anything else the
route cannot keep is caught by exact mode's self-check, run on the loaded model on this route (on
its compiled step when the run compiles), which refuses it with the measured difference. When
the run's steps are compiled (``engine.runtime.compiled``), the one shape is compiled once and on
CUDA replayed as a CUDA graph.

The two routes are each exact within themselves, not bitwise equal to each other: the run's step
mode names the route ("exact fixed 8x32 ..."), and comparisons match on it.
"""

from __future__ import annotations

import contextlib

import torch

from engine.runtime.cache import crop
from engine.steps import exact_step_mode

ROUTES = ("auto", "rows", "fixed")
ROWS, WIDTH = 8, 32  # one shape per model, shared by every exact run on this route (baseline, SSR, RSD)
SHAPE = f"{ROWS}x{WIDTH}"


def resolve(requested: str, device: torch.device, unfit: str | None) -> str:
    """The route an exact run takes: ``auto`` is the fixed route on CUDA (where the per-row route is
    launch-bound) and the per-row route elsewhere, or wherever the fixed route cannot hold
    (``unfit``: why, from :func:`unfit`); an explicit ``fixed`` there is a ValueError saying why."""
    if requested not in ROUTES:
        raise ValueError(f"exact_route must be one of {', '.join(ROUTES)}, not {requested!r}")
    if requested == "auto":
        return "fixed" if device.type == "cuda" and unfit is None else "rows"
    if requested == "fixed" and unfit is not None:
        raise ValueError(f"exact mode's fixed route cannot hold on this model: {unfit}; use exact_route 'rows' "
                         "(the per-row reference)")
    return requested


EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "num_experts_per_tok")


def unfit(config, layout, rope) -> str | None:
    """Why the fixed route cannot hold on a model (None: it may; its self-check then measures it).
    Each reason is a property of what the model computes, not of its class:

    * a cache class of the model's own: the route needs the engine's fixed cache;
    * recurrent states: a padding token would enter them;
    * position-scaled RoPE: its frequencies follow each forward's highest position, and the route
      runs a wide forward in chunks of :data:`WIDTH`;
    * routed experts: the router routes the padding tokens too, so how many tokens each expert
      gets, and so its matmul's shape, follows the data (one self-check input may pass by chance).
    """
    if layout.own:
        return f"it runs on the engine's fixed cache, and this model keeps a cache class of its own ({layout.own})"
    if layout.recurrent:
        return "a padding token would enter this model's recurrent states"
    if rope.kind:
        return (f"this model's rope_type {rope.kind!r} picks its frequencies from each forward's highest position, "
                f"and the route runs wide forwards in chunks of {WIDTH}")
    text = config.get_text_config(decoder=True)
    if any(isinstance(getattr(text, k, None), int) and getattr(text, k) > 1 for k in EXPERT_KEYS):
        return ("its experts' router routes the padding tokens too, so each expert's matmul shape follows the data, "
                "not the step's shape")
    return None


def step_mode(route: str, compiled: bool) -> str:
    """How an exact run's steps run, for its stats and the comparisons' match (``engine.steps``)."""
    return exact_step_mode(route, SHAPE, compiled)


def capacity_rows(rows: int) -> int:
    """Rows a fixed-route cache holds: the route's rows (the padding rows live in the spare ones)."""
    if rows > ROWS:
        raise ValueError(f"exact mode's fixed route runs {ROWS} rows a step and this run needs {rows} (the main row "
                         f"and its drafts): at most {ROWS - 1} drafts, or exact_route 'rows'")
    return ROWS


def fixed_forward(lm, ids: torch.Tensor, cache, start: int, positions: torch.Tensor,
                  attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Logits ``[b, t, V]`` of ``ids`` ``[b, t]`` at ``start`` on a fixed cache, every forward of
    :data:`SHAPE` (``t`` past :data:`WIDTH`: in chunks)."""
    b, t = ids.shape
    capacity_rows(b)
    out = []
    for j in range(0, t, WIDTH):
        w = min(WIDTH, t - j)
        mask = None if attention_mask is None else attention_mask[:, : start + j + w]
        out.append(_step(lm, ids[:, j : j + w], cache, start + j, positions[:, j : j + w], mask))
    return torch.cat(out, dim=1)


def _step(lm, ids: torch.Tensor, cache, start: int, positions: torch.Tensor,
          attention_mask: torch.Tensor | None) -> torch.Tensor:
    b, t = ids.shape
    rows, width = _shape(b, t)
    if start + width > cache.capacity:
        raise RuntimeError(f"a {width}-token step at slot {start} does not fit a cache of {cache.capacity} slots")
    ids, positions = padded(ids, rows, width), padded(positions, rows, width)
    mask = capacity_mask(attention_mask, rows, cache.capacity, ids.device)
    with _rows_in_use(cache, rows):
        if lm.compiled is not None and not cache.ready:  # an eager forward makes the buffers, then the step
            _eager(lm, ids, positions, mask, cache)       # runs compiled, as every step of a compiled run does
            cache.advanced(width)
            crop(cache, start)
        logits = lm.compiled(ids, positions, mask, cache) if lm.compiled is not None else \
            _eager(lm, ids, positions, mask, cache)
    cache.advanced(width)
    crop(cache, start + t)  # the padding's slots given back
    return logits[:b, :t]


def _eager(lm, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
    return lm.model(input_ids=ids, cache=cache, position_ids=positions, attention_mask=mask, use_cache=True,
                    logits_to_keep=ids.shape[1]).logits


def _shape(live_rows: int, tokens: int) -> tuple[int, int]:
    """The shape every step runs at, whatever it carries (a test breaks the route here)."""
    return ROWS, WIDTH


def padded(x: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    """``x`` ``[b, t]`` (token ids or positions) as ``[rows, width]``: each row's last column
    repeated (its padding sits at its last position, so it never reaches a position the step's
    tokens do not: longrope picks its factors from the highest; with a cache passed transformers
    reads no packed sequences into it), then row 0 repeated as the padding rows. Every fixed-shape
    step pads so, compiled buckets (``LoadedModel._fixed_step``) and this route alike."""
    x = torch.cat([x, x[:, -1:].expand(x.shape[0], width - x.shape[1])], dim=1)
    return torch.cat([x, x[:1].expand(rows - x.shape[0], width)])


def capacity_mask(attention_mask: torch.Tensor | None, rows: int, capacity: int, device) -> torch.Tensor:
    """A fixed cache's mask ``[rows, capacity]``: the step's own mask over its first slots, every
    other slot visible (causality hides the ones past each query; padding rows see them all)."""
    mask = torch.ones(rows, capacity, dtype=torch.long, device=device)
    if attention_mask is not None:
        mask[: attention_mask.shape[0], : attention_mask.shape[1]] = attention_mask
    return mask


@contextlib.contextmanager
def _rows_in_use(cache, rows: int):
    """Every slot layer takes ``rows`` rows for one step (its live rows first), then its live rows
    again."""
    layers = cache.slot_layers
    live = [layer.rows for layer in layers]
    for layer in layers:
        layer.rows = rows
    try:
        yield
    finally:
        for layer, n in zip(layers, live, strict=True):
            layer.rows = n
