"""Where torch.compile keeps what it compiled, so a later job (or a restart) starts warm.

Inductor and Triton cache compiled graphs and kernels on disk, by default under /tmp on each
machine: a cluster job lands on a fresh node, or restarts after preemption, and compiles
everything again.  On one H200 (docs/benchmarks.md, "a whole GRPO step against TRL") the first
GRPO step of the Qwen3-0.6B shape took 63.1 s with empty caches and 12.0 s in a process that
found the caches a previous one had left.  `run.compile_cache: FOLDER` points both caches at
FOLDER/inductor and FOLDER/triton (put it on shared storage); the trainer's process sets them
before anything compiles and Ray actors get the same variables.  Unset: torch's defaults (or
whatever TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR the environment already holds).
"""
from __future__ import annotations

import os
from pathlib import Path

from training.config import ConfigError


def compile_cache_env(folder: str | None) -> dict[str, str]:
    """The environment variables for `folder` (created), {} when unset."""
    if not folder:
        return {}
    root = Path(folder).expanduser().resolve()
    try:
        for sub in ("inductor", "triton"):
            (root / sub).mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"run.compile_cache: cannot create {root}/inductor and {root}/triton ({e}); "
                                f"name a writable folder (shared storage on a cluster) or leave it unset") from e
    if not os.access(root / "inductor", os.W_OK) or not os.access(root / "triton", os.W_OK):
        raise ConfigError(f"run.compile_cache: {root} is not writable; name a writable folder or leave it unset")
    return {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton")}


def use_compile_cache(folder: str | None) -> dict[str, str]:
    """Point this process's compile caches at `folder`; returns the variables set ({} when unset)."""
    env = compile_cache_env(folder)
    os.environ.update(env)
    return env
