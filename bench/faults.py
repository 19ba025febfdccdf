"""A seeded fault injector: an HTTP reverse proxy in front of any OpenAI-compatible server or the
retrieval service, and helpers that kill and restart servers on schedule (issue 28 item 1).

    plan = FaultPlan(seed=7, rate=0.1, burst=2)              # 10% of requests, in bursts of ~2
    with FaultProxy("http://127.0.0.1:8000", plan) as proxy:  # point a registry entry at proxy.url
        ...
    proxy.log      # one entry per request: index, fault, status sent, forwarded?, delivered?, usage

Which request gets which fault is a function of the seed and the request's arrival index alone
(`FaultPlan.fault(i)`), so a run's fault sequence is reproducible and a test can assert it from the
log. With concurrent clients the *calls* that land on index i differ from run to run; the sequence
of faults does not.

Faults (`KINDS`):
- `429`: HTTP 429 with `Retry-After: plan.retry_after` (seconds), not forwarded;
- `500` / `502` / `503`: the status with a JSON error body, not forwarded;
- `reset`: the connection is reset (TCP RST) before any byte of a reply, not forwarded;
- `stall`: nothing is sent for `plan.stall_s` seconds, then the connection is reset (a server
  that accepted and hung; a client with a shorter deadline gives up first);
- `trickle`: forwarded; the upstream's reply is sent in small pieces over `plan.trickle_s`
  seconds (Content-Length set: a slow but whole body);
- `truncated`: forwarded; 200 with the upstream's JSON cut in half (a body that does not parse);
- `html`: not forwarded; 200 `text/html` (a proxy's login page: the wrong content type).
An upstream that cannot be reached (a killed replica) answers 502 and is logged as `upstream_down`.

Accounting: every forwarded request's upstream reply is parsed for its `usage`; `delivered` says
whether the client got that reply intact.  What the upstream served but the client never got
(`wasted_usage()`) is what a provider bills for failed attempts: the gateway sees no usage for
them (no parseable reply), so this log is where they are counted.

Servers on schedule: `ServerProcess` (start / kill / restart a subprocess server, ready when its
health URL answers 200), `Schedule` (actions at seconds from start), and `FaultProxy(at_request=
{i: action})` (an action when request i arrives: deterministic relative to the fault sequence).
`kill_actor_on_call(actor, "generate", at=3)`: a Ray actor's process SIGKILLed right after the
3rd call of one of its methods is sent (training under chaos: a rollout engine mid-generation,
a trainer rank mid-update).

The proxy buffers each request and reply whole (no streaming pass-through): the gateway and the
retrieval client make non-streaming calls.  Lives in the core package because evaluation's
tests, bench/chaos_eval.py and training's chaos tests all use it.
"""
from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

KINDS = ("429", "500", "502", "503", "reset", "stall", "trickle", "truncated", "html")
# request headers not passed upstream (hop-by-hop, or recomputed); Accept-Encoding is dropped so
# that the upstream's reply comes uncompressed and its usage can be read
_DROP = {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "accept-encoding",
         "proxy-connection", "te", "upgrade"}


