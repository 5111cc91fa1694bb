"""First load (``ssr_ui.tools.first_load``): each launch is a fresh process on the studio's own
load path; the first, from an empty cache, probes the model; a later one reads the probe back and
runs no forward before the first kind of run is warmed; no load warm-up of its own is left."""

from __future__ import annotations

import json

import pytest

from engine.runtime.model import LoadedModel
from ssr_ui.shelf import ModelShelf
from ssr_ui.tools import first_load


def test_two_launches_probe_once_then_read_the_probe_back(tmp_path):
    out = tmp_path / "first-load.json"
    assert first_load.main(["--model", "tiny-reasoner", "--methods", "ssr,baseline", "--launches", "2", "--runs", "2",
                            "--cache", str(tmp_path / "cache"), "--json", str(out)]) == 0
    first, again = json.loads(out.read_text())["launches"]
    names = [[name for name, _ in launch["stages"]] for launch in (first, again)]
    for stages in names:
        assert stages[0].startswith("python and imports") and any("weights" in s for s in stages)
        assert stages[-2:] == ["warm-up of ssr (untimed in the studio)", "warm-up of baseline (untimed in the studio)"]
        assert not any("first forward" in s for s in stages), "a load warm-up of its own is back"
    assert any(s.startswith("measuring what SSR relies on") for s in names[0])
    assert first["status"].startswith("loaded; capabilities measured in")
    assert not any(s.startswith("measuring what SSR relies on") for s in names[1])
    assert again["status"].startswith("loaded; capabilities from the probe cached on")
    for launch in (first, again):
        seconds = [s for _, s in launch["stages"]]
        assert all(s >= 0 for s in seconds) and launch["waited"] >= sum(seconds) - 0.05
        assert launch["first_run"] > 0 and launch["steady"] > 0 and launch["tokens"] > 0 and launch["method"] == "ssr"


def test_a_method_it_cannot_measure_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        first_load.main(["--methods", "rsd"])
    assert "--methods: one or more of baseline, ssr" in capsys.readouterr().err


def test_a_load_with_the_probe_cached_runs_no_forward(tmp_path, monkeypatch):
    """The load runs no forward of its own: the probe (the first time) is all it runs."""
    monkeypatch.setenv("SSR_STUDIO_CACHE", str(tmp_path / "cache"))
    forwards: list[int] = []
    step, forward = LoadedModel.step_logits, LoadedModel.forward
    monkeypatch.setattr(LoadedModel, "step_logits", lambda self, *a, **k: forwards.append(1) or step(self, *a, **k))
    monkeypatch.setattr(LoadedModel, "forward", lambda self, *a, **k: forwards.append(1) or forward(self, *a, **k))
    def load() -> None:
        shelf = ModelShelf("tiny-reasoner", "tiny-prm", None, 120)
        list(shelf.loading("tiny-reasoner", poll_s=0.05))
        assert shelf.model("tiny-reasoner") is not None

    load()
    probed = len(forwards)
    assert probed > 0, "the first load did not probe"
    load()
    assert len(forwards) == probed, "a load with its probe cached ran forwards"


def test_the_studio_says_how_the_load_went_then_reads_the_probe_back_on_a_later_start(tmp_path, monkeypatch):
    """Through the studio's run handler (what the page shows while a model loads): the first start
    names the probe it measured; a later start (a new studio, the same cache) reads it back and
    says so, with the date; neither warms the model up outside the run's own warm-up."""
    from ssr_ui.handlers import Studio

    monkeypatch.setenv("SSR_STUDIO_CACHE", str(tmp_path / "cache"))

    def notes(db: str) -> list[str]:
        frames = list(Studio("tiny-reasoner", db=str(tmp_path / db)).run("What is 2 plus 2?", "Baseline",
                                                                            max_think=16, max_answer=8))
        assert frames[-1].view.stats is not None and frames[-1].view.phase == "done"
        return [f.metrics for f in frames if f.view.stats is None]

    first = " ".join(notes("a.db"))
    assert "loaded; capabilities measured in" in first and "(the probe)" in first
    assert "warming up Baseline on tiny-reasoner" in first and "first forward" not in first
    again = " ".join(notes("b.db"))
    assert "loaded; capabilities from the probe cached on" in again and "measuring what SSR relies on" not in again
