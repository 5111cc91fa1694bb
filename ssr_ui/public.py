"""Public mode: the studio shared with strangers (a Hugging Face Space, or ``app.py --public on``).

Off (the default on one's own machine), nothing here changes anything. On:

* **Runs belong to their visitor.** A visitor is Gradio's session (one per page load, one per
  ``gradio_client.Client``); the run log keeps an opaque key of it (:meth:`Public.visitor`), never
  the session id itself. History, replay and exports read a visitor's own rows only; another
  visitor's run id is refused exactly as an id that does not exist.
* **The operator's model list.** The Model, draft model and PRM fields (Run, Compare, the sweep,
  the Benchmark tab, the API) take only the names the operator listed (``--models``; by default
  the bundled models and the installed registry models, plus the app's own ``--model``,
  ``--draft-model`` and ``--prm``). Anything else, a path that exists or not, a Hub id, is refused
  with one message that depends on nothing but the name typed: the server's files cannot be probed.
* **Nothing of the server's disk.** The Benchmark tab's dataset box takes a bundled suite, a preset or
  a Hub id ``owner/name[:config][:split]``, judged by the string alone and read from the Hub even
  where the working directory has a folder of that name; a path, a folder, a URL, Gradio's cache
  are refused with one message (:data:`~engine.benchmarks.problems.NOT_ON_DISK`) whether they exist
  or not. An upload is read only from Gradio's upload folder, where Gradio saved it (not a path an API
  caller typed); what fails to load is said without a server path or another file's content.
* **Bounds.** One run, sweep or benchmark in flight per visitor (a session, and every session of
  one client address: :func:`~ssr_ui.jobs.visitor_address`), at most ``max_jobs`` in all; a
  job over a bound is refused when it is submitted, saying which bound and when to try again
  (:class:`~ssr_ui.jobs.Bounds`, read by :class:`~ssr_ui.jobs.CancelRoute`). The jobs admitted wait their
  turn for the model in arrival order, each told its place (``ssr_ui.waiting``). A benchmark is at
  most ``max_benchmark_runs`` runs (:meth:`Public.check_benchmark`) and takes turns: between two of
  its runs, the visitors waiting get the model first.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from engine.benchmarks.problems import NOT_ON_DISK, check_hub_only
from engine.presets import BUNDLED
from engine.runtime.gguf import REGISTRY, installed

PUBLIC_MODES = ("auto", "on", "off")
TARGET_LIKELIHOOD = "target-likelihood"  # an RSD scorer that is no model: always allowed as a PRM
MAX_JOBS = 8  # runs, sweeps and benchmarks admitted at once in public mode (one using the model, the rest waiting)
MAX_NAME_SHOWN = 60  # a refused name is echoed at most this long
MAX_BENCHMARK_RUNS = 120  # problems x repeats x methods of one benchmark in public mode (app --max-benchmark-runs)


def public_on(mode: str, environ=os.environ) -> bool:
    """Whether public mode is on: ``mode`` "on" or "off" says so; "auto" is on where Hugging Face
    runs the app (it sets ``SPACE_ID``)."""
    if mode not in PUBLIC_MODES:
        raise ValueError(f"--public must be one of {', '.join(PUBLIC_MODES)}, not {mode!r}")
    return mode == "on" or (mode == "auto" and bool(environ.get("SPACE_ID")))


def default_models() -> list[str]:
    """The models a public studio offers when the operator names none: the bundled ones and the
    registry's real models whose package is installed."""
    return [*BUNDLED, *(name for name in REGISTRY if installed(name))]


