"""Run configuration: one frozen dataclass, each default stated once.

The CLI and the UI build a :class:`RunConfig` and never restate its defaults; invalid values raise
``ValueError`` naming the field and the value.

>>> RunConfig(draft_start=100, max_think=400).max_draft
500
>>> RunConfig(draft_start=500, max_think=400).check_ssr()
Traceback (most recent call last):
ValueError: Draft start (draft_start) must be a whole number in 0..399 (below Max think 400); got 500
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from engine.runtime.compiled import COMPILE_MODES
from engine.runtime.fixed import ROUTES as EXACT_ROUTES

WEIGHTINGS = ("binary", "constant", "clipping", "sigmoidal", "logistic")  # RSD's acceptance rules
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
    thinking: bool = True  # False: the answer alone (the template's thinking off, e.g. Qwen3's enable_thinking=False)
    # --- SSR (paper defaults: draft at 500 CoT tokens, drafts up to 500 tokens, CoT up to 2000)
    draft_start: int = 500  # reasoning tokens the first draft sees
    max_draft: int = 500  # tokens per draft answer
    num_drafts: int = 1  # > 1: iterative SSR, a new draft every draft_interval reasoning tokens
    draft_interval: int = 250
    max_spec: int = 32  # most tokens verified in one forward
    think_spec: int = 8  # > 0: in the reasoning, each row also verifies up to this many lookup tokens per step (the main
    # row as many as pay: engine.methods.ssr.widths); 0: one token per reasoning step, the paper's mode
    min_match: int = 2  # shortest answer suffix that suffix recovery matches
    spec_factor: float = 0.0  # > 0: a suffix proposal is at most spec_factor x its match length (SuffixDecoding)
    suffix_recovery: bool = True  # reuse drafts after the first mismatch
    context_lookup: bool = True  # then search the prompt, the reasoning and the answer itself
    # auto: fork the drafts only where they have paid on this model (engine.methods.ssr.policy); always: as planned
    drafting: str = "auto"
    # --- RSD (the released code's defaults: binary threshold 0.7, at most 100 steps)
    threshold: float = 0.7  # binary rule: keep a draft step iff its reward >= threshold
    weighting: str = "binary"  # or a soft rule: constant, clipping, sigmoidal, logistic
    weight_param: float = 1.0  # p for "constant", the slope a for "logistic"
    max_steps: int = 100
    max_step_tokens: int = 256
    # beyond the paper: also rewrite a draft step whose least likely token had draft probability below
    # this (the draft's own doubt; free, its logits exist anyway). 0 = off: the paper's rule alone
    draft_confidence: float = 0.0
    # --- early exit (method ssr-exit, lossy: engine.methods.exit): SSR's iterative drafts as probes of the answer
    exit_k: int = 3  # stop reasoning once this many consecutive finished drafts agree on the answer
    exit_min_think: int = 0  # never stop before this many reasoning tokens
    exit_confidence: float = 0.0  # and only when the agreeing drafts' mean token probability reaches this (0: off)
    # --- numerics
    exact: bool = False  # batch- and width-invariant forwards (engine.runtime.exact): slow, bitwise reproducible
    exact_route: str = "auto"  # exact mode's route: rows (per-row reference), fixed (one padded step shape), auto (fixed on CUDA)
    compile: str = "auto"  # compiled fixed-shape steps (engine.runtime.compiled): auto (CUDA only), on, off
    # SSR's widths and drafting frozen from the model's stored evidence (engine.methods.ssr.evidence): read once as the
    # run starts, nothing learned during it, so two runs give the same tokens, statuses and counts (and, sampled, text)
    reproducible: bool = False

    def __post_init__(self) -> None:
        for name in self.field_names():
            value = getattr(self, name)
            if not _valid(name, value, self):
                raise invalid(name, value, self)

    def check_ssr(self) -> RunConfig:
        """The cross-field rule SSR adds: a draft must fork inside the reasoning budget."""
        if not self.draft_start < self.max_think:
            raise invalid("draft_start", self.draft_start, self)
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
    def coerce(cls, name: str, value, context: dict | None = None):
        """``value`` (from a form or an API client: a number, a numeric string, a bool) as the type
        of field ``name``; ValueError naming the field for anything else (NaN, 2.5 for a count, an
        empty box...), in :func:`invalid`'s words. ``context``: the other settings known so far
        (a draft start's range depends on max think).

        >>> RunConfig.coerce("seed", "7"), RunConfig.coerce("temperature", 1)
        (7, 1.0)
        >>> RunConfig.coerce("draft_start", "", {"max_think": 600})
        Traceback (most recent call last):
        ValueError: Draft start (draft_start) is empty: it must be a whole number in 0..599 (below Max think 600)
        """
        if name not in cls.field_names():
            raise ValueError(f"unknown setting {name!r}")
        kind = type(getattr(cls(), name))
        if value is None or (isinstance(value, str) and not value.strip() and kind is not str):
            raise ValueError(f"{LABELS[name]} ({name}) is empty: it must be {rule(name, context)}")
        if kind is bool:
            if isinstance(value, bool):
                return value
            raise invalid(name, value, context)
        if kind is str:
            if isinstance(value, str):
                return value
            raise invalid(name, value, context)
        try:
            return number(name, value, whole=kind is int)
        except ValueError:
            raise invalid(name, value, context) from None


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


THRESHOLD_MAX = 2.0  # RSD's threshold: 0 keeps every draft step; above 1 (a PRM scores in [0, 1]) none

# Each setting's name on screen: a message names the setting as the studio shows it and as the API
# and the CLI spell it ("Draft start (draft_start)").
LABELS = {"max_think": "Max think", "max_answer": "Max answer", "temperature": "Temperature", "top_p": "Top p",
          "seed": "Seed", "draft_start": "Draft start", "max_draft": "Max draft", "num_drafts": "Number of drafts",
          "draft_interval": "Draft interval", "max_spec": "Max spec", "think_spec": "Reasoning lookup",
          "min_match": "Min match", "spec_factor": "Spec factor", "suffix_recovery": "Suffix recovery",
          "context_lookup": "Context lookup", "threshold": "Threshold", "weighting": "Weighting",
          "weight_param": "Weight parameter", "max_steps": "Max steps", "max_step_tokens": "Max step tokens",
          "draft_confidence": "Draft doubt", "exit_k": "Agreeing drafts", "exit_min_think": "Min reasoning",
          "exit_confidence": "Exit confidence", "exact": "Exact mode", "exact_route": "Exact route",
          "compile": "Compiled steps", "drafting": "Drafting", "thinking": "Thinking",
          "reproducible": "Reproducible"}
COUNTS = ("max_think", "max_answer", "max_draft", "num_drafts", "max_spec", "min_match", "max_steps", "max_step_tokens",
          "exit_k")
DRAFTING = ("auto", "always")  # SSR's drafts: where they pay on this model, or always as planned
CHOICES = {"weighting": WEIGHTINGS, "compile": COMPILE_MODES, "exact_route": EXACT_ROUTES, "drafting": DRAFTING}
# the plain ranges, inclusive, with what their ends mean: rule() words them, _valid() checks them
RANGES = {**{name: (1, MAX_COUNT, "") for name in COUNTS},
          "think_spec": (0, MAX_COUNT, " (0: one token per reasoning step)"), "seed": (0, MAX_SEED, ""),
          "temperature": (0, MAX_TEMPERATURE, " (0: greedy)"),
          "threshold": (0, THRESHOLD_MAX, " (above 1: every draft step rewritten)"), "draft_confidence": (0, 1, " (0: off)"),
          "exit_min_think": (0, MAX_COUNT, ""), "exit_confidence": (0, 1, " (0: off)")}


def _get(context, name: str):
    """A setting from a RunConfig or a dict of the settings known so far (None: not known)."""
    return context.get(name) if isinstance(context, dict) else getattr(context, name, None)


def rule(name: str, context=None) -> str:
    """What setting ``name`` takes, in words, given the other settings (``context``: a RunConfig or
    a dict; a draft start's range depends on max think, a weight parameter's on the weighting).
    The one statement of each range: the checks below, the messages and the studio's boxes use it."""
    if name in RANGES:
        low, high, note = RANGES[name]
        kind = "a whole number" if type(getattr(RunConfig, name)) is int else "a number"
        return f"{kind} in {low:g}..{high:g}{note}" if isinstance(high, float) else f"{kind} in {low}..{high}{note}"
    if name == "draft_start":
        think = _get(context, "max_think")
        return (f"a whole number in 0..{think - 1} (below Max think {think})" if isinstance(think, int) and think >= 1
                else "a whole number below Max think")
    if name == "draft_interval":
        many = (_get(context, "num_drafts") or 1) > 1
        return f"a whole number in {1 if many else 0}..{MAX_COUNT}" + (" (Number of drafts is above 1)" if many else "")
    if name == "top_p":
        return "a number above 0, at most 1"
    if name == "spec_factor":
        return "a number >= 0 (0: no cap)"
    if name == "weight_param":
        weighting = _get(context, "weighting")
        return {"constant": "a probability in 0..1 (the constant rule's p)",
                "logistic": "a number above 0 (the logistic rule's slope)"}.get(weighting, "a finite number")
    if name in CHOICES:
        return f"one of {', '.join(CHOICES[name])}"
    return "true or false"


def _valid(name: str, value, cfg: RunConfig) -> bool:
    """Whether ``value`` is what :func:`rule` says for ``name`` (``cfg``: the whole config)."""
    kind = type(getattr(RunConfig, name))
    if kind is bool:
        return isinstance(value, bool)
    if kind is str:
        return isinstance(value, str) and (name not in CHOICES or value in CHOICES[name])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    if isinstance(value, float) and not math.isfinite(value):  # (an int of 400 digits is finite, and too big below)
        return False
    if kind is int and value != int(value):
        return False
    if name in RANGES:
        low, high, _ = RANGES[name]
        return low <= value <= high
    if name == "draft_start":  # any run takes 0..MAX_COUNT; SSR's bound below max think is check_ssr's
        return 0 <= value <= MAX_COUNT
    if name == "draft_interval":
        return (1 if cfg.num_drafts > 1 else 0) <= value <= MAX_COUNT
    if name == "top_p":
        return 0 < value <= 1
    if name == "spec_factor":
        return value >= 0
    if name == "weight_param":
        return {"constant": 0 <= value <= 1, "logistic": value > 0}.get(cfg.weighting, True)
    return True


def invalid(name: str, value, context=None) -> ValueError:
    """The one message for a setting out of its range or of the wrong kind, for the studio, the
    API and the CLI alike: "Draft start (draft_start) must be a whole number in 0..599 (below Max
    think 600); got -1"."""
    return ValueError(f"{LABELS[name]} ({name}) must be {rule(name, context)}; got {value!r}")


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
