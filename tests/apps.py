"""Launch the studio in its own process on a free port, for end-to-end tests."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

from ssr_ui.tools.screenshots import wait_for_port

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"  # Debian's, driven through Playwright (no browser download; .ci/run installs it)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def launched(folder: Path, *args: str, db: Path | None = None, module: str | None = None):
    """Yield ``(url, db, process)`` for ``python app.py`` (``module``: ``python -m module``, a launcher
    that builds the app its own way, e.g. ``tests.shrunk_app``) with a run log in ``folder``; its output
    goes to ``folder/app.log``. The process is stopped on exit (if it is still running)."""
    port, db = free_port(), db or folder / "runs.db"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", "OMP_NUM_THREADS": "1"}
    log = open(folder / "app.log", "w")  # noqa: SIM115 (the process writes to it until the caller stops it)
    # SSR's drafts as planned (the tests that show them need them), unless a test asks for its own drafting
    drafting = () if "--drafting" in args else ("--drafting", "always")
    entry = ["-m", module] if module else ["app.py"]
    proc = subprocess.Popen([sys.executable, *entry, "--port", str(port), "--db", str(db), *drafting, *args], cwd=ROOT,
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        try:
            wait_for_port(port, proc)
        except RuntimeError as err:
            raise RuntimeError(f"{err}\n{(folder / 'app.log').read_text()}") from None
        yield f"http://127.0.0.1:{port}/", db, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
        log.close()


def query(db, sql: str, *params) -> list[tuple]:
    """``sql``'s rows from the run log at ``db``, on a connection closed before returning. A dropped
    ``sqlite3`` connection is only closed by the cyclic garbage collector (its statement cache refers
    back to it), and while it stays open the log's WAL journal stays too: a test that waits for the
    journal to close (or a writer that needs the file to itself) would wait on this process's garbage."""
    import sqlite3

    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def wait_for(check, what: str, timeout: float = 120.0, every: float = 0.05):
    """Poll ``check()`` until it returns something truthy, and return that; fail naming ``what``
    after ``timeout`` seconds (generous: a wait is for an event, never a bet on the machine's speed)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


def cancel_replies(monkeypatch) -> list[dict]:
    """From now on until the test ends, collect the studio's replies to ``gradio_client``'s cancels
    (``Job.cancel()`` posts with ``httpx.post`` and drops the reply): a list that grows by one
    reply per cancel sent."""
    import httpx

    replies: list[dict] = []
    post = httpx.post

    def posting(url, *args, **kwargs):
        response = post(url, *args, **kwargs)
        if str(url).endswith("/cancel"):
            replies.append(response.json())
        return response

    monkeypatch.setattr(httpx, "post", posting)
    return replies
