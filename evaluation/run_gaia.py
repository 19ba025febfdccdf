"""Evaluate an orchestrator on GAIA.  Usage: python evaluation/run_gaia.py --help (docs/evaluation.md)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run as a script from anywhere

from evaluation.qa_cli import main  # noqa: E402 (after sys.path: runs as a script)

if __name__ == "__main__":
    raise SystemExit(main("gaia"))
