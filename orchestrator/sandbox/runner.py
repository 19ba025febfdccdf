"""Run one piece of model-written Python in the sandbox and collect what it printed.

`run_python` writes the code (and any extra files) into a fresh scratch directory, starts
it under the strongest isolation level that works here (see isolation.py), enforces the
wall-clock timeout, holds the run-wide limits the kernel does not hold here with a watchdog
thread (watchdog.py: total memory, process count, scratch dir size), caps captured output,
kills everything the code started, and deletes the scratch directory (cleanup.py; a folder
that cannot be deleted is a warning in the result, never an exception). A killed run says
why in `killed` (also the last line of its stderr). The price of a run is
`Catalog.code_cost(result.duration_s)`.
"""
from __future__ import annotations

import contextlib
import math
import os
import select
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Union

import psutil

from orchestrator.sandbox.cleanup import remove_tree
from orchestrator.sandbox.isolation import (
    Limits,
    Plan,
    choose_level,
    interpreter,
    plan_for,
    popen_user_kwargs,
)
from orchestrator.sandbox.watchdog import INTERVAL_S, Budget, Watchdog, scratch_usage

MAIN_FILE = "main.py"
FileContent = Union[str, bytes, os.PathLike]   # `files` values: text, raw bytes, or a host file to copy in
_KILL_WAIT_S = 5.0     # how long to wait for a killed pid namespace to empty
_DRAIN_GRACE_S = 0.5   # how long to keep reading pipes after the sandbox is gone


@dataclass
class SandboxResult:
    """What a run produced. `duration_s` is wall seconds from start to exit (the billed time)."""

    stdout: str
    stderr: str
    exit_code: int          # the program's status; 128+N when killed by signal N
    timed_out: bool         # killed at the wall-clock timeout
    duration_s: float
    isolation: str          # "bwrap", "unshare" or "rlimits"
    runs_as: str            # host user the code ran as
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    warnings: list[str] = field(default_factory=list)
    killed: str | None = None   # why the sandbox killed the run, e.g. "killed: memory budget 512 MiB exceeded (...)"

    def to_dict(self) -> dict:
        return asdict(self)


class _CappedBuffer:
    """Keeps the first and last `cap // 2` bytes of a stream; counts what it drops.

    The head holds the program's first output, the tail the traceback that usually ends it.
    """

    def __init__(self, cap: int):
        self.half = max(cap // 2, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.half - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > self.half:
            extra = len(self.tail) - self.half
            del self.tail[:extra]
            self.dropped += extra

    def text(self) -> str:
        marker = f"\n...[{self.dropped} bytes truncated]...\n".encode() if self.dropped else b""
        return (bytes(self.head) + marker + bytes(self.tail)).decode("utf-8", errors="replace")


def _check_args(code: str, timeout: float, ints: dict[str, int], files: dict[str, FileContent] | None) -> None:
    if not isinstance(code, str):
        raise TypeError(f"code must be a str, got {type(code).__name__}")
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    for name, value in ints.items():
        if not (isinstance(value, int) and value > 0):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    for name, content in (files or {}).items():
        rel = PurePosixPath(name)
        if rel.is_absolute() or ".." in rel.parts or name in ("", ".") or str(rel) == MAIN_FILE:
            raise ValueError(f"files: {name!r} must be a relative path inside the scratch dir "
                             f"(no '..', not {MAIN_FILE!r}, which holds the code)")
        if isinstance(content, os.PathLike):
            if not Path(content).is_file():
                raise ValueError(f"files[{name!r}]: {os.fspath(content)!r} is not a file (a path is copied in)")
        elif not isinstance(content, (str, bytes)):
            raise TypeError(f"files[{name!r}] must be a str (text), bytes or a path to copy, "
                            f"got {type(content).__name__}")


def _write_scratch(scratch: Path, code: str, files: dict[str, FileContent] | None,
                   owner: tuple[int, int] | None) -> None:
    for name, content in {**(files or {}), MAIN_FILE: code}.items():
        path = scratch / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, os.PathLike):
            shutil.copyfile(content, path)      # a copy: the code may change it, never the original
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    if owner:  # the sandbox runs as nobody: it must own its scratch dir to write there
        for path in [scratch, *scratch.rglob("*")]:
            os.chown(path, *owner)


def _check_reachable(folder: Path, user: str) -> None:
    """The code runs as another host user: every folder above its scratch dir must let it pass."""
    for path in [folder, *folder.parents]:
        if not os.stat(path).st_mode & stat.S_IXOTH:
            raise ValueError(f"scratch_root {str(folder)!r}: user {user} cannot enter {str(path)!r} "
                             "(mode lacks o+x); pick a scratch_root under a world-searchable folder")


