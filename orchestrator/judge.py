"""Moved to evaluation/scoring/judge.py (issue 46); this name goes in the next release."""
from orchestrator.moved import forward

forward(__name__, "evaluation.scoring.judge")
