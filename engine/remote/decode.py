"""Plain decoding and SSR against a vLLM server: the same events, colours and stats as in process.

``baseline``: the reasoning is one streamed request (stopped by the server at the end-of-thinking
marker or an end of sequence, ``max_think - 1`` tokens at most (the marker is the budget's last); on reaching the budget the marker and
the template tail are appended, as in process), then the answer is a second one.

``ssr`` (greedy): phase A streams the main reasoning; at each fork point a draft is a duplicated
request (the question, the reasoning so far and the end-of-thinking marker), streamed beside the
main one and batched with it by the server, which also shares their prefix in its cache (the
paper's own vLLM method). A draft still streaming when the reasoning ends keeps what it has.
Phase B is SSR's own answer loop (``engine.methods.ssr.loop.answer_by_verification``) over
:class:`RemoteState` (an ``SSRState``), whose ``verify`` sends
the candidate tokens in one request with ``prompt_logprobs`` (the rank-1 token at each position is
the greedy one); with nothing to verify it asks for the next token with a plain request, which
reads the server's prefix cache. A verify re-prefills its prompt on the server (vLLM skips the
prefix cache for ``prompt_logprobs``): the cost the proposal lengths face there.

Not over a server: sampling in SSR (the server returns top-k log-probabilities, not the
distributions speculative sampling needs) and exact mode, each refused with the reason; reasoning
lookups (``think_spec``: rows with holes are an in-process cache layout, and a verify per
reasoning step would be a round trip per step) are set aside, and the run's ``lookups`` says so.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

from engine.config import RunConfig
from engine.events import Event, RowWork
from engine.methods.budget import ThinkBudget
from engine.methods.recorder import Recorder
from engine.methods.sampling import accept_greedy
from engine.methods.ssr.loop import SSRBudget, answer_by_verification, fork_point, open_draft, take_draft_token
from engine.methods.ssr.proposers import Draft
from engine.methods.ssr.suffix_index import SuffixIndex
from engine.remote.client import BackendError
from engine.remote.model import RemoteModel
from engine.remote.speculation import speculated_answer
from engine.steps import CLIENT_SIDE


def decode_remote_baseline(rm: RemoteModel, prompt: str, cfg: RunConfig) -> Iterator[Event]:
    """Yield the events of a plain run of ``prompt`` on the server."""
    rm.begin_run(cfg.exact_mode)
    prompt_ids = rm.prompt_ids(prompt)
    rec = _recorder(rm, "baseline", prompt_ids)
    markers, eos = rm.markers, rm.eos_ids
    budget = ThinkBudget(markers, cfg.max_think)
    seq = list(prompt_ids)
    yield rec.phase("prefill")  # the server prefills inside the first request
    ended = False
    if markers is not None:
        yield rec.phase("reasoning")
        closed, reasoning, t0 = False, [], rec.now()
        for tok in _stream(rm, seq, budget.picks, eos | markers.stop_ids, cfg):
            if tok in eos:  # the run ends, or (a prompted model's end of turn) the end of thinking is forced
                ended = budget.ends_run(tok, eos)
                break
            yield rec.token("reasoning", tok)
            reasoning.append(tok)
            if markers.closes_at(reasoning, len(reasoning) - 1):  # (a prompted close: leaving the stream ends it)
                closed = True
                break
        forcing = budget.force() if not (ended or closed) else []  # the server stopped at the budget
        yield rec.forward(t0, [RowWork("main", len(seq), len(reasoning), len(forcing) + len(budget.forced))])
        seq += reasoning
        if forcing:  # the end of thinking is forced
            for tok in forcing:
                yield rec.token("reasoning", tok)
                seq.append(tok)
            seq += budget.forced
    yield from budget.open_answer(rec)
    if not ended and cfg.max_answer > len(budget.forced):
        if rm.speculation:  # a speculating server: its figures and colours, as SSR's answer gets them
            yield from speculated_answer(rm, rec, seq, cfg.max_answer - len(budget.forced), cfg, [], len(budget.forced))
        else:
            t0, kept = rec.now(), 0
            for tok in _stream(rm, seq, cfg.max_answer - len(budget.forced), eos, cfg):
                if tok in eos:
                    break
                kept += 1
                yield rec.token("answer", tok)
            yield rec.forward(t0, [RowWork("main", len(seq), kept)])  # a request's record comes when it ends
    yield rec.phase("done")
    yield rec.done()


def lookups_set_aside(cfg: RunConfig) -> str:
    """What a server run says of ``think_spec`` (reasoning lookups): set aside, with why."""
    return ("off on a server: a lookup verified in the reasoning would be a request, a round trip, per step; "
            f"Reasoning lookup {cfg.think_spec} applies in process") if cfg.think_spec else ""


def decode_remote_ssr(rm: RemoteModel, prompt: str, cfg: RunConfig) -> Iterator[Event]:
    """Yield the events of a greedy SSR run of ``prompt`` on the server."""
    markers = rm.require_markers()
    cfg.check_ssr()
    rm.begin_run(cfg.exact_mode)
    if not cfg.greedy:
        raise ValueError("SSR over a vLLM server is greedy only (temperature 0): verifying sampled tokens needs "
                         "the full distributions, and the server returns top-k log-probabilities")
    prompt_ids = rm.prompt_ids(prompt)
    rec = _recorder(rm, "ssr", prompt_ids)
    rec.stats.verify = f"{CLIENT_SIDE}: one verify request per proposal (the server does not speculate)"
    rec.stats.lookups = lookups_set_aside(cfg)
    index = SuffixIndex(cfg.min_match)
    index.extend("prompt", prompt_ids)
    state = RemoteState(rm, cfg, rec, index, prompt_ids)
    budget = SSRBudget(markers, cfg, state)
    yield rec.phase("prefill")
    yield from _reason_and_fork(state, budget)
    if not state.ended:
        yield from answer_by_verification(state, budget)
    yield rec.phase("done")
    yield rec.done()


class RemoteState:
    """SSR's state over a server (an ``engine.methods.ssr.loop.SSRState``): the tokens committed
    so far and a ``verify`` that asks the server."""

    def __init__(self, rm: RemoteModel, cfg: RunConfig, rec: Recorder, index: SuffixIndex, prompt_ids: list[int]):
        self.lm, self.cfg, self.rec, self.index = rm, cfg, rec, index
        self.eos_ids = rm.eos_ids
        self.seq = list(prompt_ids)  # every token before the unfed ones
        self.drafts: list[Draft] = []
        self.unfed: list[int] = []
        self.answer: list[int] = []
        self.ended = False
        self.computed = 0  # the server's FLOPs are not known here
        self.forward_end = 0.0

    def room(self) -> int | None:
        """No limit on a proposal (None): the server handles its model's positions."""
        return None

    def verify(self, proposed: list[int], probs) -> tuple[int, int]:
        """(Accepted count, the server's next token) for ``proposed`` after the unfed tokens."""
        client = self.lm.client
        if proposed:  # the greedy token at each proposed position, then the one after
            picks = client.verify(self.seq, self.unfed + proposed)[len(self.unfed):]
        else:
            picks = list(_first(client.stream(self.seq + self.unfed, 1)))
        self.forward_end = self.rec.now()
        accepted, nxt = accept_greedy(picks, proposed)
        self.seq += self.unfed + proposed[:accepted]
        return accepted, nxt

    def answer_widths(self, label: str) -> None:
        """Every proposal is verified whole: the server verifies in its own kernels (no forward costs here)."""


