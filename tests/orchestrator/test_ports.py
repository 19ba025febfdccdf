"""Ports on the command line (orchestrator/ports.py): every server CLI that takes one refuses a port
that is not one, or is taken, with one line before anything loads (`--port 99999` used to hang the
retrieval server after it had loaded its index)."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.ports import PortError, check_port

REPO = Path(__file__).resolve().parents[2]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *argv], cwd=REPO, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, flag, low", [
    (["retrieval.server", "--index", "{tmp}", "--port", "99999"], "--port", 0),
    (["retrieval.shards", "route", "--shard", "http://127.0.0.1:9", "--port", "99999"], "--port", 1),
    (["orchestrator.vllm_servers.launch", "--port", "99999"], "--port", 0),
    (["evaluation.mock_backend", "--port", "99999", "--answers", "{tmp}/a.json"], "--port", 1),
    (["orchestrator.vllm_servers.experts", "--profile", "open", "--dry-run", "--base-port", "99999"], "--base-port", 1),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_a_port_past_65535_is_one_line_not_a_hang(tmp_path, argv, flag, low):
    proc = _cli(*[a.format(tmp=tmp_path) for a in argv])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {flag} 99999: not a TCP port; give {low}-65535"), proc.stderr
    assert proc.stderr.count("\n") == 1 and not proc.stdout, (proc.stdout, proc.stderr)


def test_a_taken_port_is_refused_before_the_index_loads(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _cli("retrieval.server", "--index", str(tmp_path), "--port", str(port))
    assert proc.returncode == 2 and proc.stderr == (
        f"error: --port {port}: 127.0.0.1:{port} is already in use; stop what listens there or give another "
        f"--port (0: a free one)\n")


def test_check_port():
    check_port(0)                                   # a free one, chosen by the server
    check_port(8000, last=8007)
    with pytest.raises(PortError, match=r"^--port 0: not a TCP port; give 1-65535$"):
        check_port(0, zero_ok=False)
    with pytest.raises(PortError, match=r"^--base-port 65535: not a TCP port \(its servers would use 65535-65536\)"):
        check_port(65535, "--base-port", last=65536)
    with pytest.raises(PortError, match=r"^--port -1: "):
        check_port(-1)
    with pytest.raises(PortError, match=r"^--host no-such-host\.invalid: cannot be resolved"):
        check_port(8000, host="no-such-host.invalid")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    check_port(port, host="127.0.0.1")               # free again: nothing listens
