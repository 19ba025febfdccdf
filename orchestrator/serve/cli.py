"""`python -m orchestrator.serve`: the flags (evaluation's, plus the server's), the set-up
evaluation builds from them, and serving it with uvicorn (`main`; `Background` in a thread).

Before anything loads, bad flags are one line on stderr and exit 2: a port outside 0-65535 or
one that cannot be listened on, an unknown profile, serving map or model (with the closest
name).  Then the server listens at once and loads the in-process models in the background
(GET /health/ready: 503 until they are loaded); a model that fails to load stops it (exit 1)."""
import argparse
import difflib
import logging
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI

from orchestrator.redaction import install_log_redaction
from orchestrator.serve.app import create_app, serve_error
from orchestrator.serve.service import Served, ServeLimits

SECTIONS = ("hle", "frames")      # the QA sections (configs/profiles/*.yaml `qa.<use>`) a server can run


class OneLineParser(argparse.ArgumentParser):
    """argparse, with its refusals in one line (no usage block)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (--help lists the flags)\n")


def port_number(text: str) -> int:
    """A TCP port: 0-65535 (0 picks a free one)."""
    try:
        port = int(text)
    except ValueError:
        port = None
    if port is None or not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give 0-65535 (0 picks a free port)")
    return port


def did_you_mean(name: str, known) -> str:
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="python -m orchestrator.serve",
                                description="Serve a trained orchestrator behind an OpenAI-compatible API "
                                            "(FastAPI + uvicorn).",
                                epilog="Docs: README.md, 'Serve a trained orchestrator'")
    o = p.add_argument_group("orchestrator (as run_hle.py / run_frames.py take them)")
    o.add_argument("--model", default="smollm2-135m", help="orchestrator: a configs/models.yaml name (default: "
                                                           "%(default)s, the embedded model, in process)")
    o.add_argument("--served-name", help="the model id clients send (default: --model)")
    o.add_argument("--price-model", help="its row in tools.json 'prices' (default: the registry's price_model)")
    o.add_argument("--endpoint", help="serve --model from this OpenAI-compatible URL (a trained checkpoint behind "
                                      "vLLM, e.g. http://host:8000/v1)")
    o.add_argument("--endpoint-model", help="model id the --endpoint server expects (default: --model)")
    o.add_argument("--profile", help="settings profile (configs/profiles/ name or YAML path; default: as the "
                                     "evaluation scripts choose: local for an in-process model or missing keys)")
    o.add_argument("--section", choices=SECTIONS, default="hle",
                   help="the profile's QA section whose budgets, prompts and experts serve (default: %(default)s)")
    o.add_argument("--serve", help="tools.json serving map (default: the profile's)")
    o.add_argument("--tools", type=Path, help="tools.json (default: the repository's)")
    o.add_argument("--prompts", type=Path, help="folder of prompt files overriding orchestrator/prompts/")
    o.add_argument("--retriever", help="retrieval service base URL(s), comma-separated; without it or --index "
                                       "the search tool is not offered")
    o.add_argument("--index", type=Path, help="index folder (retrieval/build_index.py) searched in-process")
    o.add_argument("--topk", type=int, help="documents per search (default: the profile's)")
    o.add_argument("--max-turns", type=int, help="turn cap (default: the profile's; a request's budget can lower it)")
    o.add_argument("--max-tokens", type=int, help="completion tokens per orchestrator turn (default: the profile's)")
    o.add_argument("--temperature", type=float, help="orchestrator temperature (default: the profile's)")
    o.add_argument("--expert-max-tokens", type=int, help="completion tokens per expert call (default: the profile's)")
    o.add_argument("--constrained", action=argparse.BooleanOptionalAction, default=None,
                   help="constrain the orchestrator to valid tool calls (default: on for an in-process model)")
    s = p.add_argument_group("server")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=port_number, default=8080, help="0-65535; 0 picks a free port (default: %(default)s)")
    s.add_argument("--concurrency", type=int, help="episodes at once (default: 1 when a model runs in process, "
                                                   "else 16, as the evaluation scripts)")
    s.add_argument("--queue", type=int, default=16, help="requests waiting for a slot before 503 (default: %(default)s)")
    s.add_argument("--request-timeout", type=float, default=300.0,
                   help="seconds a request may take, queue included, before 504 (default: %(default)s)")
    # what evaluation/qa_cli.resolve reads and a server has no use for: no benchmark data, no judge
    p.set_defaults(data="served", mode="all", judge=None, judge_model="exact", judge_style=None, judge_prompt=None,
                   stop_after_errors=0)
    return p


def build(args: argparse.Namespace) -> Served:
    """The set-up evaluation builds for `args` (evaluation/qa_cli.py): profile, budgets, runtime, policy,
    and the loader of the models it runs in process (`Served.load`; nothing is loaded here).
    Raises the evaluation scripts' errors (CLIError, ProfileError, ...) for bad flags."""
    from evaluation.cli import CLIError, check_serve, resolve_price_model, use_endpoint
    from evaluation.qa_cli import build_setup, check_models, make_retriever, resolve
    from orchestrator.catalog import load_catalog

    for flag, value, low in (("--concurrency", args.concurrency, 1), ("--queue", args.queue, 0),
                             ("--max-turns", args.max_turns, 1), ("--max-tokens", args.max_tokens, 1),
                             ("--request-timeout", args.request_timeout, 1e-9)):
        if value is not None and value < low:
            raise CLIError(f"{flag} must be >= {low:g}, got {value}")
    if args.endpoint_model and not args.endpoint:
        raise CLIError("--endpoint-model needs --endpoint")
    if args.retriever and args.index:
        raise CLIError("--retriever and --index both name the search backend; give one")
    for flag, path in (("--tools", args.tools), ("--prompts", args.prompts), ("--index", args.index)):
        if path is not None and not path.exists():
            raise CLIError(f"{flag} {path}: no such {'file' if flag == '--tools' else 'folder'}")
    catalog = load_catalog(args.tools)
    check_names(args, catalog)
    _, settings, line = resolve(args, args.section, catalog)
    price_model = resolve_price_model(args, catalog)
    if args.endpoint:
        use_endpoint(args, Path(tempfile.mkdtemp(prefix="orchestrator-serve-")), price_model)
    check_serve(catalog, args.serve, args.tools, args.pricing)
    models = sorted(check_models(args, catalog))
    retriever = make_retriever(args)
    setup = build_setup(args, catalog, price_model, retriever, settings)
    return Served(name=args.served_name or args.model, setup=setup, section=args.section, profile=args.profile,
                  search=retriever is not None, line=line.rsplit("; judge ", 1)[0],
                  load=lambda: load_models(models))