def _reason_and_fork(s: RemoteState, budget: ThinkBudget, drafts_stop: threading.Event | None = None,
                     finish_drafts: bool = False) -> Iterator[Event]:
    """Phase A: the main reasoning and the drafts, each a streamed request, as their tokens arrive.
    Ends with ``s.ended``, or with ``s.seq`` holding the reasoning but the token(s) that closed it,
    left in ``s.unfed`` with the tail forced after them (phase B feeds them first). The drafts'
    requests are aborted when it ends, unless the caller owns ``drafts_stop`` (and sets it when its
    run ends); the main request always ends here.
    ``finish_drafts``: when the reasoning has ended, wait for the drafts still running to finish
    (each at ``max_draft`` or its end of sequence), so that the answer starts with every draft whole
    in the server's material, however far they had got: pass counts that do not race the drafts."""
    cfg, rec, rm, markers = s.cfg, s.rec, s.lm, budget.markers
    eos = rm.eos_ids
    yield rec.phase("reasoning")
    arrivals: queue.Queue = queue.Queue()  # (source, token | None at the end | BackendError)
    stop = threading.Event()  # the main request's
    drafts = drafts_stop or stop
    pumps = [_pump(rm, s.seq, budget.picks, eos | markers.stop_ids, "main", arrivals, stop)]
    requests = _Requests(rec, len(s.seq))
    live: dict[int, Draft] = {}
    n = 0
    try:
        while True:
            while len(s.drafts) < cfg.num_drafts and n == fork_point(cfg, len(s.drafts)):
                yield from open_draft(s, n, list(markers.tail_ids))
                d = s.drafts[-1]
                if len(d.tokens) < cfg.max_draft:
                    live[d.index] = d
                    pumps.append(_pump(rm, s.seq + list(markers.close_ids), cfg.max_draft - len(d.tokens), eos, d.index,
                                       arrivals, drafts))
                    requests.opened(d, len(s.seq) + len(markers.close_ids))
                else:
                    d.finished = True
            try:  # the client's own timeout answers first; this one only guards a thread that died silently
                source, item = arrivals.get(timeout=(rm.client.http.timeout.read or 0) + 30 or None)
            except queue.Empty:
                raise BackendError(f"{rm.client.base_url} sent nothing for too long") from None
            if isinstance(item, BackendError):
                raise item
            if source != "main":
                yield from _draft_takes(s, live, source, item, requests)
                continue
            if budget.ends_run(item, eos):  # the model ended without closing its thoughts: no answer
                s.ended = True
                yield requests.main(n)
                break
            if item is None or item in eos:  # the server stopped at the budget (or a prompted model's turn ended)
                s.unfed = budget.force()
                yield requests.main(n, len(s.unfed) + len(budget.forced))
                for tok in s.unfed:
                    yield rec.token("reasoning", tok)
                s.unfed += budget.forced
                break
            yield rec.token("reasoning", item)
            s.index.extend("reasoning", [item])
            reasoning = s.index.sources["reasoning"]
            if markers.closes_at(reasoning, len(reasoning) - 1):
                yield requests.main(n + 1)
                s.unfed = [item]
                break
            s.seq.append(item)
            n += 1
        while finish_drafts and live and not s.ended:  # the main request has ended: its late tokens are dropped
            source, item = arrivals.get(timeout=(rm.client.http.timeout.read or 0) + 30 or None)
            if isinstance(item, BackendError):
                raise item
            if source != "main":
                yield from _draft_takes(s, live, source, item, requests)
        for d in live.values():  # frozen as they are: their requests end here
            yield requests.draft(d)
    except queue.Empty:
        raise BackendError(f"{rm.client.base_url} sent nothing for too long") from None
    finally:
        stop.set()  # drafts still streaming keep what they have; their requests are aborted


