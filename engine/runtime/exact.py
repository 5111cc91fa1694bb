"""Exact mode: forwards whose result for one row and one position does not depend on the batch.

A matmul, a norm or an attention reduction may sum in an order chosen by the shape of the call:
how many rows the batch holds (the main row alone, or with drafts) and how many query tokens the
forward carries (a 1-token step, or a k-token verify). Then the same token at the same position
gets slightly different logits in different forwards, and a near-tie flips the greedy token: on
a GPU in bf16, "SSR gives the same answer as plain decoding" fails at random.

Exact mode removes every shape-dependent reduction from the forward, under the model's own
modelling code (nothing forked, nothing monkey-patched):

* **Linear layers** (every projection, the LM head): a ``TorchFunctionMode`` computes
  ``F.linear`` (and ``addmm``, GPT-2's Conv1D) one token row at a time, so every row is the same
  call on the same shapes, whatever else is in the batch.
* **Attention**: an attention function registered with transformers' ``AttentionInterface`` (and
  its mask with ``AttentionMaskInterface``) computes each query on its own, over exactly the keys
  its mask lets it see, gathered in position order: the scores, the softmax and the weighted sum
  have the same shapes and order for that query in a lone step, in a wide verify, beside other
  rows, and with holes. Soft-capped logits (Gemma 2) are supported; attention sinks are refused.
* Norms, softmax over the vocabulary, rotary embeddings, activations and residual adds reduce per
  row along the last dimension only (or not at all), which is already independent of the batch;
  the tests check the end result, bitwise, so a kernel that broke this would be caught.

It is slow (one call per token row per linear layer and per query per attention layer): the
reference that CPU tests run. A GPU would want fixed-tile Triton kernels with the same property;
until then the same code runs there too, as the slow, exact path.

>>> with exact_forwards(model):
...     logits = model(input_ids=ids).logits  # row 0's logits do not depend on the other rows
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

NAME = "ssr-exact"


class _RowwiseLinear(TorchFunctionMode):
    """``F.linear`` computed one token row at a time (the same call for every row)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.addmm, torch.Tensor.addmm) and not kwargs and len(args) == 3 and args[1].dim() == 2:
            bias, rows, weight = args  # GPT-2's Conv1D: bias + x @ W, one token row at a time
            return torch.cat([torch.addmm(bias, rows[i : i + 1], weight) for i in range(rows.shape[0])])
        if func is not F.linear:
            return func(*args, **kwargs)
        x, weight = args[0], args[1]
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        rows = x.reshape(-1, x.shape[-1])  # [N, in]
        out = torch.cat([F.linear(rows[i : i + 1], weight, bias) for i in range(rows.shape[0])])  # [N, out]
        return out.reshape(*x.shape[:-1], weight.shape[0])


def exact_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """Attention one query at a time over its visible keys. ``query`` ``[B, H, T, D]``, ``key`` /
    ``value`` ``[B, Hkv, S, D]``, ``attention_mask`` additive ``[B, 1, T, S]`` (0: visible).
    Returns ``([B, T, H, D], None)`` as transformers' attention functions do."""
    if kwargs.get("s_aux") is not None:
        raise ValueError("exact mode does not support attention sinks (gpt-oss): turn exact mode off for this model")
    softcap = kwargs.get("softcap")
    b, h, t, _d = query.shape
    groups = h // key.shape[1]
    out = query.new_empty(b, t, h, value.shape[-1])
    for row in range(b):
        keys = key[row].repeat_interleave(groups, dim=0)  # [H, S, D]
        values = value[row].repeat_interleave(groups, dim=0)
        for q in range(t):
            visible = (attention_mask[row, 0, q] == 0).nonzero().flatten() if attention_mask is not None \
                else torch.arange(key.shape[2] - t + q + 1, device=key.device)
            k_sel, v_sel = keys[:, visible], values[:, visible]  # [H, n, D]
            scores = torch.matmul(query[row, :, q : q + 1], k_sel.transpose(1, 2)) * scaling  # [H, 1, n]
            if softcap is not None:
                scores = torch.tanh(scores / softcap) * softcap
            probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
            out[row, q] = torch.matmul(probs, v_sel)[:, 0]  # [H, D]
    return out, None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(NAME, exact_attention)
    AttentionMaskInterface.register(NAME, eager_mask)  # an additive mask, always materialised


@contextlib.contextmanager
def exact_forwards(model):
    """Within the block, ``model``'s forwards are batch- and width-invariant (see the module doc)."""
    _register()
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        with _RowwiseLinear():
            yield
    finally:
        config._attn_implementation = before


# ---------------------------------------------------------------------------- the self-check

ROWS = (2, 3)  # row 0 beside one and two other rows
WIDTHS = (4, 16, 32)  # a token alone vs at every offset of windows this wide
PREFIX = 24


class ExactRefused(ValueError):
    """Exact mode measured not exact on this model: the message gives the difference and where."""


