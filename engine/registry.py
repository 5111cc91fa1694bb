"""The decoding methods by name: one place the bench CLI, the studio and the run log look them up.

Every method declares itself as one :class:`~engine.methods.contract.Method` record (its names, its
traits, where the studio offers it, its decoder); :data:`REGISTERED` lists the records that ship, one line
each, and :func:`register` adds one of your own (or name its file in ``SSR_STUDIO_METHODS``: paths
separated by ``os.pathsep``, each a Python file that defines ``METHOD``, loaded when this module is
imported, so the bench, the studio and a test's subprocess all see it). Everything else reads the
records: :func:`method_of`, :func:`methods`, and the refusals below.

``decoder(name, target, draft, scorer, evidence)`` returns a callable ``(prompt, cfg) -> events``
(``evidence``: the store SSR's loop learns in, None for the target's own). This is the
composition root that joins a method to its backend (a method never imports one): a target on a vLLM
server (``engine.remote``) runs ``baseline`` and ``ssr`` built for a server (:data:`SERVED`), and a
step-writing method's models each write on their server or in process (:func:`rsd_writer`, handed to
the method in its :class:`~engine.methods.contract.Models`).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from engine.config import RunConfig
from engine.events import DoneEvent, Event
from engine.llamacpp.model import LlamaModel
from engine.methods import baseline, peers, sd
from engine.methods.budget import budget_cut
from engine.methods.contract import IN_PROCESS, Decoder, Method, Models
from engine.methods.exit import budget as exit_budget
from engine.methods.rsd import loop as rsd
from engine.methods.rsd.writer import LocalWriter, StepWriter
from engine.methods.ssr import method as ssr
from engine.remote.decode import decode_remote_baseline, decode_remote_ssr
from engine.remote.model import RemoteModel
from engine.remote.served import decode_served_ssr
from engine.remote.steps import RemoteWriter
from engine.runtime.markers import answer_only_refusal
from engine.runtime.model import LoadedModel

REGISTERED: dict[str, Method] = {}
ENV = "SSR_STUDIO_METHODS"  # files of methods of your own, each defining METHOD (os.pathsep between them)


def register(method: Method) -> Method:
    """Add ``method`` to the registry (a name taken by another method is refused)."""
    if not isinstance(method, Method):
        raise TypeError(f"register() takes an engine.methods.contract.Method, not {type(method).__name__}")
    if method.name in REGISTERED and REGISTERED[method.name] is not method:
        raise ValueError(f"a method named {method.name!r} is registered already")
    if any(m.label == method.label and m.name != method.name for m in REGISTERED.values()):
        raise ValueError(f"the label {method.label!r} is taken by another method")
    REGISTERED[method.name] = method
    return method


def register_file(path: str | Path) -> Method:
    """Load a method from one Python file that defines ``METHOD`` (a ``Method``) and register it."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no method file at {path}")
    spec = importlib.util.spec_from_file_location(f"ssr_studio_method_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not isinstance(getattr(module, "METHOD", None), Method):
        raise TypeError(f"{path} defines no METHOD (an engine.methods.contract.Method)")
    return register(module.METHOD)


for _m in (baseline.METHOD, *ssr.METHODS, exit_budget.METHOD, *peers.METHODS, *rsd.METHODS, sd.METHOD, peers.ASSISTED):
    register(_m)
for _path in filter(None, os.environ.get(ENV, "").split(os.pathsep)):
    register_file(_path)

METHODS = tuple(REGISTERED)  # the names that ship and those loaded at import (register() later adds to REGISTERED only)
# a vLLM server's own builds of the methods that run there with a decoder of their own (the step-writing methods'
# models each write on their server: rsd_writer)
SERVED = {"baseline": decode_remote_baseline, "ssr": decode_remote_ssr}


def method_of(name: str) -> Method:
    """The registered method ``name`` (ValueError naming the choices otherwise)."""
    if name not in REGISTERED:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(REGISTERED)}")
    return REGISTERED[name]


def known(name: str) -> Method | None:
    """The registered method ``name``, or None (a run logged or exported under a method not registered here)."""
    return REGISTERED.get(name)


def label_of(name: str) -> str:
    """How the page names the method ``name``: its label, or the name itself for a method not registered here
    (a run logged or exported elsewhere: shown, never refused)."""
    return method.label if (method := known(name)) else name


def check_method(name: str) -> str:
    return method_of(name).name