@dataclass
class Public:
    """The public-mode policy of one studio (``on`` False: every method lets everything through)."""

    on: bool = False
    models: tuple[str, ...] = ()  # the operator's list (in public mode the only names a visitor may use)
    max_jobs: int = MAX_JOBS
    max_benchmark_runs: int = MAX_BENCHMARK_RUNS
    _salt: bytes = field(default_factory=lambda: secrets.token_bytes(16), repr=False)

    @classmethod
    def build(cls, mode: str, models: str | None, own: list[str], max_jobs: int = MAX_JOBS,
              environ=os.environ, max_benchmark_runs: int = MAX_BENCHMARK_RUNS) -> Public:
        """From the app's flags: ``--public`` (``mode``), ``--models`` (comma-separated, or None for
        :func:`default_models`), the app's own model names ``own`` (always on the list),
        ``--max-jobs``, ``--max-benchmark-runs``."""
        if max_jobs < 1:
            raise ValueError(f"--max-jobs must be at least 1, not {max_jobs}")
        if max_benchmark_runs < 1:
            raise ValueError(f"--max-benchmark-runs must be at least 1, not {max_benchmark_runs}")
        listed = [m.strip() for m in models.split(",")] if models is not None else default_models()
        listed = [m for m in listed if m]
        if models is not None and not listed:
            raise ValueError("--models names no model: give a comma-separated list of model names")
        return cls(public_on(mode, environ), tuple(dict.fromkeys([*own, *listed])), max_jobs, max_benchmark_runs)

    def check_benchmark(self, problems: int, repeats: int, methods: int) -> None:
        """Refuse a benchmark of more than ``max_benchmark_runs`` runs (public mode only), before
        anything is read or run: "a benchmark of 20 problems x 5 repeats x 6 methods = 600 runs is
        over this shared studio's bound of 120 runs: choose fewer problems, repeats or methods"."""
        runs = problems * repeats * methods
        if self.on and runs > self.max_benchmark_runs:
            raise ValueError(f"a benchmark of {problems} problems x {repeats} repeats x {methods} methods = {runs} "
                             f"runs is over this shared studio's bound of {self.max_benchmark_runs} runs: choose "
                             "fewer problems, repeats or methods")

    def visitor(self, session: str | None) -> str | None:
        """The run log's key for this session's visitor (None when public mode is off: runs are
        nobody's in particular, and every view shows all of them). Salted per server start: a key
        in the log cannot be traced back to a session id."""
        if not self.on:
            return None
        if not session:  # a caller with no session (a bare HTTP call): a visitor of its own, whose runs nobody sees
            return "anon-" + secrets.token_hex(10)
        return hashlib.sha256(self._salt + session.encode()).hexdigest()[:24]

    def vet(self, field_name: str, name: str | None) -> None:
        """Refuse a model name not on the operator's list (public mode only; an empty name means the
        studio's default, which is on it). The message is the same whatever the name is: a path
        that exists, one that does not, a Hub id."""
        if not self.on or name is None:
            return
        name = str(name).strip()
        if not name or name in self.models or (field_name == "PRM" and name == TARGET_LIKELIHOOD):
            return
        shown = name if len(name) <= MAX_NAME_SHOWN else name[:MAX_NAME_SHOWN] + "…"
        raise ValueError(f"{field_name} {shown!r} is not offered on this shared studio: pick one of "
                         f"{', '.join(self.models)}")

    def vet_source(self, spec: str, uploaded: bool) -> None:
        """Refuse a benchmark source on the server's disk (public mode only), before anything is
        opened. ``spec``: the dataset box's name, or the upload's path when ``uploaded``; an upload
        outside Gradio's upload folder (an API caller's own string) is refused, and so is a name that
        is not a bundled suite, a preset or a Hub id (:func:`check_hub_only`). One message,
        :data:`NOT_ON_DISK`, whatever was refused and whether it exists or not."""
        if not self.on:
            return
        if not uploaded:
            check_hub_only(spec.strip())
            return
        from gradio.utils import get_upload_folder  # the folder this process's uploads are saved in

        if Path(get_upload_folder()).resolve() not in Path(spec).resolve().parents:
            raise ValueError(NOT_ON_DISK)

    def choices(self, default: list[str]) -> list[str]:
        """The Model list a visitor sees: the operator's list in public mode, else ``default``."""
        return list(self.models) if self.on else default
