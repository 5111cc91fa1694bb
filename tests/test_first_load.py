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
