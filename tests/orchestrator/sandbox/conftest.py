"""Fixtures shared by the sandbox tests: a run at one isolation level, leftover processes."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from orchestrator.sandbox import run_python
from orchestrator.sandbox.isolation import _nobody_can_run, probe

SYSTEM_PYTHON = "/usr/bin/python3"


def _python_for(level: str) -> str:
    """The interpreter that gives `level` its full guarantees (non-root) where one exists."""
    if os.geteuid() != 0 or level == "bwrap" or _nobody_can_run(sys.executable):
        return sys.executable
    if os.path.exists(SYSTEM_PYTHON) and _nobody_can_run(SYSTEM_PYTHON):
        return SYSTEM_PYTHON
    return sys.executable


@pytest.fixture
def run(level):
    """run(code, **kw) at the level under test; skips when that level cannot run here."""
    python = _python_for(level)
    why = probe(level, python)
    if why is not None:
        pytest.skip(f"isolation {level} unavailable here: {why}")

    def _run(code: str, **kw):
        kw.setdefault("timeout", 10)
        result = run_python(code, isolation=level, python=python, **kw)
        assert result.isolation == level
        return result
    return _run


@pytest.fixture
def alive_with():
    """alive_with(marker): host processes whose command line contains `marker` (sandboxed pids show in host /proc)."""
    def _alive_with(marker: str) -> list[str]:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if marker.encode() in cmdline:
                    found.append(f"{entry.name}: {cmdline!r}")
        return found
    return _alive_with
