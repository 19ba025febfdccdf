"""HTTP retrieval server speaking Search-R1's /retrieve contract (FastAPI + uvicorn).

    python -m retrieval.server --index DIR [--host 127.0.0.1] [--port 8000] [--method dense|bm25]
        [--eid-file eids.json] [--endpoints-file endpoints.json] [--device cuda]

POST /retrieve  {"queries": [str], "topk": int, "return_scores": bool,
                 "eid": str?, "min_score": float?, "min_length": int?}
  -> {"result": [[{"document": {"id", "contents"}, "score": float}, ...] per query],
      "usage": {"web_searches": int, "pages": int}}
  (without return_scores each hit is the bare document, as in Search-R1)
GET /health; GET /openapi.json and /docs as FastAPI serves them.

Concurrent requests are micro-batched (one encoder call, one index search per batch) by
worker threads (one per core on CPU, one on GPU); index access is serialised. Limits
answer 422 naming the field, as does a body that is not JSON; too large a body 413 (declared
or chunked); a body not received within --body-timeout 408 (the connection is closed); a
request line and headers not received within --header-timeout 408 and closed (nothing sent:
closed), headers past 16 KiB without ending 431; a full queue or a request slower than --request-timeout 503,
so a client never waits forever and none can hold a connection.

`--frontends N` (N > 1) runs N HTTP processes feeding one batch-worker process that holds the
encoder and the index (retrieval/frontends.py); /health answers 503 when that worker is gone.
"""
# No `from __future__ import annotations`: FastAPI must see the real request model class.
import argparse
import asyncio
import json
import logging
import os
import socket
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from starlette.exceptions import HTTPException

from orchestrator.ports import PortError, check_port  # the base layer below retrieval (tests/test_imports.py LAYERS)
from orchestrator.redaction import install_log_redaction
from retrieval.batcher import Overloaded
from retrieval.encoders import set_cpu_threads
from retrieval.endpoints import register_endpoint, unregister_endpoint
from retrieval.frontends import WorkerGone, serve
from retrieval.searcher import Query, QueryError, Searcher
from retrieval.service import RetrievalService
from retrieval.web import web_search_from_env

log = logging.getLogger("retrieval.server")


@dataclass(frozen=True)
class Limits:
    max_queries: int = 64           # queries per request
    max_query_chars: int = 4096     # characters per query (the orchestrator cuts at ~390)
    max_topk: int = 200              # upstream FRAMES evaluation asks for 150
    max_body_bytes: int = 1 << 20   # 1 MiB of JSON
    request_timeout_s: float = 60.0
    body_timeout_s: float = 10.0    # the whole body must arrive within this (slow or half-sent requests)
    header_timeout_s: float = 10.0  # a request's line and headers must arrive within this (slowloris)
    max_header_bytes: int = 16384   # request line + headers (larger, not ended: 431 and closed)
    keep_alive_s: float = 30.0      # an idle kept-alive connection is closed after this


def request_model(limits: Limits) -> type[BaseModel]:
    """The /retrieve body, with this server's limits baked into its schema."""
    QueryText = Annotated[str, StringConstraints(max_length=limits.max_query_chars)]

    class RetrieveRequest(BaseModel):
        model_config = ConfigDict(extra="ignore")   # Search-R1 clients send extra keys
        queries: list[QueryText] = Field(min_length=1, max_length=limits.max_queries)
        topk: int | None = Field(None, ge=1, le=limits.max_topk, description="hits per query (default 3)")
        return_scores: bool = False
        eid: str | None = Field(None, min_length=1, max_length=256, description="key of a whitelist in --eid-file")
        min_score: float | None = Field(None, allow_inf_nan=False, description="drop hits scoring below this")
        min_length: int | None = Field(None, ge=0, le=10_000_000, description="drop documents shorter than this (chars)")

    return RetrieveRequest


