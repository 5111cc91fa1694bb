"""Compiled fixed-shape steps: the model's forward through ``torch.compile`` over a fixed cache.

Every step a decode loop takes is ``rows x width`` tokens over a :class:`SlotCache` built with
``fixed=True`` (attention reads the whole preallocated buffer, the mask hides what is not there).
Widths are padded up to a bucket (1, 2, 4, 8, 16, 32, 64: the padding writes slots past the real
tokens, which causality hides and the step then gives back), rows are the live rows; so a run
meets a handful of shapes, each compiled once per model and shape and, on CUDA, replayed as a CUDA
graph (``mode="reduce-overhead"``). The cache's capacity is not part of a compiled shape (it is a
symbolic dimension: ``engine.runtime.static``), so a run whose budgets need a larger cache reuses
the graphs; its first call at a new capacity (a CUDA graph capture) still runs before its clock.
Wider forwards (a prompt's prefill) run eagerly on the same cache, as ``generate()`` does.

``--compile``: ``on`` compiles, ``off`` runs the eager static path, ``auto`` compiles on CUDA
only. On the CPU a step compiled by inductor is faster (see docs/BENCHMARKS.md) but each shape
takes tens of seconds to compile, which no single run of the studio earns back, so ``auto`` stays
eager there. Compilation is skipped, with the reason, where it cannot be exact or cannot work:
exact mode (its kernels are Python), models with recurrent states (a padded token would enter
the state), and torch builds or platforms where ``torch.compile`` is unavailable (ZeroGPU
Spaces). Compile time is counted apart from any run's latency.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field

import torch

COMPILE_MODES = ("auto", "on", "off")
BUCKETS = (1, 2, 4, 8, 16, 32, 64)


def bucket(width: int) -> int | None:
    """The compiled width a ``width``-token step runs at (None: wider than any bucket, run eagerly)."""
    return next((b for b in BUCKETS if b >= width), None)


def compile_reason(mode: str, device: torch.device, recurrent: bool, exact: bool) -> str | None:
    """Why steps are not compiled under ``mode`` (None: they are)."""
    if mode not in COMPILE_MODES:
        raise ValueError(f"compile must be one of {', '.join(COMPILE_MODES)}, not {mode!r}")
    if mode == "off":
        return "--compile off"
    if mode == "auto" and device.type != "cuda":
        return f"auto compiles on CUDA only (on {device.type} a compile costs more than a run saves)"
    if exact:
        return "exact mode runs its own Python kernels"
    if os.environ.get("SPACES_ZERO_GPU"):
        return "ZeroGPU Spaces do not support torch.compile"
    if recurrent:
        return "the model has recurrent states (a padded token would enter them)"
    if not _compiler_available():
        return "torch.compile is unavailable here"
    if device.type == "cpu" and not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
        return "no C++ compiler for inductor on the CPU"
    return None


def _compiler_available() -> bool:
    try:
        import torch._dynamo
        return torch._dynamo.is_dynamo_supported()
    except Exception:  # noqa: BLE001 - any import or platform failure means no compiler
        return False


@dataclass
class CompiledSteps:
    """One model's compiled step function and what compiling it has cost so far."""

    model: torch.nn.Module
    cuda_graphs: bool
    backend: str = "inductor"  # tests pass "eager": dynamo's tracing and guards without inductor's compile time
    shapes: dict[tuple[int, int, int, int], float] = field(default_factory=dict)  # (rows, width, capacity, buffer rows) -> s
    _fn: object = None

    def __post_init__(self) -> None:
        import torch._dynamo

        # a run meets rows (1 + drafts) x width buckets shapes, more over runs of other sizes
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 128)
        self._fn = torch.compile(self.model, dynamic=False, fullgraph=False, backend=self.backend,
                                 mode="reduce-overhead" if self.cuda_graphs and self.backend == "inductor" else None)

    @property
    def compile_seconds(self) -> float:
        return sum(self.shapes.values())

    def __call__(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        """Logits ``[rows, width, V]`` of one fixed-shape step (a fresh tensor, safe to keep)."""
        shape = (*ids.shape, cache.capacity, cache.rows_capacity)  # the buffers' row count is guarded too
        first = shape not in self.shapes
        # fresh inputs with standard strides, made in inference mode: guards tell apart strides (an
        # expanded row of positions) and inference tensors from normal ones, and either would recompile
        ids, positions = (torch.empty(x.shape, dtype=x.dtype, device=x.device).copy_(x) for x in (ids, positions))
        torch._dynamo.mark_dynamic(mask, 1)  # the capacity, symbolic as the buffers' (engine.runtime.static)
        start = time.perf_counter()
        if self.cuda_graphs:
            torch.compiler.cudagraph_mark_step_begin()
        logits = self._fn(input_ids=ids, cache=cache, position_ids=positions, attention_mask=mask, use_cache=True,
                          logits_to_keep=ids.shape[1]).logits.clone()
        if first:
            if ids.device.type == "cuda":
                torch.cuda.synchronize(ids.device)
            self.shapes[shape] = time.perf_counter() - start
        return logits
