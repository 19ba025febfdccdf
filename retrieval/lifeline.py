"""A child process that dies with its parent: `die_with_parent(parent_pid)` at the child's start.

`python -m retrieval.server --frontends N` starts a batch worker (on a GPU: the whole index in
GPU memory) and N front ends (the listening port). If the supervisor is SIGKILLed (an OOM
killer, `kill -9`, a Slurm step torn down hard) it cannot stop them, and without this they
would run on as orphans, holding the port and the GPU memory.

Two mechanisms, both armed:
- Linux: `prctl(PR_SET_PDEATHSIG, SIGKILL)` (through ctypes): the kernel kills the child the
  moment the parent *thread* that started it exits (the supervisor starts its children from its
  main thread, which lives as long as the process);
- anywhere: a daemon thread that checks `os.getppid()` every `poll_s` and kills this process
  once the parent pid changed (the child was re-parented to init or a subreaper).
Both check the parent pid once at arming time, so a parent that died before the child got here
is caught too.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import threading

log = logging.getLogger("retrieval.lifeline")
PR_SET_PDEATHSIG = 1        # <linux/prctl.h>


def die_with_parent(parent_pid: int, poll_s: float = 1.0, use_prctl: bool = True) -> bool:
    """Arm both mechanisms for this process; True when the kernel's (prctl) is armed too."""
    armed = use_prctl and _set_pdeathsig(signal.SIGKILL)
    threading.Thread(target=_watch, args=(parent_pid, poll_s), name="lifeline", daemon=True).start()
    if os.getppid() != parent_pid:        # it died before we armed anything
        _die(parent_pid)
    return armed


def _set_pdeathsig(sig: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):     # no libc / no prctl: the watcher thread still runs
        return False


def _watch(parent_pid: int, poll_s: float) -> None:
    stop = threading.Event()
    while not stop.wait(poll_s):
        if os.getppid() != parent_pid:
            _die(parent_pid)


def _die(parent_pid: int) -> None:
    log.error("the supervisor (pid %d) is gone; pid %d exits with it", parent_pid, os.getpid())
    os.kill(os.getpid(), signal.SIGKILL)
