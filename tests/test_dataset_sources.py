"""The data sources a visitor may name on a shared studio (issue 54): the Benchmark tab's dataset box
takes a bundled suite, a preset or a Hub id, judged by the string alone; a path, a folder, a URL,
Gradio's cache are refused with one message whether they exist or not, and nothing is read (a
planted secret never reaches a reply or the run log); an upload is read only from Gradio's upload
folder; what fails to load is said without the library's words. With public mode off, the box
reads local folders and files as before."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path

import pytest

from engine.benchmarks.problems import NOT_ON_DISK, Source, check_hub_only, load_problems, read_hub
from ssr_ui.jobs import Job
from ssr_ui.public import Public
from ssr_ui.render import esc
from tests.apps import ROOT, launched

SMALL = dict(max_think=12, max_answer=6, draft_start=4, max_draft=6)
REFUSED = esc(NOT_ON_DISK)  # as the status line shows it


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """What datasets reads from a local folder it caches: in the test's folder, not the user's cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")

# (spec, allowed on a shared studio) -- each row with the tempting wrong answer
HUB_ONLY_ROWS = [
    ("bundled-arithmetic", True),  # a bundled suite is the studio's own file, not a path: allowed
    ("gsm8k", True),  # a preset alias has no owner, yet names a Hub dataset (openai/gsm8k)
    ("GSM8K:main:test", True),  # presets are matched case-blind, as parse_dataset does
    ("openai/gsm8k:main:test", True),
    ("HuggingFaceH4/MATH-500:test", True),  # dots, dashes, digits, capitals are the Hub's grammar
    ("data/notes", True),  # looks like a relative path, but is a valid Hub id: allowed, and then read from the Hub only
    ("owner/name.jsonl", True),  # a file suffix is no reason to refuse a Hub id: it never becomes a file read
    ("notes", False),  # a bare name is not a Hub id here (no owner): "text", "json" are datasets' local builders
    ("text:train", False),  # datasets' "text" builder reads the working directory's .txt files
    ("/tmp/gradio", False),  # Gradio's cache: every visitor's uploads and exports
    ("/etc", False),  # an absolute folder
    ("/etc/passwd", False),  # an absolute file
    ("./data", False),  # a relative path spelled as one
    ("../secrets", False),  # a parent folder
    ("..", False),
    ("owner/..", False),  # ".." as a Hub name segment would be a path step
    ("a..b/c", False),  # no ".." anywhere (the Hub refuses it too)
    ("owner/na--me", False),  # no "--" (the Hub refuses it: it is its cache's separator)
    ("~/notes", False),  # the home folder
    ("~", False),
    ("file:///etc/passwd", False),  # a URL scheme: "file" would parse as NAME and the rest as CONFIG
    ("hf://datasets/owner/name", False),  # a URL even where it is the Hub's: one spelling only
    ("https://example.com/x.jsonl", False),
    ("owner\\name", False),  # a backslash: a Windows path separator
    ("a/b/c", False),  # two slashes: a path, not owner/name
    ("owner/name:config:split:extra", False),  # at most NAME:CONFIG:SPLIT
    ("owner/name:", False),  # an empty split
    ("owner/name:../x", False),  # a config or split is a name, never a path
    ("owner/ name", False),  # whitespace inside
    ("-owner/name", False),  # a segment starts with a letter or digit
    ("owner/" + "n" * 96, True),  # the Hub's bound: 96 characters a name
    ("owner/" + "n" * 97, False),  # one more is no Hub id
    ("", False),
]


@pytest.mark.parametrize("spec, allowed", HUB_ONLY_ROWS)
def test_the_hub_only_rule_is_a_check_of_the_string(spec, allowed):
    if allowed:
        check_hub_only(spec)
    else:
        with pytest.raises(ValueError) as refused:
            check_hub_only(spec)
        assert str(refused.value) == NOT_ON_DISK  # one message, whatever the reason