def _unit(seed: int, index: int, salt: str) -> float:
    """A number in [0, 1) fixed by (seed, index, salt): the plan's only source of randomness."""
    digest = hashlib.sha256(f"{seed}:{salt}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


@dataclass(frozen=True)
class FaultPlan:
    """Which requests fail and how.  `rate`: the expected fraction of requests faulted; `burst`:
    faults come in runs of `burst` consecutive requests (1: independent); `kinds`: drawn uniformly
    (repeat a kind to weight it); `methods`: only these requests are faulted (others pass)."""

    seed: int = 0
    rate: float = 0.1
    burst: int = 1
    kinds: tuple[str, ...] = KINDS
    methods: tuple[str, ...] = ("POST",)
    retry_after: float = 1.0      # seconds, the 429's Retry-After
    stall_s: float = 30.0         # a stall's silence before the reset
    trickle_s: float = 1.0        # how long a trickled reply takes to send

    def __post_init__(self):
        if not 0 <= self.rate <= 1:
            raise ValueError(f"rate: expected a fraction in [0, 1], got {self.rate}")
        if self.burst < 1:
            raise ValueError(f"burst: expected >= 1 requests, got {self.burst}")
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ValueError(f"kinds: {bad or 'empty'}; choose from {', '.join(KINDS)}")

    def _starts(self, j: int) -> bool:
        return _unit(self.seed, j, "start") < self.rate / self.burst

    def fault(self, index: int) -> str | None:
        """The fault of request `index` (0-based arrival order), or None: a burst that started at
        one of the `burst` indices up to this one covers it, with the kind drawn at its start."""
        for start in range(index, max(-1, index - self.burst), -1):
            if self._starts(start):
                return self.kinds[int(_unit(self.seed, start, "kind") * len(self.kinds))]
        return None

    def sequence(self, n: int) -> list[str | None]:
        return [self.fault(i) for i in range(n)]


@dataclass
class Entry:
    """One request through the proxy."""

    index: int
    method: str
    path: str
    body_sha: str                 # sha256 of the request body (16 hex): a call's retries share it
    fault: str | None             # the injected fault (None: passed through)
    status: int | None = None     # what the client was sent (None: reset / stalled)
    forwarded: bool = False       # the upstream saw it
    delivered: bool = False       # the client got the upstream's reply intact
    usage: dict[str, int] | None = None   # the upstream reply's usage (forwarded requests)
    upstream_down: bool = False   # the upstream could not be reached (502 sent)
    t: float = 0.0                # seconds since the proxy started


def _usage(body: bytes) -> dict[str, int] | None:
    try:
        usage = json.loads(body).get("usage")
    except (ValueError, AttributeError):
        return None
    if not isinstance(usage, dict):
        return None
    return {k: int(usage.get(k) or 0) for k in ("prompt_tokens", "completion_tokens")}


class FaultProxy:
    """The proxy: an aiohttp server on a thread of its own (see the module docstring).

    upstream: base URL the requests go to (`http://host:port`, path prefixes are kept as sent:
    point a client at `proxy.url + "/v1"` for an upstream served at `/v1`).  at_request: {index:
    action} actions started (on a thread of their own) when request `index` arrives.  log_path:
    where `write_log` puts the log (JSON lines)."""

    def __init__(self, upstream: str, plan: FaultPlan = FaultPlan(rate=0.0), *, port: int = 0,
                 at_request: dict[int, Callable[[], Any]] | None = None, log_path: str | Path | None = None):
        self.upstream = upstream.rstrip("/")
        self.plan = plan
        self.port = port
        self.at_request = dict(at_request or {})
        self.log_path = Path(log_path) if log_path else None
        self.log: list[Entry] = []
        self.actions: list[threading.Thread] = []
        self._count = 0
        self._started = time.monotonic()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- what the log says ---------------------------------------------------------------------
    def faults(self) -> list[str | None]:
        return [e.fault for e in sorted(self.log, key=lambda e: e.index)]

    def attempts_per_body(self) -> dict[str, int]:
        """Requests per distinct body: a call and its retries send the same body."""
        out: dict[str, int] = {}
        for e in self.log:
            out[e.body_sha] = out.get(e.body_sha, 0) + 1
        return out

    def _sum(self, delivered: bool | None) -> dict[str, int]:
        total = {"prompt_tokens": 0, "completion_tokens": 0}
        for e in self.log:
            if e.usage and (delivered is None or e.delivered == delivered):
                for k in total:
                    total[k] += e.usage[k]
        return total

    def served_usage(self) -> dict[str, int]:
        """Tokens the upstream produced for requests through this proxy."""
        return self._sum(None)

    def delivered_usage(self) -> dict[str, int]:
        return self._sum(True)

    def wasted_usage(self) -> dict[str, int]:
        """Tokens the upstream produced whose reply the client never got whole (billed, unseen)."""
        return self._sum(False)

    def write_log(self, path: str | Path | None = None) -> Path:
        path = Path(path or self.log_path)
        path.write_text("".join(json.dumps(asdict(e)) + "\n" for e in sorted(self.log, key=lambda e: e.index)))
        return path

    # ---- the server ----------------------------------------------------------------------------
    async def _handle(self, request):
        from aiohttp import web  # lazy: only the proxy uses it

        index = self._count
        self._count += 1
        if index in self.at_request:
            thread = threading.Thread(target=self.at_request[index], name=f"fault-action-{index}", daemon=True)
            thread.start()
            self.actions.append(thread)
        body = await request.read()
        fault = self.plan.fault(index) if request.method in self.plan.methods else None
        entry = Entry(index=index, method=request.method, path=request.path_qs,
                      body_sha=hashlib.sha256(body).hexdigest()[:16], fault=fault,
                      t=round(time.monotonic() - self._started, 3))
        self.log.append(entry)
        if fault in ("429", "500", "502", "503"):
            entry.status = int(fault)
            headers = {"Retry-After": f"{self.plan.retry_after:g}"} if fault == "429" else {}
            return web.json_response({"error": {"message": f"injected fault {fault} (request {index})",
                                                "type": "injected"}}, status=entry.status, headers=headers)
        if fault == "html":
            entry.status = 200
            return web.Response(text="<html><body>Please sign in to continue</body></html>", content_type="text/html")
        if fault in ("reset", "stall"):
            if fault == "stall":
                await asyncio.sleep(self.plan.stall_s)
            _reset(request)
            return web.Response(status=500)     # never sent: the transport is gone
        try:
            status, headers, reply = await self._forward(request, body)
        except OSError as exc:
            entry.status, entry.upstream_down = 502, True
            return web.json_response({"error": {"message": f"upstream {self.upstream} unreachable: {exc}",
                                                "type": "upstream_down"}}, status=502)
        entry.forwarded, entry.usage = True, _usage(reply)
        entry.status = status
        if fault == "truncated":
            return web.Response(body=reply[:max(1, len(reply) // 2)], status=status, content_type="application/json")
        if fault == "trickle":
            resp = web.StreamResponse(status=status, headers=headers)
            resp.content_length = len(reply)
            try:
                await resp.prepare(request)
                pieces = 10
                step = max(1, -(-len(reply) // pieces))
                for start in range(0, len(reply), step):
                    if start:
                        await asyncio.sleep(self.plan.trickle_s / pieces)
                    await resp.write(reply[start:start + step])
                entry.delivered = True          # every byte handed to the socket
                await resp.write_eof()
            except (ConnectionError, RuntimeError):
                pass                            # the client gave up: not delivered
            return resp
        entry.delivered = True
        return web.Response(body=reply, status=status, headers=headers)

    async def _forward(self, request, body: bytes) -> tuple[int, dict, bytes]:
        import aiohttp  # lazy: only the proxy uses it

        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP}
        try:
            async with self._session.request(request.method, self.upstream + request.path_qs, data=body,
                                             headers=headers) as resp:
                reply = await resp.read()
                keep = {k: v for k, v in resp.headers.items() if k.lower() in ("content-type", "retry-after")}
                return resp.status, keep, reply
        except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
            raise OSError(f"{type(exc).__name__}: {exc}") from None

    async def _serve(self) -> None:
        import aiohttp  # lazy: only the proxy uses it
        from aiohttp import web

        self._stop = asyncio.Event()
        # no connection limit (the proxy must not be the bottleneck); the environment's proxies unused
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), trust_env=False,
                                              auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port, backlog=1024)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self._started = time.monotonic()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await self._session.close()

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported by start()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    def start(self) -> "FaultProxy":
        self._thread = threading.Thread(target=self._run, name="fault-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"fault proxy did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
        for thread in self.actions:
            thread.join(120)
        if self.log_path:
            self.write_log()

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _reset(request) -> None:
    """Close the client's connection with a TCP RST (SO_LINGER 0), nothing sent."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


# ---- servers on schedule ---------------------------------------------------------------------
def http_ok(url: str, timeout: float = 2.0) -> bool:
    """GET `url` answers 200 (no proxies from the environment, as every client here)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout)
    try:
        conn.request("GET", parts.path or "/")
        return conn.getresponse().status == 200
    except OSError:
        return False
    finally:
        conn.close()


@dataclass
class ServerProcess:
    """A server in a subprocess that a test or bench kills and restarts.  `argv`: the command;
    `health_url`: answers 200 once it serves; `log`: where its output goes (appended, so a
    restart's output follows the first start's)."""

    argv: list[str]
    health_url: str
    log: Path | None = None
    env: dict[str, str] | None = None
    cwd: str | Path | None = None
    ready_timeout_s: float = 180.0
    proc: subprocess.Popen | None = None
    events: list[tuple[float, str]] = field(default_factory=list)   # (time.time(), what)
    # one kill / start / restart at a time: two scheduled restarts that meet run one after the other
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def start(self) -> "ServerProcess":
        with self._lock:
            return self._start()

    def _start(self) -> "ServerProcess":
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, cwd=self.cwd,
                                         env=self.env, start_new_session=True)
        finally:
            if self.log:
                out.close()
        deadline = time.monotonic() + self.ready_timeout_s
        while not http_ok(self.health_url):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.argv[:4]}... exited with {self.proc.returncode} before serving "
                                   f"{self.health_url}" + (f"; see {self.log}" if self.log else ""))
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"{self.health_url} not answering after {self.ready_timeout_s:g} s")
            time.sleep(0.1)
        self.events.append((time.time(), "ready"))
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the server (SIGKILL: a node lost; SIGTERM: a clean stop) and wait for it."""
        with self._lock:
            self._kill(sig)

    def _kill(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
            self.events.append((time.time(), f"killed ({signal.Signals(sig).name})"))

    def restart(self, down_s: float = 0.0, sig: int = signal.SIGKILL) -> None:
        with self._lock:
            self._kill(sig)
            time.sleep(down_s)
            self._start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.kill(signal.SIGTERM)


class Schedule:
    """Run `actions` [(seconds from start(), callable), ...] on one thread, in time order; `done`
    lists (seconds, name) as each finishes and `errors` what raised."""

    def __init__(self, actions: list[tuple[float, Callable[[], Any]]]):
        self.actions = sorted(actions, key=lambda a: a[0])
        self.done: list[tuple[float, str]] = []
        self.errors: list[str] = []
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fault-schedule", daemon=True)

    def _run(self) -> None:
        started = time.monotonic()
        for at, action in self.actions:
            if self._cancel.wait(max(0.0, at - (time.monotonic() - started))):
                return
            try:
                action()
            except Exception as exc:  # noqa: BLE001 - reported to the caller
                self.errors.append(f"{getattr(action, '__name__', action)}: {type(exc).__name__}: {exc}")
            self.done.append((round(time.monotonic() - started, 2), getattr(action, "__name__", repr(action))))

    def start(self) -> "Schedule":
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def cancel(self) -> None:
        self._cancel.set()
        self._thread.join(60)



# ---- Ray actors on schedule --------------------------------------------------------------------
def actor_pid(actor) -> int:
    """The pid of a Ray actor's process (asked of the actor: it must be idle or free to answer)."""
    import ray  # lazy: optional (distributed extra)

    return ray.get(actor.__ray_call__.remote(lambda self: os.getpid()))


