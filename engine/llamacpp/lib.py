"""The few calls of llama.cpp's C API this runtime makes (through llama-cpp-python's ctypes
bindings), wrapped once: a model loaded from a GGUF file and contexts on it, whose sequences are
decoded in batches (one sequence id per row), copied and cut.

llama-cpp-python is optional (``requirements-llama.txt`` builds it from source); :func:`missing`
says why it cannot be used, and nothing here imports it before it is asked for.

One load setting is not llama.cpp's default: **extra buffer types are off**
(``llama_model_params.use_extra_bufts``). With them on, llama.cpp repacks weights for the CPU's
matrix units at load (AMX on this project's CI machines), and on those machines ``llama_decode``
then segfaults on SmolLM2's Q4_1 weights (measured with llama-cpp-python 0.3.36, docs/BENCHMARKS.md
"llama.cpp"); a crash in native code cannot be caught, so it is not risked.
``SSR_LLAMA_EXTRA_BUFTS=1`` turns them back on, for a machine where they are known to work.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import weakref
from dataclasses import dataclass

import numpy as np

# How contexts compute attention, chosen so that a sequence's logits do not depend on the batch around it (what
# SSR's exactness needs; the probe checks it on every loaded model). llama.cpp's CPU attention has three paths, two
# of them picked by the batch's shape (ggml-cpu ops.cpp, flash_attn_ext), each measured here on SmolLM2 Q4_1
# (llama-cpp-python 0.3.36) to give other logits than one-token decoding (by 0.3-1.7):
# * without flash attention, K.Q and V.softmax are matrix products whose kernels follow the batch width: every
#   token of a multi-token batch differs;
# * with it and an f16 / f32 KV cache, a lone token over 512 or more cells splits the cells across threads (and
#   merges the parts), and 64 tokens or more go through query tiles.
# With flash attention and a q8_0 KV cache, every batch takes the per-token path (one query row at a time over
# every cell, in order): bit-identical whatever the batch, at the speed of llama.cpp's defaults (f16 KV, no flash
# attention: 10.3 against 10.5 ms a token at 200-600 tokens of context), in half their KV memory. Micro-batches
# of 32 tokens keep any batch below the 64-query tiles.
KV = "q8_0"
KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}  # ggml_type ids
UBATCH = 32
INSTALL = "pip install -r requirements-llama.txt (builds llama-cpp-python from source, ~4 min on 2 cores)"


class LlamaError(RuntimeError):
    """llama.cpp refused something (a load, a decode): the message says what."""


@functools.lru_cache(maxsize=1)
def missing() -> str | None:
    """Why the llama.cpp runtime cannot be used here (None: it can)."""
    try:
        import llama_cpp  # noqa: F401
    except (ImportError, OSError) as err:  # OSError: the package is there, its shared library is not loadable
        return f"llama-cpp-python is not installed ({str(err).splitlines()[0]}): {INSTALL}"
    return None


@functools.lru_cache(maxsize=1)
def api():
    """llama-cpp-python's low-level module, the backend initialised once (LlamaError where missing)."""
    why = missing()
    if why:
        raise LlamaError(why)
    import llama_cpp

    logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)  # llama.cpp's load logs: errors only
    llama_cpp.llama_backend_init()
    return llama_cpp


def version() -> str:
    import llama_cpp

    return f"llama-cpp-python {llama_cpp.__version__}"


@dataclass(frozen=True)
class Item:
    """One token of a batch: its id, its position in its sequence, the sequence, and whether its
    logits are read."""

    token: int
    pos: int
    seq: int
    logits: bool = True


class Model:
    """A GGUF file loaded by llama.cpp (weights only: contexts hold the KV caches)."""

    def __init__(self, path: str) -> None:
        L = api()
        params = L.llama_model_default_params()  # every layer on the build's device (a CPU build: the CPU)
        params.use_extra_bufts = os.environ.get("SSR_LLAMA_EXTRA_BUFTS") == "1"  # see the module docstring
        self.ptr = L.llama_model_load_from_file(path.encode(), params)
        if not self.ptr:
            raise LlamaError(f"llama.cpp could not load {path} (not a GGUF file it reads, or an architecture it lacks)")
        self.path = path
        _finalizer(self, L.llama_model_free, self.ptr)  # when the model is dropped (its contexts hold it until then)
        vocab = L.llama_model_get_vocab(self.ptr)
        self.vocab_size = int(L.llama_vocab_n_tokens(vocab))
        self.parameters = int(L.llama_model_n_params(self.ptr))
        self.context = int(L.llama_model_n_ctx_train(self.ptr))
        buf = ctypes.create_string_buffer(256)
        L.llama_model_desc(self.ptr, buf, len(buf))
        self.desc = buf.value.decode(errors="replace")  # "llama 135M Q4_1"


