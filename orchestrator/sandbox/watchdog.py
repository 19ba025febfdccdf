"""The run-wide limits no kernel mechanism holds here, kept by a watchdog thread.

Without a cgroup (cgroup.py) the kernel caps memory per process (RLIMIT_AS) and processes
per uid (RLIMIT_NPROC), not per run: four children of 1.5 GiB each fit under a 2 GiB
RLIMIT_AS, and code that runs as host root is exempt from RLIMIT_NPROC. Nothing caps the
scratch dir's total size (RLIMIT_FSIZE is per file). A `Watchdog` samples the run every
`INTERVAL_S` and kills the whole run (the `kill` it is given), recording why, when

- memory: the resident memory (RSS, psutil) of all the run's processes together exceeds
  `Budget.memory_mb`;
- processes: the run's processes + threads exceed `Budget.max_processes`;
- disk: the blocks allocated under the scratch dir exceed `Budget.scratch_mb`.

A limit set to None is not watched (the kernel holds it: a cgroup, a uid of the run's own).
The run's processes are the started process and its descendants, read from
/proc/PID/task/TID/children (the cost follows the run's size, not the host's), plus, where
the run has a uid of its own but no pid namespace, every process of that uid (a setsid()
double fork is no one's descendant), scanned every `UID_SCAN_S`.

What sampling does not give (the run's `warnings` repeat it): memory or files created and
grown between two samples overshoot until the next one; RSS counts a page shared by forked
children once per process (an overcount: the run is killed early, never late); memory in
no process's RSS (tmpfs files, socket and pipe buffers, kernel memory) is not counted.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

INTERVAL_S = 0.05      # between two samples of the run's processes
UID_SCAN_S = 0.5       # between two scans of the host's processes for the run's uid
DISK_MIN_S = 0.1       # between two walks of the scratch dir (longer when a walk is slow)
MIB = 1024 * 1024


@dataclass(frozen=True)
class Budget:
    """What the watchdog holds; None: not watched (the kernel holds it, or no limit)."""

    memory_mb: int | None = None       # total RSS of the run's processes, MiB
    max_processes: int | None = None   # processes + threads of the run
    scratch_mb: int | None = None      # blocks allocated under the scratch dir, MiB

    def watched(self) -> bool:
        return any(v is not None for v in (self.memory_mb, self.max_processes, self.scratch_mb))


def human(nbytes: int) -> str:
    """1.6 GiB, 300 MiB: the sizes in a kill reason."""
    if nbytes >= 1024 * MIB:
        return f"{nbytes / (1024 * MIB):.1f} GiB"
    return f"{nbytes / MIB:.0f} MiB"


def descendants(root: int) -> dict[int, int]:
    """{pid: its number of threads} for `root` and every process below it (gone ones skipped)."""
    found: dict[int, int] = {}
    stack = [root]
    while stack:
        pid = stack.pop()
        if pid in found:
            continue
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        found[pid] = len(tasks)
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    stack.extend(int(child) for child in f.read().split())
            except OSError:
                continue
    return found


def disk_usage(folder: str | os.PathLike) -> tuple[int, int]:
    """(bytes allocated on disk, files) under `folder`: st_blocks, so sparse files count what
    they hold; a hard-linked file counts once; folders it cannot enter are skipped."""
    total, files, seen = 0, 0, set()
    stack = [os.fspath(folder)]
    while stack:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_blocks * 512
                        files += 1
        except OSError:
            continue
    return total, files


class Watchdog:
    """Samples one run until `stop()`; on a breach calls `kill(processes)` once and keeps why.

    kill: receives the psutil.Process objects of the run as last seen; it must end the whole
    run (the runner kills the process group or pid namespace, then these).
    """

    def __init__(self, root_pid: int, budget: Budget, kill: Callable[[list[psutil.Process]], None], *,
                 scratch: str | os.PathLike | None = None, uid: int | None = None,
                 interval: float = INTERVAL_S):
        self.root_pid, self.budget, self.kill = root_pid, budget, kill
        self.scratch = scratch if budget.scratch_mb is not None else None
        self.uid, self.interval = uid, interval
        self.reason: str | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._uid_pids: set[int] = set()
        self._next_uid_scan = 0.0
        self._next_disk = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"sandbox-watchdog-{root_pid}", daemon=True)

    def start(self) -> Watchdog:
        if self.budget.watched():
            self._thread.start()
        return self

    def stop(self) -> str | None:
        """End the sampling (after a kill in progress finishes); returns why the run was killed."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.reason

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                reason = self.check()
            except Exception as exc:  # noqa: BLE001  fail closed: a watchdog that cannot look kills the run
                reason = f"killed: the sandbox watchdog failed ({type(exc).__name__}: {exc})"
            if reason:
                self.reason = reason
                self.kill(list(self._procs.values()))
                return
            self._stop.wait(self.interval)

    def _process(self, pid: int) -> psutil.Process | None:
        proc = self._procs.get(pid)
        if proc is None:
            try:
                proc = self._procs[pid] = psutil.Process(pid)
            except psutil.Error:
                return None
        return proc

    def _run_pids(self) -> dict[int, int]:
        pids = descendants(self.root_pid)
        if self.uid is not None:
            now = time.monotonic()
            if now >= self._next_uid_scan:
                self._uid_pids = {p.pid for p in psutil.process_iter(["uids"])
                                  if p.info["uids"] is not None and p.info["uids"].real == self.uid}
                self._next_uid_scan = now + UID_SCAN_S
            for pid in self._uid_pids - pids.keys():
                try:
                    pids[pid] = len(os.listdir(f"/proc/{pid}/task"))
                except OSError:
                    continue
        return pids

    def check(self) -> str | None:
        """One sample: None while within the budget, else the kill reason."""
        b = self.budget
        pids = self._run_pids()
        for gone in self._procs.keys() - pids.keys():
            del self._procs[gone]
        if b.max_processes is not None and sum(pids.values()) > b.max_processes:
            for pid in pids:
                self._process(pid)
            return (f"killed: process limit {b.max_processes} exceeded "
                    f"({sum(pids.values())} processes and threads in {len(pids)} processes)")
        if b.memory_mb is not None:
            rss = 0
            for pid in pids:
                proc = self._process(pid)
                try:
                    rss += proc.memory_info().rss if proc is not None else 0
                except psutil.Error:
                    continue
            if rss > b.memory_mb * MIB:
                return (f"killed: memory budget {b.memory_mb} MiB exceeded "
                        f"(total RSS {human(rss)} over {len(pids)} processes)")
        if self.scratch is not None and time.monotonic() >= self._next_disk:
            started = time.monotonic()
            used, files = disk_usage(self.scratch)
            took = time.monotonic() - started
            self._next_disk = time.monotonic() + max(DISK_MIN_S, 4 * took)   # a huge tree: walk less often
            if used > b.scratch_mb * MIB:
                for pid in pids:
                    self._process(pid)
                return (f"killed: scratch dir cap {b.scratch_mb} MiB exceeded "
                        f"({human(used)} in {files} files)")
        return None


def scratch_usage(path: str | os.PathLike) -> int:
    """MiB the scratch dir holds now (rounded up): what `files` put there before the run."""
    used, _ = disk_usage(Path(path))
    return -(-used // MIB)
