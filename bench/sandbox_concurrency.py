"""Sandbox throughput with many runs at once, with and without a fork bomb among them.

At each concurrency C (1, 8, 32, 64 by default) a thread pool keeps C `run_python` calls in
flight until `--runs` small programs (`print(sum(range(10**5)))`) have finished; runs/s is
finished runs over wall seconds. The "beside a fork bomb" row starts one fork bomb
(`max_processes` 32, timeout 5 s) first and counts only the other runs, which must all
succeed: each run's process budget is its own (a leased uid per run, see docs/sandbox.md).

    python bench/sandbox_concurrency.py [--runs 64] [--levels 1,8,32,64] [--write]

--write puts the table into docs/benchmarks.md ("## Sandbox concurrency") and docs/sandbox.md.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _report import BENCHMARKS, load, machine, write_section

from orchestrator.sandbox import run_python

SECTION = "## Sandbox concurrency"
SANDBOX_DOC = Path(__file__).resolve().parents[1] / "docs" / "sandbox.md"
WORK = "print(sum(range(10**5)))"
EXPECTED = f"{sum(range(10**5))}\n"
BOMB = ("import os, time\n"
        "while True:\n"
        "    try:\n"
        "        os.fork()\n"
        "    except OSError:\n"
        "        time.sleep(5)\n")


def _one(isolation: str) -> bool:
    result = run_python(WORK, isolation=isolation, timeout=60)
    return result.exit_code == 0 and result.stdout == EXPECTED


def measure(concurrency: int, runs: int, isolation: str, bomb: bool) -> tuple[float, int, int, str]:
    """(runs per second, failed runs, total runs, isolation used) at `concurrency` in flight."""
    with ThreadPoolExecutor(max_workers=concurrency + int(bomb)) as pool:
        bomb_future = pool.submit(run_python, BOMB, isolation=isolation, timeout=5, max_processes=32) if bomb else None
        start = time.monotonic()
        ok = list(pool.map(lambda _: _one(isolation), range(runs)))
        elapsed = time.monotonic() - start
        used = bomb_future.result().isolation if bomb_future else run_python("pass", isolation=isolation).isolation
    return runs / elapsed, ok.count(False), runs, used


def table(rows: list[tuple], command: str) -> str:
    lines = [SECTION, "",
             f"Runs of `{WORK}` finished per second with C runs in flight (thread pool, `run_python`), "
             "and the same beside one fork bomb (its `max_processes` = 32, timeout 5 s; only the other runs "
             "are counted, and every one of them must succeed).", "",
             f"Machine: {machine()}, running as {'root' if os.geteuid() == 0 else 'non-root'}; "
             f"load average {load():.1f} at the end (the box is shared).", "",
             f"Command: `{command}`", "",
             "| in flight | isolation | runs | runs/s | failed | runs/s beside a fork bomb | failed beside it |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    for c, level, runs, rate, failed, bomb_rate, bomb_failed in rows:
        lines.append(f"| {c} | {level} | {runs} | {rate:.1f} | {failed} | {bomb_rate:.1f} | {bomb_failed} |")
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=64, help="runs per measurement (at least the concurrency)")
    parser.add_argument("--levels", default="1,8,32,64", help="comma-separated concurrencies")
    parser.add_argument("--isolation", default="auto", help="auto, bwrap, unshare or rlimits")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md and docs/sandbox.md")
    args = parser.parse_args()
    try:
        levels = [int(x) for x in args.levels.split(",")]
    except ValueError:
        parser.error(f"--levels must be comma-separated integers, got {args.levels!r}")
    if args.runs < 1 or any(c < 1 for c in levels):
        parser.error("--runs and every --levels entry must be at least 1")
    rows = []
    for c in levels:
        runs = max(args.runs, c)
        rate, failed, _, used = measure(c, runs, args.isolation, bomb=False)
        bomb_rate, bomb_failed, _, _ = measure(c, runs, args.isolation, bomb=True)
        rows.append((c, used, runs, rate, failed, bomb_rate, bomb_failed))
        print(rows[-1], flush=True)
    command = f"python bench/sandbox_concurrency.py --runs {args.runs} --levels {args.levels}" + \
        (" --write" if args.write else "")
    text = table(rows, command)
    print(text)
    if args.write:
        write_section(text)
        write_section(text.replace(SECTION, "## Concurrency (measured)", 1), path=SANDBOX_DOC)
        print(f"written to {BENCHMARKS} and {SANDBOX_DOC}")


if __name__ == "__main__":
    main()