class Context:
    """One llama.cpp context on ``model``: a KV cache of ``cells`` cells shared by up to ``seqs``
    sequences (unified: a copied sequence shares its cells, nothing is copied), decoded in batches
    of up to ``batch`` tokens on ``threads`` threads."""

    def __init__(self, model: Model, cells: int, seqs: int, threads: int, batch: int = 512, ubatch: int | None = None,
                 kv: str = KV, flash: bool = True) -> None:
        L = api()
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = cells, batch, ubatch or UBATCH, seqs
        cp.n_threads = cp.n_threads_batch = threads
        cp.kv_unified = True  # forks share cells (seq_cp adds a sequence id to them)
        # a full-size cache for the sliding-window layers too (llama.cpp's default sizes it to the window, and a
        # verify running past it prunes cells a rollback needs again: ggml-org/llama.cpp#13194); llama.cpp still
        # reuses cells past a window, which the probe's long-context check meets (forks, rollbacks, departures)
        cp.swa_full = True
        cp.no_perf = True
        cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cp.type_k = cp.type_v = KV_TYPES[kv]
        self.model, self.cells, self.seqs, self.batch_size = model, cells, seqs, batch
        self.ptr = L.llama_init_from_model(model.ptr, cp)
        if not self.ptr:
            raise LlamaError(f"llama.cpp could not make a context of {cells} cells and {seqs} sequences")
        self.memory = L.llama_get_memory(self.ptr)
        self._batch = L.llama_batch_init(batch, 0, 1)
        # freed when dropped or closed; the model (held here) outlives it
        self._free = _finalizer(self, _free_context, L, self.ptr, self._batch, model)

    def _open(self) -> None:
        if not self.ptr:
            raise LlamaError("this llama.cpp context was closed")

    def decode(self, items: list[Item]) -> np.ndarray:
        """Decode ``items`` (in batches of at most :attr:`batch_size`); the logits of the items that
        ask for them, in order, ``[n, V]`` float32 (a copy: the next decode overwrites llama.cpp's)."""
        self._open()
        L, b, V = api(), self._batch, self.model.vocab_size
        out = []
        for start in range(0, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            for i, it in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i] = it.token, it.pos, 1
                b.seq_id[i][0] = it.seq
                b.logits[i] = it.logits
            b.n_tokens = len(chunk)
            rc = L.llama_decode(self.ptr, b)
            if rc != 0:
                raise LlamaError(f"llama_decode returned {rc} on a batch of {len(chunk)} tokens "
                                 + ("(no free cells left in the KV cache)" if rc == 1 else ""))
            n = sum(it.logits for it in chunk)
            if n:
                out.append(np.ctypeslib.as_array(L.llama_get_logits(self.ptr), shape=(n, V)).copy())
        if len(out) == 1:
            return out[0]
        return np.concatenate(out) if out else np.zeros((0, V), dtype=np.float32)

    def seq_cp(self, src: int, dst: int) -> None:
        self._open()
        api().llama_memory_seq_cp(self.memory, src, dst, -1, -1)

    def seq_rm(self, seq: int, start: int = 0) -> None:
        """Drop sequence ``seq``'s cells from position ``start`` on (0: the whole sequence)."""
        self._open()
        if not api().llama_memory_seq_rm(self.memory, seq, start, -1):
            raise LlamaError(f"llama.cpp could not remove sequence {seq}'s positions from {start} on")

    def clear(self) -> None:
        self._open()
        api().llama_memory_clear(self.memory, True)

    def seq_bytes(self, seq: int) -> int:
        """Bytes of sequence ``seq``'s state (its KV cells, as llama.cpp would save them)."""
        self._open()
        return int(api().llama_state_seq_get_size(self.ptr, seq))

    def close(self) -> None:
        self._free()
        self.ptr = self.memory = None


def _finalizer(owner, free, *args) -> weakref.finalize:
    """``free(*args)`` once: when ``owner`` is dropped or closed, not at interpreter exit (the
    process's end frees native memory, and the library may be gone by then)."""
    fin = weakref.finalize(owner, free, *args)
    fin.atexit = False
    return fin


def _free_context(L, ctx, batch, model) -> None:  # ``model``: kept alive until the context goes
    L.llama_batch_free(batch)
    L.llama_free(ctx)
