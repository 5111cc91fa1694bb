"""SSR over a server that speculates by itself: the drafts become the server's material.

A client-side verify loop over HTTP costs more per token than the server's own decode step, so on
a server started with a speculative method that proposes from other requests' outputs (vLLM's
``suffix``: a global suffix tree of every running request's output, ArcticInference's), SSR sends
its drafts as today (duplicated requests forked at ``draft_start`` / every ``draft_interval``,
streamed beside the main reasoning, which they share a prefix with) and then asks for the answer as
one plain streamed request. The server proposes the drafts' tokens and verifies them inside its
own decode steps; the output is what plain decoding gives (the server's speculation is lossless).
The drafts keep running while the answer is written (a draft must be running or done before the
answer needs it), and are stopped when the run ends.

The answer streams as the server writes it and is recoloured when its request ends, from the
stream itself: one chunk is one engine step, so a chunk of k tokens is k - 1 proposed tokens the
server accepted and one it picked; that count is checked against the per-request metrics the
server reports in its last chunk (``--per-request-spec-decode-metrics detailed``). An accepted run
found in a draft is labelled with it ("the server's speculation (reconstructed): draft 0 at 14").
The user declares the server's method (``--server-speculation suffix``: vLLM's API does not expose
its speculative config); a run whose server sends no speculative metrics, or proposes nothing,
says so in the strip (``RunStats.server_note``) and is never silently turned into the client-side
loop.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from engine.config import RunConfig
from engine.events import Event
from engine.methods.budget import ThinkBudget
from engine.methods.recorder import Recorder
from engine.methods.ssr.suffix_index import SuffixIndex
from engine.remote.decode import RemoteState, _reason_and_fork, _recorder
from engine.remote.model import RemoteModel

SPECULATIONS = ("suffix", "ngram")  # server methods a run can declare (suffix draws on other requests' outputs)
RECONSTRUCTED = "the server's speculation (reconstructed)"


def decode_served_ssr(rm: RemoteModel, prompt: str, cfg: RunConfig) -> Iterator[Event]:
    """Yield the events of an SSR run of ``prompt`` on a server that speculates by itself."""
    markers = rm.require_markers()
    cfg.check_ssr()
    rm.begin_run(cfg.exact)
    if cfg.think_spec:
        raise ValueError("think_spec (reasoning lookups) runs in process only: set it to 0 for a vLLM server")
    prompt_ids = rm.prompt_ids(prompt)
    rec = _recorder(rm, "ssr", prompt_ids)
    rec.stats.verify = f"on the server: its {rm.speculation} speculation (no client-side verify)"
    rec.stats.server_speculation = rm.speculation
    index = SuffixIndex(cfg.min_match)
    index.extend("prompt", prompt_ids)
    state = RemoteState(rm, cfg, rec, index, prompt_ids)
    budget = ThinkBudget(markers, cfg.max_think)
    drafts_stop = threading.Event()  # the drafts run on until the answer is written
    yield rec.phase("prefill")
    try:
        yield from _reason_and_fork(state, budget, drafts_stop)
        if not state.ended:
            yield from budget.open_answer(rec)
            offset = len(budget.forced)
            metrics: dict = {}
            chunks: list[int] = []
            if cfg.max_answer > offset:
                rec.forward()
                for tok in rm.client.stream(state.seq + [markers.close_id, *budget.forced], cfg.max_answer - offset,
                                            rm.eos_ids, cfg.temperature, cfg.top_p, cfg.seed, metrics=metrics,
                                            chunks=chunks):
                    if tok in rm.eos_ids:  # the last token: the stream goes on to its metrics chunk, read it
                        continue
                    yield rec.token("answer", tok)
            yield from recolour(state, rec, offset, chunks, metrics.get("speculative_decoding"))
    finally:
        drafts_stop.set()
    yield rec.phase("done")
    yield rec.done()


def recolour(s: RemoteState, rec: Recorder, offset: int, chunks: list[int], spec: dict | None) -> Iterator[Event]:
    """Mark the answer tokens the server's speculation accepted (from the stream's chunks, checked
    against its metrics ``spec``), each run with the draft it matches; record the server's figures."""
    st = rec.stats
    if not spec:
        st.server_note = (f"declared {st.server_speculation} speculation, but the server sent no per-request "
                          "speculative metrics: start it with --speculative-config and "
                          "--per-request-spec-decode-metrics detailed (docs/SCALING.md)")
        return
    st.server_accepted = int(spec.get("num_accepted_draft_tokens", 0))
    st.server_proposed = int(spec.get("num_draft_tokens", 0))
    st.server_steps = int(spec.get("num_spec_steps", 0))
    if not st.server_proposed:
        st.server_note = f"the server's {st.server_speculation} speculation proposed nothing on this answer"
    answer = rec.streams.get(("answer", None), [])
    steps = engine_steps(chunks, spec.get("per_step_accepted"))
    if steps is None:
        st.server_note = st.server_note or (f"the server accepted {st.server_accepted} proposed tokens; its stream "
                                            "and its metrics do not say which, so the answer is not recoloured")
        return
    p = offset
    for accepted in steps:  # a step gives its accepted tokens, then the one it picked
        run = answer[p:min(p + accepted, len(answer))]
        if run:
            where = _in_drafts(s, run)
            source = RECONSTRUCTED + (f": draft {where[0]} at {where[1]}" if where else "")
            for j in range(len(run)):
                yield rec.answer_status(p + j, "accepted", source, where[0] if where else None, len(run))
        p += accepted + 1


def engine_steps(chunks: list[int], per_step_accepted: list[int] | None) -> list[int] | None:
    """The accepted count of each of the request's engine steps, in order (0 for the prefill and for
    steps nothing was proposed in), from the stream's chunk sizes and the server's per-step figures
    (which list only steps with a proposal). One chunk is one step unless the server merged the
    outputs of several for a slow reader; then the steps are fitted into the chunks in order, each
    speculative step as early as it fits. None when they cannot be fitted (no colours are guessed)."""
    if per_step_accepted is None or not chunks:
        return None
    spec = list(per_step_accepted)
    plain = sum(chunks) - sum(a + 1 for a in spec)  # the prefill's token and the steps with no proposal
    if plain < 1:
        return None
    out, k = [0], 0  # the prefill
    plain -= 1
    room = chunks[0] - 1
    for c in [None, *chunks[1:]]:
        room += c or 0
        while room > 0:
            if k < len(spec) and spec[k] + 1 <= room:
                out.append(spec[k])
                room -= spec[k] + 1
                k += 1
            elif plain > 0:
                out.append(0)
                room -= 1
                plain -= 1
            else:
                return None
    return out if k == len(spec) and plain == 0 and room == 0 else None


def _in_drafts(s: RemoteState, run: list[int]) -> tuple[int, int] | None:
    """(draft, position) where ``run`` occurs in a draft, if it does."""
    k = len(run)
    for d in s.drafts:
        toks = d.tokens
        for i in range(len(toks) - k + 1):
            if toks[i:i + k] == run:
                return d.index, i
    return None
