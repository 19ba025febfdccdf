"""Serve a trained orchestrator behind an OpenAI-compatible API (FastAPI + uvicorn).

    python -m orchestrator.serve --model NAME [--endpoint URL] [--profile NAME] [--section hle|frames]
        [--retriever URL | --index DIR] [--host 127.0.0.1] [--port 8080] [--concurrency N] [--queue N]
        [--request-timeout S]

The orchestrator is `--model` (a configs/models.yaml name; a checkpoint behind vLLM is `--endpoint
URL`), run as run_hle.py / run_frames.py run it: the same flags, the same profile section
(`--section`, default hle: `qa.hle` of configs/profiles/<profile>.yaml gives turns, tokens,
prompts, experts and retrieval), the same set-up (evaluation/qa_cli.py `resolve`, `build_setup`)
and the same loop (evaluation/qa.py `play`, orchestrator/loop.py).  Nothing here chooses a
budget or a prompt of its own.

POST /v1/chat/completions   the last user message is the task; the reply's message content is
    the loop's final answer (null when it stopped without one: finish_reason "length" and
    `orchestra.stop_reason` say why).  Extra body fields (the openai SDK's `extra_body`):
      preference  a preset (accuracy, cost, latency, balanced, avoid_tool:T, prefer_alias:A,
                  avoid_alias:A) or a weight vector ("accuracy=1,cost=0.5" or {"cost": 0.5}),
                  stated to the orchestrator in training's words (evaluation/preference.py)
      budget      {"dollars": D, "turns": N}: before each orchestrator turn the loop stops when
                  D dollars are spent or N turns taken (a turn under way finishes: the spend
                  can pass D by that turn's cost)
    `usage` counts the orchestrator's own tokens over its turns; `orchestra` has dollars,
    seconds (tool latency, the paper's), wall_seconds, turns, stop_reason, budget, preference and
    `trace` (per turn: tool, alias, model, cost, latency, error, tokens; evaluation's turn record).
    `stream: true`: server-sent chat.completion.chunk events, one per orchestrator turn (its
    text and call in `delta.reasoning_content`, the turn record in `orchestra.turn`), then the
    answer in `delta.content` with the finish reason, a last chunk with `usage` and
    `orchestra`, and `data: [DONE]`.  Other OpenAI fields (temperature, max_tokens...) are
    ignored: the profile decides them.
GET /v1/models, GET /health (running, queued, limits, counts of finished requests).

Limits: `--concurrency` episodes run at once (default: evaluation's, 1 for an in-process model),
`--queue` more wait; past that 503 with Retry-After.  A request not answered within
`--request-timeout` gets 504 (streams: an error event), and its episode stops before its next
turn; so does the episode of a client that disconnects.  Bad input: 400/404/422 with one line
naming the field.
"""
# No `from __future__ import annotations`: FastAPI must see the real request model classes.
import argparse
import asyncio
import json
import logging
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

log = logging.getLogger("orchestrator.serve")
SECTIONS = ("hle", "frames")      # the QA sections (configs/profiles/*.yaml `qa.<use>`) a server can run


@dataclass(frozen=True)
class ServeLimits:
    concurrency: int = 1             # episodes running at once
    queue: int = 16                  # requests waiting for a slot; past that 503
    request_timeout_s: float = 300.0
    max_question_chars: int = 100_000
    max_messages: int = 256
    max_body_bytes: int = 4 << 20
    body_timeout_s: float = 10.0     # retrieval/server.py's guards, reused (BodyLimit, server_config)
    header_timeout_s: float = 10.0
    max_header_bytes: int = 16384
    keep_alive_s: float = 30.0


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dollars: float | None = Field(None, gt=0, allow_inf_nan=False, description="stop once this much is spent")
    turns: int | None = Field(None, ge=1, le=10_000, description="stop after this many orchestrator turns")


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")     # OpenAI clients send sampling keys the profile decides here
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    preference: str | dict[str, float] | None = None
    budget: Budget | None = None


