"""A scripted policy and expert for episodes that call function tools (shared by this folder's tests)."""
from __future__ import annotations

import json
from pathlib import Path

from orchestrator.catalog import load_catalog
from orchestrator.loop import LoopConfig, Task, run_episode
from orchestrator.policy import PolicyOutput
from orchestrator.records import LLMResponse, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.toolcall import format_tool_call

REPO = Path(__file__).resolve().parents[3]


class ScriptedPolicy:
    price_model = "Qwen3-8B"

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    def act(self, messages, tools, *, choices=None, grammar=None, temperature=1.0, max_tokens=1024):
        self.seen.append({"messages": messages, "tools": tools, "choices": choices, "grammar": grammar})
        return PolicyOutput(text=self.replies.pop(0), usage=Usage(100, 10), latency=0.01,
                            prompt_ids=list(range(100)), response_ids=list(range(10)), logprobs=[-0.1] * 10)


def answering_llm(answer: str = "14"):
    def llm(model, messages, **kw):
        return LLMResponse(model=model, text=f"<answer>{answer}</answer>", usage=Usage(1000, 200))
    return llm


def catalog_file(tmp_path: Path, addition: dict, name: str = "tools.json") -> Path:
    """The repository's tools.json with `addition` ({"tools": [...], "prices": {...}}) added."""
    data = json.loads((REPO / "tools.json").read_text())
    data["tools"] += addition.get("tools", [])
    data["prices"].update(addition.get("prices", {}))
    path = tmp_path / name
    path.write_text(json.dumps(data, indent=1))
    return path


def run_calls(catalog_path, calls: list[tuple[str, dict]], answer_after: bool = True, **config):
    """One QA episode whose policy makes `calls` (tool, arguments) then answers with answer-2."""
    catalog = load_catalog(catalog_path)
    replies = [format_tool_call(t, a) for t, a in calls]
    if answer_after:
        replies.append(format_tool_call("answer", {"model": "answer-2"}))
    policy = ScriptedPolicy(replies)
    runtime = ToolRuntime(catalog=catalog, serve="local", llm=answering_llm())
    rollout = run_episode(Task("t1", "What is (3+4)*2?"), policy, runtime,
                          LoopConfig(max_turns=len(replies), **config))
    return rollout, policy
