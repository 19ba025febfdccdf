"""The package layout's promises: tests mirror the packages; a moved module's old name lives one
release, forwarding to where it went (orchestrator/moved.py), then goes."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_imports import old_names

ROOT = Path(__file__).resolve().parents[1]


def test_no_compatibility_aliases_are_left():
    """Names whose release of grace is over are gone: one name for each thing."""
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


def test_old_names_forward_for_one_release():
    """Each old name, imported, warns where its module went and is that module; run with
    `python -m`, it says so on stderr and runs the new module."""
    moved = old_names()
    assert moved, "no old names: delete orchestrator/moved.py and this test"
    code = ("import importlib, json, sys, warnings\n"
            "out = {}\n"
            "for old, new in json.loads(sys.argv[1]).items():\n"
            "    with warnings.catch_warnings(record=True) as seen:\n"
            "        warnings.simplefilter('always')\n"
            "        try:\n"
            "            module = importlib.import_module(old)\n"
            "        except ModuleNotFoundError as e:      # an optional extra (tau2) not installed\n"
            "            out[old] = e.name\n"
            "            continue\n"
            "    out[old] = [module is importlib.import_module(new),\n"
            "                [str(w.message) for w in seen if w.category is FutureWarning]]\n"
            "print(json.dumps(out))\n")
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(moved)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    for old, seen in json.loads(proc.stdout.splitlines()[-1]).items():
        if isinstance(seen, str):              # the new module needs a package this venv lacks
            assert seen.split(".")[0] not in ("orchestrator", "evaluation", "training", "retrieval",
                                              "data_synthesis"), (old, seen)
            continue
        same, warned = seen
        assert same and len(warned) == 1 and f"{old} moved to {moved[old]}" in warned[0], (old, same, warned)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.serving", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "orchestrator.serving moved to orchestrator.vllm_servers.launch" in proc.stderr
    assert "--served-name" in proc.stdout
