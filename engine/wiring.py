"""Model wiring, written once for the bench, the sweeps, the breakdown and the studio: which model
plays which role (target, draft, PRM), where it runs (in process, or on a vLLM server), and the
settings a run starts from (the model's recommended ones under what the caller set).

>>> target = load_role("tiny-reasoner")
>>> draft = load_role("tiny-reasoner-draft", target=target)  # checked: same tokenizer as the target
>>> scorer = load_scorer("tiny-prm")
>>> cfg = run_config("tiny-reasoner", {"max_think": 200})
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from engine.config import RunConfig, fit_budgets
from engine.llamacpp.model import RUNTIME as LLAMA
from engine.llamacpp.model import LlamaModel, load_llama
from engine.methods.rsd.prm import MathShepherdScorer, QwenMathPRMScorer
from engine.methods.seams import check_pair
from engine.presets import recommended_settings
from engine.remote.model import RemoteModel, connect
from engine.remote.prm import connect_prm
from engine.runtime import numerics
from engine.runtime.gguf import Progress
from engine.runtime.model import (
    LoadedModel,
    context_positions,
    load_model,
    random_weights_model,
    resolve_model_path,
)
from engine.runtime.probe import capabilities


@dataclass(frozen=True)
class Server:
    """Where a role's model is served: a vLLM server's URL, its key and its name for the model
    (``transport``: an httpx transport in its place, as the tests' fake server gives)."""

    base_url: str
    api_key: str | None = None
    served_name: str | None = None
    transport: object = None
    speculation: str | None = None  # the server's own speculative method, as declared (--server-speculation)


def run_config(model: str, settings: dict) -> RunConfig:
    """The run's config: ``model``'s recommended settings (``engine.presets``) under ``settings``,
    with the budgets neither sets fitted to the model's context (``fit_budgets``) where its config
    can be read without a download."""
    values = {**recommended_settings(model), **settings}
    context = declared_context(model)
    if context:
        values = fit_budgets(values, context, set(values))
    return RunConfig(**values)


@functools.lru_cache(maxsize=64)
def declared_context(model: str) -> int | None:
    """The positions ``model``'s config declares (a bundled model, a local folder, a Hub id in the
    cache), or None where it cannot be read offline."""
    from transformers import AutoConfig

    path, _ = resolve_model_path(model)
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError):  # not local, not cached, or not a transformers config
        return None
    return context_positions(config)  # as the loaded model will check its runs against


RUNTIMES = ("transformers", LLAMA)  # what runs a model in process: torch and transformers, or llama.cpp (a GGUF file)


def check_runtime(runtime: str | None, server: object = None, device: str | None = None, dtype: str | None = None,
                  random_weights: bool = False) -> None:
    """ValueError where ``runtime`` is unknown or cannot go with the other settings asked for."""
    if runtime in (None, "transformers"):
        return
    if runtime != LLAMA:
        raise ValueError(f"unknown runtime {runtime!r}; choose from {', '.join(RUNTIMES)}")
    for given, what in ((server, "a vLLM server (--base-url)"), (dtype, "--dtype (the GGUF file's quantization is used)"),
                        (random_weights, "--random-weights"), (device not in (None, "cpu"), f"--device {device}")):
        if given:
            raise ValueError(f"the llama.cpp runtime runs a GGUF file in process, on its own build's devices: drop {what}")


def load_role(name: str, device: str | None = None, server: Server | None = None, target=None,
              random_weights: bool = False, progress: Progress | None = None,
              dtype: str | None = None, runtime: str | None = None,
              threads: int | None = None, tokenizer: str | None = None) -> LoadedModel | LlamaModel | RemoteModel:
    """The model ``name`` for one role: on its ``server`` if it has one, else in process (with
    random weights when asked: the architecture's real per-token cost, offline; with ``tokenizer``,
    a folder holding the family's real tokenizer and chat template, in place of the bundled one:
    ``engine.runtime.tokenizer_folder``), on ``runtime`` (``transformers``, the default, or
    ``llama.cpp``: a GGUF file on ``threads`` threads). A draft (given its ``target``) must share the
    target's tokenizer. ``progress`` hears how a load goes (a GGUF file's first conversion)."""
    check_runtime(runtime, server, device, dtype, random_weights)
    if tokenizer and not random_weights:
        raise ValueError("--tokenizer gives a model built with --random-weights its tokenizer: add --random-weights "
                         "(a real model brings its own)")
    if runtime == LLAMA:
        lm = load_llama(name, threads, progress)
    elif server is not None:
        lm = connect(name, server.base_url, server.api_key, server.served_name, transport=server.transport,
                     speculation=server.speculation)
    elif random_weights:
        lm = random_weights_model(name, device, dtype=dtype, tokenizer=tokenizer)
        lm.numerics = numerics.given(lm, "random weights, as built" + (" (--dtype)" if dtype else ""))
    else:
        lm = numerics.settle(load_model(name, device=device, dtype=dtype, progress=progress), dtype, progress)
    if isinstance(lm, LoadedModel):  # measured at load (or read back from its cache), kept: what SSR relies on
        capabilities(lm, progress)
    if target is not None:
        check_pair(target, lm)
    return lm


def load_scorer(name: str, device: str | None = None, server: Server | None = None,
                trust_remote_code: bool = False):
    """RSD's step scorer ``name``: a PRM on its ``server``, a PRM in process, or
    ``"target-likelihood"`` (no PRM: the RSD loop scores with the target)."""
    if server is not None:
        return connect_prm(name, server.base_url, server.api_key, server.served_name, transport=server.transport)
    name = name or "tiny-prm"
    if name == "target-likelihood":  # resolved when a run's roles are cast (it reads the target's writer)
        return name
    if "qwen2.5-math-prm" in name.lower():
        return QwenMathPRMScorer(name, trust_remote_code, device)
    return MathShepherdScorer(load_model(name, device=device))  # any math-shepherd-format PRM (ValueError if none)
