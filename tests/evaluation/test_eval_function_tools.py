"""Evaluation with a catalog that adds a function tool (docs/tools.md): run_frames' main() against
evaluation.mock_backend (real HTTP) offers the orchestrator the tool with its own argument schema
and price, under `--tools FILE` and as an unseen-tools `--catalog FILE`."""
import json
from pathlib import Path

import pytest

from evaluation.mock_backend import MockBackend, registry_yaml

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = {"Which city hosts the Louvre?": "Paris"}


class RecordingBackend(MockBackend):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.bodies = []

    def reply(self, body):
        self.bodies.append(body)
        return super().reply(body)


@pytest.fixture()
def env(tmp_path, monkeypatch, capsys):
    with RecordingBackend(answers=QUESTIONS) as backend:
        (tmp_path / "models.yaml").write_text(registry_yaml(backend.base_url, ["mock-orch", "mock-expert", "mock-judge"]))
        tools = json.loads((REPO / "tools.json").read_text())
        tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
        tools["tools"].append({"name": "calculator", "kind": "python", "handler": "examples.tools.calculator:calculate"})
        tools["prices"]["calculator"] = {"per_call": 0.0001}
        (tmp_path / "tools.json").write_text(json.dumps(tools))
        (tmp_path / "frames.jsonl").write_text("".join(json.dumps({"id": f"f{i}", "question": q, "answer": a}) + "\n"
                                                       for i, (q, a) in enumerate(QUESTIONS.items())))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(tmp_path / "models.yaml"))
        monkeypatch.syspath_prepend(str(REPO))      # the handler's package, as from the repository root
        yield {"tmp": tmp_path, "backend": backend, "capsys": capsys}


def frames(env, *args):
    from evaluation.qa_cli import main

    env["capsys"].readouterr()
    code = main("frames", ["--profile", "default", "--serve", "mock", "--model", "mock-orch", "--judge-model",
                           "mock-judge", "--no-progress", "--no-report", "--data", str(env["tmp"] / "frames.jsonl"),
                           *map(str, args)])
    return code, *env["capsys"].readouterr()


@pytest.mark.parametrize("flag", ["--tools", "--catalog"])
def test_a_function_tool_reaches_the_orchestrator_in_evaluation(env, flag):
    out = env["tmp"] / f"out{flag}"
    code, stdout, err = frames(env, flag, env["tmp"] / "tools.json", "--output", out)
    assert code == 0, err
    orchestrator_requests = [b for b in env["backend"].bodies if b.get("tools")]
    assert orchestrator_requests
    calc = next(t["function"] for t in orchestrator_requests[0]["tools"] if t["function"]["name"] == "calculator")
    assert calc["parameters"]["required"] == ["expression"] and "$0.0001 per call" in calc["description"]
    config = json.loads((out / "run_config.json").read_text())
    if flag == "--catalog":                      # a new tool is what is unseen
        assert config["unseen_tools"]["tools"] == ["calculator"] and config["unseen_tools"]["models"] == {}
