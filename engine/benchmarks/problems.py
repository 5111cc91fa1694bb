"""Where a benchmark's problems come from, and how a row becomes a prompt and a reference.

A source is a bundled suite (:data:`BUNDLED_SETS`), a local file (``.jsonl``, ``.json``, ``.csv``, ``.parquet``) or a Hugging Face dataset
named ``NAME[:CONFIG][:SPLIT]`` (two parts are ``NAME:SPLIT``), loaded with ``datasets`` so the
user's cache and offline mode (``HF_HUB_OFFLINE=1``) behave as they expect. With a row limit, an
online dataset streams: only the rows read are downloaded. A stranger's source (``Source.hub_only``:
a shared studio's visitor) is a bundled suite, a preset or a Hub dataset only, judged by the string
alone (:func:`check_hub_only`) and read from the Hub even where the server's working directory has a
folder of that name; what fails to load is said without the library's words. Presets (:data:`PRESETS`) know the
common ones: their fields, task, prompt template and how to pull the reference out of the answer
field (GSM8K's worked solution ends in ``#### 42``; a MATH solution ends in ``\\boxed{...}``).

Without a preset, the question field is the first of :data:`QUESTION_FIELDS` a row has, the answer
field the first of :data:`ANSWER_FIELDS` (none: graded by agreement with baseline). The task is,
in order: ``task`` given, the preset's, the row's own ``suite`` (a bundled suite keeps its own
checker) or ``task`` field, ``math`` when the row has a reference, else ``free``.
"""

from __future__ import annotations

import csv
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.answers import last_boxed

TASKS = ("math", "choice", "code", "free")
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "assets" / "benchmarks"
# the bundled suites (20 held-out problems each, from ``python -m engine.tools.synthetic``), by name
BUNDLED_SETS = {"bundled-arithmetic": BUNDLED_DIR / "arithmetic.jsonl", "bundled-classes": BUNDLED_DIR / "classes.jsonl"}
LOCAL_FORMATS = (".jsonl", ".json", ".csv", ".parquet")
QUESTION_FIELDS = ("prompt", "question", "problem", "input")
ANSWER_FIELDS = ("reference", "answer", "solution", "target")
ID_FIELDS = ("id", "unique_id", "idx")
MATH_TEMPLATE = "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."
CHOICE_TEMPLATE = "{question}\n\n{choices}\n\nAnswer with the letter of the correct option."
LETTERS = "ABCDEFGHIJ"


@dataclass(frozen=True)
class Problem:
    """One problem: the user message the engine templates, what it is graded against, and how."""

    id: str
    prompt: str
    reference: str | None = None
    task: str = "free"  # one of TASKS, or "suite" (the bundled suite named by ``suite`` checks it)
    suite: str | None = None


@dataclass(frozen=True)
class Preset:
    name: str  # the Hub dataset
    config: str | None
    split: str
    question: str
    answer: str
    task: str
    template: str = "{question}"


PRESETS = {
    "gsm8k": Preset("openai/gsm8k", "main", "test", "question", "answer", "math", MATH_TEMPLATE),
    "math500": Preset("HuggingFaceH4/MATH-500", None, "test", "problem", "answer", "math", MATH_TEMPLATE),
    "aime24": Preset("HuggingFaceH4/aime_2024", None, "train", "problem", "answer", "math", MATH_TEMPLATE),
}
_BY_HUB_NAME = {p.name.lower(): p for p in PRESETS.values()}
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}"  # the Hub's grammar for an owner, a repo (96 characters at most), a part
_HUB_ONLY = re.compile(rf"(?P<name>{_SEGMENT}(?P<owner>/{_SEGMENT})?)(?::{_SEGMENT}){{0,2}}")
NOT_ON_DISK = ("this shared studio reads no file of its own: upload your problems file, or name a bundled suite "
               f"({', '.join(BUNDLED_SETS)}), a preset ({', '.join(PRESETS)}) or a Hub dataset as "
               "owner/name, owner/name:split or owner/name:config:split")