@dataclass
class ActorKill:
    """What `kill_actor_on_call` did: `killed` lists (time.time(), pid) per kill."""

    name: str
    method: str
    at: tuple[int, ...]
    calls: int = 0                  # calls counted (those made while `when` held)
    killed: list[tuple[float, int]] = field(default_factory=list)


def kill_actor_on_call(actor, method: str, at: int | tuple[int, ...], *, when: Callable[[], bool] | None = None,
                       name: str = "", sig: int = signal.SIGKILL) -> ActorKill:
    """Kill a Ray actor's process when its `method` is called for the `at`-th time (1-based, calls
    counted through this handle), right after that call is sent, so the call is in flight when the
    process dies: what the OOM killer or a lost node does to a rollout engine mid-generation or a
    trainer rank mid-update.  Deterministic: the point is a call count, not a time.  `when`: count
    only the calls made while it returns true (e.g. "the first generation of step 2").

    The handle is patched in place (it stays a Ray ActorHandle, so `ray.kill` and pickling work);
    the actor's pid is asked before each kill (a restarted actor has a new one).  SIGKILL of the
    process, unlike `ray.kill(actor)`, lets Ray restart an actor started with `max_restarts`."""
    at = (at,) if isinstance(at, int) else tuple(at)
    record = ActorKill(name or repr(actor), method, at)
    real = getattr(actor, method)

    class _Method:
        def remote(self, *args, **kwargs):
            if when is not None and not when():
                return real.remote(*args, **kwargs)
            record.calls += 1
            if record.calls in at:
                pid = actor_pid(actor)         # asked before the call is queued behind it
                ref = real.remote(*args, **kwargs)
                time.sleep(0.05)               # the call reaches the actor and starts
                os.kill(pid, sig)
                record.killed.append((time.time(), pid))
                return ref
            return real.remote(*args, **kwargs)

        def options(self, **kw):
            return real.options(**kw)

    setattr(actor, method, _Method())
    return record
