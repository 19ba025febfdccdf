"""The orchestrator server's tests' world (tests/orchestrator/test_serve*.py): the scripted mock
backend (evaluation/mock_backend.py: real HTTP, the gateway, the evaluation set-up and loop; no
keys), which answers in milliseconds and records every request, so the tests read the
orchestrator's real prompt and count its turns, and can keep a question from ever being answered
(ENDLESS) or have it answered slowly (`delay_s`); the set-up serving it (`serve_mock`; the
fixtures are in tests/orchestrator/serve/conftest.py) and the openai-SDK helpers."""
from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from evaluation.mock_backend import MockBackend, registry_yaml
from orchestrator.serve import build, build_parser

REPO = Path(__file__).resolve().parents[1]
QUESTION, ANSWER = "Which city hosts the Louvre?", "Paris"
ENDLESS = "Keep thinking about the meaning of life."   # the scripted orchestrator never answers it
FAILING = "What does the broken server say?"          # the backend answers HTTP 500


class ScriptedBackend(MockBackend):
    """The mock, recording every request body; the orchestrator never answers ENDLESS."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.bodies = []

    def reply(self, body):
        self.bodies.append(body)
        status, out = super().reply(body)
        calls = out.get("choices", [{}])[0].get("message", {}).get("tool_calls") if status == 200 else None
        if calls and ENDLESS in body["messages"][-1]["content"]:
            calls[0]["function"] = {"name": "enhance_reasoning", "arguments": json.dumps({"model": "reasoner-2"})}
        return status, out

    def orchestrator_bodies(self, question=QUESTION):
        return [b for b in self.bodies if any(t["function"]["name"] == "answer" for t in b.get("tools") or [])
                and question in b["messages"][-1]["content"]]


@contextmanager
def serve_mock(backend: ScriptedBackend, tmp: Path):
    """The evaluation set-up serving `backend` as "mock-orch" (every expert "mock-expert", profile
    default), with $TOOLORCHESTRA_MODELS at its registry while in the block; yields (Served, tools.json)."""
    (tmp / "models.yaml").write_text(registry_yaml(backend.base_url, ["mock-orch", "mock-expert"]))
    tools = json.loads((REPO / "tools.json").read_text())
    tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
    (tmp / "tools.json").write_text(json.dumps(tools))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TOOLORCHESTRA_MODELS", str(tmp / "models.yaml"))
        args = build_parser().parse_args(["--model", "mock-orch", "--profile", "default", "--serve", "mock",
                                          "--tools", str(tmp / "tools.json")])
        yield build(args), tmp / "tools.json"


def client(srv, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, **kw)


def ask(srv, question=QUESTION, **kw):
    return client(srv).chat.completions.create(
        model="mock-orch", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": question}],
        **kw)


def health(srv) -> dict:
    return httpx.get(srv.url + "/health").json()


def wait_for(predicate, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)