@dataclass(frozen=True)
class Source:
    """What the user asked for: a file or a dataset, the fields, the task, how many rows."""

    spec: str  # a path, a preset alias, or NAME[:CONFIG][:SPLIT]
    question_field: str | None = None
    answer_field: str | None = None
    task: str | None = None
    template: str | None = None
    limit: int | None = None
    sample_seed: int | None = None  # with limit: a random subset (sorted); without: the first rows
    hub_only: bool = False  # a stranger's source: never a path on this machine (check_hub_only), always the Hub

    @property
    def file(self) -> str | None:
        """The local file it reads: a bundled suite's, or ``spec`` where it names a file (never with
        ``hub_only``: then no path is even looked at); None for a Hub dataset."""
        spec = self.spec.strip()
        if spec in BUNDLED_SETS:
            return str(BUNDLED_SETS[spec])
        return None if self.hub_only or not is_file_spec(spec) else spec

    @property
    def label(self) -> str:
        """How runs name it in the log: a file's name, or the dataset as given."""
        file = self.file
        return Path(file).name if file else self.spec.strip()


def is_file_spec(spec: str) -> bool:
    return Path(spec).suffix.lower() in LOCAL_FORMATS or Path(spec).is_file()


def check_hub_only(spec: str) -> None:
    """Refuse, with :data:`NOT_ON_DISK` whatever the reason, a ``spec`` that is not a bundled suite,
    a preset (``gsm8k:test``) or a Hub dataset ``owner/name[:config][:split]`` in the Hub's grammar
    (no ``..``, no ``--``, 96 characters a part). The string alone decides: a path, a URL or a name
    like ``notes`` is refused the same whether or not the server has it, and nothing is opened:
    ``check_hub_only("openai/gsm8k:main:test")`` passes, ``check_hub_only("/tmp/gradio")`` raises.
    """
    if spec in BUNDLED_SETS:
        return
    match = _HUB_ONLY.fullmatch(spec)
    if not match or ".." in spec or "--" in spec or not (match["owner"] or match["name"].lower() in PRESETS):
        # a bare name that is no preset is refused too: ``text``, ``json``, ``csv`` name the datasets library's
        # own builders, which read the working directory's files
        raise ValueError(NOT_ON_DISK)


def load_problems(source: Source, display_name: str | None = None) -> list[Problem]:
    """The problems of ``source``; ValueError naming the file, row or field that is wrong.
    ``display_name``: ``source.spec`` is a file the user uploaded, known to them by this name (the
    messages say it, never the path it was saved at; it is read as a file, whatever its name)."""
    if source.task is not None and source.task not in TASKS:
        raise ValueError(f"unknown task {source.task!r}; choose one of {', '.join(TASKS)}")
    if source.limit is not None and source.limit < 1:
        raise ValueError(f"limit {source.limit} must be at least 1")
    spec = source.spec.strip()
    if not spec:
        raise ValueError("name a dataset or a file")
    if source.hub_only:
        check_hub_only(spec)
    preset, file = None, spec if display_name else source.file
    if file:
        rows = read_file(file, source.limit, source.sample_seed, display_name)
        where = display_name or file
    else:
        preset, name, config, split = parse_dataset(spec)
        rows = read_hub(name, config, split, source.limit, source.sample_seed, source.hub_only)
        where = f"dataset {spec}"
    if not rows:
        raise ValueError(f"{where} has no rows")
    return [_problem(row, n, source, preset, where) for n, row in enumerate(rows, 1)]


def parse_dataset(spec: str) -> tuple[Preset | None, str, str | None, str]:
    """``gsm8k``, ``openai/gsm8k:main:test``, ``HuggingFaceH4/MATH-500:test`` -> (preset, name,
    config, split); a preset fills in what the spec leaves out."""
    parts = spec.split(":")
    if len(parts) > 3 or not all(parts):
        raise ValueError(f"dataset {spec!r}: write NAME, NAME:SPLIT or NAME:CONFIG:SPLIT")
    preset = PRESETS.get(parts[0].lower()) or _BY_HUB_NAME.get(parts[0].lower())
    name = preset.name if preset else parts[0]
    config = parts[1] if len(parts) == 3 else (preset.config if preset else None)
    split = parts[-1] if len(parts) > 1 else (preset.split if preset else "test")
    return preset, name, config, split