def methods(place: str | None = None) -> tuple[Method, ...]:
    """Every registered method, in the registry's order; with ``place``, those the studio offers there
    (``"run"``, ``"compare"``, ``"benchmark"``)."""
    return tuple(m for m in REGISTERED.values() if place is None or place in m.studio)


def uses(names, model: str) -> bool:
    """Whether any of the methods ``names`` uses ``model`` ("draft", "prm") beside the target."""
    return any(model in method_of(n).uses for n in names)


def on_ssr_loop(names) -> list[str]:
    """Those of ``names`` that run SSR's loop (they need think markers and SSR's settings checked)."""
    return [n for n in names if method_of(n).ssr_loop]


def writes_steps(name: str) -> bool:
    """Whether ``name`` writes whole reasoning steps (RSD's family; an unknown name, say an old log's: no)."""
    return (method := known(name)) is not None and method.steps


def is_lossy(name: str) -> bool:
    """Whether a run of ``name`` may differ from baseline's by design (an unknown name: not known lossy)."""
    return (method := known(name)) is not None and not method.exact


def rsd_writer(lm: LoadedModel | RemoteModel, cfg: RunConfig, capacity: int, role: str) -> StepWriter:
    """RSD's step writer for one model (a ``WriterFactory``): on its vLLM server, or in process."""
    return RemoteWriter(lm, cfg) if isinstance(lm, RemoteModel) else LocalWriter(lm, cfg, capacity, role)


def not_on_a_server(name: str) -> str | None:
    """Why method ``name`` cannot run on a vLLM server, or None where it can."""
    why = method_of(name).server
    if why == IN_PROCESS:
        there = ", ".join(m.name for m in REGISTERED.values() if not m.server)
        return f"method {name!r} runs in process only; on a vLLM server: {there}"
    return f"method {name!r} is not offered on a vLLM server: {why}" if why else None


def not_on_llama(name: str) -> str | None:
    """Why method ``name`` cannot run on the llama.cpp runtime, or None where it can."""
    why = method_of(name).llama
    return f"method {name!r} {why}" if why else None


def not_answer_only(name: str, target: LoadedModel | LlamaModel | RemoteModel) -> str | None:
    """Why method ``name`` on ``target`` cannot run with thinking off (``RunConfig.thinking`` False: the
    answer alone), or None where it can: a method that runs with thinking off, in process, on a model that
    can be asked for an answer alone (``engine.runtime.markers.answer_only_refusal``). Asked before a run
    (the bench, the studio) and by every run :func:`decoder` builds."""
    if why := method_of(name).thinking_off:
        answer_only = ", ".join(m.name for m in REGISTERED.values() if not m.thinking_off)
        return f"method {name!r} {why}: with thinking off run one of {answer_only}"
    if isinstance(target, RemoteModel):
        return "thinking off runs in process only, not on a vLLM server (the server loops always ask for reasoning)"
    return answer_only_refusal(target.markers, target.model_id)


def decoder(name: str, target: LoadedModel | LlamaModel | RemoteModel, draft=None, scorer=None,
            evidence=None) -> Decoder:
    method = method_of(name)
    if isinstance(target, RemoteModel) and (why := not_on_a_server(name)):
        raise ValueError(why)
    if isinstance(target, LlamaModel) and (why := not_on_llama(name)):
        raise ValueError(why)
    if isinstance(target, RemoteModel) and name == "ssr" and target.speculation:
        run = partial(decode_served_ssr, target)  # the server speculates from the drafts: no client-side verify
    elif isinstance(target, RemoteModel) and name in SERVED:
        run = partial(SERVED[name], target)
    else:
        run = method.start(Models(target, draft, scorer, writer=rsd_writer, evidence=evidence))
    return partial(_noting_cuts, run, method, target)


def _noting_cuts(run: Decoder, method: Method, target, prompt: str, cfg: RunConfig) -> Iterator[Event]:
    """``run``'s events, its final stats saying which budget cut it (``RunStats.cut``: the one rule,
    :func:`engine.methods.budget.budget_cut`, for every method and backend); with thinking off refused
    before its first event where :func:`not_answer_only` says so."""
    if not cfg.thinking and (why := not_answer_only(method.name, target)):
        raise ValueError(why)
    events = run(prompt, cfg)
    try:
        for ev in events:
            if isinstance(ev, DoneEvent):
                s = ev.stats
                s.cut = budget_cut(s.reasoning_tokens, s.answer_tokens, cfg.max_think, cfg.max_answer, rsd=method.steps)
            yield ev
    finally:
        events.close()  # a consumer that stops early closes the run (it logs itself cancelled)
