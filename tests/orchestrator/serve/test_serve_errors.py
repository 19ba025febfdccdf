"""The server's refusals: every error body in OpenAI's shape (the app's, FastAPI's and Starlette's,
the body and header limits', uvicorn's own 400), any lone surrogate a 422 naming the field, and no
error repeating more than 200 characters of what the client sent."""
import json
import socket
import time

import httpx
import pytest

from _serve_world import QUESTION, health
from orchestrator.serve import Background, ServeLimits, create_app

LIMITS = ServeLimits(concurrency=1, queue=1, max_body_bytes=4096, body_timeout_s=0.5, header_timeout_s=1.0,
                     max_header_bytes=2048)
CHAT = "/v1/chat/completions"


@pytest.fixture()
def small(served, backend):
    """A server with small body and header limits, as `main` configures uvicorn."""
    backend.bodies.clear()
    with Background(create_app(served[0], LIMITS), limits=LIMITS) as srv:
        yield srv


def assert_openai_error(status: int, text: str, expected: int) -> dict:
    assert status == expected, (status, text[:300])
    body = json.loads(text)
    assert list(body) == ["error"] and set(body["error"]) == {"message", "type", "param", "code"}, body
    error = body["error"]
    assert isinstance(error["message"], str) and error["message"] and "\n" not in error["message"]
    assert error["type"] == ("invalid_request_error" if expected < 500 else "server_error")
    return error


def raw(srv, data: bytes, pause_s: float = 0.0, more: bytes = b"") -> tuple[int, str]:
    """Send raw bytes (then, after `pause_s`, `more`); (status, body) of the one reply."""
    port = int(srv.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        if pause_s:
            time.sleep(pause_s)
        if more:
            try:
                sock.sendall(more)
            except OSError:
                pass
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body.decode()


def test_every_refusal_is_in_openai_error_shape(small):
    url = small.url
    r = httpx.get(url + "/no/such/path")
    assert_openai_error(r.status_code, r.text, 404)
    r = httpx.get(url + CHAT)
    assert_openai_error(r.status_code, r.text, 405)
    assert r.headers["allow"] == "POST"
    r = httpx.post(url + CHAT, content=b"{not json", headers={"content-type": "application/json"})
    assert assert_openai_error(r.status_code, r.text, 422)["param"] == "body"
    r = httpx.post(url + CHAT, json={"model": "mock-orch", "messages": [{"role": "user", "content": "q" * 5000}]})
    error = assert_openai_error(r.status_code, r.text, 413)          # BodyLimit: over max_body_bytes
    assert error["code"] == "body_too_large" and "4096 bytes" in error["message"]
    # BodyLimit: a body that does not all arrive within body_timeout_s
    status, text = raw(small, f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                              f"Content-Length: 100\r\n\r\n{{\"model\"".encode(), pause_s=1.5)
    assert assert_openai_error(status, text, 408)["code"] == "timeout"
    # the header limits (retrieval/server.py's header_deadline_protocol): too large, too slow
    status, text = raw(small, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 4096)   # never ending
    assert assert_openai_error(status, text, 431)["code"] == "headers_too_large"
    status, text = raw(small, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: 1", pause_s=2.0)
    assert assert_openai_error(status, text, 408)["code"] == "timeout"
    # a request uvicorn cannot parse at all (its own reply is plain text)
    status, text = raw(small, b"NOT HTTP AT ALL\r\n\r\n")
    assert assert_openai_error(status, text, 400)["code"] == "invalid_http"
    assert httpx.get(url + "/health").status_code == 200            # and the server goes on


def test_an_unexpected_exception_is_a_500_in_the_shape_and_the_server_goes_on(small):
    service = small.app.state.service
    original = service.task

    def broken(body):
        raise RuntimeError("a bug with the secret input " + body.messages[-1].content)

    service.task = broken
    try:
        r = httpx.post(small.url + CHAT, json={"model": "mock-orch", "messages": [{"role": "user", "content": "xyz"}]})
    finally:
        service.task = original
    error = assert_openai_error(r.status_code, r.text, 500)
    assert error["code"] == "internal_error" and "RuntimeError" in error["message"] and "xyz" not in error["message"]
    r = httpx.post(small.url + CHAT, json={"model": "mock-orch", "messages": [{"role": "user", "content": QUESTION}]})
    assert r.status_code == 200


# a JSON body as sent on the wire: "\ud800" stays an escape here, json.loads makes it a lone surrogate
@pytest.mark.parametrize("body, param", [
    ('{"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "preference": "\\ud800"}', "preference"),
    ('{"model": "mock-orch", "messages": [{"role": "user", "content": "q\\ud800"}]}', "messages.0.content"),
    ('{"model": "mock-orch", "messages": [{"role": "user", "content": [{"type": "text", "text": "a\\udfff"}]}]}',
     "messages.0.content.0.text"),
    ('{"model": "mock\\ud800", "messages": [{"role": "user", "content": "q"}]}', "model"),
    ('{"model": "mock-orch", "messages": [{"role": "us\\udc00er", "content": "q"}]}', "messages.0.role"),
    ('{"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "budget": {"\\ud800": 1}}',
     "budget.\\ud800"),
    ('{"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "preference": {"cost\\ud83d": 1}}',
     "preference.cost\\ud83d"),
])
def test_a_lone_surrogate_anywhere_is_a_422_naming_the_field(small, backend, body, param):
    r = httpx.post(small.url + CHAT, content=body.encode(), headers={"content-type": "application/json"})
    error = assert_openai_error(r.status_code, r.text, 422)
    assert error["param"] == param and error["code"] == "invalid_value"
    assert error["message"].startswith(f"{param}: a lone surrogate (\\u") and "valid Unicode" in error["message"]
    assert not backend.bodies                                        # refused before any model call


LONG = "Z" * 100_000


@pytest.mark.parametrize("body, status", [
    ({"model": LONG, "messages": [{"role": "user", "content": "q"}]}, 404),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "preference": LONG}, 400),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "preference": {LONG: 1}}, 400),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "preference": {"cost": LONG}}, 422),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "budget": {LONG: 1}}, 422),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "budget": {"turns": LONG}}, 422),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": LONG + "Z"}]}, 400),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "stream": LONG}, 422),
    ({"model": "mock-orch", "messages": [{"role": "user", "content": "q"}], "preference": "a=" + LONG}, 400),
])
def test_no_error_repeats_more_than_200_characters_of_the_input(served, body, status):
    limits = ServeLimits(max_body_bytes=1 << 20)
    with Background(create_app(served[0], limits), limits=limits) as srv:
        r = httpx.post(srv.url + CHAT, json=body)
    assert_openai_error(r.status_code, r.text, status)
    assert r.text.count("Z") <= 200 and len(r.text) < 1500, r.text[:400]


def test_health_says_what_the_server_runs(small):
    h = health(small)
    assert h["status"] == "ok" and h["ready"] and h["load_error"] is None and h["model"] == "mock-orch"
    assert h["limits"] == {"concurrency": 1, "queue": 1, "request_timeout_s": 300.0}