def _plant(folder: Path, marker: str) -> Path:
    """A folder holding the kind of files datasets reads from a folder, each with ``marker``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "notes.txt").write_text(f"HF_TOKEN={marker}\n")
    (folder / "data.jsonl").write_text(json.dumps({"question": f"what is {marker}?", "answer": "1"}) + "\n")
    return folder


def _public_studio(tmp_path, on: bool = True):
    from engine.methods.rsd.prm import MathShepherdScorer
    from ssr_ui.handlers import Studio
    from tests.tiny import make_model

    s = Studio("tiny", db=str(tmp_path / "runs.db"), draft_model="tiny-draft", prm="tiny-prm",
               public=Public.build("on" if on else "off", "tiny,tiny-draft,tiny-prm", ["tiny"]))
    s.add_model("tiny", make_model("llama", init_scale=3.0))
    s.add_model("tiny-draft", make_model("qwen2", seed=4, init_scale=2.0))
    s.add_scorer("tiny-prm", MathShepherdScorer(make_model("llama", seed=5)))
    return s


def _db_bytes(db: Path) -> bytes:
    return b"".join(p.read_bytes() for p in db.parent.glob(db.name + "*"))


def _statuses(studio, **kwargs) -> list[str]:
    frames = studio.benchmark(methods=["baseline"], limit=1, job=Job(None, "visitor"), model_name="tiny",
                              **SMALL, **kwargs)
    return [f.status for f in frames]


def test_a_path_in_the_dataset_box_is_refused_the_same_whether_it_exists_or_not(tmp_path, monkeypatch):
    from gradio.utils import get_upload_folder

    marker = secrets.token_hex(8)
    planted = _plant(tmp_path / "planted", marker)
    cache = Path(get_upload_folder())
    monkeypatch.chdir(tmp_path)
    studio = _public_studio(tmp_path)
    specs = [str(planted), str(planted) + ":train", str(tmp_path / "no-such-folder"), str(planted / "data.jsonl"),
             str(planted / "missing.jsonl"), f"file://{planted}/data.jsonl", "file:///no/such.jsonl", "planted",
             "planted:train", "nothing-here", "../" + tmp_path.name + "/planted", "..", str(cache),
             str(cache) + ":train", "~", "planted\\data.jsonl"]
    for spec in specs:
        statuses = _statuses(studio, dataset=spec)
        assert statuses == [f'<div class="metrics error">⚠ {REFUSED}</div>'], spec
    assert studio.history() == [] and marker.encode() not in _db_bytes(tmp_path / "runs.db")


def test_a_folder_named_like_a_hub_id_in_the_working_directory_is_never_read(tmp_path, monkeypatch):
    marker = secrets.token_hex(8)
    _plant(tmp_path / "acme" / "notes", marker)
    monkeypatch.chdir(tmp_path)
    # the hole it closes: datasets reads a local folder named like the id before it asks the Hub
    assert marker in json.dumps(read_hub("acme/notes", None, "train", None, None))
    with pytest.raises(ValueError) as there:
        read_hub("acme/notes", None, "train", None, None, hub_only=True)
    with pytest.raises(ValueError) as nowhere:
        read_hub("acme/nothing", None, "train", None, None, hub_only=True)
    assert marker not in str(there.value) and str(tmp_path) not in str(there.value)
    assert str(there.value).replace("notes", "X") == str(nowhere.value).replace("nothing", "X")  # no existence oracle
    studio = _public_studio(tmp_path)
    for spec in ("acme/notes", "acme/notes:train", "acme/notes/data.jsonl", "acme/notes:../../x"):
        statuses = _statuses(studio, dataset=spec)
        assert not any(marker in s or str(tmp_path) in s for s in statuses), spec
        assert statuses[-1].startswith('<div class="metrics error">'), spec
    assert studio.history() == [] and marker.encode() not in _db_bytes(tmp_path / "runs.db")


def test_an_upload_is_read_from_gradios_upload_folder_only(tmp_path, monkeypatch):
    uploads = tmp_path / "uploads"
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(uploads))
    marker = secrets.token_hex(8)
    planted = _plant(tmp_path / "planted", marker) / "data.jsonl"
    studio = _public_studio(tmp_path)
    for path in (planted, uploads / ".." / "planted" / "data.jsonl", uploads, tmp_path / "missing.jsonl"):
        assert _statuses(studio, upload=str(path)) == [f'<div class="metrics error">⚠ {REFUSED}</div>'], path
    theirs = _plant(uploads / "4567cdef", marker)  # another visitor's upload folder: named as an upload, it is no file
    for path in (theirs, uploads / "89ab" / "gone"):
        said = _statuses(studio, upload=str(path))[-1]
        assert said == f'<div class="metrics error">⚠ file {path.name!r} does not exist</div>', said
    assert studio.history() == [] and marker.encode() not in _db_bytes(tmp_path / "runs.db")
    mine = uploads / "0123abcd" / "mine.jsonl"  # where Gradio saves a visitor's upload
    mine.parent.mkdir(parents=True)
    mine.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    assert "done: 1 runs on 1 problems of mine.jsonl" in _statuses(studio, upload=str(mine))[-1]


def test_a_failed_load_never_says_a_server_path_or_another_files_content(tmp_path):
    uploads = tmp_path / "a" / "b"
    uploads.mkdir(parents=True)
    broken = uploads / "theirs.parquet"
    broken.write_text("not parquet at all")
    with pytest.raises(ValueError) as err:
        load_problems(Source(str(broken)), display_name="theirs.parquet")
    assert "theirs.parquet" in str(err.value) and str(uploads) not in str(err.value)
    # a Hub id's failure, on a shared studio: the dataset as typed, not the library's message
    with pytest.raises(ValueError) as err:
        load_problems(Source("acme/secret-set:train", hub_only=True))
    assert str(err.value).startswith("dataset 'acme/secret-set', split 'train' could not be loaded")
    assert str(err.value).endswith("or upload it as a file") and "Couldn't" not in str(err.value)
    with pytest.raises(ValueError, match="reads no file of its own"):
        load_problems(Source(str(broken), hub_only=True))  # the engine keeps the rule for any caller


def test_without_public_mode_a_local_folder_and_file_still_work(tmp_path, monkeypatch):
    marker = secrets.token_hex(8)
    planted = _plant(tmp_path / "planted", marker)
    (planted / "notes.txt").unlink()  # one kind of file: datasets' local folder reader infers its builder from them
    got = load_problems(Source(str(planted) + ":train"))
    assert [p.prompt for p in got] == [f"what is {marker}?"]
    assert load_problems(Source(str(planted / "data.jsonl")))[0].prompt == got[0].prompt
    monkeypatch.chdir(tmp_path)
    assert load_problems(Source("planted:train"))[0].prompt == got[0].prompt
    studio = _public_studio(tmp_path, on=False)
    studio.public.vet_source("/etc/passwd", uploaded=True)  # nothing is refused off
    studio.public.vet_source("/etc", uploaded=False)
    assert _statuses(studio, dataset=str(planted) + ":train")[-1].startswith("<div class=\"metrics bench-status\">")
    assert marker in str(studio.history())


# ----------------------------------------------------------------------------- through the /benchmark API route


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sources")
    with launched(folder, "--public", "on") as (url, db, _):
        yield folder, url, db


def _predict(url: str, **kwargs):
    """One /benchmark call from a fresh visitor: its status line, or the error gradio_client raises."""
    from gradio_client import Client

    try:
        out = Client(url, verbose=False).predict(**{"dataset": "", "upload": None, "methods": ["baseline"], "limit": 1,
                                                    "question_field": "", "answer_field": "", **kwargs},
                                                 api_name="/benchmark")
    except Exception as err:  # noqa: BLE001 (gradio_client raises its own kinds: the words are what the test reads)
        return f"{type(err).__name__}: {err}"
    return out[0]


def test_the_api_route_refuses_the_servers_paths_and_reads_nothing(shared):
    from gradio.utils import get_upload_folder

    folder, url, db = shared
    marker = secrets.token_hex(8)
    planted = _plant(folder / "planted", marker)
    hub_like = ROOT / "build" / f"ssr-probe-{marker[:6]}"  # under the server's cwd, named like a Hub id
    made_build = not hub_like.parent.exists()
    _plant(hub_like, marker)
    try:
        cache = get_upload_folder()
        specs = [str(planted), str(planted) + ":train", str(folder / "none"), str(planted / "data.jsonl"),
                 str(folder / "none.jsonl"), f"file://{planted}/data.jsonl", "file:///none.jsonl", "..",
                 "../" + ROOT.name + "/build", cache, cache + ":train", "build", "tests"]
        replies = {spec: _predict(url, dataset=spec) for spec in specs}
        for spec, reply in replies.items():
            assert reply == f'<div class="metrics error">⚠ {REFUSED}</div>', (spec, reply)
        hub = _predict(url, dataset=f"build/{hub_like.name}:train")
        nowhere = _predict(url, dataset=f"build/{hub_like.name}-none:train")
        assert "could not be loaded" in hub
        assert hub.replace(hub_like.name, "X") == nowhere.replace(hub_like.name + "-none", "X")  # no existence oracle
        assert marker not in hub and str(ROOT) not in hub
    finally:
        shutil.rmtree(hub_like)
        if made_build:
            hub_like.parent.rmdir()
    assert marker.encode() not in _db_bytes(db)


def test_the_api_route_reads_an_upload_but_not_a_server_path_typed_as_one(shared, monkeypatch):
    from gradio.utils import get_upload_folder
    from gradio_client import handle_file
    from gradio_client.client import Endpoint

    folder, url, db = shared
    marker = secrets.token_hex(8)
    planted = _plant(folder / "typed", marker) / "data.jsonl"
    mine = folder / "mine.jsonl"
    mine.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n")
    assert "done: 1 runs on 1 problems of mine.jsonl" in _predict(url, upload=handle_file(str(mine)))
    # an API caller who sends a server path as the upload, without uploading it (what a raw HTTP call sends)
    monkeypatch.setattr(Endpoint, "_upload_file", lambda self, f, data_index: {**f, "orig_name": Path(f["path"]).name})
    cache = get_upload_folder()
    for path in (planted, Path(cache) / os.path.relpath(planted, cache)):  # the second: in the cache by its spelling
        reply = _predict(url, upload=handle_file(str(path)))
        assert "done:" not in reply and marker not in reply, (path, reply)
    assert marker.encode() not in _db_bytes(db)
