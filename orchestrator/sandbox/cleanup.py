"""Deleting a run's scratch directory, whatever the code left in it.

The code controls the tree: thousands of nested folders (`shutil.rmtree` recurses in
Python and raises RecursionError near 1,000 levels), read-only files, folders with their
permission bits removed, files owned by the sandbox's uid. coreutils `rm -rf` walks with
fts (no recursion limit) and, run as root, ignores permission bits; run as a normal user
it cannot enter a folder the code made 0000, so `chmod -R u+rwX` (also fts) comes first
on a second try. `--one-file-system` keeps `rm` out of anything mounted inside.

`remove_tree` never raises: it returns None when the folder is gone, else why not, and
the runner puts that in the result's `warnings`.
"""
from __future__ import annotations

import os
import shutil
import subprocess

_TIMEOUT_S = 120.0


def _run(argv: list[str]) -> str:
    """'' on success, else the tool's complaint (its last stderr line)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{argv[0]}: {exc}"
    lines = done.stderr.strip().splitlines()
    return "" if done.returncode == 0 else (lines[-1] if lines else f"{argv[0]} exited {done.returncode}")


def remove_tree(path: str | os.PathLike) -> str | None:
    """Delete `path` and everything under it; None when it is gone, else the reason."""
    path = os.fspath(path)
    rm, chmod = shutil.which("rm") or "/bin/rm", shutil.which("chmod") or "/bin/chmod"
    why = _run([rm, "-rf", "--one-file-system", "--", path])
    if not os.path.lexists(path):
        return None
    # A normal user cannot enter folders the code made unreadable: restore the bits, retry.
    why = _run([chmod, "-R", "u+rwX", "--", path]) or _run([rm, "-rf", "--one-file-system", "--", path]) or why
    if not os.path.lexists(path):
        return None
    return f"scratch dir {path} could not be removed: {why or 'still present after rm -rf'}"
