"""``python -m tests.shrunk_app [app.py's flags]``: the studio as ``app.py`` builds it, with every preset whose
shapes are written in (the ``--random-weights`` ones) shrunk to the tests' toy width (``tests.test_templates.SMALL``:
a few thousand weights per layer, the vocabulary kept). For end-to-end tests only: ``--model qwen3-1.7b
--random-weights --tokenizer DIR`` then runs Qwen3's architecture class with its real tokenizer and chat template
in seconds on a CPU, where the full preset would take ~7 GB. The model's name stays the preset's."""

from __future__ import annotations

import dataclasses
import sys

import app
from engine.presets import PRESETS
from tests.test_templates import SMALL


def shrink() -> None:
    """Every preset with written-in shapes, shrunk in this process's registry."""
    for name, preset in list(PRESETS.items()):
        if preset.shape:
            PRESETS[name] = dataclasses.replace(preset, shape={**preset.shape, **SMALL})


if __name__ == "__main__":
    shrink()
    app.main(sys.argv[1:])
