"""Run one checkpoint under a list of preference vectors: one run folder per vector, one table.

    python -m evaluation.preference_sweep --benchmark frames --preferences accuracy,cost,latency \\
        --output runs/frames-prefs -- --limit 20 --model Orchestrator-8B --endpoint http://host:8000/v1
    python -m evaluation.preference_sweep --benchmark tau2 --preferences accuracy 'accuracy=1,cost=0.5' \\
        --output runs/tau2-prefs -- --domains airline --catalog configs/catalogs/unseen_example.json

Everything after `--` goes to the benchmark's script (run_hle.py / run_frames.py / run_tau2.py)
unchanged, once per vector, with `--preference VECTOR --output OUTPUT/<vector> --no-report`
added: the same runner, records and run_config.json as a single run.  `--resume` continues
each vector's folder that exists (and starts the others).  At the end the report runs over
all the folders (per-vector table and preference-following score, PAPER.md §9) and the
per-vector rows are written to OUTPUT/preferences.json.

Preset names may be comma-separated (accuracy,cost,latency); a vector is its own argument
(`accuracy=1,cost=0.5` or JSON), since it has commas of its own.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evaluation import qa_cli, tau2_cli
from evaluation.preference import run_folder_name
from evaluation.qa_cli import DEFAULT_DATA
from evaluation.report import report

BENCHMARKS = (*DEFAULT_DATA, "tau2")                   # qa_cli's (hle, frames, ...) and run_tau2.py's
FORBIDDEN = ("--preference", "--output", "--resume")   # the sweep sets these per vector
STOP = (2, 130)                                         # bad flags or Ctrl-C: the next vector would fail alike


def split_preferences(items: list[str]) -> list[str]:
    """`accuracy,cost` -> two names; an item with '=' or '{' is one vector."""
    out = []
    for item in items:
        out += [item] if "=" in item or item.lstrip().startswith("{") else [p.strip() for p in item.split(",") if p.strip()]
    return out


def _main_for(benchmark: str):
    if benchmark == "tau2":
        return tau2_cli.main
    return lambda argv: qa_cli.main(benchmark, argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m evaluation.preference_sweep", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--benchmark", required=True, choices=BENCHMARKS)
    parser.add_argument("--preferences", nargs="+", required=True, metavar="PREFERENCE",
                        help="preset names (comma-separated) and/or weight vectors (one argument each)")
    parser.add_argument("--output", type=Path, required=True, help="sweep folder: one run folder per vector inside")
    parser.add_argument("--resume", action="store_true", help="continue each vector's run folder that exists")
    parser.add_argument("script_args", nargs=argparse.REMAINDER,
                        help="-- then the arguments of the benchmark's script (run_<benchmark>.py --help)")
    return parser


def sweep(benchmark: str, preferences: list[str], output: Path, script_args: list[str],
          resume: bool = False) -> tuple[int, list[dict]]:
    """Run each vector (see the module docstring); return (exit code, the report's per-vector rows)."""
    run = _main_for(benchmark)
    folders: dict[str, Path] = {}
    for pref in preferences:
        folder = output / run_folder_name(pref)
        if folder in folders.values():
            raise ValueError(f"--preferences: {pref!r} gives the run folder {folder.name} that another vector "
                             f"already uses; list each vector once")
        folders[pref] = folder
    code = 0
    for pref, folder in folders.items():
        again = resume and (folder / "run_config.json").exists()
        print(f"== {benchmark} under preference {pref} -> {folder}{' (resumed)' if again else ''}", flush=True)
        rc = run([*script_args, "--preference", pref, "--output", str(folder), "--no-report",
                  *(["--resume"] if again else [])])
        code = max(code, rc)
        if rc in STOP:
            return rc, []
    done = [f for f in folders.values() if (f / "results.jsonl").exists()]
    rows = report(done, plot=output / "cost_accuracy.png") if done else []
    table = [json.loads((f / "summary.json").read_text()).get("preference") for f in done]
    (output / "preferences.json").write_text(json.dumps([r for r in table if r], indent=2) + "\n")
    print(f"per-vector table: {output / 'preferences.json'}")
    return code, rows


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    script_args = args.script_args[1:] if args.script_args[:1] == ["--"] else args.script_args
    # argparse takes an unambiguous prefix (--out) for the flag: refuse those too
    bad = [a for a in script_args if a.startswith("--") and len(a.split("=", 1)[0]) > 3
           and any(f.startswith(a.split("=", 1)[0]) for f in FORBIDDEN)]
    if bad:
        print(f"error: {bad[0]} after --: the sweep sets --preference, --output and --resume for each vector; "
              f"give --preferences, --output and --resume before --", file=sys.stderr)
        return 2
    preferences = split_preferences(args.preferences)
    try:
        code, _ = sweep(args.benchmark, preferences, args.output, script_args, resume=args.resume)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    raise SystemExit(main())
