"""A crowd on a shared studio: many ``gradio_client`` visitors at once, on loopback, bounded.

    python -m ssr_ui.tools.crowd --visitors 8 --seconds 300          # launches app.py --public on itself
    python -m ssr_ui.tools.crowd --url http://127.0.0.1:7860/ ...     # a studio already running (public mode)

Each visitor (its own session) loops, seeded, over: a run (Baseline, SSR, RSD or Compare, small
budgets, a prompt carrying the visitor's own tag), a run it stops mid-way, a run whose client is
killed mid-stream (a real disconnect: a separate process, SIGKILLed after its first update), a
benchmark (one visitor: 40 runs that take turns with the others' runs, or one over the studio's bound),
abusive input (a 50 KB prompt, a path and a Hub id as model, draft model and PRM, an out-of-range
budget, every run id another visitor was given, replayed), session keys no client makes (4 MB, empty:
joins and cancels over HTTP), a second session of its own while a job of it is in flight, and its
History. Each visitor is its own client address (``X-Forwarded-For``, as a Space's proxy sends it:
``ssr_ui.jobs.visitor_address``).

Reported: runs completed, refused (with a reason: a bound, a bad input) and failed (anything else);
the wait in line (submit to the first update that is not "in line"/"loading") p50 and p95; the
longest time any visitor saw no update while a job of theirs was going; the studio's peak memory
(VmHWM, when this tool launched it). Checked: no visitor ever received another visitor's tag (run
frames, History, replays), and the run log holds exactly one row per run that was logged, each under
its visitor's key only (runs a visitor finished are there, ``ok``; nothing else is), and SQLite's
integrity check passes. Exit status 1 when a check fails or a run failed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SMALL = dict(max_think=24, max_answer=10, draft_start=6, max_draft=8)
REFUSALS = ("in flight already", "the studio is busy", "not offered on this shared studio", "not in the list of choices",
            "no run with id", "session_hash must be", "over this shared studio's bound", "too long",
            "shorten the prompt", "must be", "out of range", "at least", "at most")
HUGE_KEY = "k" * 4_000_000  # a session key no client makes (a probe sent this; the studio kept it)
TAG = re.compile(r"visitor-\d+-[0-9a-f]{6}")


@dataclass
class Tally:
    completed: int = 0
    stopped: int = 0
    disconnected: int = 0
    refused: dict = field(default_factory=dict)  # reason -> count
    failed: list = field(default_factory=list)
    waits: list = field(default_factory=list)  # seconds in line
    silent: float = 0.0  # the longest time without an update while a job went on
    leaks: list = field(default_factory=list)
    finished_prompts: dict = field(default_factory=dict)  # visitor -> prompts whose run finished ok
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refuse(self, text: str) -> None:
        reason = next((r for r in REFUSALS if r in text), None)
        with self.lock:
            if reason is None:
                self.failed.append(text[:300])
            else:
                self.refused[reason] = self.refused.get(reason, 0) + 1


def _text(value) -> str:
    return json.dumps(value, default=str) if not isinstance(value, str) else value


class Visitor:
    def __init__(self, url: str, index: int, seed: int, tally: Tally, ids: dict, deadline: float,
                 bench: bool) -> None:
        from gradio_client import Client

        self.url, self.index, self.tally, self.ids, self.deadline, self.bench = url, index, tally, ids, deadline, bench
        self.rng = random.Random(seed)
        self.tag = f"visitor-{index}-{self.rng.randrange(16**6):06x}"
        self.headers = address(index)
        self.client = Client(url, verbose=False, headers=self.headers)
        self.n = 0

    def prompt(self) -> str:
        self.n += 1
        kind = self.rng.choice(["Start with {n}, then add 7. What is the result?",
                                "Write a Python class Box{n}. Fields: a, b. Methods: total."])
        return kind.format(n=self.n) + f" ({self.tag} run {self.n})"

    def see(self, value) -> None:
        """Everything a visitor receives is checked for another visitor's tag."""
        for tag in TAG.findall(_text(value)):
            if tag != self.tag:
                with self.tally.lock:
                    self.tally.leaks.append(f"{self.tag} received {tag}")

    def loop(self) -> None:
        actions = ["run"] * 5 + ["stop", "disconnect", "abuse", "keys", "history", "replay-others"]
        if self.bench:
            actions.append("benchmark")
        while time.monotonic() < self.deadline:
            action = self.rng.choice(actions)
            try:
                getattr(self, action.replace("-", "_"))()
            except Exception as err:  # noqa: BLE001 (a refusal or a failure: the tally tells which)
                self.tally.refuse(f"{action}: {type(err).__name__}: {err}")

    def _stream(self, job, stop_after: float | None = None) -> tuple[str, bool]:
        """Follow a submitted run: (its last strip, whether this visitor stopped it). Polled (a
        ``gradio_client`` job's iterator never ends on a job that failed or was cancelled)."""
        start = last = time.monotonic()
        waited, strip, stopped, seen = None, "", False, 0
        while True:
            done = job.done()  # (read before the outputs: none can come after it says done)
            outputs = job.outputs()
            now = time.monotonic()
            for out in outputs[seen:]:
                self.see(out)
                strip = _text(out[3])
                with self.tally.lock:
                    self.tally.silent = max(self.tally.silent, now - last)
                last = now
                if waited is None and "in line for the model" not in strip and "loading" not in strip:
                    waited = now - start
                    with self.tally.lock:
                        self.tally.waits.append(waited)
            seen = len(outputs)
            if done:
                break
            if stop_after is not None and waited is not None and now - start - waited > stop_after and not stopped:
                job.cancel()
                stopped = True
            time.sleep(0.05)
        if not seen:  # refused when it joined (a bound), or it failed: the exception says which
            job.result()
        return strip, stopped

    def run(self, stop_after: float | None = None) -> None:
        method = self.rng.choice(["Baseline", "SSR", "SSR", "RSD", "Compare"])
        prompt = self.prompt()
        job = self.client.submit(prompt, method, **SMALL, api_name="/run")
        try:
            strip, stopped = self._stream(job, stop_after)
        except Exception as err:  # noqa: BLE001
            self.tally.refuse(f"run: {type(err).__name__}: {err}")
            return
        if stopped or "stopped" in strip:
            with self.tally.lock:
                self.tally.stopped += 1
        elif 'class="metrics error' in strip:  # a refusal with its reason, or a failure: the tally tells which
            self.tally.refuse(re.sub(r"<[^>]+>", " ", strip))
        else:
            with self.tally.lock:
                self.tally.completed += 1
                self.tally.finished_prompts.setdefault(self.tag, []).append(prompt)
        self.remember()

    def stop(self) -> None:
        self.run(stop_after=self.rng.uniform(0.0, 0.5))

    def disconnect(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        ready = ctx.Event()
        gone = self.prompt().replace(self.tag, f"visitor-{1000 * (self.index + 1) + self.n}-{self.tag[-6:]}")  # its own
        proc = ctx.Process(target=_disconnecting_visitor, daemon=True,
                           args=(self.url, gone, ready, address(self.index, "203.0.113")))
        proc.start()
        ready.wait(120)
        proc.kill()
        proc.join(10)
        with self.tally.lock:
            self.tally.disconnected += 1

    def abuse(self) -> None:
        cases = [dict(prompt="x " * 25_000), dict(model="/etc"), dict(model="someone/huge-model"),
                 dict(draft_model="/etc/passwd"), dict(prm="/no/such/path"), dict(max_think=-5)]
        case = self.rng.choice(cases)
        args = {"prompt": self.prompt(), "method": "RSD" if "prm" in case or "draft_model" in case else "SSR",
                **SMALL, **case}
        try:
            out = self.client.predict(**args, api_name="/run")
        except Exception as err:  # noqa: BLE001
            self.tally.refuse(f"abuse {list(case)}: {err}")
            return
        self.see(out)
        self.tally.refuse(f"abuse {list(case)}: " + re.sub(r"<[^>]+>", " ", _text(out[3])))

    def keys(self) -> None:
        """Session keys no Gradio client makes (4 MB, empty), to join and to cancel: refused, saying
        why; or a second session of this visitor's own while a job of it is in flight: refused too
        (one client address, one job)."""
        import httpx

        case = self.rng.choice(["oversized", "empty", "second session"])
        if case == "second session":
            job = self.client.submit(self.prompt(), "SSR", max_think=200, max_answer=60, api_name="/run")
            while not (job.outputs() or job.done()):
                time.sleep(0.05)
            if job.done():  # refused when it joined (a bound: tallied), or over already: nothing to try beside it
                try:
                    job.result()
                except Exception as err:  # noqa: BLE001 (a refusal or a failure: the tally tells which)
                    self.tally.refuse(f"keys: {err}")
                return
            try:
                from gradio_client import Client

                Client(self.url, verbose=False, headers=self.headers).predict(
                    f"What is 1 + 1? ({self.tag} second session)", "Baseline", **SMALL, api_name="/run")
                self.tally.refuse(f"keys: a second session of {self.tag} ran beside its first")  # (a failure)
            except Exception as err:  # noqa: BLE001 (the refusal, or a failure: the tally tells which)
                self.tally.refuse(f"keys: {err}")
            finally:
                job.cancel()
                while not job.done():
                    time.sleep(0.05)
            return
        key = HUGE_KEY if case == "oversized" else ""
        api = self.url.rstrip("/") + "/gradio_api/"
        for route in ("queue/join", "cancel"):
            reply = httpx.post(api + route, json={"data": [], "fn_index": 0, "event_id": None, "session_hash": key},
                               headers=self.headers, timeout=120)
            if reply.status_code in (413, 422):
                self.tally.refuse("session_hash must be" if reply.status_code == 413 else reply.text)
            else:
                self.tally.refuse(f"keys: {case} key to {route}: HTTP {reply.status_code} {reply.text[:200]}")

    def history(self) -> None:
        out = self.client.predict("all", "all", False, api_name="/history")
        self.see(out)
        self.remember(out)

    def remember(self, history=None) -> None:
        """This visitor's run ids, from its History, for the others to try."""
        history = history or self.client.predict("all", "all", False, api_name="/history")
        self.see(history)
        table = history[0] if isinstance(history[0], dict) else {}
        with self.tally.lock:
            self.ids[self.tag] = [row[0] for row in table.get("data", []) if row]

    def replay_others(self) -> None:
        with self.tally.lock:
            theirs = [i for tag, ids in self.ids.items() if tag != self.tag for i in ids]
        for rid in self.rng.sample(theirs, min(3, len(theirs))):
            out = self.client.predict(str(rid), "time", api_name="/replay")
            self.see(out)
            text = _text(out[1])
            if "no run with id" not in text:
                with self.tally.lock:
                    self.tally.leaks.append(f"{self.tag} replayed run {rid} of another visitor: {text[:200]}")
            else:
                self.tally.refuse("no run with id")

    def benchmark(self) -> None:
        """A long benchmark (40 runs, taking turns with the others' runs), or one of 600 runs: refused."""
        limit, repeat, methods = (10, 2, ["baseline", "ssr"]) if self.rng.random() < 0.8 else \
            (20, 5, ["baseline", "ssr", "ssr-lookups", "ssr-exit", "rsd", "target"])
        out = self.client.predict("bundled-arithmetic", None, methods, limit, repeat, "", "auto", "", "", "",
                                  **SMALL, api_name="/benchmark")
        self.see(out)
        text = _text(out[0])
        if 'class="metrics error' in text:
            self.tally.refuse(re.sub(r"<[^>]+>", " ", text))
        else:
            with self.tally.lock:
                self.tally.completed += 1


def address(n: int, block: str = "198.51.100") -> dict:
    """The headers of visitor ``n``'s own client address (``block``: RFC 5737's documentation
    addresses), as a proxy on loopback forwards it."""
    assert 0 <= n < 255, "one address per visitor: at most 254 visitors"
    return {"X-Forwarded-For": f"{block}.{n + 1}"}


def _disconnecting_visitor(url: str, prompt: str, ready, headers: dict) -> None:
    from gradio_client import Client

    job = Client(url, verbose=False, headers=headers).submit(prompt, "SSR", max_think=200, max_answer=60,
                                                             api_name="/run")
    while not (job.outputs() or job.done()):
        time.sleep(0.05)
    ready.set()  # the parent kills this process now: the stream is cut mid-way


def integrity(db: Path, tally: Tally) -> list[str]:
    """Problems with the run log after the crowd: each logged run once, under one visitor key per
    visitor, no key shared by two visitors, every finished run there and ``ok``."""
    conn = sqlite3.connect(db)
    try:
        problems = [] if conn.execute("pragma integrity_check").fetchone()[0] == "ok" else ["integrity_check failed"]
        rows = conn.execute("select prompt, status, method, visitor from runs where origin = 'app'").fetchall()
    finally:
        conn.close()
    keys: dict[str, set] = {}
    seen: dict[tuple, int] = {}
    for prompt, status, method, visitor in rows:
        tags = set(TAG.findall(prompt or ""))
        if not tags:  # a benchmark's problems carry no tag: they are the bundled set's
            continue
        if visitor is None:
            problems.append(f"a run without a visitor key: {prompt[:60]!r}")
        for tag in tags:
            keys.setdefault(tag, set()).add(visitor)
        seen[(prompt, method, status)] = seen.get((prompt, method, status), 0) + 1  # (a Compare: one row per method)
    problems += [f"{tag}'s runs are under {len(k)} keys" for tag, k in keys.items() if len(k) != 1]
    owners: dict = {}
    for tag, k in keys.items():
        for key in k:
            owners.setdefault(key, set()).add(tag)
    problems += [f"one key holds the runs of {sorted(t)}" for t in owners.values() if len(t) > 1]
    runs: dict[tuple, int] = {}
    for (prompt, method, _), n in seen.items():
        runs[(prompt, method)] = runs.get((prompt, method), 0) + n
    problems += [f"{n} rows for one {m} run: {p[:60]!r}" for (p, m), n in runs.items() if n > 1]
    logged_ok = {p for (p, _, status) in seen if status == "ok"}
    for tag, prompts in tally.finished_prompts.items():
        problems += [f"a run {tag} finished has no ok row: {p[:60]!r}" for p in prompts if p not in logged_ok]
    return problems


def peak_mb(pid: int | None) -> float | None:
    if pid is None:
        return None
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    m = re.search(r"VmHWM:\s+(\d+) kB", text)
    return int(m.group(1)) / 1024 if m else None


def crowd(url: str, db: Path, visitors: int, seconds: float, seed: int = 0, pid: int | None = None) -> dict:
    tally, ids = Tally(), {}
    deadline = time.monotonic() + seconds
    crowd_ = [Visitor(url, i, seed * 1000 + i, tally, ids, deadline, bench=i == 0) for i in range(visitors)]
    threads = [threading.Thread(target=v.loop, name=v.tag, daemon=True) for v in crowd_]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 600)  # a job that started before the deadline finishes; bounded all the same
    hung = [t.name for t in threads if t.is_alive()]
    waits = sorted(tally.waits)

    def pct(q):
        return round(waits[min(len(waits) - 1, int(q * len(waits)))], 2) if waits else None

    return {"visitors": visitors, "seconds": round(time.monotonic() - started, 1), "completed": tally.completed,
            "stopped": tally.stopped, "disconnected": tally.disconnected, "refused": tally.refused,
            "failed": len(tally.failed) + len(hung), "failures": tally.failed[:10] + [f"{h} never ended" for h in hung],
            "wait_p50_s": pct(0.5), "wait_p95_s": pct(0.95),
            "wait_median_s": round(statistics.median(waits), 2) if waits else None,
            "longest_silence_s": round(tally.silent, 2), "peak_mb": peak_mb(pid), "leaks": tally.leaks[:10],
            "integrity": integrity(db, tally)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--visitors", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--url", default=None, help="a shared studio already running (else app.py --public on is launched)")
    ap.add_argument("--db", default=None, help="its run log (with --url)")
    args = ap.parse_args(argv)
    if args.url:
        if not args.db:
            ap.error("--url needs --db: the integrity check reads the run log")
        report = crowd(args.url, Path(args.db), args.visitors, args.seconds, args.seed)
    else:
        from tests.apps import launched  # (the tests' launcher: a free port, the log beside the run log)

        with tempfile.TemporaryDirectory() as folder, launched(Path(folder), "--public", "on") as (url, db, proc):
            report = crowd(url, db, args.visitors, args.seconds, args.seed, proc.pid)
    print(json.dumps(report, indent=2))
    bad = report["failed"] or report["leaks"] or report["integrity"]
    return 1 if bad else 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
