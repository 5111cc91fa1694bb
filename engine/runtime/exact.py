"""Exact mode: forwards whose result for one row and one position does not depend on the batch.

A matmul, a norm or an attention reduction may sum in an order chosen by the shape of the call:
how many rows the batch holds (the main row alone, or with drafts) and how many query tokens the
forward carries (a 1-token step, or a k-token verify). Then the same token at the same position
gets slightly different logits in different forwards, and a near-tie flips the greedy token: on
a GPU in bf16, "SSR gives the same answer as plain decoding" fails at random.

Exact mode removes every shape-dependent reduction from the forward, under the model's own
modelling code (nothing forked, nothing monkey-patched). A ``TorchFunctionMode`` routes ops by
what they compute, never by model class:

* **Linear layers** (``F.linear``, ``addmm``: every projection, the LM head, GPT-2's Conv1D, eager
  experts): one token row at a time, so every row is the same call on the same shapes, whatever
  else is in the batch. A ``matmul`` / ``mm`` / ``bmm`` with a weight (a parameter or a view of
  one) on one side runs the same way, one row of the other side at a time (``W @ x`` as
  ``(x.T @ W.T).T``); a grouped expert matmul (``grouped_mm``) runs one token row at a time
  against its expert's matrix, so how many tokens an expert got does not pick the kernel.
* **Every other contraction** (``matmul`` / ``bmm`` / ``baddbmm`` between activations, ``einsum``,
  ``conv1d``: state-space scans and convolutions, batched experts, rotary frequencies): exact
  elementwise products summed over the contracted dimension in a fixed pairwise order with
  elementwise adds (fp32 at least). Each result element is then the same sum of the same
  roundings whatever the shapes around it, on any CPU or GPU; the products are chunked to bound
  memory.
* **Transcendental elementwise ops on the CPU** (``sigmoid``, ``silu``, ``gelu``, ``softplus``,
  ``exp``, ...): ATen's CPU loops compute whole SIMD vectors and finish a call's last elements
  with the scalar formula, which rounds differently (measured: ``silu``, ``sigmoid``, ``gelu``,
  ``softplus``). Which elements fall in that tail follows the tensor's size, so the batch and the
  width. Exact mode feeds these ops zero-padded chunks whose size is a multiple of every SIMD
  width and below ATen's grain sizes: every element takes the vector path, on one thread,
  wherever it sits.
* **Attention**: an attention function registered with transformers' ``AttentionInterface`` (and
  its mask with ``AttentionMaskInterface``) computes each query on its own, over exactly the keys
  its mask lets it see, gathered in position order: the scores, the softmax and the weighted sum
  have the same shapes and order for that query in a lone step, in a wide verify, beside other
  rows, and with holes. Soft-capped logits (Gemma 2) are supported; attention sinks are refused.
* Norms, softmax and residual adds reduce per row along one dimension of fixed length (or not at
  all), which is already independent of the batch. The self-check (``invariance``) measures the
  end result bitwise on the loaded model, so an op this list misses is caught there, named, and
  exact mode is refused.

It is slow (one call per token row per linear layer and per query per attention layer): the
reference, the per-row route ("rows"). Exact mode's other route, ``engine.runtime.fixed``, gets the
same property on a GPU from one fixed step shape and the model's own kernels.

>>> with exact_forwards(model):
...     logits = model(input_ids=ids).logits  # row 0's logits do not depend on the other rows
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

NAME = "ssr-exact"
PRODUCT_LIMIT = 1 << 22  # elements of a contraction's products held at once (chunked over the result)
LANES = 128  # a multiple of every SIMD loop's step (two vectors: 16 fp32 on AVX2, 64 bf16 on AVX-512)
CHUNK = 2048  # at most ATen's grain sizes (2048 for its vectorised math, 32768 elsewhere): one thread


class ExactOps(TorchFunctionMode):
    """Routes every op that could let other rows or tokens into a result element to its exact form
    (``_handler``); every other op runs as it is. Inside a handler the mode is off. ``exact_forwards``
    enters it (with the attention function); on its own it makes plain tensor code exact."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _handler(func)
        return handler(func, args, kwargs) if handler else func(*args, **kwargs)


# ---------------------------------------------------------------------------- linear layers


def _is_weight(t) -> bool:
    """A parameter or a view of one (``W.T``): its shape is the model's, the same in every forward,
    so one row times it is the same call whatever the batch."""
    return isinstance(t, torch.nn.Parameter) or isinstance(getattr(t, "_base", None), torch.nn.Parameter)


def _linear(func, args, kwargs):
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    rows = x.reshape(-1, x.shape[-1])  # [N, in]
    out = torch.cat([F.linear(rows[i : i + 1], weight, bias) for i in range(rows.shape[0])])  # [N, out]
    return out.reshape(*x.shape[:-1], weight.shape[0])


