"""The package layout's promises: tests mirror the packages; no module lives under two names."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_compatibility_aliases_are_left():
    """Moved modules are gone, not forwarded: one name for each thing."""
    for gone in ("training/engines", "training/trainer.py", "training/resume.py", "orchestrator/quickstart.py"):
        assert not (ROOT / gone).exists(), f"{gone}: an old name kept as an alias"
    proc = subprocess.run([sys.executable, "-m", "training.babysitter", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--config" in proc.stdout, proc.stderr


def test_tests_mirror_the_package_layout():
    """A test of `orchestrator/gateway/` lives in tests/orchestrator/gateway/; only repo-level
    tests (layout, imports, docker, LLM_CALL.py, bench/) sit in tests/ itself."""
    misplaced = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                 if p.parent != ROOT / "tests" and not (ROOT / p.parent.relative_to(ROOT / "tests")).is_dir()]
    assert not misplaced, f"test folders with no package folder of the same path: {misplaced}"
    assert not list((ROOT / "tests").rglob("__init__.py")), \
        "tests/ folders carry no __init__.py (they would shadow the packages they are named after)"
