"""docs/tools.md followed as written: each example's JSON block added to tools.json, the tool listed
by `python -m orchestrator.catalog --list`, called in an episode with its arguments, its cost in the
turn's record, the rollout's cost and the reward."""
import json
import os
import re
import subprocess
import sys
import threading

import pytest

from _episode import REPO, catalog_file, run_calls
from training.rewards import preference_rewards, reward_inputs

GUIDE = (REPO / "docs" / "tools.md").read_text()


def example(name: str) -> dict:
    """The JSON block docs/tools.md shows after `<!-- example: name -->`."""
    match = re.search(rf"<!-- example: {name} -->\n```json\n(.*?)\n```", GUIDE, re.DOTALL)
    assert match, f"docs/tools.md has no example {name!r}"
    return json.loads(match.group(1))


def listed(path, env=None):
    proc = subprocess.run([sys.executable, "-m", "orchestrator.catalog", str(path), "--list"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "260", **(env or {})})
    return proc.returncode, proc.stdout + proc.stderr


def check_cost_in_record_and_reward(tmp_path, addition, row, calls, expected_output):
    path = catalog_file(tmp_path, addition)
    rollout, policy = run_calls(path, calls)
    tool_turn = rollout.turns[0]
    tool = calls[0][0]
    # the policy saw the tool with its own arguments and its price
    schema = next(s["function"] for s in policy.seen[0]["tools"] if s["function"]["name"] == tool)
    assert set(calls[0][1]) <= set(schema["parameters"]["properties"]) and "Price: $" in schema["description"]
    # called with its arguments; its output, cost and latency on the turn's record
    assert tool_turn.valid and tool_turn.tool_call.arguments == calls[0][1]
    call = tool_turn.expert
    assert call.error is None and expected_output in call.output and call.tool == tool and call.model == row
    price = addition["prices"][row]
    arg_tokens = (len(json.dumps(calls[0][1])) + 3) // 4
    out_tokens = (len(call.output) + 3) // 4
    assert call.cost == pytest.approx(price.get("per_call", 0) + price.get("per_second", 0) * call.latency
                                      + (price.get("input", 0) * arg_tokens + price.get("output", 0) * out_tokens) / 1e6)
    assert call.cost > 0 and call.latency > 0
    # the output reached the next turn's context
    assert f"[tool] {tool}(" in policy.seen[1]["messages"][1]["content"] and expected_output in policy.seen[1]["messages"][1]["content"]
    assert rollout.finished and rollout.tool_calls[tool] == 1
    assert rollout.cost == pytest.approx(sum(t.policy_cost + (t.expert.cost if t.expert else 0) for t in rollout.turns))
    assert rollout.latency >= call.latency
    # the reward: the same episode with the tool free costs exactly the tool's price less, and a cost
    # preference rewards it more
    free = json.loads(json.dumps(addition))
    free["prices"][row] = {"per_call": 0.0}
    cheap, _ = run_calls(catalog_file(tmp_path, free, "free.json"), calls)
    assert rollout.cost - cheap.cost == pytest.approx(call.cost - cheap.turns[0].expert.cost)
    rollout.outcome = cheap.outcome = 1
    paid_reward, free_reward = preference_rewards([reward_inputs(rollout), reward_inputs(cheap)],
                                                  {"outcome": 1.0, "cost": 1.0})
    assert free_reward > paid_reward
    assert reward_inputs(rollout)["tool_calls"][tool] == 1
    return path


def test_the_python_calculator_example(tmp_path):
    addition = example("calculator")
    path = check_cost_in_record_and_reward(tmp_path, addition, "calculator",
                                           [("calculator", {"expression": "(3 + 4) * 2"})], "14.0")
    code, out = listed(path)
    assert code == 0, out
    row = next(line for line in out.splitlines() if "calculator" in line and "python" in line)
    assert "expression: string" in row and "$0.0001 per call" in row
    assert "precision?: integer" in out


def test_the_http_weather_example(tmp_path, monkeypatch):
    from examples.tools.weather_service import serve

    secret = "wk-" + "9f3a" * 6
    monkeypatch.setenv("WEATHER_API_KEY", secret)
    server = serve(0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        addition = example("weather")
        entry = addition["tools"][0]
        assert entry["url"].startswith("http://127.0.0.1:8808/")
        entry["url"] = entry["url"].replace("8808", str(server.server_port))     # a free port, not the guide's
        path = check_cost_in_record_and_reward(tmp_path, addition, "weather",
                                               [("weather", {"city": "Paris"})], '"temp_c": 18.5')
        code, out = listed(path, {"WEATHER_API_KEY": secret})
        assert code == 0 and "weather" in out and "city: string" in out and "$0.002 per call" in out, out
        # the service now expects another key (it reads the variable per request; the tool read it once,
        # when opened): it answers 401, recorded as an error that shows neither key
        monkeypatch.setenv("WEATHER_API_KEY", "wrong-" + secret)
        rollout, _ = run_calls(catalog_file(tmp_path, addition, "wrong.json"), [("weather", {"city": "Paris"})])
        assert "answered HTTP 401" in rollout.turns[0].expert.error
        assert secret not in json.dumps(rollout.to_dict()) and "wrong-" + secret not in json.dumps(rollout.to_dict())
    finally:
        server.shutdown()


def test_the_mcp_units_example(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)                       # the guide's command is relative to the repository root
    addition = example("units")
    entry = addition["tools"][0]
    assert entry["command"][0] == "python"
    entry["command"][0] = sys.executable          # this test's interpreter, whatever `python` is on PATH
    path = check_cost_in_record_and_reward(tmp_path, addition, "units",
                                           [("convert_length", {"value": 2, "unit": "mi", "to": "km"})], "3.218688")
    code, out = listed(path)
    assert code == 0, out
    assert "convert_length" in out and "echo" not in out          # include: only convert_length
    assert '"m" | "km" | "mi" | "ft"' in out and "$0.0005 per call; $0.001 per second" in out


def test_the_mcp_example_over_streamable_http(tmp_path, monkeypatch):
    import socket
    import time

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, str(REPO / "examples/tools/units_mcp.py"), "--http", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, "the HTTP MCP server did not start"
                time.sleep(0.2)
        token = "mcp-" + "7c2d" * 6
        monkeypatch.setenv("UNITS_TOKEN", token)
        addition = {"tools": [{"name": "units", "kind": "mcp", "url": f"http://127.0.0.1:{port}/mcp",
                               "headers": {"Authorization": "Bearer ${UNITS_TOKEN}"}, "exclude": ["echo"]}],
                    "prices": {"units": {"per_call": 0.0005}}}
        check_cost_in_record_and_reward(tmp_path, addition, "units",
                                        [("convert_length", {"value": 1, "unit": "km", "to": "m"})], "1000.0")
        rollout, _ = run_calls(catalog_file(tmp_path, addition, "again.json"), [("convert_length", {"value": 3, "unit": "ft", "to": "m"})])
        assert rollout.turns[0].expert.output == "0.9144" and token not in json.dumps(rollout.to_dict())
    finally:
        server.terminate()
        server.wait(timeout=30)