def _problem(row: dict, n: int, source: Source, preset: Preset | None, where: str) -> Problem:
    if not isinstance(row, dict):
        raise ValueError(f"{where}, row {n}: a row must be an object with named fields, "  # noqa: TRY004 (bad input)
                         f"not {type(row).__name__}")
    qf = source.question_field or (preset.question if preset else _first(row, QUESTION_FIELDS))
    if qf is None or qf not in row:
        wanted = f"field {qf!r}" if qf else "question field (none of " + ", ".join(QUESTION_FIELDS) + ")"
        raise ValueError(f"{where}, row {n}: no {wanted}; its fields: {', '.join(map(str, row)) or 'none'} "
                         "(name the one to read with the question field)")
    question = row[qf]
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}, row {n}: field {qf!r} must be non-empty text")
    af = source.answer_field or (preset.answer if preset else _first(row, ANSWER_FIELDS))
    if source.answer_field and af not in row:
        raise ValueError(f"{where}, row {n}: no field {af!r}; its fields: {', '.join(map(str, row))}")
    raw = row.get(af) if af else None
    suite = row.get("suite") if source.task is None and preset is None else None
    task = source.task or (preset.task if preset else None)
    if task is None:
        task = "suite" if suite else row.get("task") if row.get("task") in TASKS else "math" if raw not in (None, "") else "free"
    choices = row.get("choices")
    reference = _reference(raw, task, choices)
    template = source.template or (preset.template if preset else CHOICE_TEMPLATE if task == "choice" and choices
                                   else "{question}")
    try:
        prompt = template.format(question=question.strip(), choices=_choice_lines(choices))
    except (KeyError, IndexError, ValueError) as err:
        raise ValueError(f"prompt template {template!r}: {err} (it may use {{question}} and {{choices}})") from None
    pid = next((str(row[k]) for k in ID_FIELDS if row.get(k) not in (None, "")), str(n))
    return Problem(pid, prompt, reference, task, suite if task == "suite" else None)


def _first(row: dict, names: tuple[str, ...]) -> str | None:
    return next((k for k in names if k in row), None)


def _choice_lines(choices) -> str:
    if not isinstance(choices, list):
        return ""
    return "\n".join(f"{LETTERS[i]}. {c}" for i, c in enumerate(choices[: len(LETTERS)]))


def _reference(raw, task: str, choices) -> str | None:
    """The reference a grader compares with: for math, what a worked solution concludes (``####``,
    the last ``\\boxed{}``); for choice, a letter (an index into ``choices`` becomes one)."""
    if raw is None or raw == "":
        return None
    if task == "choice" and isinstance(raw, int) and not isinstance(raw, bool) and 0 <= raw < len(LETTERS):
        return LETTERS[raw]
    text = str(raw).strip()
    if task == "math":
        if "####" in text:
            return text.rsplit("####", 1)[1].strip().replace(",", "")
        boxed = last_boxed(text)
        if boxed is not None:
            return boxed
    return text


# ----------------------------------------------------------------------------- reading


def _sample(n_rows: int, limit: int | None, seed: int | None) -> list[int]:
    if limit is None or limit >= n_rows:
        return list(range(n_rows))
    if seed is None:
        return list(range(limit))
    return sorted(random.Random(seed).sample(range(n_rows), limit))


def read_file(path: str, limit: int | None = None, seed: int | None = None, display_name: str | None = None) -> list:
    """The rows of a local JSON lines, JSON (a list of objects), CSV or Parquet file."""
    p, shown = Path(path), display_name or path
    suffix = Path(display_name or path).suffix.lower()
    if not p.is_file():
        raise ValueError(f"file {shown!r} does not exist")
    if suffix not in LOCAL_FORMATS:
        raise ValueError(f"file {shown!r}: read as one of {', '.join(LOCAL_FORMATS)}, not {suffix or 'no extension'}")
    if suffix == ".parquet":
        return _parquet(p, shown, limit, seed)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"file {shown!r} is not UTF-8 text") from None
    if suffix == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    elif suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"file {shown!r}: not valid JSON ({err.msg}, line {err.lineno})") from None
    else:  # JSON lines (a .json file of objects one per line too)
        rows = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"file {shown!r}, line {n}: not valid JSON ({err.msg})") from None
    return [rows[i] for i in _sample(len(rows), limit, seed)]


