"""The studio's models and scorers, by name: each loaded once, on first use, outside the run lock
(other runs go on meanwhile), on its vLLM server when the app was given one for it, and given up
after ``load_timeout`` seconds with a message. While a model loads, :meth:`ModelShelf.loading`
yields what the load last reported, stage by stage (a GGUF file's first conversion, reading the
weights, the capability probe or its cached result), so a handler can show it. A load runs no
warm-up of its own: each kind of run is warmed, untimed, before its first timed run
(:meth:`ModelShelf.warm`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from engine.llamacpp.model import RUNTIME as LLAMA
from engine.llamacpp.model import LlamaModel
from engine.remote.model import RemoteModel
from engine.runtime.model import LoadedModel, ModelLoadError
from engine.runtime.probe import capabilities
from engine.wiring import RUNTIMES, Server, check_runtime, load_role, load_scorer


def shelf_key(name: str, runtime: str = "") -> str:
    """The name a model is kept under on a runtime (the same file on llama.cpp is another model)."""
    return name if runtime in ("", RUNTIMES[0]) else f"{name} · {runtime}"


class ModelShelf:
    """Models (:meth:`model`) and RSD scorers (:meth:`scorer`) by name; ``servers`` maps a name to
    its :class:`~engine.wiring.Server`'s fields. Empty names mean the defaults given here."""

    def __init__(self, default_model: str, default_prm: str, device: str | None, load_timeout: float,
                 servers: dict | None = None, max_cache_gb: float | None = None,
                 random_weights: dict[str, str | None] | None = None, dtype: str | None = None) -> None:
        self.default_model, self.default_prm = default_model, default_prm
        # the in-process models' precision (app --dtype); None: chosen per model (engine.runtime.numerics.settle)
        self.dtype = dtype
        # presets built with random weights (app --random-weights), by name: their tokenizer folder (--tokenizer) or None
        self.random_weights = dict(random_weights or {})
        # an operator's bound on one run's KV cache (app --max-cache-gb), checked before a run: a Space's guard
        self.max_cache_bytes = None if max_cache_gb is None else int(max_cache_gb * 2**30)
        self.device, self.load_timeout = device, load_timeout
        self.servers = {name: Server(**s) for name, s in (servers or {}).items() if s.get("base_url")}
        self._models: dict[str, LoadedModel | LlamaModel | RemoteModel] = {}  # by shelf_key
        self._scorers: dict[str, object] = {}
        self._load_lock = threading.Lock()  # one load at a time
        self.load_messages: dict[str, str] = {}  # the latest progress message of each load, by name
        self._pending: dict[tuple, tuple] = {}  # loads under way: (cache, name) -> (worker thread, its result, start time)
        self._warm_kinds: set[tuple] = set()  # kinds of run already warmed up (warm)

    def _loaded(self, key: str, cache: dict, load):
        """``cache[key]``, loading it (outside the run lock, within ``load_timeout``) if needed."""
        for _ in self._loading(key, cache, load):
            pass
        return cache[key]

    def _loading(self, key: str, cache: dict, load, poll_s: float | None = None) -> Iterator[str]:
        """Put ``cache[key]`` in place, loading it in a worker thread if needed (one load at a time;
        given up, with a ModelLoadError, ``load_timeout`` seconds after it started, its worker left
        to finish unheard). With ``poll_s``, yields a status line every ``poll_s`` seconds while it
        waits: for another load to end, then for this one (its seconds so far and its latest
        progress message, ``load_messages[key]``), and once more when the load is done; nothing when
        ``key`` is loaded already. The load lock is held between yields: closing the generator (a
        stopped handler, a client gone) lets it go, and the load goes on: the next call for ``key``
        waits for the same worker."""
        wait = self.load_timeout if poll_s is None else poll_s
        while not self._load_lock.acquire(timeout=-1 if poll_s is None else poll_s):
            yield "waiting for another model's load to end"
        try:
            if key in cache:
                return
            slot = id(cache), key  # (a model and a scorer may share a name)
            if slot not in self._pending:
                self.load_messages.pop(key, None)
                out: dict = {}

                def work():
                    try:
                        out["value"] = load()
                    except Exception as err:  # noqa: BLE001 (any load failure is handed to the caller's thread)
                        out["error"] = err

                worker = threading.Thread(target=work, name=f"load {key}", daemon=True)
                self._pending[slot] = worker, out, time.monotonic()
                worker.start()
            worker, out, started = self._pending[slot]
            while True:
                left = started + self.load_timeout - time.monotonic()
                worker.join(max(0.0, min(wait, left)))
                if not worker.is_alive() or left <= wait:
                    break
                message = self.load_messages.get(key)
                yield f"{time.monotonic() - started:.0f} s" + (f" · {message}" if message else "")
            del self._pending[slot]
            if worker.is_alive():
                raise ModelLoadError(f"loading {key!r} took longer than {self.load_timeout:.0f} s; gave up (the "
                                     "Hub may be slow or unreachable; --load-timeout sets the limit)")
            if "error" in out:
                raise out["error"]
            cache[key] = out["value"]
            if poll_s is not None:  # how the load ended (the probe measured or read back from its cache)
                yield f"{time.monotonic() - started:.0f} s · {self.load_messages.get(key) or 'loaded'}"
        finally:
            self._load_lock.release()

    def model(self, name: str, runtime: str = "") -> LoadedModel | LlamaModel | RemoteModel:
        """A model by name, loaded once: on its vLLM server when the app was given one for it,
        else in process, on ``runtime`` (transformers, the default, or llama.cpp)."""
        name = (name or self.default_model).strip()
        return self._loaded(shelf_key(name, runtime), self._models, self._model_loader(name, runtime))

    def loading(self, name: str, poll_s: float = 0.5, runtime: str = "") -> Iterator[str]:
        """Load the model ``name`` (as :meth:`model`) if it is not loaded yet, yielding a status
        line every ``poll_s`` seconds until it is (see :meth:`_loading`): how long it has taken and
        what the load last reported, e.g. "12 s · converting SmolLM2-135M-Instruct.Q4_1.gguf:
        dequantizing 272 tensors (first use; kept in ...)", then "loading ...'s weights", the probe
        ("measuring what SSR relies on ...") and "loaded; capabilities measured in 3.1 s (the
        probe)" or "loaded; capabilities from the probe cached on ...". Then :meth:`model` returns
        it at once; a load that fails raises here."""
        name = (name or self.default_model).strip()
        yield from self._loading(shelf_key(name, runtime), self._models, self._model_loader(name, runtime), poll_s)

    def _model_loader(self, name: str, runtime: str = ""):
        key = shelf_key(name, runtime)
        if runtime == LLAMA:  # a server's model, a device, are the transformers runtime's: refused here by name
            check_runtime(runtime, self.servers.get(name), self.device if self.device != "cpu" else None)

        def progress(message: str) -> None:  # called from the load's thread: the latest message is kept
            self.load_messages[key] = message

        def load():
            if runtime == LLAMA:
                lm = load_role(name, progress=progress, runtime=runtime)
            else:
                lm = load_role(name, self.device, self.servers.get(name), progress=progress,
                               dtype=None if name in self.servers else self.dtype,
                               random_weights=name in self.random_weights, tokenizer=self.random_weights.get(name))
            if not isinstance(lm, RemoteModel):  # no warm-up here: each kind of run is warmed before its first (warm)
                numerics = f"; {lm.numerics.sentence}" if getattr(lm, "numerics", None) is not None else ""
                self.load_messages[key] = f"loaded; {capabilities(lm).provenance}{numerics}"
                lm.max_cache_bytes = self.max_cache_bytes
            return lm

        return load

    @staticmethod
    def _kind(lm, method: str, cfg) -> tuple:
        return id(lm), method, cfg.exact_mode, cfg.compile, cfg.num_drafts > 1, cfg.think_spec > 0

    def is_warm(self, lm, method: str, cfg) -> bool:
        return self._kind(lm, method, cfg) in self._warm_kinds

    def warm(self, lm, method: str, cfg, rsd: dict | None = None, evidence=None) -> None:
        """Run ``method`` once, untimed and unlogged, on short budgets, the first time this kind of
        run (model, method, exact route, compiled steps, drafts, lookups) meets this model, as the
        bench's warm-up does: a first run's one-off costs (first shapes, lazy setup, first
        allocations) never reach the log, the strip or a median. ``evidence``: the store SSR's loop counts
        the warm-up in (a shared studio's visitor's; None: the model's own)."""
        if self.is_warm(lm, method, cfg):
            return
        from engine.registry import decoder  # (the shelf loads models; running one is the studio's)

        # long enough for each shape a run meets (prefill, one row, rows forked at 6 and 10, their verifies), no
        # longer: on SmolLM2 the first timed run after it is as fast as a steady one (docs/BENCHMARKS.md, "First load")
        small = cfg.replace(max_think=min(cfg.max_think, 12), max_answer=min(cfg.max_answer, 4),
                            max_draft=min(cfg.max_draft, 8), draft_start=min(cfg.draft_start, 6), draft_interval=4,
                            max_steps=min(cfg.max_steps, 3), drafting="always")  # (no measure of what drafts are worth)
        rsd = rsd or {}
        list(decoder(method, lm, rsd.get("draft"), rsd.get("scorer"), evidence)("warm up", small))
        self._warm_kinds.add(self._kind(lm, method, cfg))

    def add_model(self, name: str, model: LoadedModel | RemoteModel) -> None:
        """Serve an already loaded ``model`` under ``name`` (scripts, tests, a caller's own model)."""
        if not isinstance(model, RemoteModel):
            model.max_cache_bytes = self.max_cache_bytes
        with self._load_lock:
            self._models[name.strip()] = model

    def add_scorer(self, name: str, scorer) -> None:
        """Serve an already built RSD step ``scorer`` under ``name``."""
        with self._load_lock:
            self._scorers[name.strip()] = scorer

    def scorer(self, name: str):
        name = (name or self.default_prm).strip()
        return self._loaded(name, self._scorers, lambda: load_scorer(name, self.device, self.servers.get(name)))