def check_names(args: argparse.Namespace, catalog) -> None:
    """--profile, --serve and --model name things that exist, or CLIError with the closest name."""
    from evaluation.cli import CLIError
    from orchestrator.gateway.registry import load_registry
    from orchestrator.settings import available, profile_path

    if args.profile and not profile_path(args.profile).exists():
        shipped = available()
        raise CLIError(f"--profile {args.profile}: no such profile{did_you_mean(args.profile, shipped)}; the shipped "
                       f"profiles are {shipped} (configs/profiles/), or give a path to a YAML file")
    if args.serve and args.serve not in catalog.profiles:
        raise CLIError(f"--serve {args.serve}: not a serving map of tools.json{did_you_mean(args.serve, catalog.profiles)}; "
                       f"its 'profiles' are {sorted(catalog.profiles)}")
    known = load_registry().models
    if not args.endpoint and args.model not in known:
        raise CLIError(f"--model {args.model}: not in the model registry{did_you_mean(args.model, known)} "
                       f"(configs/models.yaml or $TOOLORCHESTRA_MODELS); or serve a checkpoint with --endpoint URL")


def load_models(models: list[str]) -> None:
    """Load every model of `models` that runs in process (the gateway's transformers backend keeps
    it for the process: the first request does not wait for it).  Others are served elsewhere."""
    from orchestrator.gateway.backends import make_backend
    from orchestrator.gateway.registry import load_registry

    registry = load_registry()
    for name in models:
        entry = registry.entry(name)
        if entry.backend == "transformers":
            make_backend(name, entry)


def limits_from(args: argparse.Namespace) -> ServeLimits:
    return ServeLimits(concurrency=args.concurrency, queue=args.queue, request_timeout_s=args.request_timeout)


@dataclass
class Background:
    """The app served by uvicorn in a thread (the tests and bench/serve_load.py), as `main` serves it;
    entering waits until it listens and (`ready`) until its models are loaded."""

    app: FastAPI
    limits: ServeLimits = field(default_factory=ServeLimits)
    host: str = "127.0.0.1"
    port: int = 0
    ready: bool = True

    def __enter__(self) -> "Background":
        import uvicorn

        from retrieval.server import _free_port, server_config

        self.port = self.port or _free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        self._server = uvicorn.Server(server_config(self.app, self.host, self.port, self.limits, serve_error))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"orchestrator server did not start on port {self.port}")
            time.sleep(0.02)
        service = self.app.state.service
        if self.ready and not service.loaded.wait(600):
            raise RuntimeError("orchestrator server: its models did not load within 600 s")
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (0: a free port), or CLIError naming the flags."""
    from evaluation.cli import CLIError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
    except (OSError, UnicodeError) as exc:
        raise CLIError(f"--host {host}: not an address to listen on ({exc}); e.g. 127.0.0.1 or 0.0.0.0") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise CLIError(f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc}); "
                       f"pick another --port (0 picks a free one)") from None
    return sock


def main(argv: list[str] | None = None) -> int:
    from evaluation.cli import CLIError
    from orchestrator.catalog import CatalogError
    from orchestrator.context import PromptError
    from orchestrator.gateway.errors import GatewayConfigError
    from orchestrator.settings import ProfileError

    args = build_parser().parse_args(argv)
    install_log_redaction()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        served = build(args)                       # flags and names; nothing is loaded yet
        sock = listen(args.host, args.port)        # a port in use or a bad host: one line too
    except (CLIError, CatalogError, PromptError, GatewayConfigError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    with sock:
        return _serve(served, limits_from(args), sock, args.host)


def _serve(served: Served, limits: ServeLimits, sock: socket.socket, host: str) -> int:
    """Serve on `sock` until stopped; 1 when the models fail to load (the server stops then)."""
    import uvicorn

    from retrieval.server import server_config

    port = sock.getsockname()[1]
    app = create_app(served, limits)
    server = uvicorn.Server(server_config(app, host, port, limits, serve_error))
    service = app.state.service

    def stop_if_load_fails():
        service.loaded.wait()
        if service.load_error:
            server.should_exit = True

    threading.Thread(target=stop_if_load_fails, name="serve-load-watch", daemon=True).start()
    print(served.line)
    print(f"serving {served.name!r} at http://{host}:{port}/v1 (profile {served.profile}, qa.{served.section}; "
          f"{limits.concurrency} at once, {limits.queue} queued, {limits.request_timeout_s:g} s per request); "
          f"loading the models (GET /health/ready: 200 once loaded)", flush=True)
    server.run(sockets=[sock])
    if service.load_error:
        print(f"error: {service.load_error}", file=sys.stderr)
        return 1
    return 0
