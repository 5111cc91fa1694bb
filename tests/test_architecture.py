"""The layout's promises, checked on the import graph of the code itself (every import, top-level
or inside a function):

* no import cycle between modules;
* no module imports a private (``_name``) from another package;
* dependencies point one way: ``engine`` never imports ``ssr_ui`` or Gradio; a method
  (``engine/methods``) never imports a backend (``engine.remote``) or a tool (``engine.tools``); the
  runtime never imports a method, a backend or a tool.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "ssr_ui")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    found = {_module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    found["app"] = ROOT / "app.py"
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str | None]]:
    """``(module, imported name or None)`` for every import in the file that reaches ``known``."""
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                base = ".".join([*anchor, *([base] if base else [])])
            for a in node.names:
                sub = f"{base}.{a.name}"
                out.append((sub, None) if sub in known else (base, a.name))
    return [(m, n) for m, n in out if m in known or m.split(".")[0] in ("gradio", "ssr_ui", "engine")]


def _graph() -> dict[str, list[tuple[str, str | None]]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def _package(module: str) -> str:
    """The package a module belongs to (``engine.methods.ssr`` for ``engine.methods.ssr.loop``)."""
    path = ROOT.joinpath(*module.split("."))
    return module if path.is_dir() else module.rpartition(".")[0]


def test_no_import_cycle():
    graph = {m: {t for t, _ in targets if t != m and t in _modules()} for m, targets in _graph().items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*trail[trail.index(nxt):], nxt]))
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_name_crosses_a_package():
    crossing = [f"{m} imports {t}.{n}" for m, targets in _graph().items() for t, n in targets
                if n and n.startswith("_") and not n.startswith("__") and _package(t) != _package(m)]
    assert not crossing, "\n".join(crossing)


RULES = [  # (importer prefix, forbidden prefix, why)
    ("engine", "ssr_ui", "the engine knows nothing of the UI"),
    ("engine", "gradio", "the engine never imports Gradio"),
    ("engine.methods", "engine.remote", "a method never imports a backend: the registry hands it one"),
    ("engine.methods", "engine.tools", "a method never imports a tool"),
    ("engine.methods", "engine.registry", "the registry composes the methods, not the reverse"),
    ("engine.runtime", "engine.methods", "the runtime sits under the methods"),
    ("engine.runtime", "engine.remote", "the runtime is in process"),
    ("engine.runtime", "engine.llamacpp", "the torch runtime and the llama.cpp runtime sit side by side"),
    ("engine.methods", "engine.llamacpp", "a method never imports a backend: the registry hands it one"),
    ("engine.llamacpp", "engine.methods", "a runtime sits under the methods"),
    ("engine.llamacpp", "engine.remote", "the llama.cpp runtime is in process"),
    ("engine.runtime", "engine.tools", "the runtime never imports a tool"),
]


BACKENDS = ("LoadedModel", "RemoteModel", "LlamaModel", "load_model", "random_weights_model", "connect", "load_llama")


def test_methods_see_models_through_the_seams():
    """A method names the models it runs by the declared seams (``engine.methods.seams``), never
    by a backend class or loader: which backend runs is the composition root's choice."""
    named = [f"{m} imports {t}.{n}" for m, targets in _graph().items() if _under(m, "engine.methods")
             for t, n in targets if n in BACKENDS]
    assert not named, "\n".join(named)


def _members(protocol) -> dict[str, object]:
    own = [k for k in protocol.__mro__ if k.__module__ == protocol.__module__]
    names = {n for k in own for n in [*vars(k), *vars(k).get("__annotations__", {})] if not n.startswith("_")}
    return {n: getattr(protocol, n, None) for n in sorted(names)}


def _parameters(fn) -> list[str]:
    fn = fn.fget if isinstance(fn, property) else fn
    return [p.name for p in inspect.signature(fn).parameters.values()] if callable(fn) else []


@pytest.mark.parametrize("backend, seam", [
    ("engine.runtime.model:LoadedModel", "StepModel"),
    ("engine.llamacpp.model:LlamaModel", "StepModel"),
    ("engine.remote.model:RemoteModel", "ModelBackend"),
    ("engine.runtime.batch:RowBatch", "Rows"),  # the rows seam, on every in-process runtime
    ("engine.llamacpp.rows:SeqRows", "Rows"),
])
def test_backends_fit_the_seams(backend, seam):
    """Each backend has every member its seam declares, methods with the same parameters."""
    from engine.methods import seams

    module, name = backend.split(":")
    cls, protocol = getattr(importlib.import_module(module), name), getattr(seams, seam)
    probe = _instance_attributes(cls)
    missing, differ = [], []
    for member, declared in _members(protocol).items():
        if not hasattr(cls, member) and member not in probe:
            missing.append(member)
        elif callable(declared) and _parameters(getattr(cls, member)) != _parameters(declared):
            differ.append(f"{member}{_parameters(getattr(cls, member))} vs {_parameters(declared)}")
    assert not missing and not differ, f"{name} against {seam}: missing {missing}, parameters differ {differ}"


