"""Several HTTP front-end processes feeding one batch worker: `python -m retrieval.server --frontends N`.

One process per role, all started (spawn) by the server's main process, the supervisor:

- the **batch worker** loads the index and the encoder once (one copy of the index on the GPU) and
  runs the usual `RetrievalService` (micro-batcher + Searcher); one reader thread per front end
  feeds it, and a sender thread per front end writes the answers back;
- **N front ends** each run uvicorn + the same FastAPI app (`create_app`: limits, 422/413/408/503)
  on one shared listening socket; their service is a `RemoteService`, which forwards each
  request's queries to the worker over a duplex pipe (multiprocessing.Pipe: pickled tuples) and
  resolves the request's Future when the answer comes back. The web fallback runs in the front ends.

With one process, the HTTP event loop and the batch thread took turns on one GIL (~1.6 ms of
Python per request capped the server near 600 requests/s at any index size; docs/benchmarks.md).
Here the HTTP work spreads over N processes and the worker keeps its GIL for batching.

Messages: front end -> worker ("retrieve", id, [Query]) | ("cancel", id, None) | ("health", id, None);
worker -> front end ("result", id, payload) | ("error", id, (kind, message, field)). Errors cross
as text, rebuilt as the same exception classes (QueryError -> 422, Overloaded -> 503, anything
else -> the 500 a single-process server gives). When the worker dies, each front end fails its
pending requests and answers 503 (and /health 503, status "down") with the reason; the
supervisor then stops the front ends after WORKER_GONE_GRACE_S and exits with status 1, so a
babysitter or Slurm restarts it. A front end that dies stops the server the same way.

Start-up: the worker loads first; then the front ends start on the listening socket, each
reports once uvicorn accepts on it, and the supervisor registers the endpoint only after that
and a 200 from /health through the socket (so no client is sent to a server still starting).
Every child dies with the supervisor, even a SIGKILLed one (retrieval/lifeline.py).
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import queue
import signal
import socket
import sys
import threading
import urllib.error
import urllib.request
from concurrent.futures import Future, InvalidStateError
from dataclasses import replace
from multiprocessing.connection import wait

from retrieval.batcher import Overloaded
from retrieval.encoders import QueryTokenizer
from retrieval.lifeline import die_with_parent
from retrieval.searcher import QueryError
from retrieval.service import web_finish
from retrieval.web import web_search_from_env

log = logging.getLogger("retrieval.frontends")
# front ends answer 503 "worker gone" this long before the server exits (the environment variable
# RETRIEVAL_WORKER_GONE_GRACE_S changes it: a longer window for a supervisor that restarts slowly, or a test)
WORKER_GONE_GRACE_S = float(os.environ.get("RETRIEVAL_WORKER_GONE_GRACE_S", "5"))
HEALTH_TIMEOUT_S = 5.0       # a worker that does not answer /health within this is reported down
LOG_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"


class WorkerGone(RuntimeError):
    """The batch worker process is no longer there: the server answers 503 until it stops."""


class WorkerError(RuntimeError):
    """An exception raised in the worker by a request (the front end answers 500, as one process does)."""


def encode_error(err: BaseException) -> tuple[str, str, str | None]:
    """An exception as (kind, message, field): plain text, so it always crosses the pipe."""
    if isinstance(err, QueryError):
        return "query", str(err).removeprefix(f"{err.field}: "), err.field
    if isinstance(err, Overloaded):
        return "overloaded", str(err), None
    return "error", f"{type(err).__name__}: {err}", None


def decode_error(kind: str, message: str, field: str | None) -> Exception:
    if kind == "query":
        return QueryError(field, message)
    if kind == "overloaded":
        return Overloaded(message)
    return WorkerError(message)


# ---- front end -------------------------------------------------------------------------------
class RemoteService:
    """The RetrievalService interface (submit / finish / health / close / web) over a pipe to the
    batch worker. Thread-safe: the event loop submits, a reader thread resolves the Futures."""

    def __init__(self, conn, web=None, tokenize=None):
        self.conn, self.web, self._finish, self.tokenize = conn, web, web_finish, tokenize
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count()
        self._send_lock = threading.Lock()
        self.gone: str | None = None
        self.closed = False
        threading.Thread(target=self._read, name="retrieval-frontend-reader", daemon=True).start()

    def submit(self, queries) -> Future:
        """Forward one request's queries; the Future gives their hits, or raises what the worker raised."""
        if self.gone:
            raise WorkerGone(self.gone)
        queries = list(queries)
        if self.tokenize is not None and queries:      # here, not in the worker: its one GIL batches
            queries = [replace(q, tokens=row) for q, row in zip(queries, self.tokenize([q.text for q in queries]))]
        rid, fut = next(self._ids), Future()
        self._pending[rid] = fut
        fut.add_done_callback(lambda f: f.cancelled() and self._cancel(rid))   # a request that timed out
        self._send(("retrieve", rid, queries))
        return fut

    def finish(self, queries, hits):
        return self._finish(self.web, queries, hits)

    def health(self) -> dict:
        if self.gone:
            return {"status": "down", "error": self.gone}
        rid, fut = next(self._ids), Future()
        self._pending[rid] = fut
        try:
            self._send(("health", rid, None))
            return {**fut.result(timeout=HEALTH_TIMEOUT_S), "frontend_pid": os.getpid()}
        except WorkerGone as err:
            return {"status": "down", "error": str(err)}
        except TimeoutError:
            self._pending.pop(rid, None)
            return {"status": "down", "error": f"the batch worker did not answer within {HEALTH_TIMEOUT_S:g} s"}

    def close(self) -> None:
        self.closed = True
        self.conn.close()

    def _send(self, message) -> None:
        try:
            with self._send_lock:
                self.conn.send(message)
        except (OSError, ValueError) as err:       # the pipe is broken or closed: the worker is gone
            self._worker_gone(f"the batch worker is gone ({type(err).__name__}); the server is stopping")
            raise WorkerGone(self.gone) from None

    def _cancel(self, rid: int) -> None:
        self._pending.pop(rid, None)
        try:
            self._send(("cancel", rid, None))
        except WorkerGone:
            pass

    def _read(self) -> None:
        while True:
            try:
                kind, rid, payload = self.conn.recv()
            except (EOFError, OSError, TypeError, ValueError):   # TypeError/ValueError: closed under recv
                if self.closed:
                    return
                self._worker_gone("the batch worker exited; the server is stopping (retry on another replica)")
                return
            fut = self._pending.pop(rid, None)
            try:
                if fut is not None:
                    fut.set_result(payload) if kind == "result" else fut.set_exception(decode_error(*payload))
            except InvalidStateError:             # cancelled meanwhile
                pass

    def _worker_gone(self, reason: str) -> None:
        if self.gone is None:
            self.gone = reason
            log.error("%s", reason)
        for rid in list(self._pending):
            fut = self._pending.pop(rid, None)
            if fut is not None and not fut.done():
                try:
                    fut.set_exception(WorkerGone(reason))
                except InvalidStateError:
                    pass


