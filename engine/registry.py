"""The decoding methods by name: one place the bench CLI and the UI look them up.

``decoder(name, target, draft, scorer)`` returns a callable ``(prompt, cfg) -> events``.
SSR-family methods use the target alone; the RSD family (``rsd``, ``target``, ``draft``) also
takes the draft model and the PRM scorer. A target on a vLLM server (``engine.remote``) runs
``baseline`` and ``ssr`` built for a server, and the RSD family (whose target and draft may each be
on a server or in process).

This is the composition root that joins a method to its backend (a method never imports one). The
RSD loop knows step writers (``engine.methods.rsd.writer.StepWriter``) only: :func:`rsd_writer`
builds each model's, in process or on its server, and the loop is handed that factory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from engine.config import RunConfig
from engine.events import DoneEvent, Event
from engine.llamacpp.model import LlamaModel
from engine.methods.baseline import decode_baseline
from engine.methods.budget import budget_cut
from engine.methods.exit.budget import METHOD as EXIT
from engine.methods.exit.budget import decode_exit
from engine.methods.peers import decode_hf
from engine.methods.rsd.loop import RSD_METHODS, decode_rsd
from engine.methods.rsd.writer import LocalWriter, StepWriter
from engine.methods.ssr.loop import decode_ssr
from engine.remote.decode import decode_remote_baseline, decode_remote_ssr
from engine.remote.model import RemoteModel
from engine.remote.served import decode_served_ssr
from engine.remote.steps import RemoteWriter
from engine.runtime.markers import answer_only_refusal
from engine.runtime.model import LoadedModel

Decoder = Callable[[str, RunConfig], Iterator[Event]]

SINGLE_MODEL = {
    "baseline": decode_baseline,
    "ssr": decode_ssr,
    EXIT: decode_exit,  # lossy: SSR that stops reasoning when its drafts agree
    "ssr-lookups": partial(decode_ssr, method="ssr-lookups", drafts=False),  # the ablation: SSR's lookups alone
    "hf": decode_hf,
    "hf-pld": partial(decode_hf, prompt_lookup=True),
    "hf-static": partial(decode_hf, static=True),
}
METHODS = (*SINGLE_MODEL, *RSD_METHODS)
WRITES_DRAFTS = ("ssr", EXIT, "rsd")  # the methods with something to show in a Draft pane
SSR_LOOP = ("ssr", EXIT, "ssr-lookups")  # SSR's loop (engine.methods.ssr): think markers, a draft start in the reasoning
PLAIN = tuple(m for m in METHODS if m not in (*WRITES_DRAFTS, *SSR_LOOP))  # one model writes every token, unproposed
ON_A_SERVER = {"baseline": decode_remote_baseline, "ssr": decode_remote_ssr}  # and the RSD family (its writers)
LOSSY = (EXIT,)  # methods whose output may differ from baseline's by design (never called exact)
# why a method is not offered on a vLLM server (the others there: ON_A_SERVER and the RSD family)
NOT_ON_A_SERVER = {EXIT: "over a server the drafts are requests of their own that finish when the server schedules "
                         "them, so where the reasoning stopped would depend on the server's timing, not on the tokens; "
                         "ssr-exit runs in process"}


def check_method(name: str) -> str:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return name


def rsd_writer(lm: LoadedModel | RemoteModel, cfg: RunConfig, capacity: int, role: str) -> StepWriter:
    """RSD's step writer for one model (a ``WriterFactory``): on its vLLM server, or in process."""
    return RemoteWriter(lm, cfg) if isinstance(lm, RemoteModel) else LocalWriter(lm, cfg, capacity, role)


def not_on_a_server(name: str) -> str | None:
    """Why method ``name`` cannot run on a vLLM server, or None where it can."""
    if name in NOT_ON_A_SERVER:
        return f"method {name!r} is not offered on a vLLM server: {NOT_ON_A_SERVER[name]}"
    if name not in (*ON_A_SERVER, *RSD_METHODS):
        return f"method {name!r} runs in process only; on a vLLM server: {', '.join((*ON_A_SERVER, *RSD_METHODS))}"
    return None


def not_on_llama(name: str) -> str | None:
    """Why method ``name`` cannot run on the llama.cpp runtime, or None where it can."""
    if name in ("hf", "hf-pld", "hf-static"):
        return (f"method {name!r} is transformers' own generate(), which the llama.cpp runtime does not run (a GGUF file "
                "there has no transformers module): run it on the transformers runtime; the bench compares with "
                "llama.cpp's own generation instead")
    return None


def not_answer_only(name: str, target: LoadedModel | LlamaModel | RemoteModel) -> str | None:
    """Why method ``name`` on ``target`` cannot run with thinking off (``RunConfig.thinking`` False: the
    answer alone), or None where it can: the single-model methods in process, on a model that can be asked
    for an answer alone (``engine.runtime.markers.answer_only_refusal``). Asked before a run (the bench, the
    studio) and by every run :func:`decoder` builds."""
    answer_only = ", ".join(m for m in SINGLE_MODEL if m != EXIT)
    if name == EXIT:
        return f"method {name!r} ends a reasoning early, and with thinking off there is none: run one of {answer_only}"
    if name not in SINGLE_MODEL:
        return (f"method {name!r} runs with thinking on only (its draft model writes reasoning steps); with thinking "
                f"off run one of {answer_only}")
    if isinstance(target, RemoteModel):
        return "thinking off runs in process only, not on a vLLM server (the server loops always ask for reasoning)"
    return answer_only_refusal(target.markers, target.model_id)


def decoder(name: str, target: LoadedModel | LlamaModel | RemoteModel, draft=None, scorer=None) -> Decoder:
    check_method(name)
    if isinstance(target, RemoteModel) and (why := not_on_a_server(name)):
        raise ValueError(why)
    if isinstance(target, LlamaModel) and (why := not_on_llama(name)):
        raise ValueError(why)
    if isinstance(target, RemoteModel) and name == "ssr" and target.speculation:
        run = partial(decode_served_ssr, target)  # the server speculates from the drafts: no client-side verify
    elif isinstance(target, RemoteModel) and name in ON_A_SERVER:
        run = partial(ON_A_SERVER[name], target)
    elif name in SINGLE_MODEL:
        run = partial(SINGLE_MODEL[name], target)
    else:
        run = partial(decode_rsd, target, draft, scorer, mode=name, writer=rsd_writer)
    return partial(_noting_cuts, run, name, target)


def _noting_cuts(run: Decoder, name: str, target, prompt: str, cfg: RunConfig) -> Iterator[Event]:
    """``run``'s events, its final stats saying which budget cut it (``RunStats.cut``: the one rule,
    :func:`engine.methods.budget.budget_cut`, for every method and backend); with thinking off refused
    before its first event where :func:`not_answer_only` says so."""
    if not cfg.thinking and (why := not_answer_only(name, target)):
        raise ValueError(why)
    events = run(prompt, cfg)
    try:
        for ev in events:
            if isinstance(ev, DoneEvent):
                s = ev.stats
                s.cut = budget_cut(s.reasoning_tokens, s.answer_tokens, cfg.max_think, cfg.max_answer,
                                   rsd=name in RSD_METHODS)
            yield ev
    finally:
        events.close()  # a consumer that stops early closes the run (it logs itself cancelled)
