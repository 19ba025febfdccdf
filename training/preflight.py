"""Checks that fail a training run before start-up, with one line, when the machine cannot
do what the config asks (instead of a long traceback minutes later)."""
from __future__ import annotations

from pathlib import Path

from training.config import ConfigError


def check_device(device: str, key: str = "run.device") -> None:
    """Raise ConfigError naming `key` when `device` is not usable on this machine."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise ConfigError(f"{key}: {device!r} is not a device ({exc}); use cpu, cuda or cuda:N") from None
    if dev.type == "cpu":
        return
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise ConfigError(f"{key}={device}: this machine has no usable CUDA GPU (torch {torch.__version__}, "
                              f"{build}); use {key}=cpu or run on a GPU node")
        if dev.index is not None and dev.index >= count:
            raise ConfigError(f"{key}={device}: this machine has {count} CUDA GPU(s), cuda:0..cuda:{count - 1}")
        return
    backend = getattr(torch, dev.type, None) or getattr(torch.backends, dev.type, None)
    available = getattr(backend, "is_available", None)
    if available is None or not available():
        raise ConfigError(f"{key}={device}: no {dev.type} device on this machine; use {key}=cpu")


def check_paths(cfg) -> None:
    """The files and folders the config names exist (ConfigError naming the key), checked before
    anything is loaded or written; data.train_files are checked as they load (training/tasks.py)."""
    for key, path, kind in (("tools.catalog", cfg.tools.catalog, "file"), ("tools.prompts", cfg.tools.prompts, "folder"),
                            ("tools.index", cfg.tools.index, "folder")):
        if path and not (Path(path).is_file() if kind == "file" else Path(path).is_dir()):
            raise ConfigError(f"{key}: {path}: no such {kind}" + (" (the quickstart writes it: python -m "
                                                                   "training.quickstart)" if "quickstart" in path else ""))
    for key, path in (("model.path", cfg.model.path), ("model.reference", cfg.model.reference)):
        local = path.startswith(("/", "./", "../", "~")) or Path(path).expanduser().exists()
        if path and path != "same" and local and not Path(path).expanduser().is_dir():
            raise ConfigError(f"{key}: {path}: no such folder (a local policy folder, or a hub id such as "
                              f"Qwen/Qwen3-8B)")


def check_models(tasks, runtime, others: dict[str, str], request_s: float = 0.0) -> None:
    """Every model the run will call can be called (orchestrator/gateway/preflight.py, as evaluation
    checks it): each task's experts (its own `tools`, else the catalog's tools for its kind) as
    `runtime` serves them, and `others` (model -> role: the LLM judge, the tau2 user simulator).
    `request_s` > 0 (`tools.preflight_timeout`): each also answers one tiny real request within it.
    Raises PreflightError (one line: role, model, key variable or endpoint, fix)."""
    from orchestrator.gateway.preflight import catalog_pairs, check_models as check, expert_roles

    needed: dict[str, str] = {}
    prices: dict[str, str] = {}
    for task in tasks:
        pairs = catalog_pairs(runtime.catalog, task.kind, task.tools)
        needed.update({m: r for m, r in expert_roles(pairs, runtime.served).items() if m not in needed})
        for _alias, model in pairs:
            prices.setdefault(runtime.served(model), runtime.priced(model, runtime.catalog))
    for model, role in others.items():
        needed.setdefault(model, role)
    check(needed, request_s=request_s or None, prices=prices, catalog=runtime.catalog)
