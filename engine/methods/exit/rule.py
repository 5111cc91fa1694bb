"""The early-exit rule: when do SSR's drafts agree enough to stop the reasoning?

Each finished draft is a probe of the answer the model would give from the reasoning so far (as
Dynasor-CoT's probes are, arXiv 2412.20993). A draft's answer is reduced to a key
(:func:`answer_key`): the last ``\\boxed{...}`` where there is one (a graded math answer), else
the first fenced code block (whitespace normalised), else the text (case and whitespace folded).
The rule (:class:`ExitRule`) stops once ``k`` consecutive drafts, in fork order, are finished with
the same key, no sooner than ``min_think`` reasoning tokens, and (when ``confidence`` is above 0)
only if those drafts' mean token probability reaches it.

>>> rule = ExitRule(k=2)
>>> rule.check([Probe(0, "boxed:7", 0.9), Probe(1, "boxed:8", 0.9)], thought=40) is None
True
>>> rule.check([Probe(0, "boxed:7", 0.9), Probe(1, "boxed:8", 0.9), Probe(2, "boxed:8", 0.8)], thought=52).drafts
[1, 2]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.answers import last_boxed


def answer_key(text: str) -> str | None:
    """What two drafts must share to agree (None: a draft with no answer in it, not one letter or
    digit: empty, or only a code fence or punctuation; it agrees with nothing)."""
    boxed = last_boxed(text)
    if boxed is not None:
        return _key("boxed", re.sub(r"\s+", "", boxed))
    code = re.search(r"```[^\n]*\n(.*?)(?:```|$)", text, flags=re.DOTALL)
    if code is not None and code.group(1).strip():
        return _key("code", "\n".join(line.rstrip() for line in code.group(1).splitlines() if line.strip()))
    prose = re.sub(r"```[^\n]*", " ", text)  # a code fence and its language name are no answer
    return _key("text", " ".join(prose.lower().split()).rstrip(" .!"))


def _key(kind: str, body: str) -> str | None:
    return f"{kind}:{body}" if re.search(r"\w", body) else None


@dataclass(frozen=True)
class Probe:
    """A finished draft, as the rule sees it."""

    index: int  # fork order
    key: str | None  # answer_key of its text
    confidence: float | None  # its tokens' mean probability under the model (None: not measured)


@dataclass(frozen=True)
class Exit:
    """Where and why the reasoning stopped."""

    at: int  # the model's own reasoning tokens when it stopped (the forced marker comes after)
    drafts: list[int]  # the agreeing drafts, in fork order
    key: str
    confidence: float | None


@dataclass(frozen=True)
class ExitRule:
    k: int
    min_think: int = 0
    confidence: float = 0.0  # 0: off

    def describe(self, interval: int) -> str:
        """The rule in words, for the run log and the strip."""
        bar = f", mean token probability >= {self.confidence:g}" if self.confidence > 0 else ""
        floor = f", not before {self.min_think} reasoning tokens" if self.min_think else ""
        return f"{self.k} consecutive drafts agree (a draft every {interval} tokens){bar}{floor}"

    def check(self, probes: list[Probe], thought: int) -> Exit | None:
        """The exit, if ``probes`` (the finished drafts) allow one after ``thought`` reasoning
        tokens: the newest run of ``k`` consecutive drafts that agree (and are confident enough)."""
        if thought < self.min_think or self.k < 1:
            return None
        by_index = {p.index: p for p in probes}
        for last in sorted(by_index, reverse=True):
            window = [by_index.get(i) for i in range(last - self.k + 1, last + 1)]
            if any(p is None or p.key is None for p in window) or len({p.key for p in window}) != 1:
                continue
            scores = [p.confidence for p in window if p.confidence is not None]
            mean = sum(scores) / len(scores) if scores else None
            if self.confidence > 0 and (mean is None or mean < self.confidence):
                continue
            return Exit(thought, [p.index for p in window], window[0].key, mean)
        return None
