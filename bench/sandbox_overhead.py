"""Sandbox start-up overhead per execution: `print(1)` under each isolation level that works
here, against plain `python -c "print(1)"`. Median (and p90) wall seconds over N repeats.

    python bench/sandbox_overhead.py [--repeats 30] [--write]

--write puts the table into the "Sandbox" section of docs/benchmarks.md (other sections kept).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _report import BENCHMARKS, write_section

from orchestrator.sandbox import available_levels, run_python

SECTION = "## Sandbox"
MACHINE = "2-core CPU, 24 GiB; shared with other workers during measurement"


def _plain(python: str) -> float:
    start = time.monotonic()
    subprocess.run([python, "-c", "print(1)"], check=True, capture_output=True)
    return time.monotonic() - start


def _sandboxed(level: str, python: str) -> tuple[float, str]:
    """(wall seconds of the whole run_python call, host user the code ran as)."""
    start = time.monotonic()
    result = run_python("print(1)", isolation=level, python=python, timeout=30)
    elapsed = time.monotonic() - start
    if result.stdout != "1\n":
        raise RuntimeError(f"{level}: unexpected output {result.stdout!r} / {result.stderr!r}")
    return elapsed, "a uid of its own" if result.runs_as.startswith("uid ") else result.runs_as


def measure(repeats: int, python: str) -> list[tuple[str, str, float, float]]:
    """[(label, ran as, median seconds, p90 seconds)], plain python first. Levels are interleaved
    per repeat so a burst of load from other workers hits every level alike."""
    levels = available_levels(python)
    labels = ["plain python -c"] + [f"run_python, {level}" for level in levels]
    times: dict[str, list[float]] = {label: [] for label in labels}
    ran_as = {"plain python -c": "caller"}
    for _ in tqdm(range(repeats), desc="sandbox overhead", unit="round"):
        times["plain python -c"].append(_plain(python))
        for level in levels:
            seconds, ran_as[f"run_python, {level}"] = _sandboxed(level, python)
            times[f"run_python, {level}"].append(seconds)
    rows = []
    for label in labels:
        samples = sorted(times[label])
        rows.append((label, ran_as[label], statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]))
    return rows


def table(rows: list[tuple[str, str, float, float]], repeats: int, command: str) -> str:
    base = rows[0][2]
    intro = ("Start-up overhead of one sandboxed execution of `print(1)` (wall seconds, whole "
             "`run_python` call: scratch dir, isolation, interpreter start, clean-up). "
             f"Median and p90 of {repeats} interleaved repeats.")
    machine = (f"Machine: {MACHINE}. Python {platform.python_version()}, kernel {platform.release()}, "
               f"running as {'root' if os.geteuid() == 0 else 'non-root'}.")
    lines = [SECTION, "", intro, "", machine,
             "", f"Command: `{command}`", "",
             "| execution | code ran as | median s | p90 s | overhead vs plain (median) |",
             "|---|---|---:|---:|---:|"]
    for label, user, median, p90 in rows:
        lines.append(f"| {label} | {user} | {median:.3f} | {p90:.3f} | {median - base:+.3f} |")
    note = ("The code price is billed on `SandboxResult.duration_s`, which includes this overhead. "
            "\"root\" at the unshare/rlimits levels: started as root with an interpreter user nobody "
            "cannot reach (the venv's Python lives under /root here); see docs/sandbox.md. The bwrap level "
            "includes the seccomp filter and a leased uid per run.")
    lines += ["", note, ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=30, help="rounds (each runs every level once)")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    rows = measure(args.repeats, sys.executable)
    command = f"python bench/sandbox_overhead.py --repeats {args.repeats}" + (" --write" if args.write else "")
    text = table(rows, args.repeats, command)
    print(text)
    if args.write:
        write_section(text)
        print(f"written to {BENCHMARKS}")


if __name__ == "__main__":
    main()
