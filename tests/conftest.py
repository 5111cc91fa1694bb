"""Test-wide settings: never reach a hub, and one intra-op thread (``SSR_TEST_THREADS`` sets
another count: .ci/run reruns the numeric tests with 2, so a kernel's threading is felt).

Tiny models gain nothing from intra-op threads and lose a lot to oversubscription.
"""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # set before transformers / huggingface_hub are imported
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch

torch.set_num_threads(int(os.environ.get("SSR_TEST_THREADS", "1")))


import pytest


@pytest.fixture
def studio(tmp_path):
    """A studio over tiny random models (target, draft, PRM) and a run log in ``tmp_path``."""
    from engine.methods.rsd.prm import MathShepherdScorer
    from ssr_ui.handlers import Studio
    from tests.tiny import make_model

    s = Studio("tiny", db=str(tmp_path / "runs.db"), drafting="always")  # SSR's drafts as planned: tests show them
    s.add_model("tiny", make_model("llama", init_scale=3.0))
    s.add_model("tiny-draft", make_model("qwen2", seed=4, init_scale=2.0))
    s.add_scorer("tiny-prm", MathShepherdScorer(make_model("llama", seed=5)))
    return s


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium through Playwright, one per test module (skipped, saying why, where it is missing)."""
    from pathlib import Path

    from tests.apps import CHROMIUM

    if not Path(CHROMIUM).exists():
        pytest.skip("Debian chromium is not installed (.ci/run installs it)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu",
                                                              "--disable-background-networking", "--no-first-run"])
        yield b
        b.close()
