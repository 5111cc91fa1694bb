"""What the capability probe (``engine.runtime.probe``; llama.cpp's: ``engine.llamacpp.probe``) found
a loaded model can do, as one frozen record on the model (``.capabilities``): each check measured,
and the routes they decide, read by the runtime instead of loose flags. A model not probed yet holds
:data:`UNPROBED` (no check, no route: the default route every run takes until measured)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.steps import K_TOKENS, ONE_TOKEN


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    diff: float | None = None  # largest |logit| difference from the one-token reference (None: it raised)
    error: str | None = None
    reason: str | None = None  # a check decided by what the model's cache holds, not by a measurement

    def __str__(self) -> str:
        if self.reason:
            return f"{self.name}: {self.reason}"
        if self.error:
            return f"{self.name}: raised {self.error}"
        return f"{self.name}: max logit difference {self.diff:.3g}" + ("" if self.ok else " (beyond rounding)")


INVARIANCE = "batch invariance"  # the check of bf16's batch-invariant route (engine.runtime.attention), on the CPU
FORK_MARGIN = 0.9  # copied forks are taken where a riding step costs at most this fraction of a shared one's


@dataclass(frozen=True)
class Capabilities:
    checks: tuple[Check, ...]
    one_token_steps: bool  # multi-token forwards after a cached state run one token at a time
    tokens: int  # the prefix length the checks ran at
    tolerance: float
    seconds: float
    cached: str | None = None  # when the probe read back from the cache ran ("2026-12-05 03:10 UTC"); None: this process
    # a step with one draft riding, in ms, its prefix shared / copied (the median of several, interleaved, warm); None:
    # not measured (the shared-forks check did not run or failed)
    fork_ms: tuple[float, float] | None = None

    @property
    def provenance(self) -> str:
        """Where these capabilities come from, for a load's status line."""
        if self.cached:
            return (f"capabilities from the probe cached on {self.cached} (measured on this model, with this torch "
                    "and transformers)")
        return f"capabilities measured in {self.seconds:.1f} s (the probe)"

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def _failed(self, name: str) -> bool:
        check = self.check(name)
        return check is not None and not check.ok

    @property
    def holes_unsafe(self) -> bool:
        """The holes check failed: this model's mask does not hide holes, so its rows hold none."""
        return self._failed("holes")

    @property
    def shared_unsafe(self) -> bool:
        """The shared-forks check failed: rows sharing one buffer row do not decode as copies do, so
        each draft copies the prefix."""
        return self._failed("shared forks")

    @property
    def copies_cheaper(self) -> str | None:
        """Why each draft copies the prefix although it could share it: a riding step measured cheaper
        copied (by :data:`FORK_MARGIN`: the shared path's mask and slot map cost more than the copies
        save on this model); None where sharing costs no more."""
        if self.fork_ms is None:
            return None
        shared, copied = self.fork_ms
        if copied > FORK_MARGIN * shared:
            return None
        return (f"a step with a draft riding measured {copied:.2f} ms copied against {shared:.2f} ms shared on this "
                "model (the capability probe)")

    @property
    def verify(self) -> str:
        """How SSR's verifies run on this model, for the run's stats and the strip."""
        holes = self.check("holes")
        rows = "" if holes is None or holes.ok else f"; rows hold no holes: this model's mask does not hide them ({holes})"
        if not self.one_token_steps:
            return K_TOKENS + rows
        return f"{ONE_TOKEN}: this model's multi-token forward ignores its state ({self.check('multi-token')})" + rows

    def failed(self, rollbacks: bool = True, identical: bool = True) -> list[Check]:
        """The failed checks a method depends on. Plain decoding (``rollbacks`` false) needs
        one-token decoding and, where the probe chose them, one-token steps; SSR and RSD, which
        roll rows back and fork them, need every check but the ones a route answers (multi-token:
        one token per step; holes: rows hold none; shared forks: each draft copies the prefix);
        a method that promises plain decoding's tokens (``identical``: SSR, sd, not RSD, and not a
        run in exact mode, whose own self-check holds it) also needs the bf16 route's batch
        invariance, where the probe measured it (a bf16 or fp16 model on the CPU)."""
        plain = ("one-token decoding", "one-token steps")
        routed = ("multi-token", "holes", "shared forks") + (() if identical else (INVARIANCE,))
        return [c for c in self.checks if not c.ok and c.name not in routed and (rollbacks or c.name in plain)]

    def refusal(self, method: str, model_id: str, rollbacks: bool = True, identical: bool = True) -> str | None:
        """Why ``method`` cannot run exactly on this model, as measured, or None."""
        failed = self.failed(rollbacks, identical)
        if not failed:
            return None
        still = " (plain decoding still works)" if rollbacks and not self.failed(False) else ""
        return (f"{method} is refused on {model_id}: the capability probe at {self.tokens} tokens found "
                + "; ".join(map(str, failed)) + still)


UNPROBED = Capabilities((), False, 0, 0.0, 0.0)  # a model the probe has not measured yet
