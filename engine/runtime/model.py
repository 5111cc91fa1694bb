"""Loading a reasoning model, finding its think markers, templating prompts, running forwards.

>>> lm = load_model("assets/models/tiny-reasoner")          # a local folder or a Hub id
>>> ids = lm.prompt_ids("Write a Python class Garden. ...")  # templated, think block opened

The model is used only through its public ``forward``; its caches (every layer kind, forks,
rollbacks) come from the runtime layer, ``engine.runtime``. The cache length is the one explicit
position every decode loop tracks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.presets import BUNDLED, BUNDLED_DIR, PRESETS, Preset
from engine.runtime import attention, fixed
from engine.runtime.batch import RowBatch, rotary, unshared
from engine.runtime.cache import (
    CacheLayout,
    Checkpoint,
    available_bytes,
    crop,
    layout,
    new_cache,
    own_cache_class,
    restore,
    seq_length,
    take_rows,
)
from engine.runtime.capabilities import UNPROBED, Capabilities
from engine.runtime.compiled import BUCKETS, CompiledSteps, bucket, compile_reason
from engine.runtime.exact import ExactRefused, Invariance, exact_forwards, invariance
from engine.runtime.gguf import GGUFError, Progress, is_gguf, local_folder
from engine.runtime.markers import ThinkMarkers, chat_prompt_ids, find_markers
from engine.runtime.rope import rope_of
from engine.runtime.tokenizer_folder import load_tokenizer
from engine.steps import COMPILED, EAGER


class ModelLoadError(RuntimeError):
    """A model could not be loaded; the message names the id and says why, without a traceback."""


class MemoryRefused(ValueError):
    """A run whose caches would not fit: the message gives the estimate and the limit."""


class SSRUnsupportedError(ValueError):
    """The model has no end-of-thinking marker, so SSR cannot fork a draft answer."""


@dataclass(frozen=True)
class Compiling:
    """How far preparing a run's step shapes has got: ``done`` of ``total`` compiled, in ``seconds``."""

    done: int
    total: int
    seconds: float


def require_markers(markers: ThinkMarkers | None, model_id: str) -> ThinkMarkers:
    """``markers``, or :class:`SSRUnsupportedError` saying why a model without them cannot run SSR."""
    if markers is None:
        raise SSRUnsupportedError(
            f"{model_id} does not reason: it has no end-of-thinking marker token and no chat template to "
            "prompt it with (a base model); SSR needs a reasoning or chat model (plain decoding still works)")
    return markers


def pick_device(device: str | None = None) -> torch.device:
    """``device`` if given, else CUDA, then MPS, then CPU."""
    if device and device != "auto":
        return torch.device(device)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def context_positions(config) -> int | None:
    """Positions a model of ``config`` was built for (None if its config does not say); dynamic
    NTK RoPE is meant to run past ``max_position_embeddings`` by its scaling factor."""
    limit = getattr(config.get_text_config(decoder=True), "max_position_embeddings", None)
    if not isinstance(limit, int) or limit <= 0:
        return None
    rope = rope_of(config)
    return int(limit * rope.factor) if rope.kind == "dynamic" else limit


def resolve_model_path(name: str | None) -> tuple[str, Preset | None]:
    """Map a preset name, a bundled model name, a local path or a Hub id to (path or id, preset)."""
    name = name or "tiny-reasoner"
    if name in BUNDLED:
        return str(BUNDLED_DIR / name), None
    if name in PRESETS:
        return PRESETS[name].hub_id, PRESETS[name]
    by_id = {p.hub_id: p for p in PRESETS.values()}
    return name, by_id.get(name)


def eos_ids(tokenizer, generation_config=None) -> frozenset[int]:
    """The ids that end a sequence: the tokenizer's, and the generation config's (one or a list)."""
    eos = set()
    for source in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        eos.update(source if isinstance(source, list) else [source] if source is not None else [])
    return frozenset(int(e) for e in eos)


