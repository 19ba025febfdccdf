"""A scripted OpenAI-compatible chat server for smoke tests and the concurrency benchmark.

It speaks `POST /v1/chat/completions` over real HTTP, so everything between the runner and
the socket (gateway, registry, retries, tool-call parsing) is the production path. What it
answers is scripted from the request:
- a request with `tools` (the orchestrator): `enhance_reasoning` once, then `answer`,
  as OpenAI structured tool calls, the way vLLM's hermes parser returns them;
- an expert prompt: code for the code tool, a `<query>` for search, and for an answer the
  reference from `answers` (question -> answer) inside `<answer>` tags;
- the judge prompt: "True" when the reference appears in the graded answer, else "False";
- tau2 (a user-simulator prompt, or domain tools): see `_tau2_user` / `_tau2_agent`.
Questions in `fail` get HTTP 500; every reply waits `delay_s` first.  With `search=True` the
orchestrator calls `search` first (until the context holds documents) and the search expert's
query is the question itself (the chaos tests' script: a retrieval call in every task).

As a subprocess (a replica a test kills): `python -m evaluation.mock_backend --port P --answers
answers.json [--search] [--delay S]`.

    with MockBackend(answers={...}, delay_s=1.0) as server:
        server.base_url   # http://127.0.0.1:PORT/v1
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request      # module level: FastAPI resolves the annotations here
from fastapi.responses import JSONResponse

from orchestrator import catalog
from orchestrator.ports import PortError, check_port

_REF_RE = re.compile(r"Reference answer: (.*?)\n\nAnswer to grade: (.*?)\n\n", re.DOTALL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MockBackend:
    def __init__(self, answers: dict[str, str] | None = None, delay_s: float = 0.0,
                 fail: set[str] | None = None, wrong: set[str] | None = None, search: bool = False,
                 port: int | None = None):
        self.answers = answers or {}
        self.delay_s = delay_s
        self.fail = fail or set()
        self.wrong = wrong or set()       # questions the answer expert gets wrong
        self.search = search
        self.requests = 0
        self.inflight = 0
        self.max_inflight = 0
        self.port = port or _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._lock = threading.Lock()
        self._server = None
        self._thread: threading.Thread | None = None

    # ---- what to say -----------------------------------------------------------------------
    def _question(self, text: str) -> str | None:
        return next((q for q in self.answers if q in text), None)

    def reply(self, body: dict[str, Any]) -> tuple[int, dict]:
        text = "\n".join(str(m.get("content") or "") for m in body.get("messages", []))
        question = self._question(text)
        if question is not None and question in self.fail:
            return 500, {"error": {"message": "scripted failure", "type": "server_error"}}
        message: dict[str, Any] = {"role": "assistant", "content": None}
        names = {t.get("function", {}).get("name") for t in body.get("tools") or []}
        if "<scenario>" in str(body["messages"][0].get("content")):
            said = sum(m.get("role") == "assistant" for m in body["messages"])   # its own earlier messages
            message["content"] = self._tau2_user(text, said)
        elif "answer" in names and self.search and "search" in names and "Documents:" not in text:
            message["tool_calls"] = [self._call("search", {"model": "search-1"})]
        elif "answer" in names:
            name, alias = ("answer", "answer-1") if "Output:" in text else ("enhance_reasoning", "reasoner-2")
            message["tool_calls"] = [self._call(name, {"model": alias})]
        elif names:
            self._tau2_agent(body["messages"][-1], names, message)
        elif "Answer to grade:" in text:
            m = _REF_RE.search(text)
            ok = bool(m) and m.group(1).strip().lower() in m.group(2).strip().lower()
            message["content"] = "True" if ok else "False"
        elif "<answer></answer>" in text or "\\boxed{}" in text:
            answer = self.answers.get(question, "I do not know") if question not in self.wrong else "no idea"
            message["content"] = f"The answer is <answer>{answer}</answer>"
        elif "<query></query>" in text:
            message["content"] = f"<query>{question if self.search and question else 'the missing fact'}</query>"
        else:
            message["content"] = "```python\nprint(6 * 7)\n```"
        out = message.get("content") or json.dumps(message.get("tool_calls"))
        budget = body.get("max_completion_tokens") or body.get("max_tokens")     # a server never reports more
        usage = {"prompt_tokens": len(text) // 4 + 1,
                 "completion_tokens": min(len(out) // 4 + 1, budget if isinstance(budget, int) else 1 << 30)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return 200, {"id": "mock", "object": "chat.completion", "created": int(time.time()),
                     "model": body.get("model", "mock"), "usage": usage,
                     "choices": [{"index": 0, "message": message,
                                  "finish_reason": "tool_calls" if body.get("tools") else "stop"}]}

    def _call(self, name: str, arguments: dict) -> dict:
        return {"id": f"call_{self.requests:08d}", "type": "function",   # fixed length: usage does not grow with retries
                "function": {"name": name, "arguments": json.dumps(arguments)}}

    # tau2 script: the user asks and stops when offered "anything else" (or after its
    # TAU2_USER_TURNS-th message, so that an untrained agent's conversation ends too); the orchestrator
    # calls expert-2, the expert looks the user up, the orchestrator reports back.
    TAU2_USER_ID = "mia_li_3668"
    TAU2_USER_TURNS = 2       # the user stops after this many messages of its own (any agent ends)

    def _tau2_user(self, text: str, said: int = 0) -> str:
        if "anything else" in text or said >= self.TAU2_USER_TURNS:
            return "No, thank you, that is all. ###STOP###"
        return f"Hi, I would like to check my reservations. My user id is {self.TAU2_USER_ID}."

    def _tau2_agent(self, last: dict, names: set, message: dict) -> None:
        if last.get("role") == "tool" or "<tool_response>" in str(last.get("content")):
            message["content"] = "I have looked that up for you. Is there anything else I can help you with?"
        elif "call_expert" in names:
            message["tool_calls"] = [self._call("call_expert", {"expert": "expert-2"})]
        elif "get_user_details" in names:
            message["tool_calls"] = [self._call("get_user_details", {"user_id": self.TAU2_USER_ID})]
        else:
            message["content"] = "How can I help?"

    # ---- the server --------------------------------------------------------------------------
    def _app(self):
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            with self._lock:
                self.requests += 1
                self.inflight += 1
                self.max_inflight = max(self.max_inflight, self.inflight)
            try:
                await asyncio.sleep(self.delay_s)
                status, payload = self.reply(body)
            finally:
                with self._lock:
                    self.inflight -= 1
            return JSONResponse(payload, status_code=status)

        @app.get("/health")
        async def health():
            return {"ok": True}

        return app

    def start(self) -> "MockBackend":
        import uvicorn  # lazy: only when serving

        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="warning",
                                backlog=512, timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"mock backend did not start on port {self.port}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
            self._thread.join(timeout=10)

    def __enter__(self) -> "MockBackend":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluation.mock_backend", description="the scripted mock as a server")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--answers", type=Path, required=True, help="JSON {question: answer}")
    p.add_argument("--search", action="store_true", help="the orchestrator searches first (see the module docstring)")
    p.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    args = p.parse_args(argv)
    try:
        check_port(args.port, "--port", host="127.0.0.1", zero_ok=False)
    except PortError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    server = MockBackend(answers=json.loads(args.answers.read_text()), delay_s=args.delay, search=args.search,
                         port=args.port).start()
    print(f"serving at {server.base_url}", flush=True)
    server._thread.join()
    return 0


def registry_yaml(base_url: str, names: list[str], max_retries: int = 0, price_model: str | None = None,
                  **fields: float) -> str:
    """A configs/models.yaml text sending every name in `names` to `base_url`; `fields` set more
    entry fields (timeout_s, backoff_initial_s, ...).

    `price_model`: the price row every one of these models is charged at when a caller names none
    (the orchestrator, the judge, the user simulator).  A scripted model has no price of its own,
    so by default it is charged as tools.json's `orchestrator_price_model` (read there, not named
    here: the one price table decides); expert calls are charged by the runtime at their alias's
    model whatever this says."""
    if price_model is None:
        price_model = catalog.load_catalog().orchestrator_price_model   # read per call: tools.json decides
    settings = {"max_retries": max_retries, "timeout_s": 30, "price_model": price_model, **fields}
    lines = ["models:"]
    for name in names:
        lines += [f"  {name}:", "    backend: vllm", f"    model: {name}", f"    base_url: {base_url}",
                  *(f"    {k}: {v}" for k, v in settings.items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