class RequestError(ValueError):
    def __init__(self, status: int, field_name: str, message: str, code: str = "invalid_request"):
        super().__init__(f"{field_name}: {message}")
        self.status, self.field, self.code = status, field_name, code


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None, **extra) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}, **extra}


@dataclass
class Served:
    """What every request of a server shares: the evaluation set-up of one model and section."""

    name: str                         # the model id clients ask for
    setup: Any                        # evaluation.qa.QASetup
    section: str
    profile: str
    search: bool                      # a retriever is configured (the search tool is offered)
    line: str = ""                    # what was chosen, as the evaluation scripts print it


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m orchestrator.serve", description=__doc__.split("\n\n")[0],
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
    s.add_argument("--port", type=int, default=8080, help="0 picks a free port")
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
    """The set-up evaluation builds for `args` (evaluation/qa_cli.py): profile, budgets, runtime, policy.
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
    _, settings, line = resolve(args, args.section, catalog)
    price_model = resolve_price_model(args, catalog)
    if args.endpoint:
        use_endpoint(args, Path(tempfile.mkdtemp(prefix="orchestrator-serve-")), price_model)
    check_serve(catalog, args.serve, args.tools, args.pricing)
    check_models(args, catalog)
    retriever = make_retriever(args)
    setup = build_setup(args, catalog, price_model, retriever, settings)
    return Served(name=args.served_name or args.model, setup=setup, section=args.section, profile=args.profile,
                  search=retriever is not None, line=line.rsplit("; judge ", 1)[0])


def limits_from(args: argparse.Namespace) -> ServeLimits:
    return ServeLimits(concurrency=args.concurrency, queue=args.queue, request_timeout_s=args.request_timeout)


# ---- one request ---------------------------------------------------------------------------------

class Job:
    """One request's episode: runs in a worker thread; `before_turn` (the loop's hook) publishes
    finished turns, enforces the budget and stops the episode once `cancel` is called."""

    def __init__(self, request_id: str, question: str, preference, budget: Budget | None,
                 loop: asyncio.AbstractEventLoop):
        self.id, self.question, self.preference, self.budget = request_id, question, preference, budget
        self.events: asyncio.Queue = asyncio.Queue()
        self.cancelled: str | None = None
        self.started = time.monotonic()
        self._loop, self._sent, self._lock = loop, 0, threading.Lock()

    def cancel(self, why: str) -> None:
        self.cancelled = self.cancelled or why

    def before_turn(self, rollout) -> str | None:
        for record in self.new_turns(rollout):      # to the stream, in order
            self._loop.call_soon_threadsafe(self.events.put_nowait, ("turn", record))
        if self.cancelled:
            return f"cancelled: {self.cancelled}"
        budget = self.budget
        if budget is not None and budget.turns is not None and len(rollout.turns) >= budget.turns:
            return f"budget: {len(rollout.turns)} turns taken, the request's budget is {budget.turns}"
        if budget is not None and budget.dollars is not None and rollout.cost >= budget.dollars:
            return f"budget: ${rollout.cost:.6f} spent, the request's budget is ${budget.dollars:g}"
        return None

    def new_turns(self, rollout) -> list[dict]:
        """Records of the turns finished since the last call (evaluation's turn record)."""
        from evaluation.qa import turn_record

        with self._lock:
            new, self._sent = rollout.turns[self._sent:], len(rollout.turns)
        return [turn_record(turn) for turn in new]


class Busy(RuntimeError):
    pass


class Service:
    """Admission (a semaphore of `concurrency` slots, `queue` waiting), worker threads, counts."""

    def __init__(self, served: Served, limits: ServeLimits):
        self.served, self.limits = served, limits
        self.pool = ThreadPoolExecutor(max_workers=limits.concurrency, thread_name_prefix="episode")
        self.slots: asyncio.Semaphore | None = None
        self.admitted = self.running = 0
        self.counts: dict[str, int] = {}

    def count(self, outcome: str) -> None:
        self.counts[outcome] = self.counts.get(outcome, 0) + 1

    def health(self) -> dict:
        return {"status": "ok", "model": self.served.name, "profile": self.served.profile,
                "section": self.served.section, "search": self.served.search, "running": self.running,
                "queued": self.admitted - self.running,
                "limits": {"concurrency": self.limits.concurrency, "queue": self.limits.queue,
                           "request_timeout_s": self.limits.request_timeout_s}, "finished": dict(self.counts)}

    def task(self, body: ChatRequest):
        """(question, stated preference) of a request, or RequestError naming the field."""
        from data_synthesis.preferences import PreferenceError
        from evaluation.preference import state_preference

        if body.model != self.served.name:
            raise RequestError(404, "model", f"{body.model!r} is not served here; this server serves "
                                             f"{self.served.name!r} (GET /v1/models)", "model_not_found")
        index = next((i for i in range(len(body.messages) - 1, -1, -1) if body.messages[i].role == "user"), None)
        if index is None:
            raise RequestError(400, "messages", "no message with role 'user': the last user message is the task")
        content = body.messages[index].content
        if isinstance(content, list):   # content parts: the text ones
            content = "\n".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
        question = (content or "").strip()
        if not question:
            raise RequestError(400, f"messages.{index}.content", "the last user message is empty")
        if len(question) > self.limits.max_question_chars:
            raise RequestError(400, f"messages.{index}.content", f"{len(question)} characters; at most "
                                                                  f"{self.limits.max_question_chars}")
        if len(body.messages) > self.limits.max_messages:
            raise RequestError(400, "messages", f"{len(body.messages)} messages; at most {self.limits.max_messages}")
        preference = None
        if body.preference is not None:
            spec = json.dumps(body.preference) if isinstance(body.preference, dict) else body.preference
            try:
                preference = state_preference(spec, self.served.setup.catalog, "qa", search=self.served.search)
            except PreferenceError as exc:
                raise RequestError(400, "preference", f"{spec}: {exc}") from None
        return question, preference

    def admit(self) -> None:
        if self.admitted >= self.limits.concurrency + self.limits.queue:
            self.count("busy")
            raise Busy(f"server busy: {self.running} requests running and {self.admitted - self.running} waiting "
                       f"(--concurrency {self.limits.concurrency}, --queue {self.limits.queue}); retry later")
        self.admitted += 1

    async def start(self, job: Job, deadline: float) -> asyncio.Future:
        """Wait for a slot (until `deadline`), then run the episode in a worker thread.  The slot is
        held until the thread ends, also after a timeout or a disconnect (the episode stops at its
        next turn), so at most `concurrency` episodes ever run."""
        from evaluation.qa import play
        from orchestrator.loaders import BenchmarkTask

        loop = asyncio.get_running_loop()
        if self.slots is None:
            self.slots = asyncio.Semaphore(self.limits.concurrency)
        try:
            await asyncio.wait_for(self.slots.acquire(), max(0.0, deadline - loop.time()))
        except BaseException:            # the deadline, or the client gone while queued
            self.admitted -= 1
            raise
        self.running += 1
        setup = self.served.setup
        setup = replace(setup, preference=job.preference, loop=replace(setup.loop, before_turn=job.before_turn))
        task = BenchmarkTask(id=job.id, question=job.question, answer=None)

        def done(_future):
            self.running -= 1
            self.admitted -= 1
            self.slots.release()

        future = loop.run_in_executor(self.pool, play, setup, task)
        future.add_done_callback(done)
        return future


def orchestra(rollout, job: Job) -> dict:
    """The response's extra top-level field: money, time, turns, why it stopped, the trace."""
    from evaluation.qa import rollout_record

    record = rollout_record(rollout)
    budget = job.budget.model_dump() if job.budget else None
    return {"stop_reason": rollout.stop_reason, "finished": rollout.finished, "dollars": record["cost"],
            "seconds": record["latency"], "wall_seconds": round(time.monotonic() - job.started, 3),
            "turns": len(rollout.turns), "tool_calls": record["tool_calls"], "tokens": record["tokens"],
            "budget": budget and {**budget, "stopped": rollout.stop_reason.startswith("budget")},
            "preference": job.preference.record() if job.preference else None, "trace": record["turns"]}


def usage(rollout) -> dict:
    """The orchestrator's own tokens, summed over its turns (experts' are in orchestra.tokens)."""
    prompt = sum(t.policy_usage.prompt_tokens for t in rollout.turns)
    completion = sum(t.policy_usage.completion_tokens for t in rollout.turns)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def completion(rollout, job: Job, name: str) -> dict:
    return {"id": job.id, "object": "chat.completion", "created": int(time.time()), "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": rollout.final_answer},
                         "finish_reason": "stop" if rollout.finished else "length"}],
            "usage": usage(rollout), "orchestra": orchestra(rollout, job)}


