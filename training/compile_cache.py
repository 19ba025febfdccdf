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


# -- a portable bundle of what was compiled (torch.compiler's "Mega-Cache") ---------------------------
# `run.compile_cache` needs a folder every job can reach.  `run.compile_artifacts: FILE` is one file
# instead: the first run that finds it missing writes it after its first step (what Inductor, AOTAutograd
# and Triton compiled, torch.compiler.save_cache_artifacts); every later run loads it before anything
# compiles, so a fresh node, a container built with the file, or a restart starts with warm caches.  The
# artifacts hold kernels for one GPU model and one torch/Triton version: another card recompiles (and a
# run that compiled anything new does not overwrite the file; delete it to rebuild).

def load_compile_artifacts(path: str | None) -> str | None:
    """Load `path`'s compile artifacts into this process's caches; a one-line note of what was loaded,
    None when unset or missing (the run compiles and writes it after its first step)."""
    if not path:
        return None
    if not Path(path).is_file():
        parent = Path(path).expanduser().resolve().parent
        if Path(path).exists() or not (parent.is_dir() and os.access(parent, os.W_OK)):
            raise ConfigError(f"run.compile_artifacts: {path} is not a file this run can read or write "
                              f"({parent} must be a writable folder); name a file there or leave it unset")
        return None
    import torch   # (training imports torch anyway; kept here so the config module stays light)
    blob = Path(path).read_bytes()
    try:
        info = torch.compiler.load_cache_artifacts(blob)
    except Exception as e:   # another torch's format, a truncated file: compile as if it were absent
        return f"run.compile_artifacts: {path} not loaded ({type(e).__name__}: {e}); compiling from scratch"
    if info is None:   # torch logs why (checksum, pickle) and returns None
        return (f"run.compile_artifacts: {path} not loaded (torch could not read it: another torch version or a "
                f"damaged file); compiling from scratch: delete it to have this run write a new one")
    kinds = {k: len(v) for k, v in vars(info).items() if isinstance(v, list) and v}
    return f"run.compile_artifacts: loaded {len(blob) / 2**20:.1f} MiB from {path} ({kinds or 'nothing'})"


def save_compile_artifacts(path: str | None) -> int:
    """Write this process's compile artifacts to `path` unless it exists (or nothing was compiled);
    written whole or not at all (a temporary file renamed).  Returns the bytes written."""
    if not path or Path(path).exists():
        return 0
    import torch
    saved = torch.compiler.save_cache_artifacts()
    if not saved or not saved[0]:
        return 0
    target = Path(path).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.write_bytes(saved[0])
    os.replace(tmp, target)
    return len(saved[0])
