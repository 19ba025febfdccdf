"""Our paper profile against upstream's own output (tests/fixtures/upstream/, produced by running
NVlabs/ToolOrchestra 3d29bed's code on fixed inputs; its README says how).

Each episode is replayed through our loop with the fixture's scripted orchestrator calls, expert
replies and retrieval results, and the same substitutions the fixture made (a character
tokenizer: 1 token = 1 character; code run by `python`).  Every orchestrator request (system and
user messages, tools offered, budget) and every expert request must equal upstream's byte for byte.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.catalog import load_catalog
from orchestrator.context import TokenCounter
from orchestrator.episodes.base import Task
from orchestrator.loop import run_episode
from orchestrator.policy import PolicyOutput
from orchestrator.records import LLMResponse, ToolCall, Usage
from orchestrator.settings import load_profile
from orchestrator.setup import build_runtime, loop_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "upstream"


class CharTokenizer:
    """The fixtures' stand-in for the Qwen3-8B tokenizer: one token per character."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(i) for i in ids)


def load(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


class ScriptedOrchestrator:
    """Calls the fixture's tools in order; records what it was shown."""

    price_model = "Qwen3-8B"

    def __init__(self, calls):
        self.calls, self.seen = list(calls), []
        self.engine = SimpleNamespace(tokenizer=CharTokenizer())

    def act(self, messages, tools, *, temperature, max_tokens, **kw):
        self.seen.append({"messages": messages, "tools": [t["function"]["name"] for t in tools],
                          "max_tokens": max_tokens, "temperature": temperature})
        call = self.calls.pop(0)
        return PolicyOutput(text="", usage=Usage(1, 1), latency=0.0,
                            tool_calls=[ToolCall(call["name"], call["arguments"])])


class ScriptedExperts:
    """Replies by (tool, alias) from the fixture's script; records each request."""

    def __init__(self, script, catalog):
        self.replies = {**script["search_replies"], **script["code_replies"], **script["answer_replies"]}
        self.alias = {(t.name, spec.model): a for t in catalog.tools for a, spec in t.aliases.items()}
        self.seen = []

    def __call__(self, model, messages, *, price_model, temperature, max_tokens, **kw):
        text = messages[-1]["content"]
        tool = ("search" if "write a query" in text or "concise query" in text else
                "enhance_reasoning" if "python code" in text else "answer")
        alias = self.alias[(tool, price_model)]
        self.seen.append({"tool": tool, "alias": alias, "messages": messages, "max_tokens": max_tokens,
                          "temperature": temperature})
        return LLMResponse(model=model, text=self.replies[alias], usage=Usage(1, 1))


class Searches:
    """The fixture's i-th search result for the i-th search, in our retriever's shape."""

    def __init__(self, searches):
        self.searches, self.requests = list(searches), []

    def retrieve(self, queries, topk, **kw):
        self.requests.append({"queries": queries, "topk": topk, **kw})
        hits = self.searches.pop(0)
        return [[{"document": {"id": h["document"]["id"],
                               "contents": h["document"].get("content", h["document"].get("contents"))},
                  "score": h.get("score")}
                 for h in hits if "content" in h["document"] or "contents" in h["document"]]]


def run_python(code: str, timeout: float):
    """Upstream ran `python FILE` (fixture substitutions); so do we here."""
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    return SimpleNamespace(stdout=proc.stdout, stderr=proc.stderr, exit_code=proc.returncode, timed_out=False,
                           duration_s=time.monotonic() - started)


def replay(benchmark: str, fixture: dict, final_alias: str):
    profile = load_profile("paper")
    settings = profile.section("qa", benchmark)
    catalog = load_catalog()
    script = fixture["inputs"]["script"]
    calls = script["orchestrator_tool_calls_prefix"] + [{"name": "answer", "arguments": {"model": final_alias}}]
    policy, experts, searches = ScriptedOrchestrator(calls), ScriptedExperts(script, catalog), \
        Searches(fixture["inputs"]["searches"])
    runtime = build_runtime(profile, {"qa": settings}, catalog, retriever=searches, llm=experts, run_code=run_python,
                            counter=TokenCounter(CharTokenizer()))
    example = fixture["inputs"]["example"]
    rollout = run_episode(Task(example["id"], example["question"]), policy, runtime, loop_config(settings))
    return rollout, policy, experts, searches


def orchestrator_turns(fixture):
    return [t for t in fixture["outputs"]["turns"] if t["kind"] == "orchestrator"]


def same(ours: list[dict], theirs: list[dict]) -> bool:
    """Equal messages: role and content, or (where the fixture stores a repeated message by its
    digest) role, sha256 and length."""
    if len(ours) != len(theirs):
        return False
    for a, b in zip(ours, theirs):
        text = a["content"]
        if a["role"] != b["role"]:
            return False
        if "content" in b and text != b["content"]:
            return False
        if "content" not in b and (hashlib.sha256(text.encode()).hexdigest(), len(text)) != (b["sha256"], b["len"]):
            return False
    return True


@pytest.mark.parametrize("benchmark", ["hle", "frames"])
def test_orchestrator_and_expert_requests_equal_upstreams(benchmark):
    fixture = load(f"{benchmark}_context.json")
    finals = fixture["outputs"]["final_turn_by_answer_alias"]
    for final_alias, final_turns in finals.items():
        rollout, policy, experts, searches = replay(benchmark, fixture, final_alias)
        assert rollout.stop_reason == "answer", rollout.stop_reason
        want = orchestrator_turns(fixture)
        assert len(policy.seen) == len(want)
        for k, (ours, theirs) in enumerate(zip(policy.seen, want)):
            assert ours["tools"] == theirs["tools_offered"], (benchmark, k)
            assert same(ours["messages"], theirs["messages"]), (benchmark, k)    # document order, cuts, code
            assert (ours["max_tokens"], ours["temperature"]) == (theirs["request"]["max_tokens"],
                                                                 theirs["request"]["temperature"])
        # every expert request: the same messages, budget and temperature
        theirs = [t for t in fixture["outputs"]["turns"] if t["kind"] == "expert"]
        theirs += [t for t in final_turns if t["kind"] == "expert"]
        assert [(e["tool"], e["alias"]) for e in experts.seen] == [(t["tool"], t["alias"]) for t in theirs]
        for ours, t in zip(experts.seen, theirs):
            assert same(ours["messages"], t["messages"]), (benchmark, t["alias"])
            budget = t["request"].get("max_completion_tokens") or t["request"].get("max_tokens")
            assert (ours["max_tokens"], float(ours["temperature"])) == (budget, float(t["request"]["temperature"]))
        # the retrieval requests: query, top-k and eid as upstream sent them
        sent = fixture["outputs"]["retrieval_payloads"]
        assert [r["queries"] for r in searches.requests] == [p["json"]["queries"] for p in sent]
        assert {r["topk"] for r in searches.requests} == {p["json"]["topk"] for p in sent}
        assert all("eid" in p["json"] for p in sent)
        # FRAMES: upstream sends the eid and its wiki server ignores it; ours would answer 422, so the
        # paper profile does not send it (docs/evaluation.md, "question id as eid")
        assert [r.get("eid") is not None for r in searches.requests] == [benchmark == "hle"] * len(sent)
        # the final answer as upstream extracted it
        result = next(t for t in final_turns if t["kind"] == "result")
        assert rollout.final_answer == result["call_tool_return"]["pred"]


def test_upstreams_document_list_is_what_our_episode_holds():
    """The documents (order, de-duplication) after upstream's three HLE searches are exactly those
    the last orchestrator prompt lists, in the same order, each as upstream cut it."""
    fixture = load("hle_context.json")
    _, policy, _, _ = replay("hle", fixture, "answer-1")
    last_user = policy.seen[-1]["messages"][1]["content"]
    docs = fixture["outputs"]["doc_list_after_searches"]
    positions = [last_user.find(f"Doc {i + 1}: {d[:1200]}") for i, d in enumerate(docs)]
    cut = next(i for i, p in enumerate(positions) if p >= 0)        # the context keeps its tail
    assert cut > 0 and all(p >= 0 for p in positions[cut:]) and positions[cut:] == sorted(positions[cut:])


def _one_call(benchmark: str, tool: str, alias: str, reply, run_code, task_id: str = "q-1"):
    """One expert call of `tool` through our runtime under the paper profile; returns the state and
    what the retriever was asked."""
    from orchestrator.context import EpisodeState

    profile = load_profile("paper")
    settings = profile.section("qa", benchmark)
    searches = Searches([[{"document": {"id": "d1", "contents": "some text"}}]])
    runtime = build_runtime(profile, {"qa": settings}, load_catalog(), retriever=searches, run_code=run_code,
                            llm=lambda model, messages, **kw: LLMResponse(model=model, text=reply, usage=Usage(1, 1)),
                            counter=TokenCounter(CharTokenizer()))
    state = EpisodeState(fixture_problem, task_id=task_id)
    runtime.call(tool, alias, state)
    return state, searches.requests


fixture_problem = load("query_extraction.json")["inputs"]["problem"]


@pytest.mark.parametrize("benchmark, model, alias", [("hle", "gpt-5", "search-1"), ("hle", "Qwen/Qwen3-32B", "search-3"),
                                                     ("frames", "gpt-5", "search-1"),
                                                     ("frames", "Qwen/Qwen3-32B", "search-3")])
def test_search_queries_equal_upstreams(benchmark, model, alias):
    fixture = load("query_extraction.json")
    replies = {r["case"]: r["reply"] for r in fixture["inputs"]["replies"]}
    for want in fixture["outputs"]["by_bench_and_model"][f"{benchmark} | {model}"]:
        case = want["case"]
        if want["raised"] or (benchmark, model, case) in {("frames", "gpt-5", "empty_reply"),
                                                          ("frames", "gpt-5", "null_content")}:
            # upstream crashed (a 5-character HLE query, a null reply), or FRAMES searched the question for
            # an empty gpt-5 reply: departures listed in docs/evaluation.md
            continue
        _, requests = _one_call(benchmark, "search", alias, replies[case] or "", run_code=None)
        if want["searched"]:
            assert [r["queries"] for r in requests] == [[want["query_to_call"]]], case
            assert requests[0]["topk"] == want["payload"]["topk"]
        else:
            assert requests == [], case


@pytest.mark.parametrize("benchmark, model, alias", [("hle", "gpt-5", "reasoner-1"),
                                                     ("hle", "Qwen/Qwen2.5-Coder-32B-Instruct", "reasoner-3"),
                                                     ("frames", "gpt-5", "reasoner-1"),
                                                     ("frames", "Qwen/Qwen2.5-Coder-32B-Instruct", "reasoner-3")])
def test_code_runs_and_outputs_equal_upstreams(benchmark, model, alias):
    fixture = load("code_tool.json")
    replies = {r["case"]: r["reply"] for r in fixture["inputs"]["replies"]}
    for want in fixture["outputs"]["call_tool_by_bench_and_model"][f"{benchmark} | {model}"]:
        ran = []

        def run_code(code, timeout):
            ran.append(code)
            return run_python(code, timeout)

        state, _ = _one_call(benchmark, "enhance_reasoning", alias, replies[want["case"]] or "", run_code)
        assert ran == ([want["generated_code"]] if want["generated_code"] else []), want["case"]
        kept = [(c.code, c.output) for c in state.code_blocks]
        assert kept == ([(want["generated_code"], want["exec_result"])] if want["exec_result"].strip() else []), \
            want["case"]
