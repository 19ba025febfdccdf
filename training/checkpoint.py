"""Checkpoints that a pre-empted job can trust: atomic, verified, resumable.

Layout under `<run dir>/checkpoints/`:

    step-00000010/
      model/               policy weights (safetensors) + tokenizer, `from_pretrained`-able
      trainer_state.pt     optimizer, scheduler, RNG states, data position, wandb run id
      manifest.json        written last: step, config fingerprint, size + sha256 of every file

A checkpoint is written into a hidden temporary folder and renamed into place, so a
crash mid-save leaves no half checkpoint under a real name.  Loading re-hashes every
file and compares the config fingerprint: a corrupt or mismatched checkpoint is
refused with a `CheckpointError` saying what differs and what to do.

`Preemption` turns SIGTERM (Slurm's pre-emption / time-limit signal) into a flag that
the trainer checks at safe points; it then saves and exits with status 143.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

FORMAT = 1
MANIFEST = "manifest.json"
STATE = "trainer_state.pt"
_STEP_RE = re.compile(r"^step-(\d+)$")
PREEMPTED_EXIT_CODE = 143  # 128 + SIGTERM, what a shell reports for a job ended by TERM


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be resumed; the message says why and how to proceed."""


@dataclass
class Checkpoint:
    """A verified checkpoint on disk."""

    path: Path
    step: int
    manifest: dict[str, Any]

    @property
    def model_dir(self) -> Path:
        return self.path / "model"

    def load_state(self) -> dict[str, Any]:
        return torch.load(self.path / STATE, map_location="cpu", weights_only=True)


# ---------------------------------------------------------------------------- RNG
def rng_state() -> dict[str, Any]:
    """Python, numpy and torch (CPU + every CUDA device) generator states, torch.save-able."""
    np_state = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": [np_state[0], torch.from_numpy(np_state[1].copy()), *np_state[2:]],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------- save
def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _fsync_tree(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


def save_checkpoint(root: str | Path, step: int, model, tokenizer, state: dict[str, Any],
                    fingerprint: dict[str, Any], keep: int = 2) -> Path:
    """Write checkpoint `step` under `root` atomically; keep the newest `keep`; return its path.

    `state` holds what `torch.save` can store with `weights_only` loading (tensors, numbers,
    strings, lists, dicts): optimizer and scheduler state dicts, RNG states, data position.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:08d}"
    tmp = root / f".step-{step:08d}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    model.save_pretrained(tmp / "model", safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    torch.save(state, tmp / STATE)
    files = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(tmp.rglob("*")) if p.is_file()}
    manifest = {"format": FORMAT, "step": step, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "fingerprint": fingerprint, "files": files}
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
    _fsync_tree(tmp)
    if final.exists():  # re-saving a step (e.g. SIGTERM right after a periodic save)
        old = root / f".step-{step:08d}.old-{os.getpid()}"
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    _prune(root, keep)
    return final


_TEMP_RE = re.compile(r"^\.step-(\d+)\.(tmp|old)-(\d+)$")


def _dead_saves(root: str | Path):
    """(path, step, kind) of the `.step-<step>.<tmp|old>-<pid>` folders under `root` whose
    writer is no live process on this host (a live one may be another trainer saving there)."""
    for path in sorted(Path(root).glob(".step-*")) if Path(root).is_dir() else []:
        match = _TEMP_RE.match(path.name)
        if match and path.is_dir() and not _pid_alive(int(match.group(3))):
            yield path, int(match.group(1)), match.group(2)


def recover_interrupted_saves(root: str | Path) -> list[Path]:
    """Put back the checkpoints a re-save was killed in the middle of moving; return them.

    A re-save of step N (SIGTERM right after its periodic save) renames `step-N` to
    `.step-N.old-<pid>`, then its new folder to `step-N`: killed between the two renames, no
    folder has the name, and `run.resume: auto` would go back to an older checkpoint (or
    start over, with `keep_checkpoints: 1`).  Called at start-up, before `remove_stale_temps`."""
    root, restored = Path(root), []
    for path, step, kind in list(_dead_saves(root)):
        final = root / f"step-{step:08d}"
        if kind == "old" and (path / MANIFEST).exists() and not final.exists():
            path.rename(final)
            restored.append(final)
    return restored


def remove_stale_temps(root: str | Path) -> list[Path]:
    """Delete the `.step-*.tmp-<pid>` (and re-saves' `.step-*.old-<pid>`) folders a killed
    save left under `root`; return them.

    Called once at start-up, before this run saves anything. A folder whose pid is a live
    process on this host is kept (another trainer may be writing it into the same folder)."""
    removed = []
    for path, _, _ in list(_dead_saves(root)):
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # exists, owned by someone else
        return True
    return True


def _prune(root: Path, keep: int) -> None:
    for path in list_checkpoints(root)[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)


# ---------------------------------------------------------------------------- find and load
def list_checkpoints(root: str | Path) -> list[Path]:
    """Checkpoint folders under `root` that have a manifest, oldest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := _STEP_RE.match(p.name)) and (p / MANIFEST).exists()]
    return [p for _, p in sorted(found)]


