"""The per-run cgroup v2 (orchestrator/sandbox/cgroup.py): detection, limits, entering.

This machine's cgroup v2 has no memory/pids/cpu controllers (hybrid host), so the kernel
side is not exercised here; these tests pin the decisions and the files written, on a fake
cgroup tree, and that a run without a cgroup says so in its warnings.
"""
from __future__ import annotations

import subprocess
from pathlib import Path


from orchestrator.sandbox import cgroup, run_python


def test_limit_files_for_a_run():
    # 512 MiB = 512 * 1048576 bytes; 24 processes; one CPU = 100 ms of every 100 ms.
    assert cgroup.limit_files(memory_mb=512, max_processes=24) == {
        "memory.max": "536870912", "memory.swap.max": "0", "memory.oom.group": "1",
        "pids.max": "24", "cpu.max": "100000 100000"}


def _fake_proc(tmp_path: Path, mount: str, own: str = "/") -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text(
        "25 30 0:22 / /sys/fs/cgroup/pids rw,relatime shared:5 - cgroup cgroup rw,pids\n"
        f"26 30 0:23 / {mount} rw,relatime shared:6 - cgroup2 cgroup2 rw\n")
    (proc / "cgroup").write_text(f"8:pids:/\n0::{own}\n")
    return proc


def _fake_cgroup(folder: Path, controllers: str, enabled: str = "") -> Path:
    folder.mkdir(parents=True)
    (folder / "cgroup.controllers").write_text(controllers + "\n")
    (folder / "cgroup.subtree_control").write_text(enabled + "\n")
    return folder


def test_parent_lacking_controllers_is_refused_with_the_controllers_named(tmp_path):
    mount = _fake_cgroup(tmp_path / "unified", "hugetlb")
    parent, why = cgroup.find_parent(env={}, proc=str(_fake_proc(tmp_path, str(mount))))
    assert parent is None and "memory, pids, cpu" in why and "hugetlb" in why


def test_no_cgroup2_mount_is_refused(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "mountinfo").write_text("25 30 0:22 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n")
    (proc / "cgroup").write_text("8:pids:/\n")
    assert cgroup.find_parent(env={}, proc=str(proc)) == (None, "no cgroup v2 file system is mounted")


def test_own_cgroup_with_controllers_is_used_and_enabled_for_children(tmp_path):
    mount = tmp_path / "cg2"
    own = _fake_cgroup(mount / "job.slice" / "worker", "cpuset cpu io memory pids")
    parent, why = cgroup.find_parent(env={}, proc=str(_fake_proc(tmp_path, str(mount), "/job.slice/worker")))
    assert (parent, why) == (own, "")
    assert (own / "cgroup.subtree_control").read_text() == "+memory +pids +cpu"


def test_configured_parent_wins(tmp_path):
    configured = _fake_cgroup(tmp_path / "delegated", "memory pids cpu", "memory pids cpu")
    parent, why = cgroup.find_parent(env={cgroup.ENV_PARENT: str(configured)}, proc=str(tmp_path / "absent"))
    assert (parent, why) == (configured, "")
    parent, why = cgroup.find_parent(env={cgroup.ENV_PARENT: str(tmp_path / "nope")}, proc=str(tmp_path))
    assert parent is None and cgroup.ENV_PARENT in why and "not a cgroup v2 folder" in why


def test_run_cgroup_gets_its_limits_and_the_first_process_enters_it(tmp_path):
    run = cgroup.RunCgroup.create(tmp_path, memory_mb=256, max_processes=16)
    assert run.path.parent == tmp_path and (run.path / "pids.max").read_text() == "16"
    assert (run.path / "memory.max").read_text() == str(256 * 1024 * 1024)
    done = subprocess.run(run.enter_argv() + ["echo", "inside"], capture_output=True, text=True, timeout=10)
    # `echo 0 > cgroup.procs` moves the writer (then exec'd into the sandbox) into the cgroup.
    assert done.stdout == "inside\n" and (run.path / "cgroup.procs").read_text() == "0\n"


def test_a_run_without_a_cgroup_says_so(monkeypatch):
    monkeypatch.setattr(cgroup, "detect", lambda: (None, "no delegated cgroup v2 (test)"))
    result = run_python("print(1)", timeout=10)
    assert result.stdout == "1\n"
    assert any("no delegated cgroup v2 (test)" in w and "RLIMIT_AS" in w for w in result.warnings)


def test_cli_levels_reports_seccomp_and_cgroup_status():
    import json
    import sys

    repo = Path(__file__).resolve().parents[3]
    done = subprocess.run([sys.executable, "-m", "orchestrator.sandbox", "--levels"], cwd=repo,
                          capture_output=True, text=True, timeout=120, check=False)
    status = json.loads(done.stdout)
    assert set(status) == {"levels", "seccomp", "cgroup"}
    parent, why = cgroup.detect()
    assert status["cgroup"] == (str(parent) if parent else f"unavailable: {why}")
