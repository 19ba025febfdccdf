"""CLI: run one Python file in the sandbox and print one JSON object.

    python -m orchestrator.sandbox FILE.py [--timeout SECONDS] [--memory-mb MIB] [--max-scratch-mb MIB]
                                           [--max-open-files N] [--isolation LEVEL]
    python -m orchestrator.sandbox --levels      # the isolation levels, seccomp and cgroup status here

Exit status 0 when the file ran (whatever its own exit code, which is in the JSON);
2 for bad arguments; 3 when the requested isolation level is unavailable.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from orchestrator.sandbox import cgroup
from orchestrator.sandbox.isolation import LEVELS, SandboxUnavailable, available_levels
from orchestrator.sandbox.seccomp_filter import SeccompUnavailable, filter_bpf
from orchestrator.sandbox.runner import run_python


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def protections(python: str) -> dict:
    """What this machine gives the sandbox: working levels, seccomp, the per-run cgroup."""
    try:
        seccomp = f"{len(filter_bpf())}-byte filter (bwrap level)"
    except SeccompUnavailable as exc:
        seccomp = f"unavailable: {exc}"
    parent, why = cgroup.detect()
    return {"levels": available_levels(python), "seccomp": seccomp,
            "cgroup": str(parent) if parent else f"unavailable: {why}"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchestrator.sandbox",
                                description="Run a Python file in the sandbox; print one JSON result.")
    p.add_argument("file", nargs="?", type=Path, help="the Python file to run")
    p.add_argument("--timeout", type=_seconds, default=60.0, help="wall-clock seconds (default 60)")
    p.add_argument("--memory-mb", type=_positive_int, default=2048,
                   help="address-space cap per process and the whole run's memory, MiB")
    p.add_argument("--cpu-seconds", type=_positive_int, default=None, help="CPU seconds per process")
    p.add_argument("--max-processes", type=_positive_int, default=32, help="processes + threads")
    p.add_argument("--max-file-mb", type=_positive_int, default=64, help="largest file written, MiB")
    p.add_argument("--max-scratch-mb", type=_positive_int, default=256, help="the scratch dir's total size, MiB")
    p.add_argument("--max-open-files", type=_positive_int, default=128, help="file descriptors per process")
    p.add_argument("--isolation", choices=("auto", *LEVELS), default="auto")
    p.add_argument("--levels", action="store_true", help="print the working isolation levels, seccomp and cgroup status, and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.levels:
        print(json.dumps(protections(sys.executable)))
        return 0
    if args.file is None:
        parser.error("FILE is required (the Python file to run)")
    if not args.file.is_file():
        parser.error(f"FILE {str(args.file)!r} does not exist or is not a regular file")
    try:
        code = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        parser.error(f"FILE {str(args.file)!r} cannot be read as UTF-8 text: {exc}")
    try:
        result = run_python(code, timeout=args.timeout, memory_mb=args.memory_mb, cpu_seconds=args.cpu_seconds,
                            max_processes=args.max_processes, max_file_mb=args.max_file_mb,
                            max_scratch_mb=args.max_scratch_mb,
                            max_open_files=args.max_open_files, isolation=args.isolation)
    except SandboxUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except ValueError as exc:   # e.g. code larger than --max-scratch-mb
        parser.error(str(exc))
    print(json.dumps(result.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