@dataclass(frozen=True)
class Invariance:
    rows: dict[int, float]  # rows in the batch -> largest |logit| difference of row 0 from it alone
    widths: dict[int, float]  # window width -> largest difference of a token in it from it alone
    layer: str | None  # the first module whose output differed (None: bitwise everywhere)
    seconds: float

    @property
    def exact(self) -> bool:
        return not any(self.rows.values()) and not any(self.widths.values())

    def __str__(self) -> str:
        rows = ", ".join(f"{n} rows {d:.2g}" for n, d in self.rows.items())
        widths = ", ".join(f"width {k} {d:.2g}" for k, d in self.widths.items())
        return f"max logit difference: {rows}; {widths}" + (f"; first differing layer: {self.layer}" if self.layer else "")


def invariance(lm, exact: bool = True) -> Invariance:
    """Row 0's logits beside 1 and 2 other rows, and a token alone vs at every offset of 4-, 16-
    and 32-token windows, after a shared prefix (``engine.tools.gpu_check`` reports the same on a
    GPU). ``lm`` is a ``LoadedModel``; its current run's settings are kept."""
    t0 = time.perf_counter()
    saved = lm.exact, lm.compiled, lm.compile_why
    lm.exact, lm.compiled = exact, None
    try:
        vocab = lm.model.get_output_embeddings().weight.shape[0]
        switch = lm.rope.switch if lm.rope.kind else None  # stay below it: past it RoPE itself depends on width
        start = min(PREFIX, switch - max(WIDTHS)) if switch else PREFIX
        ids = [(7919 * i + 13) % vocab for i in range(start + max(WIDTHS))]
        prefix, window = ids[:start], ids[start:]
        others = [[(t * 7 + 3) % vocab for t in window[:6]], [(t * 13 + 1) % vocab for t in window[:6]]]
        alone = beside(lm, prefix, [window[:6]])[0]
        rows = {n: _max_diff(beside(lm, prefix, [window[:6], *others[: n - 1]])[0], alone) for n in ROWS}
        one_by_one = _one_by_one(lm, prefix, window)  # [max width, V]: each token alone after the ones before
        wide = {k: beside(lm, prefix, [window[:k]])[0] for k in WIDTHS}  # [k, V]: the window in one forward
        widths = {k: _max_diff(wide[k], one_by_one[:k]) for k in WIDTHS}
        layer = None
        if any(rows.values()):
            layer = _first_difference(lm, (prefix, [window[:6], *others[: max(ROWS) - 1]], slice(None)),
                                      (prefix, [window[:6]], slice(None)))
        elif any(widths.values()):
            k = next(k for k in WIDTHS if widths[k])
            j = int(((wide[k] - one_by_one[:k]).abs().amax(-1) > 0).nonzero()[0])
            layer = _first_difference(lm, (prefix, [window[:k]], slice(j, j + 1)),
                                      (prefix + window[:j], [window[j : j + 1]], slice(0, 1)))
        return Invariance(rows, widths, layer, time.perf_counter() - t0)
    finally:
        lm.exact, lm.compiled, lm.compile_why = saved


def beside(lm, prefix: list[int], rows: list[list[int]]) -> torch.Tensor:
    """Logits ``[rows, T, V]`` of ``rows`` fed together after a shared ``prefix``, on the current
    run's route (``engine.tools.gpu_check`` and the tests call it too)."""
    return lm.forward(torch.tensor(rows, device=lm.device), _prefilled(lm, prefix, len(rows)), len(prefix))


def _prefilled(lm, prefix: list[int], rows: int):
    from engine.runtime.cache import take_rows

    cache = lm.new_cache(len(prefix) + max(WIDTHS) + 4, rows=rows)
    lm.step_logits(prefix, cache, 0)
    take_rows(cache, [0] * rows)
    return cache


def _one_by_one(lm, prefix: list[int], tokens: list[int]) -> torch.Tensor:
    cache = lm.new_cache(len(prefix) + len(tokens) + 4)
    lm.step_logits(prefix, cache, 0)
    return torch.stack([lm.step_logits([t], cache, len(prefix) + j)[0] for j, t in enumerate(tokens)])


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _first_difference(lm, wide: tuple, narrow: tuple) -> str | None:
    """The first module (in the order modules finish) whose output for row 0 differs between two
    feeds, each ``(prefix, rows, positions compared)``."""
    names = {m: n for n, m in lm.model.named_modules() if n}
    seen: list[tuple[list[str], dict[str, torch.Tensor]]] = []
    for prefix, rows, at in (wide, narrow):
        order, store = [], {}

        def hook(module, args, out, order=order, store=store, at=at):
            out = out[0] if isinstance(out, tuple) else out
            name = names[module]
            if isinstance(out, torch.Tensor) and out.dim() >= 3 and name not in store:
                store[name] = out[0, at].detach().clone()
                order.append(name)

        cache = _prefilled(lm, prefix, len(rows))
        handles = [m.register_forward_hook(hook) for m in names]
        try:
            lm.forward(torch.tensor(rows, device=lm.device), cache, len(prefix))
        finally:
            for h in handles:
                h.remove()
        seen.append((order, store))
    (order, first), (_, second) = seen
    for name in order:
        if name in second and first[name].shape == second[name].shape and not torch.equal(first[name], second[name]):
            return name
    return None
