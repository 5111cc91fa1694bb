"""Position-scaled RoPE: the rotary types whose frequencies depend on how long the sequence is.

Most RoPE types (default, linear, yarn, llama3, proportional) fix their frequencies once, so a
token's keys do not depend on which forward carried it. Two types do not:

* ``longrope`` (Phi-3, Phi-4-mini): short factors up to ``original_max_position_embeddings``,
  long factors beyond, chosen per forward from its highest position. ``generate()`` re-encodes
  the whole sequence once, when it first grows past the switch point, so that every key uses the
  long factors from then on. :class:`Rope` tells a decode loop when to do the same.
* ``dynamic`` (NTK-aware): frequencies recomputed from the longest sequence seen so far, a state
  kept in the rotary module between calls. :meth:`Rope.begin_run` resets it, so a run does not
  depend on what ran before it in the same process.

Speculative forwards carry several rows and positions at once, and both types choose their
frequencies from the highest position in the forward:

* longrope stays exact: while the main row (row 0) is below the switch point no row may be fed
  up to it (:meth:`Rope.limits`), and the main row's first forward past it re-encodes every live
  row (``engine.runtime.batch.RowBatch``), the step where plain decoding re-encodes its sequence.
  A draft ahead of the main row stops at the switch point (it would switch the main row's
  forward to the long factors early); drafts forked after it run as usual.
* dynamic NTK cannot: its frequencies are a state that grows with the longest position any
  forward has reached, and plain decoding encodes each token with the frequencies of its own
  length. A k-token verify encodes all k with the last one's, and a draft row is always ahead of
  the main row (by the end-of-thinking tail it is fed at its fork), so every batched step would
  encode the main row's token with the draft's length. ``tests/test_families.py`` measures the
  difference; SSR past the switch point is refused (:meth:`Rope.check_speculation`). Below it
  both types are plain RoPE and SSR is exact.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rope:
    kind: str | None  # "longrope", "dynamic" or None (frequencies fixed)
    switch: int | None  # sequence length above which the frequencies change
    factor: float = 1.0  # dynamic NTK: how far past the switch point the model is meant to run

    @property
    def reprefills(self) -> bool:
        """Whether the whole sequence is re-encoded when it first passes the switch point."""
        return self.kind == "longrope"

    def crosses(self, cached: int, total: int) -> bool:
        """Whether a forward that brings the sequence from ``cached`` to ``total`` tokens is the one
        where ``generate()`` re-encodes everything (longrope only)."""
        return self.reprefills and cached <= self.switch < total

    def limits(self, positions: list[int], owed: int) -> list[int] | None:
        """The most tokens each row (holding ``positions[r]`` tokens) may be fed in one forward,
        the main row owing ``owed`` tokens first; None: any number. Only longrope limits, and only
        while this step's first logit the main row keeps (after its owed tokens) is still below the
        switch point: a position at or past it anywhere in the forward would switch every row,
        the main row too, to the long factors, where plain decoding still uses the short ones.
        From the main row's first logit past the switch the forward re-encodes instead."""
        if not self.reprefills or positions[0] + owed > self.switch:
            return None
        return [self.switch - p for p in positions]

    def check_speculation(self, longest: int, model_id: str, recurrent: bool = False) -> None:
        """ValueError when a speculative run could reach ``longest`` tokens past the switch point
        on a dynamic NTK model, or on a longrope model with ``recurrent`` states (its rows' re-encode
        there starts from an empty cache, which a recurrent state is not made by a crop)."""
        if self.reprefills and recurrent and longest > self.switch:
            raise ValueError(
                f"{model_id} uses rope_type 'longrope' and has recurrent states: SSR re-encodes every row at the switch "
                f"point ({self.switch} tokens), which a recurrent state cannot be cropped for; this run could reach "
                f"{longest} tokens: keep prompt + budgets within {self.switch}, or use Baseline")
        if self.kind == "dynamic" and longest > self.switch:
            raise ValueError(
                f"{model_id} uses rope_type 'dynamic' (NTK), whose frequencies grow past {self.switch} tokens with the "
                f"longest position any forward has reached; plain decoding encodes each token at its own length, "
                f"while SSR's verifies and its drafts (always ahead of the main row) would encode the main row's "
                f"tokens at theirs, so it is not exact there; this run could reach {longest} tokens: lower max_think "
                f"and max_answer to keep prompt + budgets within {self.switch}, or use Baseline")

    def begin_run(self, model) -> None:
        """Reset the dynamic frequencies kept between calls (a no-op for other types)."""
        if self.kind != "dynamic":
            return
        for module in model.modules():
            if hasattr(module, "original_inv_freq") and hasattr(module, "max_seq_len_cached"):
                module.register_buffer("inv_freq", module.original_inv_freq.clone(), persistent=False)
                module.max_seq_len_cached = module.original_max_seq_len


def rope_of(config) -> Rope:
    """A model's RoPE policy, read from its config (every layer type's parameters)."""
    config = config.get_text_config(decoder=True)
    params = getattr(config, "rope_parameters", None) or {}
    per_type = params.values() if params and all(isinstance(v, dict) for v in params.values()) else [params]
    for p in per_type:
        kind = p.get("rope_type")
        if kind == "longrope":
            switch = p.get("original_max_position_embeddings") or config.original_max_position_embeddings
            return Rope("longrope", int(switch))
        if kind is not None and "dynamic" in kind:
            return Rope("dynamic", int(config.max_position_embeddings), float(p.get("factor", 1.0)))
    return Rope(None, None)
