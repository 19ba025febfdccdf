"""The FastAPI application: POST /v1/chat/completions (plain or streamed), GET /v1/models and
GET /health, with OpenAI's error shape for every refusal (orchestrator/serve/__init__.py)."""
# No `from __future__ import annotations`: FastAPI must see the real request model classes.
import asyncio
import logging
import uuid

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from orchestrator.serve.responses import completion, episode_failed, orchestra
from orchestrator.serve.schema import ChatRequest, RequestError, error_body
from orchestrator.serve.service import Busy, Job, Served, ServeLimits, Service
from orchestrator.serve.stream import client_gone, deadline_message, first, stop_late, stream

log = logging.getLogger("orchestrator.serve")


def create_app(served: Served, limits: ServeLimits = ServeLimits()) -> FastAPI:
    from retrieval.server import BodyLimit, invalid_field

    service = Service(served, limits)
    app = FastAPI(title="ToolOrchestra orchestrator", version="1")
    app.add_middleware(BodyLimit, max_bytes=limits.max_body_bytes, timeout_s=limits.body_timeout_s)
    app.state.service = service

    def fail(status: int, message: str, param: str | None = None, code: str | None = None,
             headers: dict | None = None, **extra) -> JSONResponse:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return JSONResponse(status_code=status, content=error_body(message, kind, param, code, **extra),
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError):
        name, msg = invalid_field(exc.errors())
        return fail(422, f"{name}: {msg}", param=name, code="invalid_value")

    @app.exception_handler(HTTPException)
    async def _http(_request: Request, exc: HTTPException):
        if exc.status_code == 400:      # a body FastAPI cannot decode
            return fail(422, f"body: not valid JSON ({exc.detail})", param="body", code="invalid_value")
        return fail(exc.status_code, str(exc.detail))

    @app.get("/health")
    def health() -> dict:
        return service.health()

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": served.name, "object": "model", "created": 0,
                                            "owned_by": "toolorchestra"}]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatRequest, request: Request):
        try:
            question, preference = service.task(body)
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
            return fail(500, f"orchestrator: {type(exc).__name__}: {exc}", code="episode_failed")
        finally:
            gone.cancel()
        failed = episode_failed(rollout)
        service.count("error" if failed else rollout.stop_reason.split(":")[0])
        if failed:
            return fail(502, f"orchestrator: {failed} (after {len(rollout.turns)} turns)", code="episode_failed",
                        orchestra=orchestra(rollout, job))
        return completion(rollout, job, served.name)

    def _stopped(job: Job, gone: asyncio.Future) -> JSONResponse:
        outcome = stop_late(job, gone, limits)
        service.count(outcome)
        if outcome == "disconnected":
            return fail(499, "client disconnected")
        return fail(504, deadline_message(limits), code="deadline_exceeded")

    return app