def frontend_main(sock: socket.socket, conn, up, settings: dict) -> None:
    """One front-end process: uvicorn + the app over a RemoteService on the shared socket;
    sends its pid on `up` once uvicorn accepts connections."""
    die_with_parent(settings["supervisor_pid"])
    import uvicorn  # lazy: only when serving

    create_app, server_config = settings["create_app"], settings["server_config"]

    from orchestrator.redaction import install_log_redaction

    install_log_redaction()     # keys (a web search's too) out of every log line
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    limits = settings["limits"]
    service = RemoteService(conn, web_search_from_env(min_docs=settings["web_min_docs"]),
                            tokenize=query_tokenizer(settings.get("query_tokenizer")))
    app = create_app(service, limits, default_min_score=settings["min_score"],
                     default_min_length=settings["min_length"])
    config = server_config(app, settings["host"], sock.getsockname()[1], limits)

    class Announcing(uvicorn.Server):
        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started:            # the app's lifespan ran and the socket is being served
                up.send(os.getpid())
                up.close()

    Announcing(config).run(sockets=[sock])


def query_tokenizer(spec: dict | None):
    """The worker encoder's query tokenizer for a front end (None: the worker tokenises: BM25, an
    encoder without a spec, or a tokenizer that fails to load here, which is logged)."""
    if not spec:
        return None
    try:
        return QueryTokenizer(**spec)
    except Exception as err:            # noqa: BLE001 -- the worker can still tokenise: serve, and say so
        log.warning("front end %d: the query tokenizer %s did not load (%s: %s); the batch worker tokenises",
                    os.getpid(), spec.get("path"), type(err).__name__, err)
        return None


