"""SSR over a server that speculates by itself: the drafts become the server's material.

A client-side verify loop over HTTP costs more per token than the server's own decode step, so on
a server started with a speculative method that proposes from other requests' outputs (vLLM's
``suffix``: a global suffix tree of every running request's output, ArcticInference's), SSR sends
its drafts as today (duplicated requests forked at ``draft_start`` / every ``draft_interval``,
streamed beside the main reasoning, which they share a prefix with) and then asks for the answer as
one plain streamed request. The server proposes the drafts' tokens and verifies them inside its
own decode steps; the output is what plain decoding gives (the server's speculation is lossless).
The answer waits for the drafts still running when the reasoning ends to finish (each writes at
most ``max_draft`` tokens), so that it starts with every draft whole in the server's material:
its pass counts then repeat run to run instead of depending on how far a draft had got (they went
56, 19, 19 on one prompt before). What it costs: the time the drafts still need when the
reasoning ends (none when they finished during it, the usual case with ``max_draft`` below the
reasoning left after the fork).

The answer streams as the server writes it and is recoloured when its request ends, from the
stream itself: one chunk is one engine step, so a chunk of k tokens is k - 1 proposed tokens the
server accepted and one it picked; that count is checked against the per-request metrics the
server reports in its last chunk (``--per-request-spec-decode-metrics detailed``). An accepted run
found in a draft is labelled with it ("the server's speculation (reconstructed): draft 0 at 14").
The user declares the server's method (``--server-speculation suffix``: vLLM's API does not expose
its speculative config); a run whose server sends no speculative metrics, or proposes nothing,
says so in the strip (``RunStats.server.note``) and is never silently turned into the client-side
loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from engine.config import RunConfig
from engine.events import Event
from engine.methods.budget import ThinkBudget
from engine.methods.ssr.suffix_index import SuffixIndex
from engine.remote.decode import RemoteState, _reason_and_fork, _recorder, lookups_set_aside
from engine.remote.model import RemoteModel
from engine.remote.speculation import speculated_answer
from engine.steps import ON_SERVER


def decode_served_ssr(rm: RemoteModel, prompt: str, cfg: RunConfig) -> Iterator[Event]:
    """Yield the events of an SSR run of ``prompt`` on a server that speculates by itself."""
    markers = rm.require_markers()
    cfg.check_ssr()
    rm.begin_run(cfg.exact_mode)
    prompt_ids = rm.prompt_ids(prompt)
    rec = _recorder(rm, "ssr", prompt_ids)
    rec.stats.verify = f"{ON_SERVER}: its {rm.speculation} speculation (no client-side verify)"
    rec.stats.lookups = lookups_set_aside(cfg)
    rec.stats.server.speculation = rm.speculation
    index = SuffixIndex(cfg.min_match)
    index.extend("prompt", prompt_ids)
    state = RemoteState(rm, cfg, rec, index, prompt_ids)
    budget = ThinkBudget(markers, cfg.max_think)
    drafts_stop = threading.Event()  # the drafts run to their end (finish_drafts); set at the end: aborts any left
    yield rec.phase("prefill")
    try:
        # the answer starts once every draft is whole in the server's tree: its passes never race the drafts
        yield from _reason_and_fork(state, budget, drafts_stop, finish_drafts=True)
        if not state.ended:
            yield from budget.open_answer(rec)
            offset = len(budget.forced)
            if cfg.max_answer > offset:
                yield from speculated_answer(rm, rec, state.seq + state.unfed,
                                             cfg.max_answer - offset, cfg, state.drafts, offset)
    finally:
        drafts_stop.set()
    yield rec.phase("done")
    yield rec.done()
