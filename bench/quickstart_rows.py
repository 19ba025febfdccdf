"""One markdown row per quickstart run folder: the four checks with their 95% intervals, the
machine and the load (the table "Quickstart: the four checks per seed and kernel path" of
docs/benchmarks.md).

    python bench/quickstart_rows.py RUN_DIR [RUN_DIR ...]      # e.g. /tmp/qs/seed-*-*

Reads each folder's summary.json only (`python -m training.quickstart --recompute RUN_DIR` first
re-derives its intervals from the saved trajectories); ends with the count of checks holding.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

COLUMNS = ("run", "seed", "CPU, kernels", "accuracy (cost)", "accuracy gain", "cost after/before",
           "share rise, favour", "the same, paraphrase", "rise, accuracy / cost (paraphrase)", "reading warm -> final",
           "checks", "CPU-s", "wall (load)")


def _ci(c: dict, signed: bool = True) -> str:
    f = "{:+.2f}" if signed else "{:.2f}"
    return f"{f.format(c['estimate'])} [{f.format(c['low'])}, {f.format(c['high'])}]"


def kernels(machine: dict) -> str:
    forced = machine.get("kernel_env", {}).get("ATEN_CPU_CAPABILITY")
    return f"{machine.get('cpu_model', '?')}, {f'{forced.upper()} forced' if forced else machine.get('cpu_capability', '?')}"


def row(run: Path) -> tuple[str, int, int]:
    """The row of `run` and (checks holding, checks)."""
    s = json.loads((run / "summary.json").read_text())
    ci, m = s["intervals"], s["machine"]
    reading = s.get("reading", {})
    read = " -> ".join(f"{reading[k]['favour']:.2f}/{reading[k]['cost']:.2f}" for k in ("warm", "final") if k in reading)
    tries = s.get("warmup_tries", [])
    kept = next((k for k, t in enumerate(tries, start=1) if t.get("kept")), len(tries))   # before "kept": the last
    read += f" (warm-up try {kept})" if read and kept > 1 else ""
    held = sum(s["checks"].values())
    cells = (run.name, str(s["seed"]), kernels(m),
             f"{s['initial']['cost']['accuracy']:.2f} -> {s['final']['cost']['accuracy']:.2f}",
             _ci(ci["accuracy_gain"]), _ci(ci["cost_ratio"], signed=False), _ci(ci["share_rise_favour"]),
             _ci(ci["share_rise_favour_paraphrase"]),
             " / ".join(f"{ci[f'share_rise_{p}']['estimate']:+.2f} ({ci[f'share_rise_{p}_paraphrase']['estimate']:+.2f})"
                        for p in ("accuracy", "cost")),
             read or "-", f"**{held} of {len(s['checks'])}**" if held == len(s["checks"]) else f"{held} of {len(s['checks'])}",
             f"{m['cpu_seconds']:.0f}", f"{s['wall_seconds'] / 60:.1f} min ({m['load_average_1min']})")
    return "| " + " | ".join(cells) + " |", held, len(s["checks"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="quickstart run folders (each with summary.json)")
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.runs if not (r / "summary.json").is_file()]
    if missing:
        print(f"error: no summary.json in {', '.join(missing)} (a run still going, or not a run folder)", file=sys.stderr)
        return 2
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    held = total = 0
    for run in args.runs:
        line, h, t = row(run)
        print(line)
        held, total = held + h, total + t
    print(f"\n{held} of {total} checks hold over {len(args.runs)} runs.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
