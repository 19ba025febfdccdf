"""slurm/retrieval.sbatch registers the retriever in $TOOLORCHESTRA_ENDPOINTS, the file LLM_CALL
and the retrieval client read (run as a plain script; PYTHON is a stub that records its call)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "slurm" / "retrieval.sbatch"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def _run(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    calls = tmp_path / "calls.txt"
    stub = tmp_path / "python"
    stub.write_text(f'#!/usr/bin/env bash\nprintf "%s\\n" "$@" > {calls}\necho ---- >> {calls}\n')
    stub.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k not in ("TOOLORCHESTRA_ENDPOINTS", "ENDPOINTS_FILE", "VENV")}
    proc = subprocess.run(["bash", str(SCRIPT)], env={**base, "REPO": str(REPO), "PYTHON": str(stub),
                                                      "DEVICE": "cpu", **env},
                          capture_output=True, text=True, timeout=60)
    return proc, calls.read_text().splitlines() if calls.exists() else []


def test_server_registers_in_the_endpoints_file_llm_call_reads(tmp_path):
    endpoints = tmp_path / "shared" / "endpoints.json"
    proc, argv = _run(tmp_path, INDEX_DIR="/idx", TOOLORCHESTRA_ENDPOINTS=str(endpoints), PORT="8123",
                      EXTRA_ARGS="--min-length 100 --max-batch 64", FRONTENDS="4")
    assert proc.returncode == 0, proc.stderr
    assert argv[:2] == ["-m", "retrieval.server"]
    flags = dict(zip(argv[2::2], argv[3::2]))
    assert flags["--endpoints-file"] == str(endpoints)
    assert flags["--index"] == "/idx" and flags["--port"] == "8123" and flags["--device"] == "cpu"
    assert flags["--advertise-host"] == socket.gethostname()
    assert flags["--min-length"] == "100" and flags["--max-batch"] == "64" and flags["--frontends"] == "4"


@pytest.mark.parametrize("device, frontends", [("cuda", "8"), ("cpu", None)])
def test_front_ends_default_to_eight_on_a_gpu_node_and_one_process_on_cpu(tmp_path, device, frontends):
    """The GPU default follows the H200 measurement (8 front ends: 1.6x one process at 256 clients);
    on CPU the server's own default (one process) stands; FRONTENDS always wins."""
    endpoints = tmp_path / "endpoints.json"
    proc, argv = _run(tmp_path, INDEX_DIR="/idx", TOOLORCHESTRA_ENDPOINTS=str(endpoints), DEVICE=device)
    assert proc.returncode == 0, proc.stderr
    assert dict(zip(argv[2::2], argv[3::2])).get("--frontends") == frontends
    proc, argv = _run(tmp_path, INDEX_DIR="/idx", TOOLORCHESTRA_ENDPOINTS=str(endpoints), DEVICE=device, FRONTENDS="2")
    assert dict(zip(argv[2::2], argv[3::2])).get("--frontends") == "2"


def test_missing_endpoints_file_is_named_and_the_old_variable_is_explained(tmp_path):
    proc, argv = _run(tmp_path, INDEX_DIR="/idx")
    assert proc.returncode != 0 and not argv
    assert "TOOLORCHESTRA_ENDPOINTS" in proc.stderr
    proc, argv = _run(tmp_path, INDEX_DIR="/idx", ENDPOINTS_FILE="/x/endpoints.json")
    assert proc.returncode == 2 and not argv
    assert "set TOOLORCHESTRA_ENDPOINTS=/x/endpoints.json" in proc.stderr