# ---- batch worker ----------------------------------------------------------------------------
def serve_connection(service, conn, index: int, counts: list[int]) -> None:
    """Answer one front end's messages until its pipe closes (`counts[index]`: requests taken)."""
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    pending: dict[int, Future] = {}

    def send_all():                 # a slow front end never blocks the batch thread
        while (message := outbox.get()) is not None:
            try:
                conn.send(message)
            except (OSError, ValueError):
                return

    sender = threading.Thread(target=send_all, name=f"retrieval-worker-send-{index}", daemon=True)
    sender.start()

    def reply(rid: int, fut: Future) -> None:
        pending.pop(rid, None)
        if fut.cancelled():
            return                  # the front end gave up on it and dropped its Future
        err = fut.exception()
        outbox.put(("error", rid, encode_error(err)) if err else ("result", rid, fut.result()))

    while True:
        try:
            kind, rid, payload = conn.recv()
        except (EOFError, OSError):
            break
        if kind == "retrieve":
            counts[index] += 1
            try:
                fut = service.submit(payload)
            except Exception as err:        # noqa: BLE001 -- QueryError, Overloaded, ...: to the client
                outbox.put(("error", rid, encode_error(err)))
                continue
            pending[rid] = fut
            fut.add_done_callback(lambda f, rid=rid: reply(rid, f))
        elif kind == "cancel":
            fut = pending.pop(rid, None)
            if fut is not None:
                fut.cancel()                # skipped by the batcher unless already running
        elif kind == "health":
            health = {**service.health(), "frontends": len(counts), "requests_per_frontend": list(counts),
                      "worker_pid": os.getpid()}
            outbox.put(("result", rid, health))
    outbox.put(None)
    sender.join(5)


def worker_main(args, conns: list, ready, supervisor_pid: int, load_service) -> None:
    """The batch-worker process: load the service, report to the supervisor, serve every front end.
    A load error goes to the supervisor as ("error", message, exit status): 2 for a bad index or
    flag (as one process exits), 1 for anything else (a CUDA error, out of memory, ...)."""
    die_with_parent(supervisor_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)      # Ctrl-C reaches the supervisor, which stops us
    from orchestrator.redaction import install_log_redaction

    install_log_redaction()     # keys (a web search's too) out of every log line
    logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    try:
        service = load_service(args)
    except (FileNotFoundError, ValueError) as err:
        ready.send(("error", str(err), 2))
        return
    except Exception as err:            # reported by the supervisor, which exits 1
        log.exception("the batch worker failed to load %s", args.index)
        ready.send(("error", f"{type(err).__name__}: {err}", 1))
        return
    encoder = getattr(getattr(service, "searcher", None), "encoder", None)
    spec = encoder.query_tokenizer_spec() if hasattr(encoder, "query_tokenizer_spec") else None
    ready.send(("ok", spec, None))     # the front ends tokenise with this (None: the worker does)
    ready.close()
    counts = [0] * len(conns)
    threads = [threading.Thread(target=serve_connection, args=(service, conn, i, counts),
                                name=f"retrieval-worker-recv-{i}", daemon=True) for i, conn in enumerate(conns)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    service.close()


# ---- supervisor ------------------------------------------------------------------------------
def listen(host: str, port: int) -> socket.socket:
    """The listening socket every front end accepts on (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=2048)
    sock.set_inheritable(True)
    return sock


def serve(args, limits, registration, *, create_app, server_config, load_service) -> int:
    """Run the worker and `args.frontends` front ends until a signal (0) or a child's death (1).
    `registration(port) -> (on_started, on_stopped)`: the endpoints-file hooks.  retrieval.server
    hands in its app factory, uvicorn config and service loader (module functions: the spawned
    children unpickle them by name), so this module does not import the server's."""
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe(duplex=True) for _ in range(args.frontends)]
    ready_recv, ready_send = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=worker_main, args=(args, [w for w, _ in pipes], ready_send, os.getpid(), load_service),
                         name="retrieval-worker")
    worker.start()
    ready_send.close()
    for w, _ in pipes:
        w.close()                   # only the worker holds these: its death closes the front ends' pipes
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    status, spec = _wait_ready(worker, ready_recv, stop)
    if status is not None:
        for _, f in pipes:
            f.close()
        return status
    sock = listen(args.host, args.port)
    port = sock.getsockname()[1]
    settings = {"create_app": create_app, "server_config": server_config, "limits": limits, "host": args.host,
                "min_score": args.min_score, "min_length": args.min_length, "web_min_docs": args.web_min_docs,
                "supervisor_pid": os.getpid(), "query_tokenizer": spec}
    ups = [ctx.Pipe(duplex=False) for _ in pipes]
    fronts = [ctx.Process(target=frontend_main, args=(sock, f, up, settings), name=f"retrieval-frontend-{i}")
              for i, ((_, f), (_, up)) in enumerate(zip(pipes, ups))]
    for p in fronts:
        p.start()
    for (_, f), (_, up) in zip(pipes, ups):
        f.close()
        up.close()
    sock.close()
    status = _wait_serving(worker, dict(zip((r for r, _ in ups), fronts)), local_url(args.host, port), stop)
    if status is not None:
        _stop(fronts + [worker])
        return status
    started, stopped = registration(port)
    log.info("batch worker pid %d; %d front-end processes", worker.pid, len(fronts))
    started()
    code = _supervise(worker, fronts, stop)
    _stop(fronts + [worker])
    if stopped:
        stopped()
    return code


