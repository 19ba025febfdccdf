"""The body of a `stream: true` request (server-sent events: a role chunk, a chunk per turn, the
answer, usage + orchestra, [DONE]) and the waits every request makes: the first of its episode,
the client going away and its deadline."""
import asyncio
import json
import logging

from fastapi import Request

from orchestrator.serve.responses import chunk, episode_failed, orchestra, turn_text, usage
from orchestrator.serve.schema import clip, error_body
from orchestrator.serve.service import Job, Service, ServeLimits

log = logging.getLogger("orchestrator.serve")


async def client_gone(request: Request) -> None:
    """Returns when the client disconnects (uvicorn answers http.disconnect from then on)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def first(awaitable, gone: asyncio.Future, deadline: float):
    """The awaitable's result, or None when the client went away or `deadline` passed first (the
    awaitable is then cancelled; a shielded episode keeps running until its next turn)."""
    task = asyncio.ensure_future(awaitable)
    timeout = max(0.0, deadline - asyncio.get_running_loop().time())
    done, _ = await asyncio.wait({task, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    return None


def stop_late(job: Job, gone: asyncio.Future, limits: ServeLimits) -> str:
    """Stop the episode of a request whose client went away ("disconnected") or whose deadline
    passed ("deadline"); returns which."""
    if gone.done():
        job.cancel("client disconnected")
        return "disconnected"
    job.cancel(f"deadline of {limits.request_timeout_s:g} s passed")
    return "deadline"


def deadline_message(limits: ServeLimits) -> str:
    return (f"deadline: no answer within {limits.request_timeout_s:g} s (--request-timeout); the episode is "
            f"stopped; ask with a smaller budget or raise the server's --request-timeout")


async def stream(service: Service, job: Job, deadline: float, request: Request):
    """The SSE body: a role chunk, a chunk per turn, the answer, usage + orchestra, [DONE]; an
    error event instead when the episode fails or the deadline passes; nothing more once the
    client is gone (its episode is cancelled)."""
    gone = asyncio.ensure_future(client_gone(request))
    gone.add_done_callback(lambda g: g.cancelled() or job.cancel("client disconnected"))
    state = {"outcome": "disconnected"}
    try:
        async for event in _events(service, job, deadline, gone, state):
            yield event
        if state["outcome"] != "disconnected":
            yield "data: [DONE]\n\n"
    finally:
        gone.cancel()
        job.cancel("client disconnected")   # a no-op once the episode is over
        service.count(state["outcome"])


async def _events(service: Service, job: Job, deadline: float, gone: asyncio.Future, state: dict):
    name = service.served.name

    def turn_chunk(record: dict) -> str:
        return chunk(job, name, {"reasoning_content": turn_text(record)}, orchestra={"turn": record})

    def error_event(message: str, code: str, **extra) -> str:
        return f"data: {json.dumps(error_body(message, 'server_error', code=code, **extra), default=str)}\n\n"

    yield chunk(job, name, {"role": "assistant", "content": ""})
    future = await first(service.start(job, deadline), gone, deadline)
    item = None
    if future is not None:
        future.add_done_callback(lambda f: job.events.put_nowait(("done", f)))
        while (item := await first(job.events.get(), gone, deadline)) is not None and item[0] == "turn":
            yield turn_chunk(item[1])
    if item is None:                       # the client went away, or the deadline passed
        state["outcome"] = stop_late(job, gone, service.limits)
        if state["outcome"] == "deadline":
            yield error_event(deadline_message(service.limits), "deadline_exceeded")
        return
    try:
        rollout = item[1].result()
    except Exception as exc:
        log.exception("request %s failed", job.id)
        state["outcome"] = "error"
        yield error_event(f"orchestrator: {type(exc).__name__}: {clip(str(exc), 300)}", "episode_failed")
        return
    for record in job.new_turns(rollout):   # the last turn (the hook runs before a turn, not after)
        yield turn_chunk(record)
    failed = episode_failed(rollout)
    state["outcome"] = "error" if failed else rollout.stop_reason.split(":")[0]
    if failed:
        yield error_event(f"orchestrator: {clip(failed, 300)}", "episode_failed", orchestra=orchestra(rollout, job))
        return
    yield chunk(job, name, {"content": rollout.final_answer or ""}, "stop" if rollout.finished else "length")
    yield chunk(job, name, None, usage=usage(rollout), orchestra=orchestra(rollout, job))