def _rows_times(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [..., M, K] @ weight [K, N]`` one row of ``x`` at a time (the shape of ``F.linear``'s)."""
    rows = x.reshape(-1, x.shape[-1])
    out = torch.cat([torch.mm(rows[i : i + 1], weight) for i in range(rows.shape[0])])
    return out.reshape(*x.shape[:-1], weight.shape[-1])


def _addmm(func, args, kwargs):
    bias, mat1, mat2 = args[:3]
    if not kwargs and len(args) == 3 and mat1.dim() == 2 and _is_weight(mat2):
        # GPT-2's Conv1D: bias + x @ W, one token row at a time
        return torch.cat([torch.addmm(bias, mat1[i : i + 1], mat2) for i in range(mat1.shape[0])])
    return _scaled_sum(bias, _matmul(mat1, mat2), kwargs.get("beta", 1), kwargs.get("alpha", 1))


def _scaled_sum(base, product, beta, alpha):
    """``beta * base + alpha * product``, as ``addmm`` / ``baddbmm`` define it (``base`` unread at 0)."""
    product = product if alpha == 1 else product * alpha
    if beta == 0:
        return product
    return (base if beta == 1 else base * beta) + product


def _grouped_mm(func, args, kwargs):
    """Experts' grouped matmul, ``x [T, K]`` against stacked ``w [E, K, N]`` with rows grouped by
    ``offs``: each token row times its expert's matrix alone."""
    a, b = args[0], args[1]
    offs, bias, out_dtype = kwargs.get("offs"), kwargs.get("bias"), kwargs.get("out_dtype")
    if len(args) > 2 or a.dim() != 2 or b.dim() != 3 or offs is None:
        raise ValueError(f"exact mode does not cover {getattr(func, '__name__', func)} on {tuple(a.shape)} x "
                         f"{tuple(b.shape)}: turn exact mode off for this model")
    groups = torch.bucketize(torch.arange(a.shape[0], device=offs.device), offs, right=True).tolist()
    out = a.new_zeros(a.shape[0], b.shape[-1], dtype=out_dtype or a.dtype)  # rows past offs[-1]: unused
    for i, g in enumerate(groups):
        if g < b.shape[0]:
            row = torch.mm(a[i : i + 1], b[g])[0]
            out[i] = row + bias[g] if bias is not None else row
    return out


# ---------------------------------------------------------------------------- other contractions


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` with ``torch.matmul``'s broadcasting: by rows against a weight, else exact sums."""
    if a.dim() == 1 and b.dim() == 1:
        return _matmul(a[None], b[:, None])[0, 0]
    if a.dim() == 1:
        return _matmul(a[None], b).squeeze(-2)
    if b.dim() == 1:
        return _matmul(a, b[:, None]).squeeze(-1)
    if b.dim() == 2 and _is_weight(b):
        return _rows_times(a, b)
    if a.dim() == 2 and _is_weight(a):  # W @ x (Mamba's dt_proj): x's columns are the rows
        return _rows_times(b.mT, a.mT).mT
    return exact_einsum("...mk,...kn->...mn", a, b)


def _matmul_op(func, args, kwargs):
    a, b = (args[1], args[0]) if getattr(func, "__name__", "") == "__rmatmul__" else args[:2]
    return _matmul(a, b)


def _baddbmm(func, args, kwargs):
    base, b1, b2 = args[:3]
    return _scaled_sum(base, _matmul(b1, b2), kwargs.get("beta", 1), kwargs.get("alpha", 1))


def _einsum(func, args, kwargs):
    operands = args[1:]
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    return exact_einsum(args[0], *operands)


def exact_einsum(equation: str, *operands: torch.Tensor) -> torch.Tensor:
    """``torch.einsum`` as exact elementwise products summed over the contracted letters in a fixed
    pairwise order: every result element is the same sum whatever the sizes of the others."""
    specs, out = _parse_einsum(equation, [t.dim() for t in operands])
    contracted = "".join(c for c in dict.fromkeys("".join(specs)) if c not in out)
    letters = out + contracted
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in operands])
    acc = torch.promote_types(dtype, torch.float32)  # bf16 / fp16 products and sums kept in fp32
    views = [_aligned(t.to(acc), spec, letters) for spec, t in zip(specs, operands, strict=True)]
    sizes = [max(v.shape[i] for v in views) for i in range(len(letters))]
    return _contract(views, sizes, len(out), bool(contracted)).to(dtype)


def _contract(views: list[torch.Tensor], sizes: list[int], n_out: int, contracted: bool) -> torch.Tensor:
    """The products of ``views`` (aligned, result letters first) summed over the contracted ones,
    never more than ``PRODUCT_LIMIT`` products at once: chunked along the first result letter, and
    where one slice of it is still too big, one slice at a time along the next. Each element's sum
    is the same pairwise sum whatever the chunks."""
    if n_out == 0:
        return _pairwise_sum(_product(views, sizes).reshape(-1))
    rest = math.prod(sizes[1:])
    if rest > PRODUCT_LIMIT and n_out > 1:
        return torch.stack([_contract([v[i] if v.shape[0] > 1 else v[0] for v in views], sizes[1:], n_out - 1, contracted)
                            for i in range(sizes[0])])
    step = max(1, PRODUCT_LIMIT // max(1, rest))
    parts = []
    for i in range(0, sizes[0], step):
        chunk = [v[i : i + step] if v.shape[0] > 1 else v for v in views]
        prod = _product(chunk, [min(step, sizes[0] - i), *sizes[1:]])
        parts.append(_pairwise_sum(prod.reshape(*prod.shape[:n_out], -1)) if contracted else prod)
    return torch.cat(parts)


def _parse_einsum(equation: str, ndims: list[int]) -> tuple[list[str], str]:
    """Input and output letter strings with ``...`` spelled out as letters of their own."""
    equation = equation.replace(" ", "")
    lhs, arrow, out = equation.partition("->")
    specs = lhs.split(",")
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz" if c not in equation]
    rank = {i: n - len(s) + 3 for i, (s, n) in enumerate(zip(specs, ndims, strict=True)) if "..." in s}
    ellipsis = "".join(free[: max(rank.values(), default=0)])  # right-aligned, as broadcasting is
    specs = [s.replace("...", ellipsis[len(ellipsis) - rank[i]:]) if i in rank else s for i, s in enumerate(specs)]
    for s in specs:
        if len(set(s)) != len(s):
            raise ValueError(f"exact mode does not cover einsum with a repeated index ({equation!r}): "
                             "turn exact mode off for this model")
    if arrow:
        return specs, out.replace("...", ellipsis)
    once = sorted(c for c in set("".join(specs)) if "".join(specs).count(c) == 1 and c not in ellipsis)
    return specs, ellipsis + "".join(once)


def _aligned(t: torch.Tensor, spec: str, letters: str) -> torch.Tensor:
    """``t`` with its dimensions in ``letters``' order, size 1 where it has no such letter."""
    present = [c for c in letters if c in spec]
    t = t.permute([spec.index(c) for c in present])
    return t.reshape([t.shape[present.index(c)] if c in spec else 1 for c in letters])


def _product(views: list[torch.Tensor], sizes: list[int]) -> torch.Tensor:
    return functools.reduce(torch.mul, views).expand(sizes)


def _pairwise_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum over the last dimension in an order fixed by its length alone: element ``i`` plus
    element ``i + n/2``, repeated, with elementwise adds (no reduction kernel to pick an order)."""
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        pair = x[..., :half] + x[..., half : 2 * half]
        x = torch.cat([pair, x[..., 2 * half :]], dim=-1) if x.shape[-1] % 2 else pair
    return x[..., 0]


def _conv1d(func, args, kwargs):
    """``F.conv1d`` as an exact contraction over (input channels of the group, kernel taps) of
    each output position's window: no batch or length reaches a result element."""
    p = dict(zip(("input", "weight", "bias", "stride", "padding", "dilation", "groups"), args, strict=False), **kwargs)
    x, w, bias, groups = p["input"], p["weight"], p.get("bias"), p.get("groups", 1)
    stride, dilation, padding = (_single(p.get(k, d)) for k, d in (("stride", 1), ("dilation", 1), ("padding", 0)))
    batched = x.dim() == 3
    x = x if batched else x[None]
    taps = w.shape[-1]
    span = dilation * (taps - 1) + 1
    if padding == "same":
        left = (span - 1) // 2
        x = F.pad(x, (left, span - 1 - left))
    elif padding != "valid" and padding:
        x = F.pad(x, (padding, padding))
    windows = x.unfold(-1, span, stride)[..., ::dilation]  # [B, C, L, taps]
    b, c, length, _ = windows.shape
    windows = windows.reshape(b, groups, c // groups, length, taps)
    out = exact_einsum("bgclk,gock->bgol", windows, w.reshape(groups, -1, c // groups, taps))
    out = out.reshape(b, -1, length)
    out = out + bias[:, None] if bias is not None else out
    return out if batched else out[0]


def _single(v):
    return v[0] if isinstance(v, (tuple, list)) else v


# ---------------------------------------------------------------------------- elementwise math on the CPU

# ops whose CPU vector and scalar formulas may round differently (by name: the function, the method
# and the in-place method share it); add, mul, div, sqrt, rsqrt are correctly rounded in both
LANE_DEPENDENT = frozenset({
    "sigmoid", "special_expit", "silu", "gelu", "softplus", "mish", "elu", "selu", "celu", "log_sigmoid",
    "hardswish", "hardsigmoid", "tanh", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos",
    "tan", "asin", "acos", "atan", "atan2", "arctan2", "sinh", "cosh", "asinh", "acosh", "atanh", "erf", "erfc",
    "erfinv", "logit", "lgamma", "digamma", "pow", "rpow", "float_power", "sinc", "xlogy",
})
EXACT_POWERS = (1, 2, 0.5)  # x ** 2 is x * x on both paths (RMSNorm's), x ** 0.5 a sqrt


def _lanewise(func, args, kwargs):
    """An elementwise op on every element through the SIMD path: the tensors broadcast, flattened,
    zero-padded to a multiple of ``LANES`` and fed in chunks of at most ``CHUNK`` elements."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    name = func.__name__.strip("_")
    if (not tensors or "out" in kwargs or any(isinstance(v, torch.Tensor) for v in kwargs.values())
            or not any(t.device.type == "cpu" and t.is_floating_point() for t in tensors)
            or name == "pow" and len(args) > 1 and not isinstance(args[1], torch.Tensor) and args[1] in EXACT_POWERS):
        return func(*args, **kwargs)
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    numel = math.prod(shape)
    padded = -(-numel // LANES) * LANES
    flat = [F.pad(a.expand(shape).reshape(-1), (0, padded - numel)) if isinstance(a, torch.Tensor) else a
            for a in args]
    chunks = [func(*(a[i : i + CHUNK] if isinstance(a, torch.Tensor) else a for a in flat), **kwargs)
              for i in range(0, padded, CHUNK)]
    out = torch.cat(chunks)[:numel].reshape(shape)
    return args[0].copy_(out) if _in_place(func, args, kwargs) else out


def _in_place(func, args, kwargs) -> bool:
    """``x.sigmoid_()``, ``x **= y``, ``F.silu(x, inplace=True)`` (a bool argument of these ops is
    only ever ``inplace``): the result goes where the caller's tensor is."""
    name = func.__name__
    return name.endswith("_") and not name.endswith("__") or bool(kwargs.get("inplace")) or \
        any(a is True for a in args[1:])


# ---------------------------------------------------------------------------- the routing


def _routes() -> dict:
    routes = {F.linear: _linear, torch.einsum: _einsum, F.conv1d: _conv1d}
    for op in (torch.addmm, torch.Tensor.addmm):
        routes[op] = _addmm
    for op in (torch.baddbmm, torch.Tensor.baddbmm):
        routes[op] = _baddbmm
    for op in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__, torch.mm,
               torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.mv, torch.Tensor.mv):
        routes[op] = _matmul_op
    for op in (getattr(torch, "_grouped_mm", None), getattr(F, "grouped_mm", None)):
        if op is not None:
            routes[op] = _grouped_mm
    return routes


_ROUTES: dict = {}


def _handler(func):
    """The exact form of ``func``, or None to run it as it is (decided once per function)."""
    if not _ROUTES:
        _ROUTES.update(_routes())
    try:
        return _ROUTES[func]
    except KeyError:
        name = getattr(func, "__name__", "").strip("_")
        _ROUTES[func] = _lanewise if name in LANE_DEPENDENT else None
        return _ROUTES[func]
    except TypeError:  # unhashable
        return None


# ---------------------------------------------------------------------------- attention


def exact_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """Attention one query at a time over its visible keys. ``query`` ``[B, H, T, D]``, ``key`` /
    ``value`` ``[B, Hkv, S, D]``, ``attention_mask`` additive ``[B, 1, T, S]`` (0: visible).
    Returns ``([B, T, H, D], None)`` as transformers' attention functions do. Its ops already have
    the same shapes for a query in any forward, so they run outside exact mode's routing."""
    if kwargs.get("s_aux") is not None:
        raise ValueError("exact mode does not support attention sinks (gpt-oss): turn exact mode off for this model")
    with torch._C.DisableTorchFunction():
        return _per_query(query, key, value, attention_mask, scaling, kwargs.get("softcap")), None


def _per_query(query, key, value, attention_mask, scaling, softcap):
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
    return out


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
        with ExactOps():
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


def invariance(lm, exact: str | bool = "rows") -> Invariance:
    """Row 0's logits beside 1 and 2 other rows, and a token alone vs at every offset of 4-, 16-
    and 32-token windows, after a shared prefix, on exact mode's route ``exact`` ("rows", "fixed";
    True: "rows"; False: the fast path) (``engine.tools.gpu_check`` reports the same on a GPU).
    ``lm`` is a ``LoadedModel``; its current run's settings are kept."""
    t0 = time.perf_counter()
    saved = lm.exact, lm.compiled, lm.compile_why
    route = "rows" if exact is True else exact
    lm.exact = route
    if route != "fixed":  # the fixed route is checked on the run's own step: compiled when the run compiles
        lm.compiled = None
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
