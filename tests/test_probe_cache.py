"""The capability probe's cache (``engine.runtime.probe``): what the probe measured on a model
loaded from a folder is kept under ``$SSR_STUDIO_CACHE/probe`` and read back by a later load of
the same files with the same software, instead of probing again. A changed file, another
transformers version or an unreadable record makes the probe run again; nothing is trusted
across a change of its identity. Whether the probe ran is counted, never timed."""

from __future__ import annotations

import json
import shutil

import pytest

from engine.presets import BUNDLED_DIR
from engine.runtime import probe
from engine.runtime.model import LoadedModel, load_model, model_source
from engine.runtime.probe import capabilities
from ssr_ui.shelf import ModelShelf
from tests.families import family_model
from tests.tiny import make_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SSR_STUDIO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "probe"


@pytest.fixture
def probes(monkeypatch) -> list[str]:
    """The model ids the probe measured (its ``_measure`` counted, then run)."""
    ran: list[str] = []
    measure = probe._measure

    def counted(lm):
        ran.append(lm.model_id)
        return measure(lm)

    monkeypatch.setattr(probe, "_measure", counted)
    return ran


@pytest.fixture
def folder(tmp_path):
    """A copy of the bundled model's folder, whose files a test may change."""
    return shutil.copytree(BUNDLED_DIR / "tiny-reasoner", tmp_path / "tiny-copy")


def _record(cache) -> dict:
    (path,) = cache.glob("*.json")
    return json.loads(path.read_text())


def test_a_later_load_reads_the_probe_back_instead_of_probing(cache, probes, folder):
    first = load_model(str(folder))
    measured = capabilities(first)
    assert probes == [str(folder)] and measured.cached is None and "measured in" in measured.provenance
    record = _record(cache)
    assert record["identity"]["source"]["folder"] == str(folder.resolve())
    assert {"torch", "transformers", "dtype", "device", "engine"} <= set(record["identity"])

    again = load_model(str(folder))
    read = capabilities(again)
    assert probes == [str(folder)], "the second load probed again"
    assert read.cached == record["measured"] and read.cached in read.provenance
    assert read.checks == measured.checks and read.tokens == measured.tokens and read.verify == measured.verify
    # what the probe sets on the model comes back with it
    assert (again.slot_bytes, again.capabilities.one_token_steps, again.capabilities.holes_unsafe) == \
        (first.slot_bytes, first.capabilities.one_token_steps, first.capabilities.holes_unsafe)
    assert again._cache_plan == first._cache_plan


def test_a_changed_file_is_another_model(cache, probes, folder):
    capabilities(load_model(str(folder)))
    config = folder / "generation_config.json"
    config.write_text(config.read_text() + "\n")  # the same weights, but a file changed: not vouched for
    capabilities(load_model(str(folder)))
    assert len(probes) == 2 and len(list(cache.glob("*.json"))) == 2


def test_another_transformers_version_probes_again(cache, probes, folder, monkeypatch):
    import transformers

    capabilities(load_model(str(folder)))
    monkeypatch.setattr(transformers, "__version__", "9.99.0")
    capabilities(load_model(str(folder)))
    assert len(probes) == 2
    versions = {json.loads(p.read_text())["identity"]["transformers"] for p in cache.glob("*.json")}
    assert "9.99.0" in versions and len(versions) == 2


@pytest.mark.parametrize("spoil", [
    lambda text: text[: len(text) // 2],  # cut short: not JSON
    lambda text: "",
    lambda text: text.replace('"ok": true', '"ok": "yes"', 1),  # parses, but not what the probe writes
    lambda text: text.replace('"checks"', '"checkz"', 1),
    lambda text: text.replace('"cache_class": null', '"cache_class": "os:getcwd"', 1),  # names no cache class
])
def test_an_unreadable_record_is_ignored_and_measured_again(cache, probes, folder, spoil):
    capabilities(load_model(str(folder)))
    (path,) = cache.glob("*.json")
    path.write_text(spoil(path.read_text()))
    caps = capabilities(load_model(str(folder)))
    assert len(probes) == 2 and caps.cached is None
    assert _record(cache)["capabilities"]["tokens"] == caps.tokens, "the record was written again, whole"


def test_a_record_of_another_identity_at_the_same_path_is_not_trusted(cache, probes, folder):
    capabilities(load_model(str(folder)))
    (path,) = cache.glob("*.json")
    record = json.loads(path.read_text())
    record["identity"]["torch"] = "0.0.1"  # written by other software (or a colliding key)
    path.write_text(json.dumps(record))
    assert capabilities(load_model(str(folder))).cached is None and len(probes) == 2


def test_a_model_built_in_memory_is_probed_every_time(cache, probes):
    lm = make_model("llama")
    fresh = LoadedModel(lm.model, lm.tokenizer, "in memory", lm.markers)
    assert fresh.source is None
    capabilities(fresh)
    capabilities(LoadedModel(lm.model, lm.tokenizer, "in memory", lm.markers))
    assert probes == ["in memory", "in memory"] and not cache.exists()


def test_a_result_where_a_check_raised_is_not_kept(cache, probes, folder, monkeypatch):
    """An error may pass (memory): the next load measures again rather than refuse on it."""
    def raising(*args):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(probe, "_fork", raising)
    caps = capabilities(load_model(str(folder)))
    assert "fork: raised RuntimeError: out of memory" in [str(c) for c in caps.checks]
    assert not cache.exists()


def test_a_model_on_its_own_cache_class_gets_it_back(cache, probes, tmp_path):
    """MiniMax runs on its own cache class (decided by decoding on it, part of the probe): the
    record names the class, and a later load runs on it without deciding again."""
    lm = family_model("minimax")
    (tmp_path / "minimax").mkdir()
    (tmp_path / "minimax" / "config.json").write_text("{}")
    source = model_source(str(tmp_path / "minimax"))

    def loaded() -> LoadedModel:
        fresh = LoadedModel(lm.model, lm.tokenizer, "minimax", lm.markers)
        fresh.source = source
        return fresh

    first = loaded()
    capabilities(first)
    own = first._cache_plan[0]
    assert own is not None and _record(cache)["cache_class"].endswith(":" + own.__qualname__)
    again = loaded()
    capabilities(again)
    assert probes == ["minimax"] and again._cache_plan == first._cache_plan


def test_the_studio_says_whether_the_probe_ran_or_was_read_back(cache):
    def last_status(shelf: ModelShelf) -> str:
        return list(shelf.loading("tiny-reasoner", poll_s=0.05))[-1]

    first = last_status(ModelShelf("tiny-reasoner", "tiny-prm", None, 120))
    assert "loaded; capabilities measured in" in first and "(the probe)" in first
    again = last_status(ModelShelf("tiny-reasoner", "tiny-prm", None, 120))
    assert "loaded; capabilities from the probe cached on" in again
