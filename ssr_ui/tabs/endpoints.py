"""The jobs that use the model (a run, a sweep, a benchmark): the API signature Gradio builds
from their settings, the job each runs as (``ssr_ui.jobs``: a shared studio's bounds refuse the
rest), their concurrency, and the Stop and start buttons they turn on and off."""

from __future__ import annotations

import contextlib
import functools
import inspect

import gradio as gr

from ssr_ui.handlers import Studio
from ssr_ui.jobs import Refused, current_event_id, visitor_address

RUN_CONCURRENCY = 4  # jobs inside the handler at once: one uses the model, the others load or wait (saying so)


def api_signature(cfg, settings: dict, models: dict):
    """Give the generator ``fn(request, prompt, ..., **settings)`` the signature Gradio builds its
    API from: after ``fn``'s own parameters, one per entry of ``settings`` in its order, its default
    ``cfg``'s value (or ``models``' for the model names). Gradio calls it positionally, in the same
    order; the wrapper (a generator too, so Gradio streams it) hands the settings on by name."""
    names = list(settings)

    def decorate(fn):
        head = [p for p in inspect.signature(fn).parameters.values() if p.kind is not p.VAR_KEYWORD]
        tail = [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                  default=models[n] if n in models else getattr(cfg, n)) for n in names]

        @functools.wraps(fn)
        def call(*args, **named):
            values = args[len(head):]  # fewer values: the rest by name or default
            given = {**dict(zip(names, values, strict=False)), **{k: v for k, v in named.items() if k in settings}}
            own = {k: v for k, v in named.items() if k not in settings}
            yield from fn(*args[: len(head)], **own, **{n: given.get(n, p.default) for n, p in zip(names, tail, strict=True)})

        call.__signature__ = inspect.Signature([*head, *tail])
        return call
    return decorate


def visitor_of(request: gr.Request) -> str | None:
    """The client address a shared studio bounds this visitor by (ssr_ui.jobs.visitor_address)."""
    client, headers = getattr(request, "client", None), getattr(request, "headers", None) or {}
    return visitor_address(getattr(client, "host", None), headers.get("x-forwarded-for"))


@contextlib.contextmanager
def job_of(studio: Studio, request: gr.Request):
    """The job this handler runs (ssr_ui.jobs); one over a shared studio's bounds is refused with the reason."""
    with contextlib.ExitStack() as stack:
        try:
            job = stack.enter_context(studio.jobs.running(current_event_id(), request.session_hash,
                                                          visitor_of(request)))
        except Refused as err:
            raise gr.Error(str(err)) from None
        yield job


def model_jobs(studio: Studio) -> dict:
    """The concurrency of the jobs that use the model: on a shared studio every admitted one enters its
    handler at once, to be told its place in the model's line (ssr_ui.waiting); the bounds refuse the
    rest when they join."""
    if studio.public.on:
        return dict(concurrency_limit=studio.public.max_jobs, concurrency_id="model")
    return dict(concurrency_limit=RUN_CONCURRENCY)


def busy():
    """A job starts: the Stop buttons on, the start buttons off (in the order Run's Stop, Run, Sweep,
    the benchmark's Stop, Run benchmark)."""
    on, off = gr.update(interactive=True), gr.update(interactive=False)
    return on, off, off, on, off


def idle():
    """The job ended: the start buttons on, the Stop buttons off (in :func:`busy`'s order)."""
    on, off = gr.update(interactive=True), gr.update(interactive=False)
    return off, on, on, off, on


def stopper(studio: Studio):
    """The Stop buttons' handler: every job of this browser session is cancelled."""
    def stop(request: gr.Request):
        studio.jobs.cancel_session(request.session_hash)
    return stop
