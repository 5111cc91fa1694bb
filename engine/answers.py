"""Reading an answer's text: its last ``\\boxed{}``, its first code block, and the bundled suites'
checker. Plain functions over strings, used by the benchmarks' graders, SSR early exit's answer
keys and the bundled suites' evaluation alike, so all three read an answer the same way.

>>> last_boxed("so \\\\boxed{\\\\frac{1}{2}}, not \\\\boxed{3}... \\\\boxed{ 42 }")
'42'
>>> extract_code("Here:\\n```python\\nclass A: pass\\n```")
'class A: pass'
"""

from __future__ import annotations

import re

_FENCE = re.compile(r"```(?:python)?\n(.*?)(?:\n```|$)", re.DOTALL)
_BOX = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces kept, stripped;
    None when there is none or its braces never close."""
    starts = [m.end() for m in _BOX.finditer(text)]
    if not starts:
        return None
    depth, i = 1, starts[-1]
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def extract_code(answer: str) -> str:
    """The first fenced code block of ``answer`` (or the whole answer when it has none), stripped."""
    m = _FENCE.search(answer)
    return (m.group(1) if m else answer).strip()


def check(suite: str | None, answer: str, reference: str) -> bool | None:
    """Whether ``answer`` is correct for a bundled suite's problem; None when no checker applies.

    ``classes``: exact code match (fences stripped). ``arithmetic``: the last ``\\boxed{}`` value.
    Without a suite name, a numeric reference selects the boxed checker and any other the code one.
    """
    if suite is None:
        suite = "arithmetic" if re.fullmatch(r"-?\d+", reference.strip()) else "classes"
    if suite == "classes":
        return extract_code(answer) == reference.strip()
    if suite == "arithmetic":
        return last_boxed(answer) == reference.strip()
    return None
