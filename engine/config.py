"""Run configuration: one frozen dataclass, each default stated once.

The CLI and the UI build a :class:`RunConfig` and never restate its defaults; invalid values raise
``ValueError`` naming the field and the value.

>>> RunConfig(draft_start=100, max_think=400).max_draft
500
>>> RunConfig(draft_start=500, max_think=400).check_ssr()
Traceback (most recent call last):
ValueError: draft_start=500 must be < max_think (400)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from engine.methods.rsd.acceptance import check_params
from engine.runtime.compiled import COMPILE_MODES
from engine.runtime.fixed import ROUTES as EXACT_ROUTES

MAX_COUNT = 1_000_000  # an upper bound on every token count and interval (far beyond any model's context)
MAX_SEED = 2**63 - 1  # the largest seed (torch.Generator takes a signed 64-bit integer)
MAX_TEMPERATURE = 2.0  # the hottest sampling allowed; the studio's slider and the API share this range


@dataclass(frozen=True)
class RunConfig:
    """Settings of one decoding run, whatever its method (plain, SSR, RSD, the peers).

    Conventions: token counts exclude the prompt; ``max_answer`` counts answer tokens after the
    end-of-thinking marker, the end-of-sequence token excluded; an acceptance length excludes the
    token the verifier itself picks after the accepted ones (the "bonus" or corrected token).
    """

    max_think: int = 2000  # reasoning budget; on reaching it the end-of-thinking marker is appended
    max_answer: int = 1024
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    seed: int = 0
    # --- SSR (paper defaults: draft at 500 CoT tokens, drafts up to 500 tokens, CoT up to 2000)
    draft_start: int = 500  # reasoning tokens the first draft sees
    max_draft: int = 500  # tokens per draft answer
    num_drafts: int = 1  # > 1: iterative SSR, a new draft every draft_interval reasoning tokens
    draft_interval: int = 250
    max_spec: int = 32  # most tokens verified in one forward
    think_spec: int = 0  # > 0: in the reasoning, each row also verifies up to this many lookup tokens per step
    min_match: int = 2  # shortest answer suffix that suffix recovery matches
    spec_factor: float = 0.0  # > 0: a suffix proposal is at most spec_factor x its match length (SuffixDecoding)
    suffix_recovery: bool = True  # reuse drafts after the first mismatch
    context_lookup: bool = True  # then search the prompt, the reasoning and the answer itself
    # --- RSD (the released code's defaults: binary threshold 0.7, at most 100 steps)
    threshold: float = 0.7  # binary rule: keep a draft step iff its reward >= threshold
    weighting: str = "binary"  # or a soft rule: constant, clipping, sigmoidal, logistic
    weight_param: float = 1.0  # p for "constant", the slope a for "logistic"
    max_steps: int = 100
    max_step_tokens: int = 256
    # beyond the paper: also rewrite a draft step whose least likely token had draft probability below
    # this (the draft's own doubt; free, its logits exist anyway). 0 = off: the paper's rule alone
    draft_confidence: float = 0.0
    # --- numerics
    exact: bool = False  # batch- and width-invariant forwards (engine.runtime.exact): slow, bitwise reproducible
    exact_route: str = "auto"  # exact mode's route: rows (per-row reference), fixed (one padded step shape), auto (fixed on CUDA)
    compile: str = "auto"  # compiled fixed-shape steps (engine.runtime.compiled): auto (CUDA only), on, off

    def __post_init__(self) -> None:
        for name in ("max_think", "max_answer", "max_draft", "num_drafts", "max_spec", "min_match"):
            _require(name, getattr(self, name), 1 <= getattr(self, name) <= MAX_COUNT, f"must be in 1..{MAX_COUNT}")
        for name in ("draft_start", "draft_interval", "think_spec"):
            _require(name, getattr(self, name), 0 <= getattr(self, name) <= MAX_COUNT, f"must be in 0..{MAX_COUNT}")
        _require("seed", self.seed, 0 <= self.seed <= MAX_SEED, "must be in 0..2**63-1")
        _require("temperature", self.temperature, math.isfinite(self.temperature), "must be a finite number")
        _require("temperature", self.temperature, 0 <= self.temperature <= MAX_TEMPERATURE,
                 f"must be in 0..{MAX_TEMPERATURE:g}")
        _require("top_p", self.top_p, 0 < self.top_p <= 1, "must be in (0, 1]")
        _require("spec_factor", self.spec_factor, math.isfinite(self.spec_factor) and self.spec_factor >= 0,
                 "must be a finite number >= 0 (0: no cap)")
        if self.num_drafts > 1:
            _require("draft_interval", self.draft_interval, self.draft_interval >= 1,
                     "must be >= 1 when num_drafts > 1")
        for name in ("max_steps", "max_step_tokens"):
            _require(name, getattr(self, name), getattr(self, name) >= 1, "must be >= 1")
        check_params(self.weighting, self.threshold, self.weight_param)
        _require("draft_confidence", self.draft_confidence, 0 <= self.draft_confidence <= 1, "must be in [0, 1]")
        _require("compile", self.compile, self.compile in COMPILE_MODES, f"must be one of {', '.join(COMPILE_MODES)}")
        _require("exact_route", self.exact_route, self.exact_route in EXACT_ROUTES,
                 f"must be one of {', '.join(EXACT_ROUTES)}")
        for name in ("suffix_recovery", "context_lookup", "exact"):
            _require(name, getattr(self, name), isinstance(getattr(self, name), bool), "must be true or false")

    def check_ssr(self) -> RunConfig:
        """The cross-field rule SSR adds: a draft must fork inside the reasoning budget."""
        _require("draft_start", self.draft_start, self.draft_start < self.max_think,
                 f"must be < max_think ({self.max_think})")
        return self

    @property
    def max_tokens(self) -> int:
        """RSD's budget for the whole response (reasoning and answer)."""
        return self.max_think + self.max_answer

    @property
    def exact_mode(self) -> str | bool:
        """What a model's ``begin_run`` takes for exact mode: False (off) or the route asked for."""
        return self.exact and self.exact_route

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def replace(self, **changes) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def coerce(cls, name: str, value):
        """``value`` (from a form or an API client: a number, a numeric string, a bool) as the type
        of field ``name``; ValueError naming the field for anything else (NaN, 2.5 for a count...).

        >>> RunConfig.coerce("seed", "7"), RunConfig.coerce("temperature", 1)
        (7, 1.0)
        """
        if name not in cls.field_names():
            raise ValueError(f"unknown setting {name!r}")
        kind = type(getattr(cls(), name))
        if kind is bool:
            if isinstance(value, bool):
                return value
            raise ValueError(f"{name}={value!r} must be true or false")
        if kind is str:
            if isinstance(value, str):
                return value
            raise ValueError(f"{name}={value!r} must be a string")
        return number(name, value, whole=kind is int)


