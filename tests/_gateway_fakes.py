"""Real local HTTP servers that stand in for OpenAI-compatible and Anthropic APIs.

Each server follows a script of actions, one per request (the last repeats):
  "ok"     a normal reply            "stall"  hold the request for `stall_s` seconds
  "500"    HTTP 500                  "429"    HTTP 429 (rate limited)
  "400"    HTTP 400                  "401"    HTTP 401 echoing the key it was sent
  "trickle_body"     headers at once, then the body one byte every `trickle_s` seconds
  "trickle_headers"  the status line and headers themselves one byte every `trickle_s` seconds
  "html"   HTTP 200 with an HTML page (text/html)   "truncated"  HTTP 200, application/json, cut JSON
A 429 carries `Retry-After: <retry_after>` when `retry_after` is given.
`on_hit(server, n)` runs before the n-th request is answered (1-based), e.g. to rewrite
an endpoints file.  Also helpers to write a registry file.  (No tests in this module.)
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable

import yaml


class FakeServer:
    def __init__(self, script=("ok",), *, kind: str = "openai", text: str = "hello",
                 usage: tuple[int, int] = (1000, 500), tool_calls: list[dict] | None = None,
                 stall_s: float = 10.0, on_hit: Callable[["FakeServer", int], None] | None = None,
                 trickle_s: float = 1.0, retry_after: str | None = None):
        self.script, self.kind, self.text, self.usage = list(script), kind, text, usage
        self.tool_calls, self.stall_s, self.on_hit = tool_calls, stall_s, on_hit
        self.trickle_s, self.retry_after = trickle_s, retry_after
        self.times: list[float] = []              # time.monotonic() of each request's arrival
        self.requests: list[dict] = []           # {"path", "headers" (lower-case names), "body"}
        self._lock = threading.Lock()
        self._release = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"{self.root}/v1"

    @property
    def hits(self) -> int:
        return len(self.requests)

    def __enter__(self) -> "FakeServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    # ---- replies ---------------------------------------------------------------------
    def _counts(self, body: dict) -> tuple[int, int]:
        """`usage`, its completion tokens within the request's budget (as a real server's are)."""
        p, c = self.usage
        budget = body.get("max_completion_tokens") or body.get("max_tokens")
        return p, (min(c, budget) if isinstance(budget, int) else c)

    def _openai_body(self, body: dict) -> dict:
        message = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        p, c = self._counts(body)
        return {"id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": body.get("model", "m"),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}}

    def _anthropic_body(self, body: dict) -> dict:
        content = [{"type": "text", "text": self.text}]
        for tc in self.tool_calls or []:
            content.append({"type": "tool_use", "id": tc["id"], "name": tc["name"], "input": tc["input"]})
        p, c = self._counts(body)
        return {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model", "m"),
                "content": content, "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": p, "output_tokens": c}}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):   # keep test output quiet
                pass

            def _send(self, status: int, obj: dict, headers: dict | None = None) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with server._lock:
                    server.requests.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body})
                    server.times.append(time.monotonic())
                    n = len(server.requests)
                    action = server.script[min(n - 1, len(server.script) - 1)]
                if server.on_hit:
                    server.on_hit(server, n)
                if action == "stall":
                    server._release.wait(server.stall_s)
                    return
                if action in ("trickle_body", "trickle_headers"):
                    return self._trickle(action, body)
                if action in ("html", "truncated"):   # a 200 whose body is not the JSON reply
                    data = (b"<html><body>proxy login</body></html>" if action == "html"
                            else json.dumps(server._openai_body(body)).encode()[:40])
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html" if action == "html" else "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if action == "ok":
                    reply = server._anthropic_body(body) if server.kind == "anthropic" else server._openai_body(body)
                    return self._send(200, reply)
                key = self.headers.get("Authorization") or self.headers.get("api-key") or self.headers.get("x-api-key") or ""
                message = {"401": f"Incorrect API key provided: {key}", "400": "bad request", "404": "The model `m` does not exist.",
                           "429": "rate limited", "500": f"internal error (request carried {key})"}[action]
                headers = {"Retry-After": server.retry_after} if action == "429" and server.retry_after else {}
                self._send(int(action), {"error": {"message": message, "type": "error"}}, headers)

            def _trickle(self, action: str, body: dict) -> None:
                data = json.dumps(server._openai_body(body)).encode()
                head = (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(data)}\r\n\r\n").encode()
                slow = head + data if action == "trickle_headers" else data
                if action == "trickle_body":
                    self.wfile.write(head)
                    self.wfile.flush()
                try:
                    for i in range(len(slow)):
                        if server._release.wait(server.trickle_s):
                            return
                        self.wfile.write(slow[i:i + 1])
                        self.wfile.flush()
                except OSError:       # the client gave up and closed the connection
                    return

        return Handler


def dead_url() -> str:
    """A base URL where nothing listens (connection refused)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def write_registry(path: Path, models: dict) -> Path:
    """Write a models.yaml; entries get fast test defaults for backoff unless given."""
    fast = {"backoff_initial_s": 0.05, "backoff_max_s": 0.1, "timeout_s": 5}
    data = {"models": {name: ({**fast, **entry} if entry.get("backend") != "transformers" else entry)
                       for name, entry in models.items()}}
    path.write_text(yaml.safe_dump(data))
    return path


def elapsed(fn) -> tuple[object, float]:
    start = time.perf_counter()
    try:
        out = fn()
    except Exception as exc:   # the caller inspects it
        out = exc
    return out, time.perf_counter() - start
