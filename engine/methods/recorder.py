"""Builds a run's events and statistics, so decode loops only say what happened.

Every decode loop owns one :class:`Recorder`: it turns token ids into :class:`TokenEvent` s (with
incrementally decoded text and positions), records each forward as a :class:`ForwardEvent` (the one
place forwards are counted and timed), counts them into :class:`RunStats`, times the phases, and
ends the run with a :class:`DoneEvent` (its forward statistics summed by ``engine.forwards``).

A loop times a forward with :meth:`Recorder.now` before it and :meth:`Recorder.clock` after it (the
device synchronised: on a GPU a forward is queued, not done, when the call returns), and yields
:meth:`Recorder.forward` before the tokens the forward chose::

    t0 = rec.now()
    logits = model(...)
    t1 = rec.clock()
    yield rec.forward(t0, [RowWork("main", fed=1, kept=1)], end=t1)
    yield rec.token("reasoning", pick(logits))
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

import torch

from engine.events import DoneEvent, ForwardEvent, PhaseEvent, RowWork, RunStats, TokenEvent, TokenTally
from engine.forwards import summarise
from engine.methods.detok import IncrementalDetokenizer
from engine.runtime.model import Compiling


def numerics_of(model) -> str:
    """A model's precision and how it was chosen, in words (``engine.runtime.numerics``), or "" where
    it was not settled (a server's, a llama.cpp file's quantization: their step mode says)."""
    numerics = getattr(model, "numerics", None)
    return numerics.sentence if numerics is not None else ""


class Recorder:
    def __init__(self, tokenizer, method: str, prompt_tokens: int, device: torch.device | None = None) -> None:
        self.tokenizer = tokenizer
        self.stats = RunStats(method=method, prompt_tokens=prompt_tokens)
        self.tally = TokenTally(self.stats)  # the token counters, from the events as they are made
        self.t0 = time.perf_counter()
        self.device = device
        self._phase: str | None = None
        self._phase_t0 = self.t0
        self._detok: dict[tuple[str, int | None], IncrementalDetokenizer] = {}
        self.streams: dict[tuple[str, int | None], list[int]] = {}
        self._pieces: dict[tuple[str, int | None], list[str]] = {}  # each stream's decoded pieces, as ``streams``
        self._taken: dict[int, set[int]] = {}  # draft positions taken: never given another verdict
        self.forwards: list[ForwardEvent] = []
        if device is not None and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def compiling(self, progress: Iterable[Compiling]) -> Iterator[PhaseEvent]:
        """Relay the runtime's progress in compiling this run's step shapes (a model's
        ``prepare_steps``) as "compiling" phases; the seconds count as ``compile_s``, never latency."""
        spent = 0.0
        for p in progress:
            spent = p.seconds
            yield PhaseEvent("compiling", 0.0, done=p.done, total=p.total)
        self.stats.compile_s += spent

    def start_clock(self, model) -> None:
        """The run starts now, after any compiling; ``model`` (the target) says how its steps run and
        in what precision."""
        self.stats.step_mode = model.step_mode
        self.stats.numerics = numerics_of(model)
        self.t0 = self._phase_t0 = time.perf_counter()
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def clock(self) -> float:
        """:meth:`now`, once the device has finished what was queued on it (a forward's end)."""
        if self.device is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return self.now()

    # ------------------------------------------------------------------ phases
    def phase(self, name: str, draft: int | None = None, at_token: int | None = None) -> PhaseEvent:
        if name != "drafting":
            self._close_phase()
            self._phase, self._phase_t0 = name, time.perf_counter()
        return PhaseEvent(name, self.now(), draft, at_token)

    def _close_phase(self) -> None:
        if self._phase in ("prefill", "reasoning", "answer"):
            field = f"{self._phase}_s"
            setattr(self.stats, field, getattr(self.stats, field) + time.perf_counter() - self._phase_t0)

    # ------------------------------------------------------------------ tokens
    def token(self, stream: str, token_id: int, status: str = "generated", draft: int | None = None,
              source: str | None = None, match_len: int | None = None) -> TokenEvent:
        """A new token on ``stream`` (for ``draft``: a new token of draft ``draft``)."""
        key = (stream, draft if stream == "draft" else None)
        detok = self._detok.get(key)
        if detok is None:
            detok = self._detok[key] = IncrementalDetokenizer(self.tokenizer)
        ids = self.streams.setdefault(key, [])
        ids.append(token_id)
        piece = detok.push(token_id)
        self._pieces.setdefault(key, []).append(piece)
        if stream == "answer" and self.stats.ttft_s is None:
            self.stats.ttft_s = self.now()
        return self._counted(TokenEvent(stream, status, token_id, piece, len(ids) - 1, self.now(), draft, source,
                                        match_len))

    def _counted(self, ev: TokenEvent) -> TokenEvent:
        self.tally.add(ev)
        return ev

    def draft_status(self, draft: int, position: int, status: str, source: str | None = None,
                     match_len: int | None = None) -> TokenEvent | None:
        """A verdict on an existing draft token; None when the token was taken already. A taken token keeps
        the verdict of the answer token that first took it (a later suffix match reading the same draft token
        for another answer token would recolour a green prefix token amber: one draft token, two credits)."""
        taken = self._taken.setdefault(draft, set())
        if position in taken:
            return None
        if status != "rejected":
            taken.add(position)
        return self._verdict(("draft", draft), position, status, draft, source, match_len)

    def answer_status(self, position: int, status: str, source: str | None = None, draft: int | None = None,
                      match_len: int | None = None) -> TokenEvent:
        """A new verdict on answer token ``position`` (a server's speculation accepted it: known
        only when its request ends, so the token streamed ``generated`` first)."""
        return self._verdict(("answer", None), position, status, draft, source, match_len)

    def _verdict(self, key: tuple[str, int | None], position: int, status: str, draft: int | None,
                 source: str | None, match_len: int | None) -> TokenEvent:
        """A new verdict on an existing token of stream ``key``: its id and piece again, a new status."""
        token_id, piece = self.streams[key][position], self._pieces[key][position]
        return self._counted(TokenEvent(key[0], status, token_id, piece, position, self.now(), draft, source, match_len))

    def rejected_lookup(self, count: int) -> None:
        """Proposed tokens from the prompt, reasoning or answer that were not taken."""
        self.stats.rejected_lookup += count

    def forward(self, start: float, rows: list[RowWork], end: float | None = None, tokens: int = 0,
                phase: str | None = None) -> ForwardEvent:
        """One forward (over a server: one request) that ran from ``start`` to ``end`` (default:
        :meth:`clock` now) in ``phase`` (default: the current one), computing ``rows``; ``tokens``:
        token positions the target computed in it (its FLOPs; other models count their own)."""
        end = self.clock() if end is None else end
        ev = ForwardEvent(len(self.forwards), phase or self._phase or "prefill", start, end, tuple(rows))
        self.forwards.append(ev)
        self.stats.forward_calls += 1
        self.stats.answer_forwards += ev.phase == "answer" and rows[0].row == "main"  # the target's (RSD counts its own)
        self.stats.target_tokens += tokens
        return ev

    # ------------------------------------------------------------------ end
    def text(self, stream: str, draft: int | None = None) -> str:
        key = (stream, draft)
        detok = self._detok.get(key)
        return detok.text + detok.flush() if detok else ""

    def done(self, wall_s: float | None = None) -> DoneEvent:
        """End the run; ``wall_s`` overrides the measured wall time (for runs replayed post hoc)."""
        self._close_phase()
        self._phase = None
        s = self.stats
        s.wall_s = self.now() if wall_s is None else wall_s
        s.tokens_per_s = (s.reasoning_tokens + s.answer_tokens) / s.wall_s if s.wall_s > 0 else 0.0
        summarise(s, self.forwards)
        if self.device is not None and self.device.type == "cuda":
            s.peak_memory_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        drafts = sorted(d for (st, d) in self.streams if st == "draft")
        return DoneEvent(
            stats=s,
            reasoning_text=self.text("reasoning"),
            answer_text=self.text("answer"),
            reasoning_ids=list(self.streams.get(("reasoning", None), [])),
            answer_ids=list(self.streams.get(("answer", None), [])),
            drafts=[list(self.streams[("draft", d)]) for d in drafts],
        )