def _wait_ready(worker, ready_recv, stop: threading.Event) -> tuple[int | None, dict | None]:
    """(None, the worker's query-tokenizer spec) once it has loaded the index; else (the exit
    status, None) (2: bad index or flags)."""
    while not stop.is_set():
        ready = wait([ready_recv, worker.sentinel], timeout=0.5)
        if ready_recv in ready:
            try:
                status, message, code = ready_recv.recv()
            except EOFError:
                worker.join(10)
                status, message, code = "error", f"the batch worker exited while loading (exit code {worker.exitcode})", 1
            if status == "ok":
                return None, message
            print(f"error: {message}", file=sys.stderr, flush=True)
            worker.join(10)
            return code, None
        if worker.sentinel in ready:
            worker.join(1)
            print(f"error: the batch worker exited while loading (exit code {worker.exitcode})",
                  file=sys.stderr, flush=True)
            return 1, None
    _stop([worker])
    return 0, None


def _wait_serving(worker, ups: dict, url: str, stop: threading.Event) -> int | None:
    """None once every front end (`ups`: its pipe -> its process) accepts connections and
    `url`/health answers 200; 1 if a child exits first; 0 on a signal."""
    procs = [worker, *ups.values()]
    waiting = dict(ups)
    while not stop.is_set():
        if any(not p.is_alive() for p in procs):
            return _died_starting(procs)
        if waiting:
            for conn in wait(list(waiting) + [p.sentinel for p in procs], timeout=0.5):
                if conn in waiting:
                    try:
                        conn.recv()
                    except EOFError:        # it exited before serving: the next round reports it
                        continue
                    conn.close()
                    del waiting[conn]
        elif health_ok(url):
            return None
        else:
            stop.wait(0.2)
    return 0


def _died_starting(procs) -> int:
    proc = next(p for p in procs if not p.is_alive())
    proc.join(1)
    print(f"error: {proc.name} exited while the server was starting (exit code {proc.exitcode})",
          file=sys.stderr, flush=True)
    return 1


def local_url(host: str, port: int) -> str:
    """Where the supervisor reaches its own front ends (a wildcard host: the loopback)."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def health_ok(url: str) -> bool:
    """GET `url`/health answers 200 (no proxy: it is this machine's own server)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(url + "/health", timeout=HEALTH_TIMEOUT_S + 1) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _supervise(worker, fronts, stop: threading.Event) -> int:
    sentinels = {worker.sentinel: worker, **{p.sentinel: p for p in fronts}}
    while not stop.is_set():
        dead = wait(list(sentinels), timeout=0.5)
        if not dead or stop.is_set():
            continue
        proc = sentinels[dead[0]]
        proc.join(1)                # reap it: its exit code
        if proc is worker:
            log.error("the batch worker exited (exit code %s); front ends answer 503 for %g s, then the server stops",
                      worker.exitcode, WORKER_GONE_GRACE_S)
            stop.wait(WORKER_GONE_GRACE_S)
        else:
            log.error("front end %s exited (exit code %s); stopping the server", proc.name, proc.exitcode)
        return 1
    return 0


def _stop(procs) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()           # SIGTERM: uvicorn finishes the requests in flight
    for p in procs:
        p.join(15)
        if p.is_alive():
            p.kill()
            p.join(5)
