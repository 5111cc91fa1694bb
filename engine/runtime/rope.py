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

Speculative forwards carry several positions at once, so with either type a token's keys would
depend on the forward's width once the sequence passes the switch point: SSR refuses such runs
(:meth:`Rope.check_speculation`) with a message naming the rope type. Below the switch point both
types are plain RoPE and SSR is exact.
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

    def check_speculation(self, longest: int, model_id: str) -> None:
        """ValueError when a speculative run could reach ``longest`` tokens past the switch point."""
        if self.kind is not None and longest > self.switch:
            raise ValueError(
                f"{model_id} uses rope_type {self.kind!r}, whose frequencies change past {self.switch} tokens, so a "
                f"multi-token forward there is not exact; this run could reach {longest} tokens: lower max_think and "
                f"max_answer to keep prompt + budgets within {self.switch}, or use Baseline")

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
