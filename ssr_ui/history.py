"""The studio's past runs: the History table, exports (JSON, HTML, CSV), imports, and re-rendering
a logged or imported run as the Run tab showed it."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from engine.config import RunConfig, number
from engine.events import RunStats
from engine.registry import label_of
from engine.runlog import prompt_hash
from engine.runlog.compare import finished, slow_runs
from ssr_ui.export import logged_view
from ssr_ui.frame import Frame
from ssr_ui.jobs import json_object
from ssr_ui.render import CSS, metrics_html

EXPORTS_KEPT = 50  # export files a server process keeps (the newest)...
EXPORT_MAX_AGE_S = 3600  # ...none of them older than this


def export_folder() -> Path:
    """This server process's one folder of export files (under the system's temporary folder),
    removed when the process ends."""
    return Path(tempfile.gettempdir()) / f"ssr-studio-exports-{os.getpid()}"


def prune_exports(folder: Path, now: float | None = None) -> None:
    """Remove the exports in ``folder`` (one sub-folder each) past the newest :data:`EXPORTS_KEPT`,
    and any older than :data:`EXPORT_MAX_AGE_S` seconds (another thread may be pruning too: what is
    already gone is skipped)."""
    now = time.time() if now is None else now
    exports = []
    for export in folder.iterdir():
        with contextlib.suppress(FileNotFoundError):
            exports.append((export.stat().st_mtime, export))
    exports.sort(reverse=True)
    for i, (mtime, export) in enumerate(exports):
        if i >= EXPORTS_KEPT or now - mtime > EXPORT_MAX_AGE_S:
            shutil.rmtree(export, ignore_errors=True)


class PastRuns:
    """History, export, import and replay over ``self.log`` (a :class:`~engine.runlog.RunLog`);
    a replayed run's ratio to its baselines comes from ``self.compare_to_baseline``, as live."""

    # gr.Blocks(delete_cache=...): Gradio's own copies of the exports it served (and of uploads), swept every
    # 10 minutes, go once they are as old as an export may be
    DELETE_CACHE = (600, EXPORT_MAX_AGE_S)

    def history(self, method: str = "all", limit: int = 200, dataset: str = "all", visitor: str | None = None,
                model: str = "all") -> list[dict]:
        """Newest runs first, of ``method``, ``dataset`` and ``model`` ("all": any), each with
        ``flag``: why its timing is an outlier for its kind, or "" (``engine.runlog.compare.slow_runs``).
        ``visitor``: that visitor's runs only (a shared studio); None: every run."""
        filters = {k: v for k, v in (("method", method), ("dataset", dataset), ("model", model))
                   if v not in ("", "all", None)}
        if visitor is not None:
            filters["visitor"] = visitor
        rows = self.log.runs(limit=limit, **filters)
        slow = slow_runs(rows)
        return [{**r, "flag": slow.get(r["id"], "")} for r in rows]

    def export(self, run_id: int | None, kind: str, method: str = "all", dataset: str = "all",
               visitor: str | None = None, model: str = "all") -> str:
        """Write run ``run_id`` (``kind`` "json" or "html") or the runs table ("csv", the runs of
        ``method``, ``dataset`` and ``model`` as History's filters show them) to a file of its own
        sub-folder of :func:`export_folder` (so that two visitors' exports never share a path, and
        the file keeps its plain name), after pruning the folder (:func:`prune_exports`); returns
        its path. ``visitor``: only that visitor's runs (another's id is refused as unknown)."""
        from ssr_ui.export import run_to_html, run_to_json, runs_to_csv

        if kind == "csv":
            # (a filter sent over the API may hold anything: the file's name keeps only a method name's characters)
            name = "runs.csv" if method in ("", "all", None) else f"runs-{re.sub(r'[^A-Za-z0-9_-]', '_', str(method))}.csv"
            text = runs_to_csv(self.history(method, limit=100_000, dataset=dataset, visitor=visitor, model=model))
        else:
            run_id = _run_id(run_id)
            row = self.log.run(run_id, visitor)
            events = self.log.events(run_id)
            if kind == "json":
                text = run_to_json(row, events)
            elif kind == "html":
                text = run_to_html(row, events, CSS, self._past(row, events, visitor).metrics)
            else:
                raise ValueError(f"unknown export format {kind!r}")
            name = f"run-{int(run_id)}.{kind}"
        root = export_folder()
        if not root.exists():  # this process's first export: the folder goes when the process ends
            root.mkdir(mode=0o700, exist_ok=True)
            atexit.register(shutil.rmtree, root, ignore_errors=True)
        prune_exports(root)
        path = Path(tempfile.mkdtemp(dir=root)) / name
        path.write_text(text, encoding="utf-8")
        return str(path)

    def import_trace(self, path: str, visitor: str | None = None) -> Frame:
        """Render a JSON trace file exported from any studio (compared with ``visitor``'s baselines
        on a shared studio, never with the visitor the file names). A file that is not a valid
        trace is refused with a ValueError naming its first bad field (``ssr_ui.export.run_from_json``);
        nothing of it is rendered before it has been validated."""
        from ssr_ui.export import MAX_TRACE_BYTES, run_from_json

        try:
            size = Path(path).stat().st_size
            if size > MAX_TRACE_BYTES:
                raise ValueError(f"{Path(path).name} is {size / 2**20:.1f} MB: a trace import reads at most "
                                 f"{MAX_TRACE_BYTES // 2**20} MB")
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ValueError(f"cannot read {Path(path).name}: {err}") from None
        row, events = run_from_json(text)
        try:
            return self._past(row, events, visitor)
        except (TypeError, KeyError, IndexError, AttributeError, ZeroDivisionError) as err:
            # the schema let through values the renderer cannot show: said as the file's fault, never a bare "Error"
            raise ValueError(f"{Path(path).name} cannot be shown ({type(err).__name__}: {err}); its values pass the "
                             "trace schema, so please report this file") from None

    def replay(self, run_id, visitor: str | None = None) -> Frame:
        """Re-render a past run from its logged events (``visitor``: only that visitor's runs)."""
        run_id = _run_id(run_id)
        row = self.log.run(run_id, visitor)
        return self._past(row, self.log.events(run_id), visitor)

    def _past(self, row: dict, events: list, visitor: str | None = None) -> Frame:
        """A logged or imported run as the Run tab showed it: panes, every metric, the vs-baseline
        ratio (a run that did not finish gets none: ``engine.runlog.compare``)."""
        view = logged_view(row, events)
        compare = None
        if row.get("method") not in (None, "baseline") and finished(row) and row.get("prompt"):
            config = row.get("config")
            try:
                cfg = RunConfig(**{k: v for k, v in (config if isinstance(config, dict) else json_object(config)).items()
                                   if k in RunConfig.field_names()})
            except ValueError:  # logged under older, wider ranges (a threshold of 5): shown, not compared
                cfg = None
            if cfg is not None:
                run = {**row, "prompt_hash": prompt_hash(row["prompt"]), "visitor": visitor}  # whoever asks, not the row
                done = _Done(view.stats, row.get("answer_text") or "", [t.token_id for t in view.reasoning],
                             [t.token_id for t in view.answer])  # its tokens: checked against baseline's one by one
                compare = self.compare_to_baseline(run, done, cfg)
        frame = Frame.of(view, metrics_html(view, label_of(str(row.get("method") or "?")), compare))
        return dataclasses.replace(frame, prompt=str(row.get("prompt", "")))


@dataclass
class _Done:
    """What compare_to_baseline reads of a finished run."""

    stats: RunStats
    answer_text: str
    reasoning_ids: list[int]
    answer_ids: list[int]


def _run_id(value) -> int:
    """A run id typed in History (or sent through the API), as a whole number."""
    if value is None or value == "":
        raise ValueError("enter a run id from the table first")
    return number("run id", value, whole=True)