def field_help() -> dict[str, str]:
    """Each :class:`RunConfig` field's comment in this file (one source for CLI help texts)."""
    import inspect
    import re

    found = re.findall(r"^    (\w+): [^=]+= [^#\n]+#\s*(.+)$", inspect.getsource(RunConfig), re.MULTILINE)
    return dict(found)


def number(name: str, value, whole: bool = False) -> float | int:
    """A finite number (a whole one with ``whole``) from a number or a numeric string; ValueError
    naming ``name`` otherwise. Whole numbers stay exact: "9223372036854775807" is that integer,
    never a float's neighbour of it ("1e3" is 1000).

    >>> number("seed", "9223372036854775807", whole=True) == 2**63 - 1
    True
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name}={value!r} must be a number")  # noqa: TRY004 (the boundary's one error type, caught as such)
    if whole and isinstance(value, int):
        return value
    if whole and isinstance(value, str) and value.strip().lstrip("+-").isdecimal():
        return int(value)
    try:
        x = float(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} must be a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{name}={value!r} must be a finite number")
    if whole:
        if x != int(x):
            raise ValueError(f"{name}={value!r} must be a whole number")
        return int(x)
    return x


def _require(name: str, value, ok: bool, why: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r} {why}")


PROMPT_ROOM = 512  # positions a fitted budget leaves the prompt (a quarter of a smaller context)


def fit_budgets(values: dict, context: int, given: set[str]) -> dict:
    """``values`` (RunConfig fields) with the budgets the caller did not set (``given``) lowered
    to fit a model of ``context`` positions: the reasoning and the answer share what the prompt
    leaves, the first draft fits beside them, the draft start stays below max think. Budgets the
    caller set are kept as set (a run that cannot fit is refused then, with the numbers)."""
    defaults = RunConfig()
    v = {k: values.get(k, getattr(defaults, k)) for k in ("max_think", "max_answer", "max_draft", "draft_start")}
    room = context - min(PROMPT_ROOM, context // 4)
    free = [k for k in ("max_think", "max_answer") if k not in given]
    over = v["max_think"] + v["max_answer"] - room
    if over > 0 and free:
        share = sum(v[k] for k in free)
        keep = max(share - over, 2 * len(free))
        for k in free:
            v[k] = max(2, v[k] * keep // share)
    if "draft_start" not in given and v["draft_start"] >= v["max_think"]:
        v["draft_start"] = v["max_think"] // 4
    if "max_draft" not in given and v["draft_start"] + v["max_draft"] > room:
        v["max_draft"] = max(1, room - v["draft_start"])
    return {**values, **v}