def _environment(plan: Plan, scratch: Path, python: str) -> dict[str, str]:
    """An allow-list: nothing from the caller's environment except locale-neutral basics."""
    home = plan.workdir or str(scratch)
    return {
        "PATH": f"{os.path.dirname(python)}:/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": "/tmp" if plan.workdir else home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",        # output written before a kill is still captured
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONIOENCODING": "utf-8",
        "OMP_NUM_THREADS": "1",         # BLAS thread pools count against max_processes
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _pump(streams: dict, sel: selectors.BaseSelector, until: float, proc: subprocess.Popen | None) -> None:
    """Read pipes into their buffers until both close, `until` passes, or `proc` exits."""
    while sel.get_map():
        remaining = until - time.monotonic()
        if remaining <= 0:
            return
        for key, _ in sel.select(timeout=min(remaining, 0.05)):
            chunk = os.read(key.fd, 65536)
            if chunk:
                streams[key.fd].add(chunk)
            else:
                sel.unregister(key.fd)
        if proc is not None and proc.poll() is not None:
            return


def _kill_sandbox(proc: subprocess.Popen, namespaced: bool) -> None:
    """Kill everything the run started; return once it is gone.

    The process group holds the outer bwrap/unshare (or, at the rlimits level, the code and
    its children). With a pid namespace, SIGKILL to the namespace's pid 1 makes the kernel
    kill every process in it, setsid() escapees included; its pidfd turns readable only
    after they are all gone. Without one, a process that called setsid() survives.
    """
    if proc.poll() is None:
        pidfds = []
        if namespaced:
            try:
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            except OSError:
                children = []
            for pid in map(int, children):
                try:
                    pidfds.append(os.pidfd_open(pid))
                except OSError:
                    continue
        # The outer first, so it dies without reporting (unshare prints on a child's death).
        _signal_group(proc.pid)
        for fd in pidfds:
            try:
                signal.pidfd_send_signal(fd, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
        for fd in pidfds:
            select.select([fd], [], [], _KILL_WAIT_S)
            os.close(fd)
    elif not namespaced:
        _signal_group(proc.pid)  # children left behind by a program that exited


def _signal_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _budget(plan: Plan, limits: Limits, max_scratch_mb: int) -> tuple[Budget, list[str]]:
    """What the watchdog must hold for this plan, and the warnings that say what that leaves open."""
    every = f"sampled every {INTERVAL_S:g} s"
    warnings = [(f"scratch dir: its total is held to max_scratch_mb={max_scratch_mb} MiB by the watchdog "
                 f"({every} or less often in a huge tree), not by a size-capped file system: a writer overshoots "
                 "by what it writes between two samples; folders the code makes unreadable to the caller are "
                 "not counted")]
    if plan.level != "bwrap":
        warnings.append(f"disk outside the scratch dir is not capped at the {plan.level} level: host /tmp, "
                        "/dev/shm and any folder writable by the run's user count toward no limit")
    memory = processes = None
    if plan.cgroup is None:
        memory = limits.memory_mb
        tmpfs = (f"bwrap's /tmp and /dev/shm tmpfs (max_file_mb={limits.max_file_mb} MiB each), "
                 if plan.level == "bwrap" else "")
        warnings.append(f"memory: the run's total is held to memory_mb={limits.memory_mb} MiB of RSS by "
                        f"the watchdog ({every}, it kills the run), not by the kernel: memory in no process's RSS "
                        f"({tmpfs}socket and pipe buffers, kernel memory) is not counted and a burst between two "
                        "samples overshoots; the run's CPU share is not limited (every core, until the timeout)")
        if plan.lease is None:
            processes = limits.max_processes
            warnings.append(f"processes: with no uid of the run's own and no cgroup, its processes+threads are held to "
                            f"max_processes={limits.max_processes} by the watchdog ({every}, it kills the run), "
                            "not by the kernel: a fork burst between two samples overshoots")
    return Budget(memory_mb=memory, max_processes=processes, scratch_mb=max_scratch_mb), warnings


def _killer(proc: subprocess.Popen, namespaced: bool):
    """The watchdog's kill: the run as the timeout kills it, then every process it saw (setsid escapees)."""
    def kill(processes) -> None:
        _kill_sandbox(proc, namespaced)
        for process in processes:
            with contextlib.suppress(psutil.Error):   # gone already
                process.kill()      # psutil checks the pid still names the process it saw
    return kill


def _execute(plan: Plan, scratch: Path, env: dict[str, str], timeout: float, max_output_bytes: int,
             budget: Budget, cpu_seconds: int) -> SandboxResult:
    user = popen_user_kwargs(plan)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(plan.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=scratch, env=env, start_new_session=True,
                                pass_fds=plan.pass_fds, **user)
    finally:
        plan.close_fds()
    namespaced = plan.level != "rlimits"
    uid = plan.lease.uid if plan.lease is not None and not namespaced else None
    watchdog = Watchdog(proc.pid, budget, _killer(proc, namespaced), scratch=scratch, uid=uid).start()
    out, err = _CappedBuffer(max_output_bytes), _CappedBuffer(max_output_bytes)
    streams = {proc.stdout.fileno(): out, proc.stderr.fileno(): err}
    with selectors.DefaultSelector() as sel:
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        try:
            _pump(streams, sel, start + timeout, proc)
            if not sel.get_map():  # both pipes closed: just wait for the exit
                try:
                    proc.wait(timeout=max(start + timeout - time.monotonic(), 0))
                except subprocess.TimeoutExpired:
                    pass
            timed_out = proc.poll() is None
            duration = time.monotonic() - start
        finally:
            killed = watchdog.stop()
            _kill_sandbox(proc, namespaced=namespaced)
            _pump(streams, sel, time.monotonic() + _DRAIN_GRACE_S, None)
            proc.stdout.close()
            proc.stderr.close()
    code = proc.returncode
    exit_code = 128 - code if code < 0 else code
    if killed:
        timed_out = False   # the watchdog ended it; proc.poll() may have raced its kill
    elif timed_out:
        killed = f"killed: wall-clock timeout {timeout:g} s"
    elif exit_code == 128 + signal.SIGXCPU:
        killed = f"killed: CPU limit {cpu_seconds} s per process (SIGXCPU)"
    stderr = err.text()
    if killed:
        stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + f"[sandbox] {killed}\n"
    return SandboxResult(
        stdout=out.text(), stderr=stderr, exit_code=exit_code,
        timed_out=timed_out, duration_s=round(duration, 4), isolation=plan.level, runs_as=plan.runs_as,
        stdout_truncated=out.dropped > 0, stderr_truncated=err.dropped > 0, warnings=list(plan.warnings),
        killed=killed)


def run_python(code: str, *, timeout: float = 60.0, memory_mb: int = 2048, cpu_seconds: int | None = None,
               max_processes: int = 32, max_file_mb: int = 64, max_scratch_mb: int = 256, max_open_files: int = 128,
               files: dict[str, FileContent] | None = None, max_output_bytes: int = 1_000_000, isolation: str = "auto",
               python: str | None = None, scratch_root: str | None = None) -> SandboxResult:
    """Run `code` as main.py in a fresh private scratch dir under the sandbox.

    timeout: wall seconds before everything is killed. memory_mb: address-space cap per process
    (MiB) and the whole run's memory (a cgroup's memory.max, else the watchdog's budget on the
    RSS of all its processes). cpu_seconds: CPU seconds per process (default: the timeout
    rounded up, plus one). max_processes: processes+threads of the run. max_file_mb: largest
    file (MiB). max_scratch_mb: the scratch dir's total (MiB, the watchdog's; `files` included).
    max_open_files: descriptors per process.
    files: extra files {relative path: content} placed next to main.py; content is text (str),
    bytes, or a host path (os.PathLike) whose file is copied in (e.g. a GAIA attachment).
    max_output_bytes: bytes kept per stream (head and tail halves); the rest is dropped.
    isolation: "auto" (strongest that works), "bwrap", "unshare" or "rlimits".
    python: interpreter to run (default: this one). scratch_root: parent of the scratch dir.
    Raises ValueError/TypeError on bad arguments, SandboxUnavailable if the level can't run.
    """
    cpu = cpu_seconds if cpu_seconds is not None else math.ceil(timeout) + 1
    _check_args(code, timeout, {"memory_mb": memory_mb, "cpu_seconds": cpu, "max_processes": max_processes,
                                "max_file_mb": max_file_mb, "max_scratch_mb": max_scratch_mb,
                                "max_open_files": max_open_files, "max_output_bytes": max_output_bytes}, files)
    interp = interpreter(python or sys.executable)
    level = choose_level(isolation, interp.path)
    limits = Limits(cpu_seconds=cpu, memory_mb=memory_mb, max_processes=max_processes, max_file_mb=max_file_mb,
                    max_open_files=max_open_files)
    scratch = Path(tempfile.mkdtemp(prefix="sandbox-", dir=scratch_root))
    plan = None
    problems: list[str] = []
    try:
        plan = plan_for(level, interp, str(scratch), limits)
        plan.argv += ["-s", MAIN_FILE]
        if plan.popen_user:
            _check_reachable(scratch.parent, plan.runs_as)
        _write_scratch(scratch, code, files, plan.chown_to)
        given = scratch_usage(scratch)
        if given > max_scratch_mb:
            raise ValueError(f"files: {given} MiB with the code, more than max_scratch_mb={max_scratch_mb}; "
                             "raise max_scratch_mb or pass smaller files")
        budget, uncontained = _budget(plan, limits, max_scratch_mb)
        plan.warnings += uncontained
        result = _execute(plan, scratch, _environment(plan, scratch, interp.path), float(timeout), max_output_bytes,
                          budget, cpu)
    finally:
        # Never raises: what cannot be cleaned up becomes a warning of the result.
        why = remove_tree(scratch)
        if why:
            problems.append(why)
        if plan is not None:
            problems += plan.release()
    result.warnings += problems
    return result