def create_app(service: RetrievalService, limits: Limits = Limits(), default_min_score: float | None = None,
               default_min_length: int = 0, on_startup=None, on_shutdown=None) -> FastAPI:
    """The FastAPI app over `service`; closes the service when the app shuts down."""
    Body = request_model(limits)

    @asynccontextmanager
    async def lifespan(_app):
        if on_startup:
            on_startup()
        yield
        if on_shutdown:
            on_shutdown()
        service.close()

    app = FastAPI(title="ToolOrchestra retrieval", version="1", lifespan=lifespan)
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        field, msg = invalid_field(exc.errors())
        return JSONResponse(status_code=422, content={"error": f"{field}: {msg}", "detail": _jsonable(exc.errors())})

    @app.exception_handler(HTTPException)
    async def _unparsable(_request: Request, exc: HTTPException):
        # FastAPI answers 400 to a body its JSON decoder cannot even read (e.g. not UTF-8);
        # the contract (docs/retrieval.md) is 422 for every body that is not valid JSON.
        if exc.status_code == 400:
            return JSONResponse(status_code=422, content={"error": f"body: not valid JSON ({exc.detail})", "detail": [
                {"loc": ["body"], "msg": str(exc.detail), "type": "json_invalid"}]})
        return await http_exception_handler(_request, exc)

    @app.get("/health")
    def health() -> dict:
        state = service.health()
        return JSONResponse(status_code=503, content=state) if state.get("status") == "down" else state

    @app.post("/retrieve")
    async def retrieve(body: Body) -> dict:  # type: ignore[valid-type]
        topk = body.topk or 3
        min_length = body.min_length if body.min_length is not None else default_min_length
        min_score = body.min_score if body.min_score is not None else default_min_score
        queries = [Query(q, topk, body.eid, min_score, min_length) for q in body.queries]
        # With --frontends the worker checks and queues in another process: its QueryError and
        # Overloaded arrive through the Future, and are answered as when submit raises them here.
        try:
            fut = service.submit(queries)
            hits = await asyncio.wait_for(asyncio.wrap_future(fut), timeout=limits.request_timeout_s)
        except QueryError as err:
            return JSONResponse(status_code=422, content={"error": str(err), "detail": [
                {"loc": ["body", err.field], "msg": str(err), "type": "value_error"}]})
        except Overloaded as err:
            return _unavailable(f"server busy ({err}); retry later")
        except WorkerGone as err:
            return _unavailable(str(err))
        except asyncio.TimeoutError:
            return _unavailable(f"retrieval took longer than {limits.request_timeout_s:g} s; retry later")
        if service.web is None:          # nothing to fetch: skip a thread hop (ms on a busy CPU)
            hits, usage = service.finish(queries, hits)
        else:
            hits, usage = await run_in_threadpool(service.finish, queries, hits)
        result = hits if body.return_scores else [[h["document"] for h in row] for row in hits]
        return {"result": result, "usage": usage}

    return app


def invalid_field(errors: list[dict]) -> tuple[str, str]:
    """(field, message) of a request's first validation error: the dotted path in the body, or
    "body" when the body is not JSON at all (orchestrator/serve/ answers with it too)."""
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    # loc is ("body", field, index...); for unparsable JSON it is ("body", byte offset).
    field = "body" if first.get("type") == "json_invalid" else ".".join(str(p) for p in first["loc"][1:]) or "body"
    return field, str(first["msg"])


def _unavailable(message: str) -> JSONResponse:
    return JSONResponse(status_code=503, content={"error": message}, headers={"Retry-After": "1"})


def _jsonable(errors: list[dict]) -> list[dict]:
    # pydantic puts the offending input and exception objects in `ctx`; keep it to plain text.
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg")), "type": str(e.get("type"))} for e in errors]


def plain_error(status: int, message: str) -> dict:
    """This server's error body, {"error": message}; orchestrator/serve/ passes OpenAI's shape
    to `BodyLimit` and `server_config` instead."""
    return {"error": message}


