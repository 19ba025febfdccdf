"""A local stand-in for Tavily's REST API (https://api.tavily.com): real HTTP, the documented
request, response and error shapes, over a small in-memory web of pages.

- Authentication: `Authorization: Bearer <key>`; a missing or unknown key gets 401.
- POST /search: body `query` (required, a non-empty string), `max_results` (0-20, default 5),
  `search_depth` ("basic", "advanced", "fast", "ultra-fast"), other documented options accepted
  and ignored.  200: {"query", "follow_up_questions": null, "answer": null, "images": [],
  "results": [{"title", "url", "content", "score", "raw_content": null}], "response_time",
  "request_id"}; pages ranked by how many query words they contain (none: no result).
- POST /extract: body `urls` (a string or a list of them, required).  200: {"results": [{"url",
  "raw_content", "images": []}], "failed_results": [{"url", "error"}], "response_time",
  "request_id"}.
- Errors, in Tavily's body `{"detail": {"error": "<message>"}}`: 400 a bad request, 401 a wrong
  or missing key, 429 rate limit, 432 the plan's credit limit (`credits` below), 433 the
  pay-as-you-go limit; `fail_next` queues any status for the next requests.

Each request is recorded in `calls` as (path, headers, body).
"""
from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DEPTHS = ("basic", "advanced", "fast", "ultra-fast")
MESSAGES = {400: "Bad request.", 401: "Unauthorized: missing or invalid API key.",
            429: "Your request has been blocked due to excessive requests. Please reduce rate of requests.",
            432: "This request exceeds your plan's set usage limit. Please upgrade your plan or contact support@tavily.com",
            433: "This request exceeds the pay-as-you-go limit. You can increase your limit on the Tavily dashboard."}


class TavilyEmulator:
    def __init__(self, pages: dict[str, str], keys=("tvly-test",), credits: int | None = None):
        self.pages, self.keys, self.credits = dict(pages), set(keys), credits
        self.calls: list[tuple[str, dict, dict]] = []
        self.fail_next: list[int] = []
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("content-length") or 0)
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except json.JSONDecodeError:
                    return self._send(400, {"detail": {"error": "Invalid JSON body."}})
                emulator.calls.append((self.path, dict(self.headers), body))
                status, out = emulator.handle(self.path, self.headers.get("Authorization", ""), body)
                self._send(status, out)

            def _send(self, status, out):
                data = json.dumps(out).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_port}"

    @staticmethod
    def error(status: int, message: str | None = None) -> tuple[int, dict]:
        return status, {"detail": {"error": message or MESSAGES[status]}}

    def handle(self, path: str, auth: str, body: dict) -> tuple[int, dict]:
        if self.fail_next:
            return self.error(self.fail_next.pop(0))
        key = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
        if key not in self.keys:
            return self.error(401)
        if self.credits is not None:
            if self.credits <= 0:
                return self.error(432)
            self.credits -= 1
        if path == "/search":
            return self.search(body)
        if path == "/extract":
            return self.extract(body)
        return 404, {"detail": {"error": f"Not Found: {path}"}}

    def search(self, body: dict) -> tuple[int, dict]:
        query = body.get("query")
        if not isinstance(query, str) or not query.strip():
            return self.error(400, "Query is missing.")
        n = body.get("max_results", 5)
        if not isinstance(n, int) or not 0 <= n <= 20:
            return self.error(400, "max_results must be between 0 and 20.")
        if body.get("search_depth", "basic") not in DEPTHS:
            return self.error(400, f"Invalid search depth. Must be one of {list(DEPTHS)}.")
        words = set(re.findall(r"\w+", query.lower()))
        ranked = sorted(((len(words & set(re.findall(r"\w+", text.lower()))), url) for url, text in self.pages.items()),
                        key=lambda x: (-x[0], x[1]))
        results = [{"title": url.rsplit("/", 1)[-1], "url": url, "content": self.pages[url][:200],
                    "score": round(hits / max(len(words), 1), 4), "raw_content": None}
                   for hits, url in ranked if hits][:n]
        return 200, {"query": query, "follow_up_questions": None, "answer": None, "images": [],
                     "results": results, "response_time": "0.01", "request_id": str(uuid.uuid4())}

    def extract(self, body: dict) -> tuple[int, dict]:
        urls = body.get("urls")
        urls = [urls] if isinstance(urls, str) else urls
        if not urls or not isinstance(urls, list):
            return self.error(400, "urls is missing.")
        ok = [{"url": u, "raw_content": self.pages[u], "images": []} for u in urls if u in self.pages]
        failed = [{"url": u, "error": "Failed to fetch url"} for u in urls if u not in self.pages]
        return 200, {"results": ok, "failed_results": failed, "response_time": "0.01",
                     "request_id": str(uuid.uuid4())}

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
