"""Refresh the studio screenshots in docs/: launch the app, drive it in headless Chromium.

    python -m ssr_ui.tools.screenshots --out docs/img [--port 7870]

Needs Debian's chromium (``apt-get install -y chromium``) and the playwright package. Takes the
main tab mid-run and after an SSR run, compare mode, an RSD run, and the history tab.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.tools.synthetic import EVAL_SEED_BASE, make_example

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--no-first-run", "--disable-sync"]


def wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    """Block until the launched app accepts connections; RuntimeError if it died first."""
    import socket

    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None:
                raise RuntimeError(f"the app exited with code {proc.returncode} before serving") from None
            time.sleep(0.5)
    raise RuntimeError(f"the app did not open port {port} within {timeout:.0f} s")


def _wait_done(page, timeout_ms: int = 180_000) -> None:
    page.wait_for_function("[...document.querySelectorAll('.metrics .v')].some(v => v.innerText === 'done')",
                           timeout=timeout_ms)
    page.wait_for_function("document.querySelector('#stop').disabled", timeout=30_000)  # the buttons are back


def main(argv: list[str] | None = None) -> None:
    from playwright.sync_api import sync_playwright

    ap = argparse.ArgumentParser(prog="python -m ssr_ui.tools.screenshots")
    ap.add_argument("--out", default="docs/img")
    ap.add_argument("--port", type=int, default=7870)
    ap.add_argument("--prm", default="tiny-prm")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    db = Path(tempfile.mkdtemp()) / "runs.db"
    app = subprocess.Popen([sys.executable, "app.py", "--port", str(args.port), "--db", str(db)])
    os.nice(10)  # this script and its browser yield the CPU to the app: timings in the shots are the app's
    try:
        wait_for_port(args.port, app)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
            page = browser.new_page(viewport={"width": 1500, "height": 1150})
            page.goto(f"http://127.0.0.1:{args.port}/")
            page.get_by_label("Prompt").fill(make_example("classes", EVAL_SEED_BASE + 1).prompt)
            page.get_by_role("button", name="Run", exact=True).click()
            page.wait_for_selector(".pane .tok", state="attached", timeout=120_000)
            page.screenshot(path=str(out / "main-mid-run.png"))  # the viewport, at once: the run is still going
            _wait_done(page)
            page.screenshot(path=str(out / "main-after-ssr.png"), full_page=True)
            page.get_by_label("Compare").check()
            page.get_by_text("RSD settings").click()
            page.get_by_label("Process reward model").fill(args.prm)
            page.get_by_role("button", name="Run", exact=True).click()
            page.wait_for_selector(".js-plotly-plot", timeout=300_000)
            _wait_done(page)
            page.screenshot(path=str(out / "compare.png"), full_page=True)
            page.locator(".run-pick").get_by_label("RSD", exact=True).check()  # the comparison's RSD panes
            time.sleep(1)
            page.screenshot(path=str(out / "compare-rsd-panes.png"), full_page=True)
            page.locator("#method").get_by_label("RSD", exact=True).check()
            # a held-out prompt on which the draft slips once and the PRM catches it
            page.get_by_label("Prompt").fill(make_example("arithmetic", EVAL_SEED_BASE + 24).prompt)
            page.get_by_role("button", name="Run", exact=True).click()
            page.wait_for_selector(".pane .step", state="attached", timeout=120_000)
            _wait_done(page)
            page.screenshot(path=str(out / "rsd.png"), full_page=True)
            page.get_by_role("tab", name="History").click()
            page.get_by_role("button", name="Refresh").click()
            page.wait_for_selector(".js-plotly-plot", timeout=60_000)
            time.sleep(2)
            page.screenshot(path=str(out / "history.png"), full_page=True)
            page.get_by_role("tab", name="Benchmark").click()
            page.locator("#bench-dataset input, #bench-dataset textarea").first.fill("bundled-classes")
            page.get_by_role("spinbutton", name="Problems", exact=True).fill("3")
            page.locator("#bench-run").click()
            page.get_by_text("done:").wait_for(timeout=300_000)
            time.sleep(1)
            page.screenshot(path=str(out / "benchmark.png"), full_page=True)
            browser.close()
    finally:
        app.terminate()
        app.wait(timeout=20)
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