class BodyLimit:
    """ASGI middleware: the whole request body is read here first, within `timeout_s` and
    `max_bytes`, then handed to the app. Over `max_bytes` (declared or streamed in chunks)
    answers 413; not all there within `timeout_s` (a slow or half-sent request) answers 408,
    after which uvicorn closes the connection, so no client can hold one open by stalling.
    `error_body(status, message)` is the refusals' JSON body."""

    def __init__(self, app, max_bytes: int, timeout_s: float, error_body=plain_error):
        self.app, self.max_bytes, self.timeout_s, self.error_body = app, max_bytes, timeout_s, error_body

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            return await self._reject(send, 413, f"request body over {self.max_bytes} bytes")
        chunks, seen = [], 0
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), deadline - asyncio.get_running_loop().time())
            except asyncio.TimeoutError:
                return await self._reject(send, 408, f"request body not received within {self.timeout_s:g} s",
                                          {"connection": "close"})
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.max_bytes:
                return await self._reject(send, 413, f"request body over {self.max_bytes} bytes")
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()   # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _reject(self, send, status: int, error: str, headers: dict | None = None):
        response = JSONResponse(status_code=status, content=self.error_body(status, error), headers=headers)
        await response({"type": "http"}, None, send)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m retrieval.server", description=__doc__.split("\n\n")[0])
    p.add_argument("--index", required=True, help="index folder made by retrieval.build_index")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--method", choices=("dense", "bm25"), default=None, help="default: dense when built")
    p.add_argument("--eid-file", default=None, help="JSON {eid: [doc_id, ...]} of per-question whitelists")
    p.add_argument("--device", default=None, help="cpu or cuda (fp16 encoder; flat index on the GPUs)")
    p.add_argument("--gpu-search", choices=("auto", "faiss", "torch"), default="auto",
                   help="on cuda, who searches a flat index: faiss-gpu, torch (exact top-k from the fp16 shards, "
                        "no faiss-gpu needed), or auto (faiss when it sees a GPU, else torch)")
    p.add_argument("--no-cuda-graphs", dest="cuda_graphs", action="store_false",
                   help="on cuda, run the query encoder eagerly instead of replaying CUDA graphs of bucketed shapes")
    p.add_argument("--threads", type=int, default=1,
                   help="torch/FAISS threads (default 1: batching gives the throughput; 0 = all cores)")
    p.add_argument("--encoder-runtime", choices=("auto", "torch", "onnx", "onnx-int8"), default="auto",
                   help="query encoder's runtime (default auto: onnx on the CPU when onnxruntime is installed)")
    p.add_argument("--min-score", type=float, default=None, help="default minimum score (requests may override)")
    p.add_argument("--min-length", type=int, default=0, help="default minimum document length in characters")
    p.add_argument("--web-min-docs", type=int, default=3,
                   help="Tavily fallback when fewer index hits survive (needs TAVILY_API_KEY)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="queries per micro-batch (default: 256 on cuda; 32 on CPU, about one encoder pass)")
    p.add_argument("--max-wait-ms", type=float, default=0.0, help="hold a micro-batch open this long")
    p.add_argument("--workers", type=int, default=None,
                   help="batch worker threads (default: 1 on cuda, else one per CPU core)")
    p.add_argument("--frontends", type=int, default=1,
                   help="HTTP processes (default 1: HTTP and the batch worker share one process); N > 1 runs N "
                        "uvicorn front ends feeding one batch-worker process that holds the encoder and index")
    p.add_argument("--request-timeout", type=float, default=60.0, help="seconds before a request answers 503")
    p.add_argument("--body-timeout", type=float, default=10.0,
                   help="seconds to receive a request's whole body before answering 408 and closing")
    p.add_argument("--header-timeout", type=float, default=10.0,
                   help="seconds to receive a request's line and headers before answering 408 and closing "
                        "(a connection that sends nothing is closed as well)")
    p.add_argument("--endpoints-file", default=None,
                   help="register this server as 'retrieval' in the endpoints JSON (removed at shutdown)")
    p.add_argument("--advertise-host", default=None, help="host name written to --endpoints-file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    install_log_redaction()     # keys (a web search's too) out of every log line
    try:   # before the index loads (minutes): a bad or taken port is one line now, not a hang then
        check_port(args.port, "--port", host=args.host)
    except PortError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    limits = Limits(request_timeout_s=args.request_timeout, body_timeout_s=args.body_timeout,
                    header_timeout_s=args.header_timeout)
    if args.frontends < 1:
        print(f"error: --frontends {args.frontends}: give 1 (one process) or more HTTP processes", file=sys.stderr)
        return 2
    if args.frontends > 1:
        return serve(args, limits, lambda port: _registration(args, port), create_app=create_app,
                     server_config=server_config, load_service=_load_service)
    try:
        service = _load_service(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    port = args.port or _free_port(args.host)
    register, unregister = _registration(args, port)
    app = create_app(service, limits, default_min_score=args.min_score,
                     default_min_length=args.min_length, on_startup=register, on_shutdown=unregister)
    import uvicorn  # lazy: only when serving
    uvicorn.Server(server_config(app, args.host, port, limits)).run()
    return 0


def server_config(app, host: str, port: int, limits: Limits = Limits(), error_body=plain_error):
    """How uvicorn serves `app` (main and the tests run this same configuration): its default
    HTTP parser (httptools when installed, else h11) under `header_deadline_protocol`, which bounds
    each request's headers in time and size, and the keep-alive timeout.  `error_body(status,
    message)`: the JSON body of the refusals the protocol writes itself (408, 431, 400)."""
    import uvicorn  # lazy: only when serving

    return uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_keep_alive=limits.keep_alive_s,
                          h11_max_incomplete_event_size=limits.max_header_bytes,
                          http=header_deadline_protocol(limits.header_timeout_s, limits.max_header_bytes, error_body))


def _reply(status: str, body: dict) -> bytes:
    body = json.dumps(body).encode()
    return (f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n").encode() + body


def header_deadline_protocol(seconds: float, max_bytes: int, error_body=plain_error) -> type:
    """uvicorn's HTTP protocol, closing a connection whose request line and headers do not all
    arrive within `seconds` of its opening (or, on a kept-alive connection, of the next request's
    first byte), or run past `max_bytes` without ending.  uvicorn has neither bound for httptools
    (its parser when installed) and no time bound at all: its keep-alive timer runs only after a
    response and any byte cancels it, so a client sending half a header (or nothing) held its
    connection for ever.  Partial headers are answered 408 before the close, a silent connection
    is just closed, oversized headers get 431.  The body is BodyLimit's (`body_timeout_s`).  A
    request uvicorn cannot parse gets 400 with a JSON body (uvicorn's own is plain text)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol  # lazy: only when serving

    timed_out = _reply("408 Request Timeout", error_body(408, f"request headers not received within {seconds:g} s"))
    too_large = _reply("431 Request Header Fields Too Large", error_body(431, f"request headers over {max_bytes} bytes"))

    class HeaderDeadline(AutoHTTPProtocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._header_timer = None
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()                     # the first bytes of the next request
            if self._header_timer is not None:  # still waiting for this request's headers to end
                self._header_seen += len(data)
                ended = b"\r\n\r\n" in self._header_tail + data
                self._header_tail = (self._header_tail + data)[-3:]
                if self._header_seen > max_bytes and not ended:
                    return self._close(too_large)
            super().data_received(data)
            self._check()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._check()

        def send_400_response(self, msg: str) -> None:      # uvicorn: a request it cannot parse
            self._close(_reply("400 Bad Request", error_body(400, f"invalid HTTP request: {msg}")))

        def connection_lost(self, exc) -> None:
            self._cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._armed_for, self._header_seen, self._header_tail = self.cycle, 0, b""
            self._header_timer = self.loop.call_later(seconds, self._expire)

        def _cancel(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _check(self) -> None:
            if self._header_timer is not None and self.cycle is not self._armed_for:
                self._cancel()                  # a new request's headers arrived in time

        def _expire(self) -> None:
            self._header_timer = None
            if self.cycle is self._armed_for:
                self._close(timed_out if self._header_seen else None)

        def _close(self, reply: bytes | None) -> None:
            self._cancel()
            if not self.transport.is_closing():
                if reply:
                    self.transport.write(reply)
                self.transport.close()

    return HeaderDeadline


def _load_service(args) -> RetrievalService:
    set_cpu_threads(args.threads)
    searcher = Searcher(args.index, method=args.method, device=args.device, eid_file=args.eid_file,
                        encoder_runtime=args.encoder_runtime, gpu_search=args.gpu_search, cuda_graphs=args.cuda_graphs)
    web = web_search_from_env(min_docs=args.web_min_docs)
    log.info("loaded %s (%s, %d documents); web fallback %s", args.index, searcher.method,
             len(searcher.store), "on" if web else "off (no TAVILY_API_KEY)")
    # GPU: one worker, big batches (a batch costs about what one query does). CPU: one worker
    # per core with batches of about one encoder pass, so the cores share the work.
    gpu = searcher.device.startswith("cuda")
    workers = args.workers or (1 if gpu else os.cpu_count() or 1)
    max_batch = args.max_batch or (256 if gpu else 32)
    log.info("%d batch worker(s) of up to %d queries, %s torch/FAISS thread(s) each", workers, max_batch,
             args.threads or "all")
    return RetrievalService(searcher, web, max_batch=max_batch, max_wait_s=args.max_wait_ms / 1000, workers=workers)


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _registration(args, port: int):
    """Start-up/shut-down hooks: log the address and, optionally, (un)register it."""
    host = args.advertise_host or (socket.getfqdn() if args.host in ("0.0.0.0", "::") else args.host)
    url = f"http://{host}:{port}"
    if not args.endpoints_file:
        return (lambda: log.info("serving at %s", url)), None

    def register():
        register_endpoint(args.endpoints_file, "retrieval", url, pid=os.getpid())
        log.info("serving at %s (registered as 'retrieval' in %s)", url, args.endpoints_file)

    return register, lambda: unregister_endpoint(args.endpoints_file, "retrieval", url)


if __name__ == "__main__":
    sys.exit(main())
