"""Bad tools don't break runs (issue 44, item 4): each failure is recorded on the turn as an error
naming the tool and the fix, with the call's cost and latency; the episode goes on to its answer;
no call waits past the tool's deadline; a tool's credentials appear in no record, log or error."""
import json
import logging
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from _episode import catalog_file, run_calls

HERE = Path(__file__).resolve().parent
PER_CALL = 0.001


def python_tool(handler, **kw):
    return {"tools": [{"name": "bad", "kind": "python", "handler": handler, **kw}], "prices": {"bad": {"per_call": PER_CALL}}}


def assert_recorded_and_went_on(rollout, words, tool="bad", kind=None):
    turn = rollout.turns[0]
    error = turn.expert.error
    assert turn.valid and error is not None, turn.invalid_reason
    assert error.startswith(f"tool {tool!r}") and "fix:" in error, error
    for w in words:
        assert w in error, error
    assert turn.expert.cost >= PER_CALL and turn.expert.latency > 0
    assert rollout.finished and rollout.stop_reason == "answer"      # the episode went on to its answer
    return error


@pytest.mark.parametrize("handler, words", [
    ("no_such_module_xyz:run", ["does not import", "ModuleNotFoundError", 'python -c "import no_such_module_xyz"']),
    ("_bad_handlers:nope", ["has no function 'nope'"]),
    ("_bad_handlers:raises", ["raised ValueError: cannot handle 3", "should return a result"]),
    ("_bad_handlers:huge", ["10,000,000 characters, over its max_output_chars", "return less"]),
    ("_bad_handlers:not_json", ["returned a set, which is not JSON"]),
])
def test_a_python_tool_that_fails_is_a_recorded_error(tmp_path, handler, words):
    rollout, policy = run_calls(catalog_file(tmp_path, python_tool(handler)), [("bad", {"x": 3})])
    error = assert_recorded_and_went_on(rollout, words)
    assert len(rollout.turns[0].expert.output) <= 2000
    # what the policy reads next turn: the error, under the tool's name
    assert "[tool] bad(" in policy.seen[1]["messages"][1]["content"] and error[:40] in policy.seen[1]["messages"][1]["content"]


@pytest.mark.parametrize("handler, sandbox", [("_bad_handlers:hangs", False), ("_bad_handlers:hangs_async", False),
                                              ("_bad_handlers:sandboxed_hang", True)])
def test_a_tool_that_never_returns_is_cut_at_its_deadline(tmp_path, handler, sandbox):
    spec = python_tool(handler, timeout_s=1.0, sandbox=sandbox)
    if sandbox:
        spec["tools"][0]["parameters"] = {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}
    started = time.monotonic()
    rollout, _ = run_calls(catalog_file(tmp_path, spec), [("bad", {"x": 3})])
    words = ["killed"] if sandbox else ["no result within its deadline (1 s)", "raise `timeout_s`"]
    assert_recorded_and_went_on(rollout, words)
    assert time.monotonic() - started < 60       # the handler would hold it 600 s


def test_async_and_sandboxed_handlers_return_their_results(tmp_path):
    both = {"tools": [{"name": "double", "kind": "python", "handler": "_bad_handlers:doubles_async"},
                      {"name": "square", "kind": "python", "handler": "_bad_handlers:sandboxed_square", "sandbox": True}],
            "prices": {"double": {"per_call": 0.0}, "square": {"per_second": 0.01}}}
    rollout, _ = run_calls(catalog_file(tmp_path, both), [("double", {"x": 21}), ("square", {"x": 12})])
    assert [t.expert.output for t in rollout.turns[:2]] == ["42", "144"]
    assert rollout.turns[1].expert.cost == pytest.approx(0.01 * rollout.turns[1].expert.latency)


# ---- http -------------------------------------------------------------------------------------------
SECRET = "tok-" + "5e1f" * 6


class Misbehaving(BaseHTTPRequestHandler):
    hits: dict = {}

    def do_POST(self):   # noqa: N802
        Misbehaving.hits[self.path] = Misbehaving.hits.get(self.path, 0) + 1
        if self.path == "/500":     # echoes the credential it was sent, as a careless service might
            return self._send(500, "application/json", json.dumps({"error": f"boom, key {self.headers.get('X-Key')}"}))
        if self.path == "/html":
            return self._send(200, "text/html", "<html><body>Login</body></html>")
        if self.path == "/empty":
            return self._send(200, "application/json", "")
        if self.path == "/silent":
            time.sleep(30)
            return None
        if self.path == "/big":
            return self._send(200, "application/json", json.dumps("z" * 10_000_000))
        return self._send(200, "application/json", json.dumps({"ok": True}))

    def _send(self, status, ctype, body):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:
            pass

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Misbehaving)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