def _parquet(p: Path, shown: str, limit: int | None, seed: int | None) -> list:
    import pyarrow.parquet as pq  # installed with ``datasets``

    try:
        f = pq.ParquetFile(p)
    except Exception as err:  # noqa: BLE001 (pyarrow raises its own kinds for a file that is not Parquet)
        why = str(err).replace(str(p), shown)  # pyarrow may name the path: an upload's is the server's, not theirs
        raise ValueError(f"file {shown!r} is not a Parquet file ({why})") from None
    if limit is not None and seed is None:  # the first rows only: never the whole file
        rows = []
        for batch in f.iter_batches(batch_size=min(limit, 1024)):
            rows += batch.to_pylist()
            if len(rows) >= limit:
                break
        return rows[:limit]
    rows = f.read().to_pylist()
    return [rows[i] for i in _sample(len(rows), limit, seed)]


HUB_ATTEMPTS, HUB_TIMEOUT_S = 3, 3.0  # the reachability check before a Hub dataset is read


def is_hub_spec(spec: str) -> bool:
    """Whether ``spec`` names a dataset on the Hub (not a bundled suite, not a file)."""
    return spec.strip() not in BUNDLED_SETS and not is_file_spec(spec.strip())


def reach_hub(attempts: int = HUB_ATTEMPTS, timeout: float = HUB_TIMEOUT_S) -> Iterator[str]:
    """Check that the Hugging Face Hub answers before a dataset is read from it, saying each try
    ("reaching the Hub: attempt 2 of 3"): an unreachable Hub is a message after ``attempts`` x
    ``timeout`` seconds, not a silent minute of the datasets library's own retries. Nothing to do
    offline (``HF_HUB_OFFLINE=1`` or ``HF_DATASETS_OFFLINE=1``: the local cache is read)."""
    import os

    import httpx

    if any(os.environ.get(flag, "").lower() in ("1", "true", "yes", "on")
           for flag in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")):
        return
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    why = ""
    for k in range(1, attempts + 1):
        yield f"reaching the Hub ({endpoint}): attempt {k} of {attempts}"
        try:
            httpx.head(f"{endpoint}/api/datasets", timeout=timeout)
            return
        except (httpx.HTTPError, httpx.InvalidURL) as err:
            why = f"{type(err).__name__}: {err}"
    raise ValueError(f"the Hub ({endpoint}) did not answer {attempts} attempts of {timeout:g} s ({why}): upload the "
                     "dataset as a file instead, or set HF_HUB_OFFLINE=1 to read it from your datasets cache")


def read_hub(name: str, config: str | None, split: str, limit: int | None, seed: int | None,
             hub_only: bool = False) -> list:
    """Rows of a Hugging Face dataset. Online with a limit, it streams (only those rows are read);
    offline (``HF_HUB_OFFLINE=1``) or without a limit, it loads through the user's cache. ``hub_only``
    (a stranger's name): the Hub or its cache only (``datasets`` reads a local folder of the same name
    first otherwise), and a failure is said without the library's message, which may quote a path."""
    try:
        import datasets
    except ImportError:
        raise ValueError("naming a Hub dataset needs the 'datasets' package (pip install datasets)") from None
    offline = bool(datasets.config.HF_HUB_OFFLINE)
    what = f"dataset {name!r}" + (f" (config {config!r})" if config else "") + f", split {split!r}"
    path = "hf://datasets/" + name if hub_only else name  # datasets' own spelling of "remote only"
    try:
        if limit is not None and not offline:
            stream = datasets.load_dataset(path, config, split=split, streaming=True)
            if seed is not None:
                stream = stream.shuffle(seed=seed, buffer_size=10_000)
            return list(stream.take(limit))
        ds = datasets.load_dataset(path, config, split=split)
    except Exception as err:  # noqa: BLE001 (datasets raises many kinds: connection, not found, bad config)
        hint = " in offline mode (HF_HUB_OFFLINE=1): only the local cache is read, and it is not there" if offline else ""
        why = ("check its name, config and split (a private or gated dataset cannot be read here), or upload it as "
               "a file" if hub_only else f"{type(err).__name__}: {err}")
        raise ValueError(f"{what} could not be loaded{hint}: {why}") from None
    return [ds[i] for i in _sample(len(ds), limit, seed)]
