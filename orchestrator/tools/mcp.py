"""Kind `mcp`: the tools of a Model Context Protocol server (the official `mcp` SDK).

    {"name": "units", "kind": "mcp", "command": ["python", "examples/tools/units_mcp.py"],
     "include": ["convert"]}
    {"name": "remote", "kind": "mcp", "url": "http://localhost:8000/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}

A stdio `command` (started by the run, stopped at exit) or a streamable-HTTP `url`.  The server's
listed tools become orchestrator tools (named as the server names them, after `prefix`), each with
the input schema the server gives, filtered by `include` / `exclude`.  Each is charged at the
entry's row of `prices`.  One session per entry is shared by every episode; a server that dies is
started again at the next call.  A server that does not start leaves stand-in tools (the names in
`include`, else the entry's name) whose calls are recorded as errors saying why.
"""
from __future__ import annotations

import asyncio
import json
import os
import tempfile
import threading
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from orchestrator.tools.http import ENV_NAME, ENV_REF, header_values
from orchestrator.tools.registry import CallContext, Function, FunctionKind, ToolFailure, register
from orchestrator.tools.spec import FunctionToolSpec
from orchestrator.tools.workers import Deadline, run_async


class Spec(FunctionToolSpec):
    kind: Literal["mcp"]
    command: list[str] | None = Field(None, min_length=1, description="argv of a stdio server")
    url: str | None = Field(None, pattern=r"^https?://\S+$", description="a streamable-HTTP server's URL")
    env: dict[str, str] = Field(default_factory=dict,
                                description="environment of a stdio server: VAR -> NAME of a variable of ours")
    headers: dict[str, str] = Field(default_factory=dict, description="as the http kind's: values name variables")
    include: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)
    prefix: str = ""
    start_timeout_s: float = Field(30.0, gt=0, strict=True)

    @model_validator(mode="after")
    def _one_transport(self) -> "Spec":
        if (self.command is None) == (self.url is None):
            raise ValueError("give exactly one of `command` (a stdio server's argv) and `url` (streamable HTTP)")
        return self

    @field_validator("env", "headers")
    @classmethod
    def _variables(cls, values: dict[str, str]) -> dict[str, str]:
        for key, value in values.items():
            if not (ENV_NAME.match(value) or ENV_REF.search(value)):
                raise ValueError(f"{key!r}: write the NAME of an environment variable that holds the value, or "
                                 f"text with ${{NAME}} in it; never the secret itself")
        return values


class _Session:
    """One server's client session, owned by a task of the background loop (the SDK's contexts
    must be entered and left by the same task); calls come from any task of that loop."""

    def __init__(self, spec: Spec):
        self.spec = spec
        self.client = None
        self._task: asyncio.Task | None = None
        self._stop: asyncio.Event | None = None
        self._lock: asyncio.Lock | None = None
        self._errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")

    def stderr_tail(self) -> str:
        try:
            self._errlog.seek(0)
            lines = [ln for ln in self._errlog.read().splitlines() if ln.strip()]
        except (OSError, ValueError):
            return ""
        return lines[-1][:300] if lines else ""

    def _target(self):
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client

        if self.spec.command:
            env = {k: (os.environ.get(v, "") if ENV_NAME.match(v) else
                       ENV_REF.sub(lambda m: os.environ.get(m.group(1), ""), v)) for k, v in self.spec.env.items()}
            from orchestrator.redaction import add_secret
            for value in env.values():
                add_secret(value)
            params = StdioServerParameters(command=self.spec.command[0], args=self.spec.command[1:], env=env or None)
            return stdio_client(params, errlog=self._errlog)
        import httpx2

        headers = header_values(self.spec)          # type: ignore[arg-type]
        return streamable_http_client(self.spec.url, http_client=httpx2.AsyncClient(headers=headers, timeout=self.spec.timeout_s))

    async def get(self):
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self.client is not None and self._task is not None and not self._task.done():
                return self.client
            await self._shutdown()
            ready: asyncio.Future = asyncio.get_running_loop().create_future()
            self._stop = asyncio.Event()
            self._task = asyncio.create_task(self._own(ready, self._stop))
            try:
                self.client = await asyncio.wait_for(asyncio.shield(ready), self.spec.start_timeout_s)
            except BaseException as exc:
                await self._shutdown()
                raise self._start_failure(exc) from None
            return self.client

    def _start_failure(self, exc: BaseException) -> ToolFailure:
        what = " ".join(self.spec.command) if self.spec.command else self.spec.url
        why = ("no answer within start_timeout_s " f"({self.spec.start_timeout_s:g} s)"
               if isinstance(exc, (asyncio.TimeoutError, TimeoutError)) else f"{type(exc).__name__}: {_message(exc)}")
        tail = self.stderr_tail()
        return ToolFailure(f"MCP server {what!r} did not start: {why}{'; its stderr: ' + tail if tail else ''}",
                           fix=("run the command by hand and check that it speaks MCP on stdio" if self.spec.command
                                else "check that the server runs at the entry's `url`"))

    async def _own(self, ready: asyncio.Future, stop: asyncio.Event) -> None:
        from mcp import Client

        try:
            async with Client(self._target()) as client:
                if not ready.done():
                    ready.set_result(client)
                await stop.wait()
        except BaseException as exc:   # noqa: BLE001 - handed to whoever waits for the start
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
        finally:
            self.client = None

    async def _shutdown(self) -> None:
        task, self._task, self.client = self._task, None, None
        if task is None:
            return
        if self._stop is not None:
            self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(task), 5.0)
        except BaseException:   # noqa: BLE001 - a server that will not stop is cancelled
            task.cancel()

    async def reset(self) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            await self._shutdown()