class _Requests:
    """Phase A's streamed requests as forward records, each recorded when it ends: the main
    reasoning (fed the prompt, keeping the reasoning it streamed) and each draft (fed the prompt,
    the reasoning so far and the marker; its opening tail counted as forced, then what it streamed)."""

    def __init__(self, rec: Recorder, prompt: int) -> None:
        self.rec, self.prompt, self.t0 = rec, prompt, rec.now()
        self.drafts: dict[int, tuple[float, int, int]] = {}  # draft -> (start, fed, opening tokens)

    def main(self, kept: int, forced: int = 0):
        return self.rec.forward(self.t0, [RowWork("main", self.prompt, kept, forced)], phase="reasoning")

    def opened(self, d: Draft, fed: int) -> None:
        self.drafts[d.index] = (self.rec.now(), fed, len(d.tokens))

    def draft(self, d: Draft):
        start, fed, opening = self.drafts.pop(d.index)
        return self.rec.forward(start, [RowWork(f"draft {d.index}", fed, len(d.tokens) - opening, opening)],
                                phase="reasoning")


def _draft_takes(s: RemoteState, live: dict[int, Draft], index: int, tok: int | None,
                 requests: _Requests) -> Iterator[Event]:
    """A streamed draft's next token (None: its request ended at ``max_draft``)."""
    d = live.get(index)
    if d is None:  # finished, or frozen when the reasoning ended
        return
    ev = take_draft_token(s, d, tok, None) if tok is not None else None
    if ev is not None:
        yield ev
    if tok is None or d.finished:
        d.finished = True
        del live[index]
        yield requests.draft(d)


def _pump(rm: RemoteModel, prompt: list[int], max_tokens: int, stop_ids: frozenset[int], source, arrivals: queue.Queue,
          stop: threading.Event) -> threading.Thread:
    """Stream a request on a thread into ``arrivals``; ``stop`` aborts it."""
    def run() -> None:
        tokens = rm.client.stream(list(prompt), max_tokens, stop_ids)
        try:
            for tok in tokens:
                if stop.is_set():
                    return
                arrivals.put((source, tok))
            arrivals.put((source, None))
        except BackendError as err:
            arrivals.put((source, err))
        finally:
            tokens.close()

    thread = threading.Thread(target=run, daemon=True, name=f"vllm-{source}")
    thread.start()
    return thread


def _stream(rm: RemoteModel, seq: list[int], max_tokens: int, stop: frozenset[int], cfg: RunConfig) -> Iterator[int]:
    return rm.client.stream(seq, max_tokens, stop, cfg.temperature, cfg.top_p, cfg.seed)


def _first(tokens: Iterator[int]) -> Iterator[int]:
    try:
        yield next(tokens)
    finally:
        tokens.close()


def _recorder(rm: RemoteModel, method: str, prompt_ids: list[int]) -> Recorder:
    rec = Recorder(rm.tokenizer, method, len(prompt_ids))
    rec.stats.step_mode = rm.backend
    return rec
