"""A sandbox for model-written Python: rlimits, namespaces (bubblewrap or unshare), a seccomp
filter, a host uid of its own per run, a cgroup v2 per run where delegated, a wall-clock
timeout, a private scratch dir, an allow-listed environment, and a kill of everything it started.

    from orchestrator.sandbox import run_python
    result = run_python("print(6 * 7)", timeout=10)   # SandboxResult(stdout="42\\n", ...)

    python -m orchestrator.sandbox FILE.py [--timeout SECONDS]   # prints one JSON object

What each isolation level stops and does not stop: docs/sandbox.md.
"""
from orchestrator.sandbox.isolation import LEVELS, SandboxUnavailable, available_levels
from orchestrator.sandbox.runner import SandboxResult, run_python

__all__ = ["LEVELS", "SandboxResult", "SandboxUnavailable", "available_levels", "run_python"]
