"""The server (orchestrator/serve/) with a catalog that adds a function tool (docs/tools.md): the
served orchestrator sees the calculator with its own arguments, calls it, and the call's arguments,
output and cost come back in the response's trace and dollars."""
import json
from pathlib import Path

import openai
import pytest

from evaluation.mock_backend import MockBackend, registry_yaml
from orchestrator.serve import Background, ServeLimits, build, build_parser, create_app

REPO = Path(__file__).resolve().parents[3]
QUESTION = "What is (3 + 4) * 2?"


class CalculatingBackend(MockBackend):
    """The scripted mock whose orchestrator calls the calculator once before its usual script."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.bodies = []

    def reply(self, body):
        self.bodies.append(body)
        status, out = super().reply(body)
        calls = out.get("choices", [{}])[0].get("message", {}).get("tool_calls") if status == 200 else None
        if calls and "[tool] calculator" not in json.dumps(body["messages"]):
            calls[0]["function"] = {"name": "calculator", "arguments": json.dumps({"expression": "(3 + 4) * 2"})}
        return status, out


@pytest.fixture()
def served(tmp_path, monkeypatch):
    with CalculatingBackend(answers={QUESTION: "14"}) as backend:
        (tmp_path / "models.yaml").write_text(registry_yaml(backend.base_url, ["mock-orch", "mock-expert"]))
        tools = json.loads((REPO / "tools.json").read_text())
        tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
        tools["tools"].append({"name": "calculator", "kind": "python", "handler": "examples.tools.calculator:calculate"})
        tools["prices"]["calculator"] = {"per_call": 0.0001}
        (tmp_path / "tools.json").write_text(json.dumps(tools))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(tmp_path / "models.yaml"))
        monkeypatch.syspath_prepend(str(REPO))
        args = build_parser().parse_args(["--model", "mock-orch", "--profile", "default", "--serve", "mock",
                                          "--tools", str(tmp_path / "tools.json")])
        with Background(create_app(build(args), ServeLimits(concurrency=2, queue=2))) as srv:
            yield srv, backend


def test_a_served_orchestrator_calls_a_function_tool_and_reports_its_cost(served):
    srv, backend = served
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="mock-orch", messages=[{"role": "user", "content": QUESTION}])
    orch = r.model_extra["orchestra"]
    calc = orch["trace"][0]
    assert calc["tool"] == "calculator" and calc["output"] == "14.0" and calc["error"] is None
    assert calc["cost"] >= 0.0001 and calc["latency"] > 0      # the turn's: the tool's $0.0001 plus the policy's tokens
    assert orch["tool_calls"]["calculator"] == 1 and orch["dollars"] == pytest.approx(sum(t["cost"] for t in orch["trace"]))
    first = next(b for b in backend.bodies if b.get("tools"))
    schema = next(t["function"] for t in first["tools"] if t["function"]["name"] == "calculator")
    assert schema["parameters"]["required"] == ["expression"] and "$0.0001 per call" in schema["description"]
