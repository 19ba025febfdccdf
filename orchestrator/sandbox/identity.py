"""A host uid of its own for every concurrent run (when the caller is root).

RLIMIT_NPROC counts the processes of a real uid. With every run as `nobody`, 40 parallel
runs shared one budget of 32 processes: runs failed at start (`setpriv: ... Resource
temporarily unavailable`) and one fork bomb starved all the others. A run that holds a uid
no one else uses has the whole budget to itself, and its keyrings (kernel keyrings are
per uid) are its own.

Uids come from a range that no account uses (default 1,900,000,000 + 0..4095; set
`ORCHESTRATOR_SANDBOX_UIDS=FIRST-LAST` to move it) and are leased with `flock` on one lock
file per uid, so any number of threads and processes on the host share the range safely;
a lease ends when its file descriptor closes (also when the caller dies). A uid is reused
only after its run's pid namespace is empty (`run_python` waits for that).
"""
from __future__ import annotations

import fcntl
import os
import pwd
import random
import tempfile
from dataclasses import dataclass

ENV_RANGE = "ORCHESTRATOR_SANDBOX_UIDS"
DEFAULT_FIRST, DEFAULT_COUNT = 1_900_000_000, 4096


class NoFreeUid(RuntimeError):
    """Every uid of the range is leased (or the range is misconfigured)."""


@dataclass
class UidLease:
    uid: int
    _fd: int

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def uid_range() -> range:
    text = os.environ.get(ENV_RANGE, "").strip()
    if not text:
        return range(DEFAULT_FIRST, DEFAULT_FIRST + DEFAULT_COUNT)
    try:
        first, last = (int(part) for part in text.split("-"))
    except ValueError:
        raise NoFreeUid(f"{ENV_RANGE}={text!r}: expected FIRST-LAST, e.g. 1900000000-1900004095") from None
    if not 1000 <= first <= last < 2**32 - 1:
        raise NoFreeUid(f"{ENV_RANGE}={text!r}: need 1000 <= FIRST <= LAST < 4294967295")
    return range(first, last + 1)


def _lock_dir() -> str:
    base = "/run" if os.access("/run", os.W_OK) else tempfile.gettempdir()
    folder = os.path.join(base, f"orchestrator-sandbox-uids-{os.geteuid()}")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return folder


def lease_uid() -> UidLease:
    """Lease a free uid of the range; NoFreeUid when all are taken."""
    uids = uid_range()
    folder = _lock_dir()
    start = random.randrange(len(uids))
    for i in range(len(uids)):
        uid = uids[(start + i) % len(uids)]
        fd = os.open(os.path.join(folder, str(uid)), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return UidLease(uid, fd)
        os.close(fd)   # an account owns this uid: never run code as it
    raise NoFreeUid(f"all {len(uids)} sandbox uids {uids.start}-{uids.stop - 1} are in use "
                    f"(or belong to accounts); widen {ENV_RANGE}")
