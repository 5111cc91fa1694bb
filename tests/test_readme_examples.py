"""Issue 34, finding 7: every example the README shows, and every example button of the studio
that names a model the tests have, runs and is answered right. Before, the `gradio_client`
example asked about fields outside the bundled model's vocabulary (it stopped mid-sentence and
printed nothing) and "the engine in five lines" gave a wrong answer."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from engine.answers import check
from engine.tools.synthetic import EVAL_SEED_BASE, make_example

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, re.DOTALL)


def _block(marker: str) -> str:
    found = [b for b in _python_blocks() if marker in b]
    assert len(found) == 1, f"one README example with {marker!r}"
    return found[0]


def _suite_reference(suite: str, prompt: str) -> str:
    """The reference of a held-out suite prompt (the README and the buttons use the suites' own)."""
    for i in range(200):
        example = make_example(suite, EVAL_SEED_BASE + i)
        if example.prompt == prompt:
            return example.reference
    raise AssertionError(f"not a held-out {suite} prompt, so no reference to grade it by: {prompt!r}")


def _run(code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})  # noqa: S102 (the README's own code)
    return out.getvalue()


def test_every_python_example_in_the_readme_is_checked_here():
    assert len(_python_blocks()) == 2  # a new example needs its check below


def test_the_engine_in_five_lines_answers_right():
    code = _block("decode_ssr")
    prompt = re.search(r'prompt = "(.*)"', code).group(1)
    printed = _run(code)
    answer, accepted = printed.rstrip("\n").rsplit(" ", 1)
    assert check("classes", answer, _suite_reference("classes", prompt)), printed
    assert int(accepted) > 0  # SSR took answer tokens from its draft


@pytest.mark.slow
def test_the_gradio_client_example_prints_the_right_answer(tmp_path):
    from tests.apps import launched

    code = _block("gradio_client")
    prompt = "".join(re.findall(r'"([^"]*)"', re.search(r"prompt = \((.*?)\)  #", code, re.DOTALL).group(1)))
    with launched(tmp_path) as (url, _, _):
        printed = _run(code.replace("http://127.0.0.1:7860/", url))
    assert check("classes", printed, _suite_reference("classes", prompt)), printed


def test_the_quick_start_lines_can_be_pasted_in_order():
    lines = re.search(r"```bash\n(.*?)```", README, re.DOTALL).group(1).strip().splitlines()
    assert len(lines) == 2 and "python app.py" in lines[0] and "Ctrl+C stops it" in lines[0]
    assert "python -m pytest" in lines[1] and "requirements-models.txt" in lines[1]


def test_the_studio_example_buttons_are_answered_right_by_the_model_they_name(tmp_path):
    """Each group of example prompts names the model (and method) it suits: on the bundled models
    every one is answered right; a group for a model the bundled one cannot answer says so."""
    from ssr_ui.handlers import Studio
    from ssr_ui.layout import examples

    studio = Studio(db=str(tmp_path / "runs.db"))
    graded = 0
    for label, (method, model, prompts) in examples().items():
        if model is None:
            assert "Need a real model" in label  # no model named: the label says the bundled one cannot
            continue
        if model != "tiny-reasoner":
            continue  # a registry model's group: tests/test_studio_real_models.py runs it
        suite = "classes" if method == "SSR" else "arithmetic"
        for prompt in prompts:
            final = list(studio.run(prompt, method, model))[-1]
            assert final.view.done is not None, final.metrics
            assert check(suite, final.view.done.answer_text, _suite_reference(suite, prompt)), (label, prompt)
            assert not final.view.cut, (prompt, final.view.cut)  # answered within its budgets
            graded += 1
    assert graded == 5


def test_the_front_door_has_the_title_and_both_commands_on_its_first_screen():
    """A new user's first screen: the title, then the install-and-launch and the test commands, within the
    README's first 25 lines (the Space's front matter above them)."""
    head = README.splitlines()[:25]
    assert any(line.startswith("# SSR Studio") for line in head), head
    assert any("pip install -r requirements.txt && python app.py" in line for line in head), head
    assert any(line.startswith("pip install -r requirements-dev.txt") and "python -m pytest" in line for line in head)