def _message(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_message(e) for e in exc.exceptions)
    return str(exc) or type(exc).__name__


def _result(result) -> Any:
    """A CallToolResult as the tool's output: structured content, else the text parts."""
    texts = [getattr(c, "text", None) for c in result.content or []]
    text = "\n".join(t for t in texts if t is not None)
    if result.is_error:
        raise ToolFailure(f"the server reported an error: {text[:500]}",
                          fix="check the arguments against the tool's schema, or the server's log")
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        return structured.get("result", structured) if isinstance(structured, dict) and set(structured) == {"result"} else structured
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text


@register
class Mcp(FunctionKind):
    name = "mcp"
    spec = Spec

    def __init__(self):
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    def session(self, spec: Spec) -> _Session:
        key = spec.model_dump_json()
        with self._lock:
            if key not in self._sessions:
                self._sessions[key] = _Session(spec)
            return self._sessions[key]

    def functions(self, spec: Spec, runtime) -> list[Function]:
        session = self.session(spec)

        async def listed():
            client = await session.get()
            return (await client.list_tools()).tools

        try:
            tools = run_async(listed, spec.start_timeout_s + spec.timeout_s)
        except ToolFailure:
            raise
        except Deadline:
            raise session._start_failure(TimeoutError()) from None
        out = []
        for tool in tools:
            if (spec.include is not None and tool.name not in spec.include) or tool.name in spec.exclude:
                continue
            schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None) or {"type": "object"}
            schema = {k: v for k, v in schema.items() if k != "title"}
            schema.setdefault("properties", {})
            out.append(Function(spec.prefix + tool.name, (tool.description or "").strip().split("\n")[0] or spec.description,
                                schema, spec, _caller(session, tool.name), is_async=True))
        missing = sorted(set(spec.include or []) - {t.name for t in tools})
        if missing:
            raise ToolFailure(f"the server lists no tool {missing}; it has {sorted(t.name for t in tools)}",
                              fix="fix the entry's `include` list")
        return out

    def stand_ins(self, spec: Spec) -> list[str]:
        return [spec.prefix + n for n in spec.include] if spec.include else [spec.name]

    def close(self) -> None:
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            try:
                run_async(session.reset, 10.0)
            except Exception:   # noqa: BLE001 - closing at exit: nothing left to tell
                pass


def _caller(session: _Session, name: str):
    async def call(arguments: dict, ctx: CallContext):
        client = await session.get()
        try:
            result = await client.call_tool(name, arguments)
        except asyncio.CancelledError:
            raise
        except Exception as exc:   # the server died or broke the protocol: start afresh next time
            await session.reset()
            tail = session.stderr_tail()
            raise ToolFailure(f"the MCP server failed during the call: {type(exc).__name__}: {_message(exc)}"
                              f"{'; its stderr: ' + tail if tail else ''}",
                              fix="check the server's log; it is started again at the next call") from None
        return _result(result)
    return call
