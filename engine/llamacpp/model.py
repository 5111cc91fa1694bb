"""A GGUF model run by llama.cpp, seen from the methods as any in-process model (``StepModel``).

The tokenizer, chat template and think markers come from the file's one conversion to a model
folder (``engine.runtime.gguf.local_folder``: the same ids the torch runtime uses; llama.cpp
reads the same vocabulary from the file); every forward runs in llama.cpp. A cache is a llama.cpp
context (:class:`SeqCache`): its rows are sequences, so a fork shares the prefix's cells and a
rollback removes a sequence's positions (``engine.llamacpp.rows``). What SSR relies on (the same
logits for a sequence whatever the batch around it) is measured on the loaded model at load
(``engine.llamacpp.probe``), and a method that needs it is refused where it does not hold.

>>> lm = load_llama("smollm2-135m-instruct", threads=2)
>>> lm.step_mode
'llama.cpp (llama 256M Q4_1, q8_0 KV, flash attention, cpu, 2 threads)'
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from engine.llamacpp import lib
from engine.llamacpp.rows import SeqRows
from engine.runtime.cache import CacheLayout, Checkpoint, crop
from engine.runtime.capabilities import UNPROBED, Capabilities
from engine.runtime.gguf import GGUFError, Progress, gguf_file, is_gguf, local_folder
from engine.runtime.model import (
    Compiling,
    MemoryRefused,
    ModelLoadError,
    ThinkMarkers,
    chat_prompt_ids,
    check_fits,
    eos_ids,
    find_markers,
    require_markers,
    resolve_model_path,
)
from engine.runtime.rope import Rope
from engine.steps import LLAMA

RUNTIME = LLAMA
SEQS = 64  # sequences a context holds: the main row, up to 62 drafts, and the parked cells (engine.llamacpp.rows)
CELL_STEP = 256  # contexts are made in multiples of this many cells, so runs of similar sizes reuse one


class SeqCache:
    """A llama.cpp context as a cache: :attr:`fed` tokens in sequence 0 (the only row a cache
    has outside a row batch). It fits what ``engine.runtime.cache`` reads of a cache: a crop
    (``set_length``) removes sequence 0's positions past it, a checkpoint holds no state (a
    rollback is a crop), :attr:`nbytes` is the KV cells' size."""

    counts_tokens = True  # engine.runtime.cache.seq_length reads ``fed``
    layers = ()  # no recurrent states to checkpoint

    def __init__(self, ctx: lib.Context, cell_bytes: float) -> None:
        self.ctx, self.fed = ctx, 0
        self.nbytes = int(ctx.cells * cell_bytes)  # the context's KV cells (allocated: as a SlotCache reports)

    def set_length(self, length: int) -> None:
        self.ctx.seq_rm(0, length)
        self.fed = length


