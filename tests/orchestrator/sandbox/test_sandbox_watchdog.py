"""The watchdog (orchestrator/sandbox/watchdog.py): run-wide limits where no cgroup holds them.

This machine has no delegated cgroup (hybrid host), so the memory budget and the scratch cap
are the watchdog's at every level here. Sizes stay small: the box is shared.
"""
from __future__ import annotations

import os
import re
import uuid

import pytest

from orchestrator.sandbox import LEVELS, cgroup, run_python
from orchestrator.sandbox.isolation import Limits, Plan
from orchestrator.sandbox.runner import _budget
from orchestrator.sandbox.watchdog import Budget, descendants, disk_usage, human

# Four children that each touch `mb` MiB (b"x" * n writes every page), say so, and sleep.
_CHILDREN = """
import os, sys, time
for i in range({n}):
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c",
                 "import time; block = b'x' * ({mb} * 1024 * 1024); print('child', flush=True); time.sleep(60)",
                 {marker!r}])
time.sleep({wait})
print('parent done', flush=True)
"""


@pytest.fixture(autouse=True)
def _no_cgroup(monkeypatch):
    """Every run here as on a machine without a delegated cgroup, whatever this one has."""
    monkeypatch.setattr(cgroup, "detect", lambda: (None, "no delegated cgroup v2 (test)"))


@pytest.mark.parametrize("level", LEVELS)
def test_children_over_the_memory_budget_kill_the_whole_run(run, level, alive_with):
    # 4 x 300 MiB = 1200 MiB of RSS against a 512 MiB budget; each child alone is under RLIMIT_AS.
    marker = f"sbx-{uuid.uuid4().hex}"
    result = run(_CHILDREN.format(n=4, mb=300, marker=marker, wait=60), timeout=30, memory_mb=512)
    assert result.killed is not None, (result.stdout, result.stderr)
    assert re.fullmatch(r"killed: memory budget 512 MiB exceeded \(total RSS \d+ MiB over \d+ processes\)",
                        result.killed), result.killed
    assert (result.exit_code, result.timed_out) == (137, False)
    assert result.stderr.endswith(f"[sandbox] {result.killed}\n")
    assert "parent done" not in result.stdout and result.duration_s < 30
    assert alive_with(marker) == []


@pytest.mark.parametrize("level", LEVELS)
def test_children_within_the_memory_budget_run_to_the_end(run, level):
    marker = f"sbx-{uuid.uuid4().hex}"
    result = run(_CHILDREN.format(n=2, mb=64, marker=marker, wait=1.5), timeout=30, memory_mb=512)
    assert (result.killed, result.exit_code) == (None, 0), result.stderr
    assert result.stdout.count("child") == 2 and result.stdout.endswith("parent done\n")


_WRITER = """
import time
for i in range(200):
    with open(f'part{i}.bin', 'wb') as f:
        f.write(b'x' * 1024 * 1024)
    print(i + 1, flush=True)
    time.sleep(0.01)
"""


@pytest.mark.parametrize("level", LEVELS)
def test_writing_beyond_the_scratch_cap_is_stopped(run, level):
    # 1 MiB files, each under max_file_mb: only the total crosses the 16 MiB cap.
    result = run(_WRITER, timeout=30, max_file_mb=2, max_scratch_mb=16)
    assert result.killed is not None and result.killed.startswith("killed: scratch dir cap 16 MiB exceeded ("), \
        (result.killed, result.stderr)
    written = int(result.stdout.split()[-1])
    assert 16 <= written < 200 and not result.timed_out


def test_files_larger_than_the_scratch_cap_are_refused():
    with pytest.raises(ValueError, match="max_scratch_mb=1"):
        run_python("print(1)", timeout=10, max_scratch_mb=1, files={"big.bin": b"x" * (2 * 1024 * 1024)})


_FORK_LOOP = """
import os, sys, time
for i in range(300):
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(60)", {marker!r}])
    print(i + 1, flush=True)
    time.sleep(0.005)
"""