def chunk(job: Job, name: str, delta: dict | None, finish: str | None = None, **extra) -> str:
    body = {"id": job.id, "object": "chat.completion.chunk", "created": int(time.time()), "model": name,
            "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(body, default=str)}\n\n"


def turn_text(record: dict) -> str:
    """A turn as the stream shows it: the orchestrator's text, then its call."""
    call = (f"{record['tool']}({record['alias']} -> {record['model']}): ${record['cost']:.6f}, "
            f"{record['latency']:.2f} s" if record["tool"] else "no tool call")
    problem = record["error"] or record["invalid_reason"]
    text = (record["reasoning"] or "").strip()
    return (f"{text}\n" if text else "") + f"[turn {record['index'] + 1}: {call}" + (f"; {problem}" if problem else "") + "]\n"


async def client_gone(request: Request) -> None:
    """Returns when the client disconnects (uvicorn answers http.disconnect from then on)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def episode_failed(rollout) -> str | None:
    return rollout.stop_reason if rollout.stop_reason.startswith("error") else None


# ---- the app -------------------------------------------------------------------------------------

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
            return StreamingResponse(stream(job, deadline, request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        gone = asyncio.ensure_future(client_gone(request))
        try:
            future = await _first(service.start(job, deadline), gone, deadline)
            if future is None:
                return _stopped(job, gone)
            rollout = await _first(asyncio.shield(future), gone, deadline)
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
        if gone.done():
            job.cancel("client disconnected")
            service.count("disconnected")
            return fail(499, "client disconnected")
        job.cancel(f"deadline of {limits.request_timeout_s:g} s passed")
        service.count("deadline")
        return fail(504, _deadline_message(), code="deadline_exceeded")

    async def stream(job: Job, deadline: float, request: Request):
        """The SSE body: a role chunk, a chunk per turn, the answer, usage + orchestra, [DONE]; an
        error event instead when the episode fails or the deadline passes; nothing more once the
        client is gone (its episode is cancelled)."""
        gone = asyncio.ensure_future(client_gone(request))
        gone.add_done_callback(lambda _: job.cancel("client disconnected"))
        state = {"outcome": "disconnected"}
        try:
            async for event in _events(job, deadline, gone, state):
                yield event
            if state["outcome"] != "disconnected":
                yield "data: [DONE]\n\n"
        finally:
            gone.cancel()
            job.cancel("client disconnected")   # a no-op once the episode is over
            service.count(state["outcome"])

    async def _events(job: Job, deadline: float, gone: asyncio.Future, state: dict):
        def turn_chunk(record: dict) -> str:
            return chunk(job, served.name, {"reasoning_content": turn_text(record)}, orchestra={"turn": record})

        def error_event(message: str, code: str, **extra) -> str:
            return f"data: {json.dumps(error_body(message, 'server_error', code=code, **extra), default=str)}\n\n"

        yield chunk(job, served.name, {"role": "assistant", "content": ""})
        future = await _first(service.start(job, deadline), gone, deadline)
        item = None
        if future is not None:
            future.add_done_callback(lambda f: job.events.put_nowait(("done", f)))
            while (item := await _first(job.events.get(), gone, deadline)) is not None and item[0] == "turn":
                yield turn_chunk(item[1])
        if item is None:                       # the client went away, or the deadline passed
            state["outcome"] = _late(job, gone)
            if state["outcome"] == "deadline":
                yield error_event(_deadline_message(), "deadline_exceeded")
            return
        try:
            rollout = item[1].result()
        except Exception as exc:
            log.exception("request %s failed", job.id)
            state["outcome"] = "error"
            yield error_event(f"orchestrator: {type(exc).__name__}: {exc}", "episode_failed")
            return
        for record in job.new_turns(rollout):   # the last turn (the hook runs before a turn, not after)
            yield turn_chunk(record)
        failed = episode_failed(rollout)
        state["outcome"] = "error" if failed else rollout.stop_reason.split(":")[0]
        if failed:
            yield error_event(f"orchestrator: {failed}", "episode_failed", orchestra=orchestra(rollout, job))
            return
        yield chunk(job, served.name, {"content": rollout.final_answer or ""}, "stop" if rollout.finished else "length")
        yield chunk(job, served.name, None, usage=usage(rollout), orchestra=orchestra(rollout, job))

    def _late(job: Job, gone: asyncio.Future) -> str:
        if gone.done():
            job.cancel("client disconnected")
            return "disconnected"
        job.cancel(f"deadline of {limits.request_timeout_s:g} s passed")
        return "deadline"

    def _deadline_message() -> str:
        return (f"deadline: no answer within {limits.request_timeout_s:g} s (--request-timeout); the episode is "
                f"stopped; ask with a smaller budget or raise the server's --request-timeout")

    return app


async def _first(awaitable, gone: asyncio.Future, deadline: float):
    """The awaitable's result, or None when the client went away or `deadline` passed first (the
    awaitable is then cancelled; a shielded episode keeps running until its next turn)."""
    task = asyncio.ensure_future(awaitable)
    timeout = max(0.0, deadline - asyncio.get_running_loop().time())
    done, _ = await asyncio.wait({task, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    return None


# ---- running it ----------------------------------------------------------------------------------

@dataclass
class Background:
    """The app served by uvicorn in a thread (the tests and bench/serve_load.py), as `main` serves it."""

    app: FastAPI
    limits: ServeLimits = field(default_factory=ServeLimits)
    host: str = "127.0.0.1"
    port: int = 0

    def __enter__(self) -> "Background":
        import uvicorn

        from retrieval.server import _free_port, server_config

        self.port = self.port or _free_port(self.host)
        self.url = f"http://{self.host}:{self.port}"
        self._server = uvicorn.Server(server_config(self.app, self.host, self.port, self.limits))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"orchestrator server did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


def main(argv: list[str] | None = None) -> int:
    from evaluation.cli import CLIError
    from orchestrator.catalog import CatalogError
    from orchestrator.context import PromptError
    from orchestrator.gateway.errors import GatewayConfigError
    from orchestrator.settings import ProfileError

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        served = build(args)
    except (CLIError, CatalogError, PromptError, GatewayConfigError, ProfileError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import uvicorn

    from retrieval.server import _free_port, server_config

    limits = limits_from(args)
    port = args.port or _free_port(args.host)
    print(served.line)
    print(f"serving {served.name!r} at http://{args.host}:{port}/v1 (profile {served.profile}, qa.{served.section}; "
          f"{limits.concurrency} at once, {limits.queue} queued, {limits.request_timeout_s:g} s per request)",
          flush=True)
    uvicorn.Server(server_config(create_app(served, limits), args.host, port, limits)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