class LlamaModel:
    """A GGUF file on llama.cpp: what the methods need of an in-process model (``StepModel``)."""

    device = torch.device("cpu")  # where the loops' tensors (logits) live; llama.cpp keeps its own buffers
    rope = Rope(None, None)  # llama.cpp applies the file's RoPE itself, the same in every batch (the probe checks)
    layout = CacheLayout(sliding=False, recurrent=False)  # rows are sequences: each keeps what it keeps, no holes
    holes_ok = True  # rows may keep different counts (a sequence's positions are removed, not hidden)
    learned_positions = False  # a context's cells are not positions: a shared prefix fits whatever the model
    forks_stay = True  # a departed draft's cells are parked, not freed (engine.llamacpp.rows: the main row's order)

    def __init__(self, native: lib.Model, tokenizer, model_id: str, markers: ThinkMarkers | None,
                 eos_ids: frozenset[int], threads: int, kv: str = lib.KV, flash: bool = True) -> None:
        self.native, self.tokenizer, self.model_id, self.markers = native, tokenizer, model_id, markers
        self.eos_ids = eos_ids
        self.threads = threads
        self.kv, self.flash = kv, flash  # the contexts' KV cache type and attention (engine.llamacpp.lib: why these)
        self.model = None  # no transformers module: the peers that call generate() are refused (engine.registry)
        self.num_parameters = native.parameters
        self.context_length = native.context or None
        self.cell_bytes = 0.0  # KV bytes per cell, measured by the probe
        self.capabilities: Capabilities = UNPROBED  # what the probe measured (engine.llamacpp.probe)
        self.exact: str | bool = False
        self.max_cache_bytes: int | None = None  # an operator's bound on one context's KV cells (app --max-cache-gb)
        self._contexts: dict[tuple[int, str], lib.Context] = {}  # by (cells, role), reused

    # ------------------------------------------------------------------ what the loops read
    @property
    def dtype(self) -> str:
        return self.native.desc.rsplit(" ", 1)[-1]  # the file's quantization ("Q4_1")

    @property
    def backend(self) -> str:
        """Where the model runs, as the run log's device column says it."""
        return f"{RUNTIME} cpu"

    @property
    def step_mode(self) -> str:
        exact = "; exact: batch-invariant as measured at load" if self.exact else ""
        attention = f"{self.kv} KV" + (", flash attention" if self.flash else "")
        return f"{RUNTIME} ({self.native.desc}, {attention}, cpu, {self.threads} threads){exact}"

    def prompt_ids(self, user_text: str, thinking: bool = True) -> list[int]:
        return chat_prompt_ids(self.tokenizer, self.markers, user_text, thinking, self.model_id)

    def require_markers(self) -> ThinkMarkers:
        return require_markers(self.markers, self.model_id)

    def check_fits(self, prompt_tokens: int, new_tokens: int) -> None:
        check_fits(self.context_length, self.model_id, prompt_tokens, new_tokens)

    def begin_run(self, exact: str | bool = False, compile: str = "off") -> None:
        """``exact``: held where the probe found every batch shape bit-identical to one-token decoding
        (llama.cpp has one kernel route: nothing to switch), refused otherwise; ``compile`` "on" is
        refused (llama.cpp runs its own kernels; "auto" and "off" run them)."""
        if compile == "on":
            raise ValueError("compiled steps are torch's (torch.compile): on the llama.cpp runtime use compile 'auto' "
                             "or 'off'")
        if exact:
            from engine.llamacpp.probe import exact_refusal

            why = exact_refusal(self)
            if why:
                raise ValueError(why)
        self.exact = "measured" if exact else False

    def prepare_steps(self, capacity: int, rows: int = 1, row_width: int = 1) -> Iterator[Compiling]:
        """Nothing to compile (llama.cpp's graphs are built per batch); a run of more rows than a
        context has sequences for is refused here, before it starts."""
        if rows > SEQS - 1:
            raise ValueError(f"a run of {rows - 1} drafts on llama.cpp: its contexts hold {SEQS} sequences (the main "
                             f"row's, {SEQS - 2} drafts' and one for departed drafts' cells); run at most {SEQS - 2} "
                             "drafts")
        return iter(())

    # ------------------------------------------------------------------ caches and forwards
    def new_cache(self, capacity: int = 256, rows: int = 1, role: str = "") -> SeqCache:
        """An empty context of at least ``capacity`` cells per row (rounded up, reused by later runs
        of the same size and ``role``): ``rows`` rows copied at a fork would each hold their own
        tokens past the prefix, which the context's shared cells hold once, so this is room to spare."""
        cells = -(-capacity * rows // CELL_STEP) * CELL_STEP
        key = (cells, role)
        ctx = self._contexts.get(key)
        need = int(cells * self.cell_bytes)
        if self.max_cache_bytes is not None and need > self.max_cache_bytes:
            raise MemoryRefused(f"this run's KV cache would take {need / 2**30:.2f} GB ({cells} cells of {self.kv}), beyond "
                                f"this studio's --max-cache-gb ({self.max_cache_bytes / 2**30:.2f} GB): lower the budgets "
                                "or the number of drafts")
        if ctx is None:
            if len(self._contexts) >= 4:  # keep a few sizes, not every size a session met
                self._contexts.pop(next(iter(self._contexts))).close()
            ctx = self._contexts[key] = self.context(cells)
        ctx.clear()
        return SeqCache(ctx, self.cell_bytes)

    def context(self, cells: int, seqs: int = SEQS, batch: int = 512, ubatch: int | None = None) -> lib.Context:
        """A new llama.cpp context on this model, with its threads, KV type and attention."""
        return lib.Context(self.native, cells, seqs, self.threads, batch, ubatch, self.kv, self.flash)

    def step_logits(self, tokens: list[int], cache: SeqCache, start: int, last_only: bool = False) -> torch.Tensor:
        """Logits ``[T, V]`` for ``tokens`` appended to sequence 0 at ``start`` (``[1, V]``, the last
        token's, with ``last_only``: a prefill's other logits are not computed)."""
        if cache.fed > start:
            crop(cache, start)
        n = len(tokens)
        items = [lib.Item(t, start + i, 0, not last_only or i == n - 1) for i, t in enumerate(tokens)]
        logits = cache.ctx.decode(items)
        cache.fed = start + n
        return torch.from_numpy(logits)

    def forward(self, input_ids: torch.Tensor, cache: SeqCache, start: int, positions: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[1, T, V]`` for one row's ``input_ids`` ``[1, T]`` (rows of several sequences run
        through :meth:`row_batch`; positions are the sequence's own, masks are llama.cpp's)."""
        if input_ids.shape[0] != 1 or positions is not None or attention_mask is not None:
            raise NotImplementedError("on llama.cpp, rows run through LlamaModel.row_batch (one sequence per row)")
        return self.step_logits(input_ids[0].tolist(), cache, start)[None]

    def row_batch(self, cache: SeqCache, length: int, ids: list[int] | None = None, shared: bool = False) -> SeqRows:
        """The rows of ``cache``, sequence 0 holding ``length`` tokens: forks share cells whatever ``shared``."""
        return SeqRows(cache, length)

    def unshared(self) -> str | None:
        """Drafts always share the prefix's cells here (a unified KV cache: ``seq_cp`` copies nothing)."""
        return None

    def rewind(self, cache: SeqCache, ckpt: Checkpoint, kept: list[int]) -> None:
        """Back to ``ckpt`` plus ``kept``: a crop (llama.cpp keeps the positions kept)."""
        crop(cache, ckpt.length + len(kept))

    def forwards(self):
        return contextlib.nullcontext()

    def close(self) -> None:
        for ctx in self._contexts.values():
            ctx.close()
        self._contexts.clear()


def load_llama(name: str, threads: int | None = None, progress: Progress | None = None, kv: str = lib.KV,
               flash: bool = True) -> LlamaModel:
    """``name`` (a registry model, a ``.gguf`` file, a folder holding one, ``HUB_ID:FILE.gguf``) on
    llama.cpp with ``threads`` threads (default: torch's), probed at load (``engine.llamacpp.probe``);
    ``kv`` and ``flash``: the KV cache type and flash attention (``engine.llamacpp.lib`` says why the
    defaults: another choice is measured by the probe like any, and SSR refused where it is not exact).
    :class:`ModelLoadError` where llama-cpp-python is missing or the source is not a GGUF file."""
    from transformers import AutoTokenizer, GenerationConfig

    from engine.llamacpp.probe import probe

    why = lib.missing()
    if why:
        raise ModelLoadError(f"the llama.cpp runtime is not available: {why}")
    if kv not in lib.KV_TYPES:
        raise ModelLoadError(f"unknown KV cache type {kv!r}; choose from {', '.join(lib.KV_TYPES)}")
    path, preset = resolve_model_path(name)
    if not is_gguf(path):
        raise ModelLoadError(f"the llama.cpp runtime runs GGUF files: {name!r} is not one (name a .gguf file, a folder "
                             "holding one, HUB_ID:FILE.gguf, or a registry model: smollm2-135m-instruct, gemma-3-270m); "
                             "run it on the transformers runtime")
    try:
        file = gguf_file(path)
        folder = local_folder(path, progress)  # the tokenizer and template, converted once (and kept)
    except GGUFError as err:
        raise ModelLoadError(str(err)) from None
    if progress is not None:
        progress(f"loading {Path(file).name} on llama.cpp ({lib.version()})")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    try:
        generation = GenerationConfig.from_pretrained(folder)
    except OSError:  # the folder holds none
        generation = None
    try:
        native = lib.Model(str(file))
    except lib.LlamaError as err:
        raise ModelLoadError(str(err)) from None
    lm = LlamaModel(native, tokenizer, name, find_markers(tokenizer, preset), eos_ids(tokenizer, generation),
                    threads or torch.get_num_threads(), kv, flash)
    if lm.native.vocab_size < len(tokenizer):
        raise ModelLoadError(f"{name}: llama.cpp reads {lm.native.vocab_size} tokens from the file, the tokenizer "
                             f"{len(tokenizer)}")
    probe(lm, progress)
    return lm
