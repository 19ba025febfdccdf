"""Evaluate an orchestrator on tau2-bench, or re-score tau2 results files.

Usage: python evaluation/run_tau2.py --help   (docs/evaluation.md)
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from anywhere

from evaluation.tau2_cli import main  # noqa: E402 (after sys.path: runs as a script)

if __name__ == "__main__":
    raise SystemExit(main())
