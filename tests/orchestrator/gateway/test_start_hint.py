"""The command a "no replicas" error names exists and takes the flags it is given (issue 44: the
local-vllm hint named `python -m orchestrator.vllm_servers.launch ... --endpoints-file`, which no shell runs)."""
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.gateway.preflight import entry_problem
from orchestrator.gateway.registry import load_registry

REPO = Path(__file__).resolve().parents[3]


def hint(name, tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLORCHESTRA_ENDPOINTS", str(tmp_path / "endpoints.json"))
    problem = entry_problem(name, load_registry().models[name])
    return shlex.split(re.search(r"start one \((python -m [^)]*)\)", problem).group(1))


def test_the_local_vllm_hint_runs_the_launcher_with_its_real_flags(tmp_path, monkeypatch):
    import orchestrator.vllm_servers.launch as serving

    argv = hint("smollm2-135m-vllm", tmp_path, monkeypatch)
    assert argv[:3] == ["python", "-m", "orchestrator.vllm_servers.launch"]
    seen = {}

    class Started(Exception):
        pass

    def launch(model, **kw):
        seen.update(model=model, **kw)
        raise Started

    monkeypatch.setattr(serving, "launch_vllm_server", launch)
    with pytest.raises(Started):
        serving.main(argv[3:])
    assert seen["model"] == "embedded:smollm2-135m" and seen["served_name"] == "smollm2-135m"
    assert seen["endpoints_file"] == str(tmp_path / "endpoints.json")


def test_an_expert_with_a_serve_block_is_started_by_the_planner(tmp_path, monkeypatch):
    argv = hint("Qwen3-32B", tmp_path, monkeypatch)
    assert argv[:3] == ["python", "-m", "orchestrator.vllm_servers.experts"]
    proc = subprocess.run([sys.executable, *argv[1:], "--dry-run"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Qwen3-32B" in proc.stdout
