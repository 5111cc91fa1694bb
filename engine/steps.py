"""How a run's steps and verifies ran, as typed values: the words the engine writes in ``RunStats.step_mode``
and ``RunStats.verify`` (the run log keeps them as text) are made from the constants here, and read back here
only, so that the studio branches on fields, never on the engine's sentences.

>>> StepMode.of("exact fixed 8x32 compiled").route, StepMode.of("exact fixed 8x32 compiled").compiled
('fixed 8x32', True)
>>> StepMode.of("llama.cpp (q4, f16 KV, cpu, 2 threads)").backend, Verify.of("one token per step: ...").one_token
(True, True)
"""

from __future__ import annotations

from dataclasses import dataclass

COMPILED, EAGER = "compiled", "eager"  # in process: "compiled", or "eager: <why not compiled>"
EXACT_FIXED, EXACT_ROWS = "exact fixed", "exact rows"  # exact mode's routes: "exact fixed 8x32 eager", "exact rows: ..."
VLLM, LLAMA = "vllm", "llama.cpp"  # a backend's own words follow its name: "vllm <url>", "llama.cpp (<its settings>)"
BACKENDS = (VLLM, LLAMA)
K_TOKENS, ONE_TOKEN = "k tokens per forward", "one token per step"  # in process, as the capability probe measured
ON_SERVER, CLIENT_SIDE = "on the server", "client-side"  # over a vLLM server: its speculation, or ours per request


@dataclass(frozen=True)
class _Words:
    """One of the engine's RunStats sentences, read: its ``text`` as written (a run logged empty: "")."""

    text: str

    @classmethod
    def of(cls, text: str | None):
        return cls(text or "")

    @property
    def head(self) -> str:
        """The words before any reason ("eager: <why>" -> "eager", "on the server: ..." -> "on the server")."""
        return self.text.split(":")[0]


@dataclass(frozen=True)
class StepMode(_Words):
    """``RunStats.step_mode`` read: where the forwards ran (a backend's own words), compiled or eager, and
    exact mode's route; its :attr:`head` is what two runs must share to compare."""

    @property
    def backend(self) -> bool:
        """The forwards ran on a backend of their own (vLLM, llama.cpp): its words say where, in full."""
        return self.text.startswith(tuple(f"{b} " for b in BACKENDS))

    @property
    def compiled(self) -> bool:
        return self.text == COMPILED or self.text.endswith(f" {COMPILED}")

    @property
    def route(self) -> str:
        """Exact mode's route: "fixed 8x32", "per row", or "" (not exact)."""
        if self.text.startswith(f"{EXACT_FIXED} "):
            return f"fixed {self.text.split()[2]}"
        return "per row" if self.text.startswith(EXACT_ROWS) else ""


def exact_step_mode(route: str, shape: str, compiled: bool) -> str:
    """The step mode of an exact run on ``route`` ("fixed": of ``shape``; "rows")."""
    if route == "fixed":
        return f"{EXACT_FIXED} {shape} {COMPILED if compiled else EAGER}"
    return f"{EXACT_ROWS}: one call per token row and per query"


@dataclass(frozen=True)
class Verify(_Words):
    """``RunStats.verify`` read: how a run's verifies ran (k tokens per forward, one token per step on a model
    whose multi-token forward cannot be trusted, the server's own speculation or a request per proposal)."""

    @property
    def one_token(self) -> bool:
        return self.text.startswith(ONE_TOKEN)

    @property
    def remote(self) -> bool:
        """Over a vLLM server (the server's speculation, or a verify request per proposal)."""
        return self.text.startswith((ON_SERVER, CLIENT_SIDE))
