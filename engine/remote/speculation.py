"""What a server's own speculation did to one streamed request, rebuilt from the stream and the
per-request metrics vLLM reports in its last chunk (``--per-request-spec-decode-metrics detailed``):
which tokens it accepted (one chunk is one engine step, unless the server merged several for a
slow reader), recorded as new verdicts on those tokens and as the run's ``server_*`` figures."""

from __future__ import annotations

from collections.abc import Iterator

from engine.events import Event, RowWork
from engine.methods.recorder import Recorder

SPECULATIONS = ("suffix", "ngram")  # server methods a run can declare (suffix draws on other requests' outputs)
RECONSTRUCTED = "the server's speculation (reconstructed)"


def speculated_answer(rm, rec: Recorder, seq: list[int], max_tokens: int, cfg, drafts: list,
                      offset: int) -> Iterator[Event]:
    """The answer as one plain streamed request after ``seq`` on ``rm``'s speculating server (its
    usage chunk and chunk sizes read), then the tokens its speculation accepted recoloured
    (:func:`recolour`); ``offset``: answer tokens before the request's (a forced template tail)."""
    rec.stats.server.speculation = rm.speculation
    metrics: dict = {}
    chunks: list[int] = []
    t0, kept = rec.now(), 0
    for tok in rm.client.stream(seq, max_tokens, rm.eos_ids, cfg.temperature, cfg.top_p, cfg.seed, metrics=metrics,
                                chunks=chunks):
        if tok not in rm.eos_ids:  # the last token: the stream goes on to its metrics chunk
            kept += 1
            yield rec.token("answer", tok)
    spec = metrics.get("speculative_decoding") or {}
    # the server's totals over its engine steps: not one verify (no proposal per step is reported), so a note,
    # never a verify's figures (the acceptance statistics would read them as one proposal's prefix)
    note = (f"the server's {rm.speculation} speculation: {spec.get('num_accepted_draft_tokens', 0)} of "
            f"{spec.get('num_draft_tokens', 0)} proposed tokens accepted over {spec.get('num_spec_steps', 0)} "
            "speculative steps" if spec else None)
    yield rec.forward(t0, [RowWork("main", len(seq), kept, note=note)])
    yield from recolour(drafts, rec, offset, chunks, metrics.get("speculative_decoding"))


def recolour(drafts: list, rec: Recorder, offset: int, chunks: list[int], spec: dict | None) -> Iterator[Event]:
    """Mark the answer tokens (from position ``offset``) the server's speculation accepted, from the
    stream's ``chunks`` fitted to its metrics ``spec``, each accepted run with the draft of ``drafts``
    it matches; record the server's figures, or a sentence where the server contradicts its
    declared speculation."""
    st = rec.stats
    if not spec:
        st.server.note = (f"declared {st.server.speculation} speculation, but the server sent no per-request "
                          "speculative metrics: start it with --speculative-config and "
                          "--per-request-spec-decode-metrics detailed (docs/SCALING.md)")
        return
    st.server.accepted = int(spec.get("num_accepted_draft_tokens", 0))
    st.server.proposed = int(spec.get("num_draft_tokens", 0))
    st.server.steps = int(spec.get("num_spec_steps", 0))
    if not st.server.proposed:
        st.server.note = f"the server's {st.server.speculation} speculation proposed nothing on this answer"
    answer = rec.streams.get(("answer", None), [])
    steps = engine_steps(chunks, spec.get("per_step_accepted"))
    if steps is None:
        st.server.note = st.server.note or (f"the server accepted {st.server.accepted} proposed tokens; its stream "
                                            "and its metrics do not say which, so the answer is not recoloured")
        return
    p = offset
    for accepted in steps:  # a step gives its accepted tokens, then the one it picked
        run = answer[p:min(p + accepted, len(answer))]
        if run:
            where = _in_drafts(drafts, run)
            source = RECONSTRUCTED + (f": draft {where[0]} at {where[1]}" if where else "")
            for j in range(len(run)):
                yield rec.answer_status(p + j, "accepted", source, where[0] if where else None, len(run))
        p += accepted + 1


def engine_steps(chunks: list[int], per_step_accepted: list[int] | None) -> list[int] | None:
    """The accepted count of each of the request's engine steps, in order (0 for the prefill and for
    steps nothing was proposed in), from the stream's chunk sizes and the server's per-step figures
    (which list only steps with a proposal). One chunk is one step unless the server merged the
    outputs of several for a slow reader; then the steps are fitted into the chunks in order, each
    speculative step as soon as it fits. The last step may have been cut by a stop token (the
    server counts what it accepted before the stop). None when they cannot be fitted: no colours
    are guessed."""
    if per_step_accepted is None or not chunks:
        return None
    spec = list(per_step_accepted)
    out, k, room = [0], 0, chunks[0] - 1  # the prefill's token opens the first chunk
    for i, c in enumerate([0, *chunks[1:]]):
        room += c
        last = i == len(chunks) - 1
        while room > 0:
            if k < len(spec) and spec[k] + 1 <= room:
                out.append(spec[k])
                room -= spec[k] + 1
                k += 1
            elif last and k == len(spec) - 1:  # the final step, cut at a stop token inside what it accepted
                out.append(room - 1 if room <= spec[k] else spec[k])
                room, k = 0, k + 1
            else:
                out.append(0)
                room -= 1
    return out if k == len(spec) else None


def _in_drafts(drafts: list, run: list[int]) -> tuple[int, int] | None:
    """(draft, position) where ``run`` occurs in a draft, if it does."""
    k = len(run)
    for d in drafts:
        toks = d.tokens
        for i in range(len(toks) - k + 1):
            if toks[i:i + k] == run:
                return d.index, i
    return None
