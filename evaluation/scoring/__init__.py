"""Benchmark scoring: is a prediction right?  judge.py: the QA judges (rules, the LLM judges of
the paper's HLE/FRAMES scripts, HLE's official judge); gaia.py: GAIA's leaderboard scorer (the
judge `gaia`).  tau2's tasks are scored by tau2's own evaluator (orchestrator/episodes/tau2.py)."""
