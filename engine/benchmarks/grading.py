"""Grading an answer, by the problem's task.

* ``math``: ``math-verify`` (LaTeX and plain answers, equivalent forms: ``\\frac{3}{4}`` = ``0.75``).
  Its own timeouts use ``SIGALRM``, which fails or misgrades off the main thread (a Gradio worker),
  so it runs with them off in a worker process of its own, and :class:`MathVerifier` bounds each
  call by the clock: a call past ``timeout_s`` kills the worker (a fresh one takes the next) and
  grades the answer wrong, counted in :attr:`MathVerifier.timeouts`.
* ``choice``: the letter the answer picks (``\\boxed{C}``, "the answer is (C)", a lone "C").
* ``code`` and ``free``: agreement with baseline's answer on the same problem (identical greedy
  output is SSR's claim; code compares the first fenced block). Baseline itself is not graded.
* a bundled suite (``task == "suite"``): its own checker (``engine.answers.check``).
* ``--grader module:function``: the user's ``function(answer, reference) -> bool | None`` for every
  problem instead.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import re
import threading
from collections.abc import Callable

from engine.answers import check, extract_code, last_boxed
from engine.benchmarks.problems import LETTERS, Problem

MATH_TIMEOUT_S = 10.0  # per answer; sympy can take minutes on an adversarial expression
START_TIMEOUT_S = 120.0  # the worker's import of math-verify and sympy


def _serve(conn) -> None:  # the worker process: parse and verify with math-verify's own timeouts off
    import logging

    logging.disable(logging.WARNING)  # "timeout is disabled" is what we want: the parent bounds the call
    from math_verify import parse, verify

    conn.send("ready")
    while True:
        try:
            answer, reference = conn.recv()
        except EOFError:
            return
        try:
            gold = parse(reference if "$" in reference or "\\boxed" in reference else f"${reference}$",
                         parsing_timeout=None)
            pred = parse(answer, parsing_timeout=None)
            ok = bool(gold) and bool(pred) and verify(gold, pred, timeout_seconds=None)
            conn.send(("ok", bool(ok)))
        except Exception as err:  # noqa: BLE001 (a grading error grades the answer wrong and says why)
            conn.send(("error", f"{type(err).__name__}: {err}"))


class MathVerifier:
    """``math-verify`` in a worker process, each call bounded by ``timeout_s`` (thread-safe)."""

    _serve = staticmethod(_serve)  # what the worker runs (a test swaps in one that hangs)

    def __init__(self, timeout_s: float = MATH_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self.timeouts = 0  # answers graded wrong because grading ran out of time
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._proc = self._conn = None
        atexit.register(self.close)

    def _start(self) -> None:
        try:
            import math_verify  # noqa: F401  (a clear message here, not a dead worker)
        except ImportError:
            raise ValueError("grading math answers needs the 'math-verify' package (pip install math-verify)") from None
        ctx = multiprocessing.get_context("spawn")  # never fork a process with threads (Gradio, torch)
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=self._serve, args=(child,), daemon=True, name="math-verify")
        self._proc.start()
        child.close()
        if not self._conn.poll(START_TIMEOUT_S):
            self.close()
            raise RuntimeError(f"the math-verify worker did not start within {START_TIMEOUT_S:.0f} s")
        self._conn.recv()

    def __call__(self, answer: str, reference: str) -> bool:
        if not answer.strip():
            return False
        boxed = last_boxed(answer)
        if boxed is not None and boxed.replace(" ", "") == reference.replace(" ", ""):
            return True  # the same text is the same answer: no need to parse it
        with self._lock:
            if self._proc is None or not self._proc.is_alive():
                self._start()
            self._conn.send((answer, reference))
            if not self._conn.poll(self.timeout_s):
                self.timeouts += 1
                self.close()  # the worker is stuck in sympy: kill it; the next call starts a fresh one
                return False
            kind, value = self._conn.recv()
        if kind == "error":
            self.errors.append(value)
            return False
        return value

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(5)
            self._conn.close()
        self._proc = self._conn = None


def chosen_letter(text: str) -> str | None:
    """The option letter an answer picks, or None."""
    letters = f"[{LETTERS}]"
    for pattern in (rf"\\boxed\{{\s*(?:\\text\{{)?\(?({letters})\)?", rf"answer\s*(?:is|:)?\s*\(?({letters})\b\)?",
                    rf"^\s*\(?({letters})\)?[.)]?\s*$"):
        found = re.findall(pattern, text, flags=re.IGNORECASE | re.MULTILINE)
        if found:
            return found[-1].upper()
    found = re.findall(rf"\(({letters})\)", text)
    return found[-1] if found else None


def load_grader(spec: str) -> Callable[[str, str | None], bool | None]:
    """``module:function`` -> the function; ValueError saying what is missing."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise ValueError(f"--grader {spec!r}: write module:function (e.g. mygrading:grade)")
    try:
        fn = getattr(importlib.import_module(module), name)
    except ImportError as err:
        raise ValueError(f"--grader {spec!r}: cannot import {module!r} ({err})") from None
    except AttributeError:
        raise ValueError(f"--grader {spec!r}: module {module!r} has no {name!r}") from None
    if not callable(fn):
        raise ValueError(f"--grader {spec!r}: {name!r} is not a function")  # noqa: TRY004 (a bad flag value)
    return fn


class Grader:
    """Grades a run's answer to a problem; ``None`` where nothing applies (no reference, baseline
    on an agreement task, or no baseline answer to agree with)."""

    def __init__(self, custom: Callable[[str, str | None], bool | None] | None = None,
                 math: MathVerifier | None = None) -> None:
        self.custom = custom
        self._math = math

    @property
    def math_timeouts(self) -> int:
        """Answers graded wrong because math-verify ran out of time (0 where it never ran)."""
        return self._math.timeouts if self._math is not None else 0

    @property
    def math(self) -> MathVerifier:
        if self._math is None:
            self._math = MathVerifier()
        return self._math

    @staticmethod
    def how(problem: Problem) -> str:
        """How a problem is graded, in words (the results' ``graded_by``)."""
        return {"math": "math-verify", "choice": "option letter", "suite": f"the {problem.suite} checker"}.get(
            problem.task, "agreement with baseline")

    def grade(self, problem: Problem, method: str, answer: str, baseline_answer: str | None) -> bool | None:
        if self.custom is not None:
            result = self.custom(answer, problem.reference)
            return None if result is None else bool(result)
        if problem.task == "suite":
            return None if problem.reference is None else check(problem.suite, answer, problem.reference)
        if problem.task in ("math", "choice"):
            if problem.reference is None:
                return None
            if problem.task == "math":
                return self.math(answer, problem.reference)
            return chosen_letter(answer) == (chosen_letter(problem.reference) or problem.reference.strip().upper())
        if method == "baseline" or baseline_answer is None:
            return None
        if problem.task == "code":
            return extract_code(answer) == extract_code(baseline_answer)
        return answer.strip() == baseline_answer.strip()
