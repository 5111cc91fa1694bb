"""The decoding methods by name: one place the bench CLI and the UI look them up.

Each entry takes ``(lm, prompt, cfg)`` and returns the run's event generator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial

from engine.baseline import decode_baseline
from engine.config import RunConfig
from engine.events import Event
from engine.model import LoadedModel
from engine.peers import decode_hf
from engine.ssr import decode_ssr

Decoder = Callable[[LoadedModel, str, RunConfig], Iterator[Event]]

METHODS: dict[str, Decoder] = {
    "baseline": decode_baseline,
    "ssr": decode_ssr,
    "hf": decode_hf,
    "hf-pld": partial(decode_hf, prompt_lookup=True),
}


def get_method(name: str) -> Decoder:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return METHODS[name]