def resolve_resume(resume: str, root: str | Path) -> Path | None:
    """The checkpoint to resume from: `resume` is "auto" (latest under root, or None),
    "never" (None) or a checkpoint folder (which must exist)."""
    if resume == "never":
        return None
    if resume == "auto":
        found = list_checkpoints(root)
        return found[-1] if found else None
    path = Path(resume)
    if not (path / MANIFEST).exists():
        raise CheckpointError(f"run.resume={resume!r}: no checkpoint there ({MANIFEST} missing); "
                              f"use 'auto', 'never' or a folder like {Path(root) / 'step-00000010'}")
    return path


def verify_checkpoint(path: str | Path, fingerprint: dict[str, Any] | None = None) -> Checkpoint:
    """Check format, every file's size and sha256, and (if given) the config fingerprint.

    Raises CheckpointError naming the first problem and how to proceed.
    """
    path = Path(path)
    advice = (f"delete {path} to resume from an earlier checkpoint, or set run.resume=never "
              "to start over")
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"checkpoint {path}: unreadable {MANIFEST} ({exc}); {advice}") from None
    if manifest.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path}: format {manifest.get('format')!r}, this code reads "
                              f"format {FORMAT}; {advice}")
    for name, meta in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file():
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} is missing; {advice}")
        if file.stat().st_size != meta["bytes"] or _sha256(file) != meta["sha256"]:
            raise CheckpointError(f"checkpoint {path} is corrupt: {name} does not match its recorded "
                                  f"size/sha256 (truncated or modified); {advice}")
    if fingerprint is not None:
        saved = manifest.get("fingerprint", {})
        diff = {k: (saved.get(k), v) for k, v in fingerprint.items() if saved.get(k) != v}
        if diff:
            lines = "; ".join(f"{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in diff.items())
            raise CheckpointError(f"checkpoint {path} does not match this config ({lines}); resume with "
                                  f"the config it was written with (its run dir holds config.yaml), "
                                  f"or use a new run.dir / run.resume=never")
    return Checkpoint(path=path, step=int(manifest["step"]), manifest=manifest)


# ---------------------------------------------------------------------------- which backend wrote it
BACKENDS = {"none": "one process: torch AdamW state in trainer_state.pt",
            "ray": "Ray + DeepSpeed: every rank's optimizer partition in deepspeed/"}


def checkpoint_backend(checkpoint: Checkpoint, state: dict[str, Any]) -> str:
    """`distributed.backend` that wrote the checkpoint: "none" or "ray" (older checkpoints,
    without the "backend" entry, are told apart by their optimizer state)."""
    if "backend" in state:
        return state["backend"]
    return "ray" if "distributed" in state or (checkpoint.path / "deepspeed").is_dir() else "none"


def require_backend(checkpoint: Checkpoint, state: dict[str, Any], backend: str, *, reference_path: str) -> None:
    """Refuse, before anything starts, to resume a checkpoint of the other backend: the
    optimizer states differ in kind (torch AdamW vs DeepSpeed's partitioned fp32 state)."""
    found = checkpoint_backend(checkpoint, state)
    if found == backend:
        return
    layout = state.get("distributed") or {}
    same = " ".join(f"distributed.{k}={v}" for k, v in layout.items())
    raise CheckpointError(
        f"checkpoint {checkpoint.path} was written with distributed.backend={found} ({BACKENDS.get(found, found)}) "
        f"and cannot be resumed with distributed.backend={backend}: the optimizer state is in the other format. "
        f"Either resume it with distributed.backend={found}{' ' + same if same else ''}, or start a new run from "
        f"its weights: model.path={checkpoint.model_dir} model.reference={reference_path} run.dir=<a new folder> "
        "(AdamW moments, LR schedule and data position then start fresh)")


# ---------------------------------------------------------------------------- SIGTERM
class Preemption:
    """SIGTERM/SIGUSR1 -> `requested` flag (checked by the trainer at safe points).

    `on_signal` (optional) runs inside the handler; keep it tiny (e.g. log a line).
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGUSR1),
                 on_signal: Callable[[int], None] | None = None):
        self.requested = False
        self.signum: int | None = None
        self._signals = signals
        self._on_signal = on_signal
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> "Preemption":
        for s in self._signals:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)

    def _handle(self, signum, frame) -> None:
        self.requested, self.signum = True, signum
        if self._on_signal is not None:
            self._on_signal(signum)