def check_fits(limit: int | None, model_id: str, prompt_tokens: int, new_tokens: int) -> None:
    """ValueError, before anything runs, when a run could pass a context of ``limit`` positions
    (None: no known limit)."""
    if limit and new_tokens >= limit:  # the budgets alone pass it: no prompt is short enough
        raise ValueError(
            f"this run may add {new_tokens} tokens (max_think + max_answer), beyond {model_id}'s context of "
            f"{limit} positions before any prompt: lower max_think / max_answer (with this {prompt_tokens}-token "
            f"prompt, at most {max(limit - prompt_tokens, 0)} in all)")
    if limit and prompt_tokens + new_tokens > limit:
        raise ValueError(
            f"the prompt is {prompt_tokens} tokens and this run may add {new_tokens} more "
            f"({prompt_tokens + new_tokens} in all), beyond {model_id}'s context of {limit} positions: "
            f"shorten the prompt (at most {max(limit - new_tokens, 0)} tokens with these budgets) or lower "
            "max_think / max_answer")


class LoadedModel:
    """A causal LM, its tokenizer and its think markers, on one device."""

    forks_stay = False  # a row that leaves a batch takes its slots with it (engine.runtime.batch)

    def __init__(self, model, tokenizer, model_id: str, markers: ThinkMarkers | None, preset: Preset | None = None):
        self.model = model.eval()
        attention.register()  # masked steps of grouped heads read the KV cache without copying it (engine.runtime.attention)
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.markers = markers
        self.preset = preset
        self.device = next(model.parameters()).device
        self.eos_ids = eos_ids(tokenizer, model.generation_config)
        self.num_parameters = sum(p.numel() for p in model.parameters())
        self.exact: str | bool = False  # the current run's exact route, "rows" or "fixed" (set by begin_run)
        self.compiled: CompiledSteps | None = None  # the current run's compiled steps (set by begin_run)
        self.compile_why: str | None = "no run yet"  # why the current run's steps are not compiled
        self._steps: CompiledSteps | None = None  # compiled once per model, kept across runs
        self._fixed: dict[tuple[int, int, str], object] = {}  # fixed caches by (capacity, rows, role), reused
        self._cache_plan: tuple[type | None, CacheLayout] | None = None  # (own cache class, layout), once decided
        self.rope = rope_of(model.config)  # position-scaled RoPE, if any
        # what the capability probe measured (engine.runtime.probe), the routes its checks decided among them:
        # one-token steps, rows without holes, copied forks
        self.capabilities: Capabilities = UNPROBED
        # an operator's switch: None, drafts share the prefix or copy it as a riding step measured cheaper (the capability
        # probe); True, they share it wherever the model can (the scaling benchmark's "shared" arm); False, they copy it
        self.share_forks: bool | None = None
        self._exact_checks: dict[tuple, Invariance] = {}  # exact mode's self-check, per (route, compiled), once measured
        self.max_cache_bytes: int | None = None  # an operator's bound on one cache (None: what is available)
        self.slot_bytes: float | None = None  # KV bytes per slot per row, as measured on a cache of this model
        # what the weights were read from (load_model: a folder and its files, or a Hub snapshot), which keys the
        # capability probe's cache; None (built in memory): probed every time
        self.source: dict | None = None
        self.numerics = None  # how the weights' precision was chosen (engine.runtime.numerics.Numerics; None: not settled)

    @property
    def layout(self) -> CacheLayout:
        """Which cache kinds the model's cache has (sliding windows, recurrent states, its own class)."""
        return self._plan()[1]

    @property
    def holes_ok(self) -> bool:
        """Whether this run's rows may hold holes (``StepModel.holes_ok``): as the cache kinds allow,
        unless the capability probe found this model's mask does not hide them, or the run is on
        exact mode's fixed route (a token at another slot is summed in another order)."""
        return self.layout.holes_ok and not self.capabilities.holes_unsafe and self.exact != "fixed"

    def _plan(self) -> tuple[type | None, CacheLayout]:
        """Decided once per model: a SlotCache, or the model's own cache class where it needs one
        (``engine.runtime.cache.own_cache_class``: a short decode on each may decide it)."""
        if self._cache_plan is None:
            own = own_cache_class(self.model, self.context_length)
            self._cache_plan = own, layout(self.model.config, own)
        return self._cache_plan

    # ------------------------------------------------------------------ prompts
    def prompt_ids(self, user_text: str, thinking: bool = True) -> list[int]:
        """The user message templated, think block opened; ``thinking`` False: the answer alone, or
        ValueError naming the model where it always reasons (:func:`chat_prompt_ids`)."""
        return chat_prompt_ids(self.tokenizer, self.markers, user_text, thinking, self.model_id)

    @property
    def dtype(self) -> str:
        return str(next(self.model.parameters()).dtype).removeprefix("torch.")

    @property
    def context_length(self) -> int | None:
        """Positions the model was built for (:func:`context_positions`)."""
        return context_positions(self.model.config)

    def check_fits(self, prompt_tokens: int, new_tokens: int) -> None:
        """ValueError, before anything runs, when a run could pass the model's context length."""
        check_fits(self.context_length, self.model_id, prompt_tokens, new_tokens) 
    def require_markers(self) -> ThinkMarkers:
        return require_markers(self.markers, self.model_id)

    # ------------------------------------------------------------------ forwards
    def begin_run(self, exact: str | bool = False, compile: str = "off") -> None:
        """Every run starts from the same model state (dynamic RoPE keeps one between calls);
        ``exact`` (False, or a route: ``rows``, ``fixed``, ``auto``; True is ``auto``) makes its
        forwards batch- and width-invariant on that route (``engine.runtime.exact``,
        ``engine.runtime.fixed``), refused before the run where the model's self-check on the
        route is not bitwise; ``compile`` (auto / on / off) runs its steps compiled where that can
        work (``engine.runtime.compiled``; :attr:`compile_why` says why not)."""
        route = self.exact_route(exact) if exact else False
        self.compile_why = compile_reason(compile, self.device, self.layout.recurrent, route == "rows")
        if self.compile_why is None and self._steps is None:
            self._steps = CompiledSteps(self.model, cuda_graphs=self.device.type == "cuda")
        self.compiled = self._steps if self.compile_why is None else None
        if route:
            self.check_exact(route)  # on the run's own steps: the fixed route checks its compiled step when compiled
        self.exact = route
        self.rope.begin_run(self.model)  # last: the checks above run forwards of their own

    def check_memory(self, capacity: int, rows: int) -> None:
        """``MemoryRefused`` before a cache of these sizes is made, when its estimate (the bytes per
        slot and row the capability probe measured on this model's own cache) is beyond
        :attr:`max_cache_bytes` (an operator's limit, ``--max-cache-gb``) or the memory available."""
        if self.slot_bytes is None:  # not measured yet (the capability probe measures it at load)
            return
        need = int(self.slot_bytes * capacity * rows)
        free = available_bytes(self.device)
        available = f"the {self.device.type} memory available now"
        for limit, what in ((self.max_cache_bytes, "this studio's --max-cache-gb"), (free, available)):
            if limit is not None and need > limit:
                raise MemoryRefused(f"this run's KV cache would take {need / 2**30:.2f} GB ({rows} rows x {capacity} "
                                    f"slots), beyond {what} ({limit / 2**30:.2f} GB): lower the budgets, the number "
                                    "of drafts or reasoning lookups" + (f" (exact mode's fixed route holds {fixed.ROWS} "
                                    "rows whatever the run: exact_route 'rows' holds the run's own)"
                                    if self.exact == "fixed" else ""))

    def exact_route(self, requested: str | bool) -> str:
        """The route an exact run takes on this model (``engine.runtime.fixed.resolve``), or a
        ValueError where the fixed route is asked for and this model rules it out (``fixed.unfit``)."""
        unfit = fixed.unfit(self.model.config, self.layout, self.rope)
        return fixed.resolve("auto" if requested is True else requested, self.device, unfit)

    def check_exact(self, route: str = "rows") -> Invariance:
        """Exact mode's self-check on ``route``, run on this model before its first exact run there
        and kept: row 0 beside other rows and a token inside wider forwards, bitwise against the
        same token alone. :class:`ExactRefused` gives the measured difference and the first layer."""
        key = route, route == "fixed" and self.compiled is not None  # a compiled step is checked as it will run
        if key not in self._exact_checks:
            self._exact_checks[key] = invariance(self, route)
        check = self._exact_checks[key]
        if not check.exact:
            raise ExactRefused(f"exact mode's {route} route is refused on {self.model_id}: measured on this model, it is "
                               f"not batch- and width-invariant ({check}); run without exact mode"
                               + (" or on exact_route 'rows'" if route == "fixed" else ""))
        return check

    @property
    def step_mode(self) -> str:
        """How the current run's steps run, for its stats: "compiled", "eager: <why>", or exact
        mode's route ("exact fixed 8x32 compiled", "exact rows: ...")."""
        if self.exact:
            return fixed.step_mode(self.exact, self.compiled is not None)
        return COMPILED if self.compiled is not None else f"{EAGER}: {self.compile_why}"

    @property
    def compile_seconds(self) -> float:
        """Seconds spent compiling step shapes so far (first calls), never part of a run's latency."""
        return self._steps.compile_seconds if self._steps else 0.0

    def forwards(self):
        """The context every forward of the current run runs in (exact mode's per-row ops, or nothing)."""
        return exact_forwards(self.model) if self.exact == "rows" else contextlib.nullcontext()

    def new_cache(self, capacity: int = 256, rows: int = 1, role: str = ""):
        """A cache for ``capacity`` slots and ``rows`` rows (the run's budgets). When this run's
        steps are compiled it is fixed-shape: room for a padded step on top, the capacity rounded
        up to a power of two and the buffers reused by the next run of that size (compiled steps
        and CUDA graphs keep their shapes and addresses). Only one fixed cache of a size and
        ``role`` is live at a time: handing it out again empties it. Exact mode's fixed route runs
        on a fixed cache too, with its rows (``engine.runtime.fixed``), compiled or not."""
        own = self._plan()[0]
        if (self.compiled is None and self.exact != "fixed") or own is not None:
            self.check_memory(capacity, rows)
            return new_cache(self.model.config, capacity, rows, own=own)
        capacity = _fixed_capacity(capacity)
        rows = fixed.capacity_rows(rows) if self.exact == "fixed" else rows
        cache = self._fixed.get((capacity, rows, role))
        if cache is None:  # a reused fixed cache holds its memory already: only a new one is checked
            self.check_memory(capacity, rows)
            cache = self._fixed[(capacity, rows, role)] = new_cache(self.model.config, capacity, rows, fixed=True)
        cache.empty()
        return cache

    def shapes_to_compile(self, capacity: int, rows: int = 1, row_width: int = 1) -> list[tuple[int, int]]:
        """The step shapes (rows, width) a run of these sizes can meet that are not compiled yet:
        one row at every width bucket, ``2..rows`` rows at the buckets up to ``row_width`` tokens."""
        if self.exact == "fixed":
            fixed.capacity_rows(rows)  # refused here, before anything compiles, when the run has more rows
        if self.compiled is None:
            return []
        capacity = _fixed_capacity(capacity)
        if self.exact == "fixed":  # one shape, whatever the run: every step is padded to it
            return [] if (fixed.ROWS, fixed.WIDTH, capacity, fixed.ROWS) in self.compiled.shapes else [(1, 1)]
        shapes = [(1, w) for w in BUCKETS] + [(r, w) for r in range(2, rows + 1) for w in BUCKETS if w <= bucket(row_width)]
        return [(r, w) for r, w in shapes if (r, w, capacity, rows) not in self.compiled.shapes]

    def prepare_steps(self, capacity: int, rows: int = 1, row_width: int = 1) -> Iterator[Compiling]:
        """Compile, before a run starts, every step shape it can meet (:meth:`shapes_to_compile`),
        saying how far it got: once before the first shape, then after each. Nothing is yielded
        when every shape is ready (or the steps run eagerly)."""
        shapes = self.shapes_to_compile(capacity, rows, row_width)
        if not shapes:
            return
        before = self.compile_seconds
        yield Compiling(0, len(shapes), 0.0)
        ready = self.new_cache(capacity, rows)
        take_rows(ready, [0] * rows)  # one eager forward over every row makes the buffers
        self.forward(torch.zeros(rows, 1, dtype=torch.long, device=self.device), ready, 0)
        for done, (r, w) in enumerate(shapes, 1):
            cache = self.new_cache(capacity, rows)
            take_rows(cache, [0] * r)
            self.forward(torch.zeros(r, w, dtype=torch.long, device=self.device), cache, 0)
            if done == len(shapes):
                self.new_cache(capacity, rows)  # leave it empty
            yield Compiling(done, len(shapes), self.compile_seconds - before)

    def rewind(self, cache, ckpt: Checkpoint, kept: list[int]) -> None:
        """Roll ``cache`` back to ``ckpt.length + len(kept)`` tokens, ``kept`` being the tokens fed
        since the checkpoint that stay: attention layers crop; recurrent states are restored and
        re-read ``kept`` in one forward."""
        target = ckpt.length + len(kept)
        if seq_length(cache) == target:
            return
        if ckpt.crop_only:
            crop(cache, target)
            return
        restore(cache, ckpt)
        if kept:
            self.forward(torch.tensor([kept], device=self.device), cache, ckpt.length)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, cache, start: int, positions: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits ``[B, T, V]`` for ``input_ids`` ``[B, T]`` appended to a cache of ``start`` slots.

        By default every row sits at positions ``start .. start + T``. A batch whose rows hold
        holes (slots a row must not see, see :func:`compact`) passes each row's own
        ``positions`` ``[B, T]`` and an ``attention_mask`` ``[B, start + T]`` (1: visible)."""
        b, t = input_ids.shape
        if positions is None:
            positions = torch.arange(start, start + t, device=self.device).expand(b, t)
        assert cache.get_seq_length() == start, f"cache holds {cache.get_seq_length()} tokens, expected {start}"
        input_ids = input_ids.to(self.device)
        # one token a forward: where the probe found multi-token forwards ignore the state, and in exact mode
        # on recurrent layers (their chunked kernels' chunks follow the forward's width)
        if t > 1 and (self.capabilities.one_token_steps and start > 0 or self.exact and self.layout.recurrent):
            return torch.cat([self.forward(input_ids[:, j : j + 1], cache, start + j, positions[:, j : j + 1],
                                           None if attention_mask is None else attention_mask[:, : start + j + 1])
                              for j in range(t)], dim=1)
        if self.exact == "fixed":
            return fixed.fixed_forward(self, input_ids, cache, start, positions, attention_mask)
        if getattr(cache, "fixed", False):
            return self._fixed_step(input_ids, cache, start, positions, attention_mask)
        with self.forwards():
            out = self.model(input_ids=input_ids, cache=cache, position_ids=positions,
                             attention_mask=attention_mask, use_cache=True, logits_to_keep=t)
        if getattr(cache, "counts_tokens", False):
            cache.fed += t
        return out.logits

    def _fixed_step(self, ids, cache, start: int, positions, attention_mask) -> torch.Tensor:
        """A step on a fixed-shape cache: the mask spans its whole capacity; a step of a bucket's
        width runs compiled (padded up to it, the padding's slots given back after), a wider one
        (a prefill) eagerly."""
        b, t = ids.shape
        mask = fixed.capacity_mask(attention_mask, b, cache.capacity, self.device)
        width = bucket(t)
        if start + (width or t) > cache.capacity:
            raise RuntimeError(f"a {width or t}-token step at slot {start} does not fit a cache of {cache.capacity} slots")
        if width is None or self.compiled is None or not cache.ready:  # a first forward makes the buffers eagerly
            logits = self.model(input_ids=ids, cache=cache, position_ids=positions, attention_mask=mask, use_cache=True,
                                logits_to_keep=t).logits
            cache.advanced(t)
            return logits
        ids, positions = fixed.padded(ids, b, width), fixed.padded(positions, b, width)
        logits = self.compiled(ids, positions, mask, cache)
        cache.advanced(width)
        if width > t:
            crop(cache, start + t)
        return logits[:, :t]

    def step_logits(self, tokens: list[int], cache, start: int, last_only: bool = False) -> torch.Tensor:
        """Logits ``[T, V]`` for a single row of ``tokens`` at ``start`` (``[1, V]``, the last
        token's, with ``last_only``; every token's are computed here all the same, so a prefill's
        last logits are the ones a full forward gives)."""
        logits = self.forward(torch.tensor([tokens], device=self.device), cache, start)[0]
        return logits[-1:] if last_only else logits

    def row_batch(self, cache, length: int, ids: list[int] | None = None, shared: bool = False) -> RowBatch:
        """The rows of ``cache`` (one row holding ``length`` slots, ``ids`` its tokens where a
        re-encode may need them; ``shared``: forks share its buffer row): a :class:`RowBatch`."""
        return RowBatch(self, cache, length, ids, shared=shared)

    def unshared(self) -> str | None:
        """Why this run's drafts cannot share the prefix in one buffer row (``engine.runtime.batch.unshared``)."""
        return unshared(self)

    @property
    def learned_positions(self) -> bool:
        """Positions are learned (absolute, not rotary) and bounded: a shared cache must fit them."""
        return bool(self.context_length) and not rotary(self.model.config)


def _fixed_capacity(capacity: int) -> int:
    """A fixed cache's slots: room for one padded step on top, rounded up to a power of two (few
    sizes, so few compiled shapes; at most twice the budgets)."""
    return 1 << (capacity + BUCKETS[-1] - 1).bit_length()


def load_model(name: str | None = None, device: str | None = None, dtype: str | None = None,
               trust_remote_code: bool = False, progress: Progress | None = None) -> LoadedModel:
    """Load a causal LM and its tokenizer from a bundled name, a preset, a local folder, a Hub id,
    or a GGUF source (a registry model's name, a ``.gguf`` file, a folder holding one,
    ``HUB_ID:FILE.gguf``: converted once, ``engine.runtime.gguf``; ``progress`` hears how far).

    bf16 on GPUs, fp32 on the CPU unless ``dtype`` says otherwise; the bundled models stay fp32.
    Errors name the id and the reason (missing folder, offline Hub, unknown id) as a
    :class:`ModelLoadError`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, preset = resolve_model_path(name)
    if is_gguf(path):
        try:
            path = str(local_folder(path, progress))
        except GGUFError as err:
            raise ModelLoadError(str(err)) from None
    dev = pick_device(device)
    bundled = Path(path).expanduser().resolve().parent == BUNDLED_DIR.resolve()
    # bf16 for Hub models on a GPU; the bundled tiny models keep the fp32 they were trained in (bf16 costs them accuracy)
    torch_dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if dev.type == "cuda" and not bundled
                                                       else torch.float32)
    local = Path(path).expanduser()
    if local.exists():
        path = str(local)
        if not (local / "config.json").is_file():
            raise ModelLoadError(f"{path!r} is not a model folder (no config.json)")
    elif path.startswith((".", "/", "~")) or path.count("/") != 1:
        raise ModelLoadError(f"model folder {path!r} does not exist (and it is not a Hub id like 'Qwen/Qwen3-0.6B')")
    if progress is not None:
        progress(f"loading {name or path}'s weights ({str(torch_dtype).removeprefix('torch.')} on {dev.type})")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        kwargs = dict(dtype=torch_dtype, trust_remote_code=trust_remote_code)
        if dev.type == "cuda":
            kwargs["device_map"] = "auto" if dev.index is None else {"": dev.index}
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except OSError as err:
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or "offline" in str(err).lower()
        why = "the Hub is unreachable or offline mode is on, and it is not in the local cache" if offline \
            else "no such local folder, Hub id, or not a causal language model"
        raise ModelLoadError(f"could not load model {path!r}: {why} ({str(err).splitlines()[0]})") from None
    except ValueError as err:
        raise ModelLoadError(f"could not load model {path!r}: {str(err).splitlines()[0]}") from None
    if dev.type != "cuda":
        model = model.to(dev)
    lm = LoadedModel(model, tokenizer, name or "tiny-reasoner", find_markers(tokenizer, preset), preset)
    lm.source = model_source(path, trust_remote_code)
    return lm


def model_source(path: str, trust_remote_code: bool = False) -> dict | None:
    """What a model was loaded from, as the capability probe's cache keys it: its folder (a Hub
    id's is its snapshot in the Hub cache), that folder's path and each of its files' name, size
    and modification time, so a changed or replaced file is another source. None where no folder
    can be found (not cached)."""
    local = Path(path).expanduser()
    if not local.is_dir():
        from huggingface_hub import try_to_load_from_cache

        try:
            config = try_to_load_from_cache(path, "config.json")
        except ValueError:  # not a valid Hub id
            return None
        if not isinstance(config, str):
            return None
        local = Path(config).parent
    files = sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in local.iterdir() if f.is_file())
    return {"folder": str(local.resolve()), "files": [list(f) for f in files], "trust_remote_code": trust_remote_code}


def random_weights_model(name: str, device: str | None = None, dtype: str | None = None, seed: int = 0,
                         tokenizer: str | Path | None = None, **overrides) -> LoadedModel:
    """A preset's architecture with random weights, built offline (``--random-weights``): meaningless
    text, real per-token costs. Its tokenizer is the bundled one, or with ``tokenizer`` (a folder:
    ``engine.runtime.tokenizer_folder``) the family's real one with its chat template, so the
    template's prompts, think markers and end of turn run as on the real model (the preset's
    markers, ``find_markers``). ``overrides`` change shapes (``engine.tools.gpu_check`` and the tests
    shrink the model on a CPU); the vocabulary must cover the tokenizer's ids (ValueError otherwise).
    Output rows of ids the tokenizer lacks are zeroed, so every generated id decodes.

    >>> lm = random_weights_model("qwen3-1.7b", tokenizer="package/models", num_hidden_layers=2, hidden_size=64)
    """
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    preset = PRESETS.get(name)
    if preset is None or preset.shape is None:
        shaped = ", ".join(n for n, p in PRESETS.items() if p.shape)
        raise ModelLoadError(f"random weights need a preset whose shapes are written in ({shaped}), not {name!r}")
    config_cls, model_cls = {"qwen3": (Qwen3Config, Qwen3ForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[preset.arch]
    tok = load_tokenizer(tokenizer) if tokenizer else AutoTokenizer.from_pretrained(BUNDLED_DIR / "tiny-reasoner")
    shape = {**preset.shape, **overrides}
    if shape["vocab_size"] < len(tok):
        raise ValueError(f"{name}'s vocabulary of {shape['vocab_size']} ids does not cover the tokenizer's {len(tok)}: "
                         f"pair this tokenizer with a preset of a larger vocabulary (in code: vocab_size={len(tok)})")
    config = config_cls(**shape, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    dev = pick_device(device)
    torch_dtype = getattr(torch, dtype) if dtype else (torch.bfloat16 if dev.type == "cuda" else torch.float32)
    torch.manual_seed(seed)
    with torch.device(dev):
        model = model_cls._from_config(config, dtype=torch_dtype)
    with torch.no_grad():
        model.get_output_embeddings().weight[len(tok):] = 0
    which = f", {Path(tokenizer).expanduser().name} tokenizer" if tokenizer else ""
    return LoadedModel(model, tok, f"{name} (random weights{which})", find_markers(tok, preset), preset)