@pytest.mark.parametrize("level", ("unshare", "rlimits"))
def test_a_loop_of_children_running_as_root_is_capped_by_the_watchdog(run, level, monkeypatch, alive_with):
    # Host root is exempt from RLIMIT_NPROC: the run's process count is the watchdog's alone.
    if os.geteuid() != 0:
        pytest.skip("plays code that runs as host root (no uid of its own); needs root")
    monkeypatch.setattr("orchestrator.sandbox.isolation._nobody_can_run", lambda python: False)
    marker = f"sbx-{uuid.uuid4().hex}"
    result = run(_FORK_LOOP.format(marker=marker), timeout=30, max_processes=16, memory_mb=4096)
    assert result.runs_as == "root"
    assert result.killed is not None and result.killed.startswith("killed: process limit 16 exceeded ("), \
        (result.killed, result.stdout[-200:], result.stderr)
    assert int(result.stdout.split()[-1]) < 300 and not result.timed_out
    assert any(w.startswith("processes:") and "watchdog" in w for w in result.warnings), result.warnings
    assert alive_with(marker) == []


@pytest.mark.parametrize("level", LEVELS)
def test_warnings_name_what_is_not_contained(run, level):
    result = run("print(1)", memory_mb=300, max_scratch_mb=40)
    assert result.stdout == "1\n" and result.killed is None
    text = "\n".join(result.warnings)
    assert "no delegated cgroup v2 (test)" in text
    memory = next(w for w in result.warnings if w.startswith("memory:"))
    assert "memory_mb=300 MiB" in memory and "socket and pipe buffers" in memory and "CPU share" in memory
    assert ("tmpfs" in memory) == (level == "bwrap")
    assert any(w.startswith("scratch dir:") and "max_scratch_mb=40 MiB" in w for w in result.warnings)
    assert any(w.startswith("disk outside the scratch dir") for w in result.warnings) == (level != "bwrap")


def test_with_a_cgroup_the_watchdog_keeps_only_the_scratch_cap():
    limits = Limits(cpu_seconds=5, memory_mb=512, max_processes=16, max_file_mb=8)
    plan = Plan(argv=[], level="bwrap", runs_as="uid 1", popen_user=None, chown_to=None, workdir="/scratch",
                cgroup=cgroup.RunCgroup(path=None))
    budget, warnings = _budget(plan, limits, max_scratch_mb=64)
    assert budget == Budget(memory_mb=None, max_processes=None, scratch_mb=64)
    assert [w.split(":")[0] for w in warnings] == ["scratch dir"]
    plan.cgroup = None
    budget, warnings = _budget(plan, limits, max_scratch_mb=64)
    assert budget == Budget(memory_mb=512, max_processes=16, scratch_mb=64)   # no uid of its own either
    assert [w.split(":")[0] for w in warnings] == ["scratch dir", "memory", "processes"]


def test_disk_usage_counts_blocks_once_per_file(tmp_path):
    (tmp_path / "a").write_bytes(b"x" * 300_000)
    os.link(tmp_path / "a", tmp_path / "hardlink")
    (tmp_path / "deep" / "er").mkdir(parents=True)
    (tmp_path / "deep" / "er" / "b").write_bytes(b"y" * 100_000)
    with open(tmp_path / "sparse", "wb") as f:
        f.truncate(1 << 30)                        # 1 GiB long, no block written
    used, files = disk_usage(tmp_path)
    assert files == 3                               # a (once), b, sparse
    assert 400_000 <= used < 500_000                # blocks of a and b, rounded up to the block size


def test_descendants_lists_the_tree_with_threads():
    import subprocess
    import sys
    code = ("import subprocess, sys, threading, time\n"
            "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
            "print(p.pid, flush=True)\ntime.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    try:
        assert descendants(child.pid) == {child.pid: 2, grandchild: 1}
    finally:
        os.kill(grandchild, 9)
        child.kill()
        child.wait()


def test_sizes_in_kill_reasons():
    assert (human(300 * 1024 * 1024), human(int(1.6 * 1024**3))) == ("300 MiB", "1.6 GiB")
