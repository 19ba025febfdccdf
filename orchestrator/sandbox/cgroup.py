"""A cgroup v2 per run: memory, process and CPU limits for the whole run, kernel-enforced.

rlimits are per process (RLIMIT_AS) or per uid (RLIMIT_NPROC); a cgroup bounds the sum of
everything the run holds, including memory no rlimit sees (socket buffers, tmpfs pages,
page cache it dirties). Each run gets `<parent>/sandbox-<random>` with

    memory.max       = memory_mb MiB     (the whole run; OOM kills the run, memory.oom.group=1)
    memory.swap.max  = 0
    pids.max         = max_processes     (processes + threads of the run)
    cpu.max          = "100000 100000"   (one CPU's worth of time)

The parent is `ORCHESTRATOR_SANDBOX_CGROUP` (a cgroup v2 folder delegated to the caller)
or, by default, the caller's own cgroup v2 when it is writable and has the memory, pids
and cpu controllers available. How to delegate one on a cluster node: docs/sandbox.md.
Where none can be used, `detect()` says why and the run's `warnings` carry it.
"""
from __future__ import annotations

import functools
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ENV_PARENT = "ORCHESTRATOR_SANDBOX_CGROUP"
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


def limit_files(memory_mb: int, max_processes: int) -> dict[str, str]:
    """What one run's cgroup is given: {interface file: value}."""
    return {
        "memory.max": str(memory_mb * 1024 * 1024),
        "memory.swap.max": "0",
        "memory.oom.group": "1",
        "pids.max": str(max_processes),
        "cpu.max": f"{CPU_PERIOD_US} {CPU_PERIOD_US}",
    }


def _cgroup2_mount(mountinfo: str) -> str | None:
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        if right.split(" ")[:1] == ["cgroup2"]:
            return left.split(" ")[4]
    return None


def _own_path(proc_cgroup: str) -> str | None:
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:]
    return None


def find_parent(env: dict[str, str] | None = None, proc: str = "/proc/self") -> tuple[Path | None, str]:
    """(cgroup folder to create run cgroups in, '') or (None, why none can be used)."""
    env = os.environ if env is None else env
    configured = env.get(ENV_PARENT, "").strip()
    if configured:
        parent = Path(configured)
        where = f"{ENV_PARENT}={configured}"
    else:
        try:
            mount = _cgroup2_mount(Path(proc, "mountinfo").read_text())
            own = _own_path(Path(proc, "cgroup").read_text())
        except OSError as exc:
            return None, f"cannot read {proc}/mountinfo or cgroup: {exc}"
        if mount is None or own is None:
            return None, "no cgroup v2 file system is mounted"
        parent = Path(mount) / own.lstrip("/")
        where = f"the caller's cgroup v2 {parent}"
    try:
        available = set(Path(parent, "cgroup.controllers").read_text().split())
        enabled = set(Path(parent, "cgroup.subtree_control").read_text().split())
    except OSError as exc:
        return None, f"{where} is not a cgroup v2 folder: {exc}"
    missing = [c for c in CONTROLLERS if c not in available]
    if missing:
        return None, (f"{where} lacks the {', '.join(missing)} controller(s) (available: "
                      f"{' '.join(sorted(available)) or 'none'}; on a hybrid/v1 host they are bound to cgroup v1)")
    if not os.access(parent, os.W_OK):
        return None, f"{where} is not writable by uid {os.geteuid()} (not delegated)"
    if not set(CONTROLLERS) <= enabled:
        try:
            Path(parent, "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in CONTROLLERS))
        except OSError as exc:
            return None, (f"{where}: cannot enable {' '.join(CONTROLLERS)} for child cgroups ({exc}); "
                          "a cgroup that holds processes cannot, use a delegated empty parent")
    return parent, ""


@functools.lru_cache(maxsize=1)
def detect() -> tuple[Path | None, str]:
    """find_parent() for this process, once."""
    return find_parent()


@dataclass
class RunCgroup:
    path: Path

    @classmethod
    def create(cls, parent: Path, memory_mb: int, max_processes: int) -> "RunCgroup":
        path = parent / f"sandbox-{uuid.uuid4().hex[:16]}"
        path.mkdir()
        run = cls(path)
        try:
            for name, value in limit_files(memory_mb, max_processes).items():
                (path / name).write_text(value)
        except OSError:
            run.remove()
            raise
        return run

    def enter_argv(self) -> list[str]:
        """Prefix for the sandbox's command line: the first process moves itself in, then execs."""
        return ["/bin/sh", "-c", 'echo 0 > "$0/cgroup.procs" && exec "$@"', str(self.path)]

    def remove(self) -> str | None:
        """Kill whatever is left in the cgroup and delete it; None when done, else why not."""
        kill = self.path / "cgroup.kill"
        if kill.exists():
            try:
                kill.write_text("1")
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        while True:
            try:
                self.path.rmdir()
                return None
            except FileNotFoundError:
                return None
            except OSError as exc:
                if time.monotonic() > deadline:
                    return f"cgroup {self.path} not removed: {exc}"
                time.sleep(0.02)
