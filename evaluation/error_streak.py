"""Stop a run whose tasks keep failing for the same reason (a rejected parameter, a wrong key).

    streak = ErrorStreak(limit=3)
    run_tasks(tasks, solve, results, stop_when=streak.observe)

`observe(record)` is called with each task's record as it is written; when the last
`limit` records are all errors with the same signature it returns the one line to stop
with.  The signature of a provider rejection is "<model>: request rejected (...): <provider
message>" (orchestrator/gateway/errors.py ProviderRejected); of any other error, its text
with numbers, turn counts and hex ids blanked, so per-task details do not hide a repeat.
"""
from __future__ import annotations

import re
import threading

_REJECTED = re.compile(r"(\S+: request rejected \(.*?\): .*?)(?: \(after \d+ turns\))?$", re.DOTALL)
_VOLATILE = re.compile(r"\(after \d+ turns\)|0x[0-9a-f]+|\d+(?:\.\d+)?")


def error_signature(record: dict) -> str | None:
    """What makes two error records "the same error" (None: the record is not an error)."""
    if record.get("status") != "error":
        return None
    text = str(record.get("error") or "")
    match = _REJECTED.search(text)
    if match:
        return match.group(1).strip()
    return _VOLATILE.sub("#", text).strip()


def _shown(record: dict, signature: str) -> str:
    """The error as the last task met it (its own numbers and addresses, which the signature
    blanks), for the stop line; a provider rejection as its signature."""
    if _REJECTED.search(str(record.get("error") or "")):
        return signature
    text = re.sub(r" \(after \d+ turns\)$", "", str(record.get("error") or "").strip())
    return text if len(text) <= 600 else text[:600] + " ..."


class ErrorStreak:
    """Counts consecutive error records with one signature; `limit` 0 never stops."""

    def __init__(self, limit: int = 3):
        if limit < 0:
            raise ValueError(f"--stop-after-errors must be >= 0, got {limit}")
        self.limit = limit
        self.signature: str | None = None
        self.count = 0
        self._lock = threading.Lock()

    def observe(self, record: dict) -> str | None:
        """Record one finished task; the line to stop the run with, or None to go on."""
        sig = error_signature(record)
        with self._lock:
            if sig is None or sig != self.signature:
                self.signature, self.count = sig, 0
            if sig is None:
                return None
            self.count += 1
            if self.limit and self.count >= self.limit:
                return (f"stopped: the last {self.count} tasks failed with the same error: {_shown(record, sig)} "
                        f"(fix it, then continue with --resume --retry-errors; --stop-after-errors 0 never stops)")
            return None
