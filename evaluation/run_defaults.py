"""Defaults of run_hle.py / run_frames.py that depend on where the models run and on the keys at hand.

- profile: as given; else `local` (every expert is the in-process SmolLM2) for the embedded
  world, for an in-process orchestrator, or when a key the paper's experts need is unset;
  else `paper` (each alias served by its own model).
- CPU-sized budgets (qa_cli.EMBEDDED) when the orchestrator is an in-process model: it makes
  ~10 tokens/s on 2 cores, so 50 turns of 1,024 free tokens never finish.
- concurrency: 1 when any model the run calls is in-process. Tasks in flight share that one
  model; 16 of them on 2 cores make each call wait for the others until it times out
  (the gateway's 120 s for smollm2-135m). Else 16.
"""
from __future__ import annotations

import argparse
import os

from orchestrator.gateway.errors import GatewayConfigError
from orchestrator.gateway.registry import load_registry

IN_PROCESS_BACKENDS = ("transformers",)
LOCAL_PROFILE, PAPER_PROFILE = "local", "paper"
REMOTE_CONCURRENCY = 16


def _entry(name: str):
    try:
        return load_registry().entry(name)
    except GatewayConfigError:   # unknown name / bad registry: resolve_price_model says so with the gateway's message
        return None


def in_process(name: str) -> bool:
    entry = _entry(name)
    return entry is not None and entry.backend in IN_PROCESS_BACKENDS


def missing_keys(catalog) -> list[str]:
    """Env vars the QA aliases' own models (the paper's experts) need and that are unset."""
    missing = set()
    for tool in catalog.tools_for("qa"):
        for spec in tool.aliases.values():
            entry = _entry(spec.model)
            env = entry.key_env() if entry is not None else None
            if env and not os.environ.get(env):
                missing.add(env)
    return sorted(missing)


def choose_profile(args: argparse.Namespace, catalog, embedded: bool) -> str:
    """Set args.profile when not given; return why it is what it is."""
    if args.profile is not None:
        return "given"
    if embedded:
        args.profile = LOCAL_PROFILE
        return "embedded world"
    if cpu_sized(args):
        args.profile = LOCAL_PROFILE
        return "in-process orchestrator"
    missing = missing_keys(catalog)
    if missing:
        args.profile = LOCAL_PROFILE
        return f"no {', '.join(missing)} set"
    args.profile = PAPER_PROFILE
    return "keys present"


def cpu_sized(args: argparse.Namespace) -> bool:
    """Whether the orchestrator runs in this process (so budgets must fit a CPU)."""
    return in_process(args.model) and not args.endpoint


def size_concurrency(args: argparse.Namespace, catalog) -> list[str]:
    """Set args.concurrency when not given; return the in-process models the run shares."""
    served = {args.model}
    if args.mode != "none":
        served |= {catalog.served_model(spec.model, args.serve)
                   for tool in catalog.tools_for("qa") for spec in tool.aliases.values()}
    shared = sorted(m for m in served if in_process(m) and not (m == args.model and args.endpoint))
    if args.concurrency is None:
        args.concurrency = 1 if shared else REMOTE_CONCURRENCY
    return shared
