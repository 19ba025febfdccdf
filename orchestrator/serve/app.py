"""The FastAPI application: POST /v1/chat/completions (plain or streamed), GET /v1/models,
GET /health (liveness) and GET /health/ready (readiness: 503 until the models are loaded), with
OpenAI's error shape for every refusal: the app's own, FastAPI's and Starlette's (validation,
404, 405, any exception) and the body and header limits' (413, 408, 431, 400: `serve_error`)."""
# No `from __future__ import annotations`: FastAPI must see the real request model classes.
import asyncio
import json
import logging
import threading
import uuid
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from orchestrator.serve.responses import completion, episode_failed, orchestra
from orchestrator.serve.schema import (PATH_CHARS, ChatRequest, ErrorResponse, RequestError, clip, error_body,
                                       surrogate_at)
from orchestrator.serve.service import Busy, Job, Served, ServeLimits, Service
from orchestrator.serve.stream import client_gone, deadline_message, first, stop_late, stream

log = logging.getLogger("orchestrator.serve")
LIMIT_CODES = {400: "invalid_http", 408: "timeout", 413: "body_too_large", 431: "headers_too_large"}


def error_type(status: int) -> str:
    return "invalid_request_error" if status < 500 else "server_error"


def serve_error(status: int, message: str) -> dict:
    """The body of a refusal made outside the app (retrieval/server.py's BodyLimit and header
    limits, handed this by create_app and cli.py): OpenAI's shape."""
    return error_body(message, error_type(status), code=LIMIT_CODES.get(status))


class BadText(HTTPException):
    """A JSON body holding a lone surrogate (no UTF-8 can carry it): 422 naming where."""

    def __init__(self, param: str, text: str):
        bad = next(i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF)
        super().__init__(422, f"{clip(param, PATH_CHARS)}: a lone surrogate ({ascii(text[bad])[1:-1]}) at character {bad}: "
                              f"text must be valid Unicode (UTF-8)")
        self.param = param


class CheckedRequest(Request):
    async def json(self):
        """The body as JSON, refused (BadText) when any string or key in it is not valid Unicode."""
        if not hasattr(self, "_json"):
            data = json.loads(await self.body())
            found = surrogate_at(data)
            if found is not None:
                where, text = found
                raise BadText(".".join(str(p) for p in where) or "body", text)
            self._json = data
        return self._json


class CheckedRoute(APIRoute):
    """A route whose JSON body is read by `CheckedRequest`."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def route(request: Request):
            return await handler(CheckedRequest(request.scope, request.receive))
        return route


def create_app(served: Served, limits: ServeLimits = ServeLimits()) -> FastAPI:
    from retrieval.server import BodyLimit, invalid_field

    service = Service(served, limits)

    @asynccontextmanager
    async def lifespan(_app):
        threading.Thread(target=service.load, name="serve-load", daemon=True).start()
        yield

    refused = {"model": ErrorResponse, "description": "refused, in OpenAI's error shape"}
    app = FastAPI(title="ToolOrchestra orchestrator", version="1", lifespan=lifespan,
                  responses={"4XX": refused, "5XX": refused})
    app.router.route_class = CheckedRoute
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s,
                       error_body=serve_error)
    app.state.service = service

    def fail(status: int, message: str, param: str | None = None, code: str | None = None,
             headers: dict | None = None, **extra) -> JSONResponse:
        return JSONResponse(status_code=status, content=error_body(message, error_type(status), param, code, **extra),
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        name, msg = invalid_field(exc.errors())
        return fail(422, f"{clip(name, PATH_CHARS)}: {msg}", param=name, code="invalid_value")

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, exc: HTTPException):
        if isinstance(exc, BadText):
            return fail(422, exc.detail, param=exc.param, code="invalid_value")
        if exc.status_code == 400:      # a body FastAPI cannot decode
            return fail(422, f"body: not valid JSON ({exc.detail})", param="body", code="invalid_value")
        return fail(exc.status_code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _crash(_request: Request, exc: Exception):   # a bug: logged, answered in the shape all the same
        log.error("unhandled %s", type(exc).__name__, exc_info=exc)
        return fail(500, f"internal error ({type(exc).__name__}); the server log has the details",
                    code="internal_error")

    @app.get("/health")
    def health() -> dict:
        return service.health()

    @app.get("/health/ready")
    def ready():
        why = service.not_ready()
        if why is not None:
            return fail(503, why, code="loading" if not service.load_error else "load_failed",
                        headers={"Retry-After": "1"})
        return {"status": "ready", "model": served.name, "load_seconds": service.load_seconds}

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": 0,
                                            "owned_by": "toolorchestra"}]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        try:
            question, preference = service.task(body)
            why = service.not_ready()
            if why is not None:
                return fail(503, why, code="loading" if not service.load_error else "load_failed",
                            headers={"Retry-After": "1"})
            service.admit()
        except RequestError as exc:
            return fail(exc.status, str(exc), param=exc.field, code=exc.code)
        except Busy as exc:
            return fail(503, str(exc), code="busy", headers={"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limits.request_timeout_s
        job = Job(f"chatcmpl-{uuid.uuid4().hex}", question, preference, body.budget, loop)
        if body.stream:
            return StreamingResponse(stream(service, job, deadline, request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        gone = asyncio.ensure_future(client_gone(request))
        gone.add_done_callback(lambda g: g.cancelled() or job.cancel("client disconnected"))   # at once
        try:
            future = await first(service.start(job, deadline), gone, deadline)
            if future is None:
                return _stopped(job, gone)
            rollout = await first(asyncio.shield(future), gone, deadline)
            if rollout is None:
                return _stopped(job, gone)
        except Exception as exc:   # the loop itself raised: a server error, the server goes on
            log.exception("request %s failed", job.id)
            service.count("error")
            return fail(500, f"orchestrator: {type(exc).__name__}: {clip(str(exc), 300)}", code="episode_failed")
        finally:
            gone.cancel()
        failed = episode_failed(rollout)
        service.count("error" if failed else rollout.stop_reason.split(":")[0])
        if failed:
            return fail(502, f"orchestrator: {clip(failed, 300)} (after {len(rollout.turns)} turns)",
                        code="episode_failed", orchestra=orchestra(rollout, job))
        return completion(rollout, job, served.name)

    def _stopped(job: Job, gone: asyncio.Future) -> JSONResponse:
        outcome = stop_late(job, gone, limits)
        service.count(outcome)
        if outcome == "disconnected":
            return fail(499, "client disconnected")
        return fail(504, deadline_message(limits), code="deadline_exceeded")

    return app
