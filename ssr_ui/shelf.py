"""The studio's models and scorers, by name: each loaded once, on first use, outside the run lock
(other runs go on meanwhile), on its vLLM server when the app was given one for it, and given up
after ``load_timeout`` seconds with a message."""

from __future__ import annotations

import threading

from engine.remote.model import RemoteModel
from engine.runtime.model import LoadedModel, ModelLoadError
from engine.wiring import Server, load_role, load_scorer


class ModelShelf:
    """Models (:meth:`model`) and RSD scorers (:meth:`scorer`) by name; ``servers`` maps a name to
    its :class:`~engine.wiring.Server`'s fields. Empty names mean the defaults given here."""

    def __init__(self, default_model: str, default_prm: str, device: str | None, load_timeout: float,
                 servers: dict | None = None, max_cache_gb: float | None = None) -> None:
        self.default_model, self.default_prm = default_model, default_prm
        # an operator's bound on one run's KV cache (app --max-cache-gb), checked before a run: a Space's guard
        self.max_cache_bytes = None if max_cache_gb is None else int(max_cache_gb * 2**30)
        self.device, self.load_timeout = device, load_timeout
        self.servers = {name: Server(**s) for name, s in (servers or {}).items() if s.get("base_url")}
        self._models: dict[str, LoadedModel | RemoteModel] = {}
        self._scorers: dict[str, object] = {}
        self._load_lock = threading.Lock()  # one load at a time
        self._warm_kinds: set[tuple] = set()  # kinds of run already warmed up (warm)

    def _loaded(self, key: str, cache: dict, load):
        """``cache[key]``, loading it (outside the run lock, within ``load_timeout``) if needed."""
        with self._load_lock:
            if key not in cache:
                out: dict = {}

                def work():
                    try:
                        out["value"] = load()
                    except Exception as err:  # noqa: BLE001 (any load failure is handed to the caller's thread)
                        out["error"] = err

                worker = threading.Thread(target=work, name=f"load {key}", daemon=True)
                worker.start()
                worker.join(self.load_timeout)
                if worker.is_alive():
                    raise ModelLoadError(f"loading {key!r} took longer than {self.load_timeout:.0f} s; gave up (the "
                                         "Hub may be slow or unreachable; --load-timeout sets the limit)")
                if "error" in out:
                    raise out["error"]
                cache[key] = out["value"]
            return cache[key]

    def model(self, name: str) -> LoadedModel | RemoteModel:
        """A model by name, loaded once: on its vLLM server when the app was given one for it,
        else in process."""
        name = (name or self.default_model).strip()

        def load():
            lm = load_role(name, self.device, self.servers.get(name))
            if isinstance(lm, LoadedModel):
                lm.warm_up()  # in process: the first forward's one-off costs, before any timed run
                lm.max_cache_bytes = self.max_cache_bytes
            return lm

        return self._loaded(name, self._models, load)

    @staticmethod
    def _kind(lm, method: str, cfg) -> tuple:
        return id(lm), method, cfg.exact_mode, cfg.compile, cfg.num_drafts > 1, cfg.think_spec > 0

    def is_warm(self, lm, method: str, cfg) -> bool:
        return self._kind(lm, method, cfg) in self._warm_kinds

    def warm(self, lm, method: str, cfg, rsd: dict | None = None) -> None:
        """Run ``method`` once, untimed and unlogged, on short budgets, the first time this kind of
        run (model, method, exact route, compiled steps, drafts, lookups) meets this model, as the
        bench's warm-up does: a first run's one-off costs (first shapes, lazy setup, first
        allocations) never reach the log, the strip or a median."""
        if self.is_warm(lm, method, cfg):
            return
        from engine.registry import decoder  # (the shelf loads models; running one is the studio's)

        small = cfg.replace(max_think=min(cfg.max_think, 24), max_answer=min(cfg.max_answer, 8),
                            max_draft=min(cfg.max_draft, 8), draft_start=min(cfg.draft_start, 8), draft_interval=4,
                            max_steps=min(cfg.max_steps, 3))
        rsd = rsd or {}
        list(decoder(method, lm, rsd.get("draft"), rsd.get("scorer"))("warm up", small))
        self._warm_kinds.add(self._kind(lm, method, cfg))

    def add_model(self, name: str, model: LoadedModel | RemoteModel) -> None:
        """Serve an already loaded ``model`` under ``name`` (scripts, tests, a caller's own model)."""
        if isinstance(model, LoadedModel):
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
