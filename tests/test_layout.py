"""The package layout's promises: old module paths fail (or forward) naming the new spelling."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name, module", [("ppo_update", "training.ppo"), ("load_tasks", "training.tasks"),
                                          ("collect_rollouts", "training.rollouts"),
                                          ("score_groups", "training.scoring")])
def test_old_trainer_imports_name_the_new_module(name, module):
    with pytest.raises(ImportError, match=f"from {module} import {name}"):
        exec(f"from training.trainer import {name}", {})


def test_old_babysitter_command_still_runs_and_names_the_new_one():
    proc = subprocess.run([sys.executable, "-m", "training.resume", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--config" in proc.stdout and "python -m training.babysitter" in proc.stdout


def test_tests_mirror_the_package_layout():
    """A test of `orchestrator/gateway/` lives in tests/orchestrator/gateway/; only repo-level
    tests (layout, imports, docker, LLM_CALL.py, bench/) sit in tests/ itself."""
    misplaced = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                 if p.parent != ROOT / "tests" and not (ROOT / p.parent.relative_to(ROOT / "tests")).is_dir()]
    assert not misplaced, f"test folders with no package folder of the same path: {misplaced}"
    assert not list((ROOT / "tests").rglob("__init__.py")), \
        "tests/ folders carry no __init__.py (they would shadow the packages they are named after)"


@pytest.mark.parametrize("module", ["batcher", "common", "grammar", "hf", "hf_static", "sampling",
                                    "split_kv_attention", "vllm_engine"])
def test_old_engine_modules_are_the_moved_ones(module):
    """training.engines.<m> (before the move to orchestrator/engines) is that very module, so
    imports, monkeypatches and isinstance checks written against the old name keep working."""
    import importlib

    import training.engines
    from orchestrator import engines
    assert importlib.import_module(f"training.engines.{module}") is importlib.import_module(f"orchestrator.engines.{module}")
    assert training.engines.make_engine is engines.make_engine and training.engines.ENGINES is engines.ENGINES