def _instance_attributes(cls) -> set[str]:
    """The attributes ``cls.__init__`` assigns (``self.x = ...``), read from its source."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return {t.attr for node in ast.walk(tree) if isinstance(node, ast.Assign) for target in node.targets
            for t in (target.elts if isinstance(target, ast.Tuple) else [target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}


def test_every_proposer_fits_the_seam():
    from engine.methods.ssr import proposers

    for cls in (proposers.DraftPrefixProposer, proposers.SuffixProposer):
        for member in ("propose", "observe"):
            assert _parameters(getattr(cls, member)) == _parameters(getattr(proposers.Proposer, member)), cls


def _under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_dependencies_point_one_way():
    broken = [f"{m} imports {t}: {why}" for m, targets in _graph().items() for t, _ in targets
              for src, dst, why in RULES if _under(m, src) and _under(t, dst)]
    assert not broken, "\n".join(sorted(set(broken)))


def test_the_checks_see_the_imports():
    """The graph is read right: known edges are there (else the tests above would pass vacuously)."""
    graph = {m: {t for t, _ in targets} for m, targets in _graph().items()}
    assert "engine.registry" in graph["ssr_ui.handlers"]
    assert "engine.methods.ssr.method" in graph["engine.registry"]
    assert any(_under(t, "engine.runtime") for t in graph["engine.methods.ssr.loop"])


MAX_UI_FUNCTION = 80  # lines: a UI function longer than this hides logic that wants a name and a test of its own


def test_no_ui_function_is_longer_than_a_screen():
    """Every function in ``ssr_ui/`` (methods and nested functions included) fits in 80 lines."""
    long = [f"{path.relative_to(ROOT)}:{node.lineno} {node.name} is {node.end_lineno - node.lineno + 1} lines"
            for path in (ROOT / "ssr_ui").rglob("*.py")
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.end_lineno - node.lineno + 1 > MAX_UI_FUNCTION]
    assert not long, "\n".join(sorted(long))


def test_the_ui_names_no_method_the_registry_does_not_declare():
    """The studio's lists of methods are the registry's (``engine.registry.methods``): the Run tab's modes, a
    Compare's runs and the Benchmark tab's choices are its records' labels and names, in its order."""
    from engine.registry import methods
    from ssr_ui.benchmark import BENCH_METHODS
    from ssr_ui.handlers import COMPARE_RUNS, METHOD_NAMES, MODES

    assert MODES == (*(m.label for m in methods("run")), "Compare")
    assert COMPARE_RUNS == tuple(m.label for m in methods("compare"))
    assert BENCH_METHODS == tuple(m.name for m in methods("benchmark"))
    assert all(METHOD_NAMES[label] for label in (*MODES[:-1], *COMPARE_RUNS))


# RunStats' words (engine.events): the studio shows them, and reads what it branches on from typed values
ENGINE_TEXT = {"step_mode", "verify", "forks", "drafting", "lookups", "acceptance", "cut"}
ENGINE_PART_TEXT = {("server", "note"), ("server", "speculation"), ("exit", "why"), ("exit", "rule")}  # stats.exit.why
SLICING = {"startswith", "endswith", "split", "rsplit", "partition", "rpartition", "index", "find", "removeprefix"}


def _names_engine_text(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and (n.attr in ENGINE_TEXT or isinstance(n.value, ast.Attribute)
                                                 and (n.value.attr, n.attr) in ENGINE_PART_TEXT)
               for n in ast.walk(node))


def test_the_ui_never_slices_or_searches_the_engines_words():
    """No ``ssr_ui`` module slices, splits or searches a RunStats text field (``s.verify.split(":")``,
    ``step_mode.startswith("vllm ")``, ``"x" in s.forks``): the engine's typed readings
    (``engine.steps``, ``RunStats.stepping()``, ``.verifying()``) say what the page branches on, so rewording a
    message in the engine cannot silently change the page."""
    found = []
    for path in (ROOT / "ssr_ui").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            sliced = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SLICING
                      and _names_engine_text(node.func.value))
            searched = (isinstance(node, ast.Compare) and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
                        and any(_names_engine_text(c) for c in node.comparators))
            if sliced or searched:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)[:90]}")
    assert not found, "\n".join(sorted(found))