def http_tool(url, **kw):
    entry = {"name": "bad", "kind": "http", "url": url, "headers": {"X-Key": "BAD_TOOL_KEY"}, "retries": 1,
             "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}, **kw}
    return {"tools": [entry], "prices": {"bad": {"per_call": PER_CALL}}}


@pytest.mark.parametrize("path, words", [
    ("/500", ["answered HTTP 500"]),
    ("/html", ["answered text/html, not JSON", "\"response\": \"text\""]),
    ("/empty", ["answered an empty body"]),
    ("/silent", ["did not answer within 2 s"]),
    ("/big", ["answered more than 400000 bytes"]),
])
def test_an_http_tool_that_misbehaves_is_a_recorded_error_without_its_key(tmp_path, monkeypatch, caplog, service,
                                                                           path, words):
    monkeypatch.setenv("BAD_TOOL_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    Misbehaving.hits.clear()
    rollout, policy = run_calls(catalog_file(tmp_path, http_tool(service + path, timeout_s=2.0)), [("bad", {"x": 1})])
    error = assert_recorded_and_went_on(rollout, words)
    if path == "/500":
        assert Misbehaving.hits[path] == 2                        # retried once (retries: 1)
        assert "***REDACTED***" in error                          # the echoed key, masked
    everything = json.dumps(rollout.to_dict()) + caplog.text + json.dumps([s["messages"] for s in policy.seen])
    assert SECRET not in everything


def test_an_http_tool_with_nothing_listening_or_no_credential(tmp_path, monkeypatch, service):
    monkeypatch.setenv("BAD_TOOL_KEY", SECRET)
    rollout, _ = run_calls(catalog_file(tmp_path, http_tool("http://127.0.0.1:9/nothing", timeout_s=2.0)), [("bad", {"x": 1})])
    assert_recorded_and_went_on(rollout, ["ConnectError", "check that the service runs"])
    monkeypatch.delenv("BAD_TOOL_KEY")
    rollout, _ = run_calls(catalog_file(tmp_path, http_tool(service + "/ok", description="a tool"), "unset.json"),
                           [("bad", {"x": 1})])
    assert_recorded_and_went_on(rollout, ["environment variable BAD_TOOL_KEY (header 'X-Key') is not set",
                                          "export BAD_TOOL_KEY="])


def test_a_secret_written_in_tools_json_is_refused(tmp_path):
    from orchestrator.catalog import CatalogError, load_catalog

    with pytest.raises(CatalogError) as err:
        load_catalog(catalog_file(tmp_path, http_tool("http://x/y", headers={"Authorization": "Bearer " + SECRET})))
    assert "$.tools[4].headers: header 'Authorization': write the NAME of an environment variable" in str(err.value)
    assert SECRET not in str(err.value)


# ---- mcp --------------------------------------------------------------------------------------------
def mcp_tool(command, **kw):
    return {"tools": [{"name": "bad", "kind": "mcp", "command": command, "start_timeout_s": 10.0, "timeout_s": 10.0, **kw}],
            "prices": {"bad": {"per_call": PER_CALL}}}


@pytest.mark.parametrize("command, words", [
    ([sys.executable, "-c", "import sys; print('no MCP here', file=sys.stderr); sys.exit(3)"],
     ["did not start", "its stderr: no MCP here", "run the command by hand"]),
    (["/no/such/server"], ["did not start", "No such file"]),
])
def test_an_mcp_server_that_does_not_start_is_a_recorded_error(tmp_path, command, words):
    rollout, _ = run_calls(catalog_file(tmp_path, mcp_tool(command)), [("bad", {"x": 1})])
    assert_recorded_and_went_on(rollout, words)


def test_an_mcp_server_that_dies_mid_episode_is_an_error_then_starts_again(tmp_path):
    spec = mcp_tool([sys.executable, str(HERE / "_dying_mcp.py")])
    rollout, _ = run_calls(catalog_file(tmp_path, spec), [("ok", {"x": 1}), ("die", {"x": 1}), ("ok", {"x": 2})])
    ok, died, again = (t.expert for t in rollout.turns[:3])
    assert ok.output == "2" and ok.error is None
    assert died.error.startswith("tool 'die' (mcp): the MCP server failed during the call") and "fix:" in died.error
    assert died.cost >= PER_CALL and died.latency > 0
    assert again.output == "3" and again.error is None            # started again at the next call
    assert rollout.finished


def test_an_mcp_call_that_stalls_is_cut_at_its_deadline_and_the_server_still_answers(tmp_path):
    spec = mcp_tool([sys.executable, str(HERE / "_dying_mcp.py")], timeout_s=2.0)
    started = time.monotonic()
    rollout, _ = run_calls(catalog_file(tmp_path, spec), [("stalls", {"x": 1}), ("ok", {"x": 5})])
    stalled, ok = (t.expert for t in rollout.turns[:2])
    assert stalled.error.startswith("tool 'stalls' (mcp): no result within its deadline (2 s)") and stalled.cost >= PER_CALL
    assert ok.output == "6" and rollout.finished
    assert time.monotonic() - started < 50        # the stalled call would hold it 60 s
