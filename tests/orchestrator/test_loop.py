"""Loop logic with a scripted policy and scripted experts (real ones: tests/test_quickstart_integration.py)."""
from types import SimpleNamespace

import pytest

from orchestrator.catalog import load_catalog
from orchestrator.loop import LoopConfig, Task, run_episode, run_episodes, task_catalog
from orchestrator.policy import PolicyOutput
from orchestrator.records import LLMResponse, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.toolcall import format_tool_call


class ScriptedPolicy:
    price_model = "Qwen3-8B"

    def __init__(self, replies):
        self.replies = list(replies)
        self.seen = []

    def act(self, messages, tools, *, choices=None, temperature=1.0, max_tokens=1024):
        self.seen.append((messages, tools, choices))
        text = self.replies.pop(0)
        return PolicyOutput(text=text, usage=Usage(100, 10), latency=0.01,
                            prompt_ids=list(range(100)), response_ids=list(range(10)), logprobs=[-0.1] * 10)


def scripted_llm(replies):
    calls = []

    def llm(model, messages, **kw):
        calls.append((model, kw["price_model"], messages[0]["content"]))
        return LLMResponse(model=model, text=replies.pop(0), usage=Usage(1000, 200))
    llm.calls = calls
    return llm


class ListRetriever:
    def retrieve(self, queries, topk):
        return [[{"document": {"id": "p1", "contents": "Paris is the capital of France."}, "score": 0.9}]]


def runtime(llm, **kw):
    sandbox = lambda code, timeout: SimpleNamespace(stdout="6\n", stderr="", exit_code=0, timed_out=False, duration_s=2.0)
    return ToolRuntime(catalog=load_catalog(), serve="local", retriever=ListRetriever(), llm=llm, run_code=sandbox, **kw)


def call(tool, alias):
    return format_tool_call(tool, {"model": alias})


def test_episode_search_code_answer_with_costs_by_hand():
    policy = ScriptedPolicy([call("search", "search-3"), "I think I know", call("enhance_reasoning", "reasoner-2"),
                             call("answer", "answer-1")])
    llm = scripted_llm(["<query>capital of France</query>", "```python\nprint(2*3)\n```", "<answer>Paris</answer>"])
    rollout = run_episode(Task("t1", "What is the capital of France?"), policy, runtime(llm), LoopConfig(max_turns=10))
    assert rollout.finished and rollout.final_answer == "Paris" and rollout.stop_reason == "answer"
    assert [t.valid for t in rollout.turns] == [True, False, True, True]
    assert rollout.turns[1].invalid_reason == "no <tool_call> in the response"
    assert rollout.tool_calls == {"search-3": 1, "reasoner-2": 1, "answer-1": 1}
    # experts are served by the local model but priced as the alias's model
    assert [c[:2] for c in llm.calls] == [("smollm2-135m", "Qwen3-32B"), ("smollm2-135m", "gpt-5-mini"),
                                         ("smollm2-135m", "gpt-5")]
    # orchestrator: 4 turns x (100 in + 10 out) x 0.2/1M = 4 x 22e-6 = 88e-6
    # search-3 Qwen3-32B: 1000*0.8e-6 + 200*0.8e-6 = 960e-6
    # reasoner-2 gpt-5-mini: 1000*0.25e-6 + 200*2e-6 = 650e-6, plus 2 s of code x 8.3e-6 = 16.6e-6
    # answer-1 gpt-5: 1000*1.25e-6 + 200*10e-6 = 3250e-6
    assert rollout.cost == pytest.approx(88e-6 + 960e-6 + 650e-6 + 16.6e-6 + 3250e-6, rel=1e-9)
    assert rollout.turns[0].loss_mask == [1] * 10 and len(rollout.turns[0].prompt_ids) == 100
    # the documents and code output reached the next contexts
    last_user = policy.seen[-1][0][1]["content"]
    assert "Paris is the capital of France." in last_user and "Output:\n6" in last_user


def test_invalid_calls_recorded_and_turn_cap_ends_cleanly():
    policy = ScriptedPolicy([call("browse", "search-1"), call("search", "answer-1"), "<tool_call>{oops</tool_call>"])
    rollout = run_episode(Task("t", "q"), policy, runtime(scripted_llm([])), LoopConfig(max_turns=3))
    assert not rollout.finished and rollout.stop_reason == "max_turns" and rollout.final_answer is None
    reasons = [t.invalid_reason for t in rollout.turns]
    assert "unknown tool 'browse'" in reasons[0] and "not allowed for tool 'search'" in reasons[1] and "not JSON" in reasons[2]
    assert rollout.tool_calls == {} and rollout.latency == 0


def test_expert_failure_is_recorded_not_fatal():
    def failing_llm(model, messages, **kw):
        raise RuntimeError("server at http://x:1/v1 gave up")
    policy = ScriptedPolicy([call("answer", "answer-2"), call("answer", "answer-2")])
    rollout = run_episode(Task("t", "q"), policy, runtime(failing_llm), LoopConfig(max_turns=2))
    assert rollout.stop_reason == "max_turns"
    assert "gave up" in rollout.turns[0].expert.error


def test_policy_failure_ends_episode_with_reason():
    class Broken:
        price_model = "Qwen3-8B"

        def act(self, *a, **k):
            raise TimeoutError("policy endpoint stalled")
    rollout = run_episode(Task("t", "q"), Broken(), runtime(scripted_llm([])), LoopConfig())
    assert rollout.stop_reason.startswith("error: policy: TimeoutError")


def test_task_subset_aliases_and_prices_reach_policy_and_constraint():
    task = Task("t", "q", tools={"search": {"web-cheap": "Qwen3-32B"}, "answer": {"ans-x": "gpt-5"}},
                prices={"gpt-5": {"input": 2.0, "output": 20.0}})
    cat = task_catalog(load_catalog(), task)
    assert [t.name for t in cat.tools] == ["search", "answer"] and cat.price("gpt-5").output == 20.0
    assert cat.tool("search").aliases["web-cheap"].latency_s == 8  # latency looked up by model
    assert "search-1 usually" not in cat.tool("search").argument_description  # prose names other aliases
    shuffled = task_catalog(load_catalog(), Task("s", "q", tools={"search": {"search-1": "Qwen3-32B"}}))
    assert shuffled.tool("search").aliases["search-1"].latency_s == 8  # Qwen3-32B's, not gpt-5's 22 s
    policy = ScriptedPolicy([call("answer", "ans-x")])
    llm = scripted_llm(["<answer>A</answer>"])
    rollout = run_episode(task, policy, runtime(llm), LoopConfig(constrained=True))
    _, tools, choices = policy.seen[0]
    assert [t["function"]["name"] for t in tools] == ["search", "answer"]
    assert choices == [call("search", "web-cheap"), call("answer", "ans-x")]
    # answer priced with the task's own gpt-5 price: 1000*2e-6 + 200*20e-6 = 6e-3, + orchestrator 22e-6
    assert rollout.cost == pytest.approx(6e-3 + 22e-6)


def test_run_episodes_keeps_order_and_reports_each():
    done = []
    tasks = [Task(str(i), "q") for i in range(5)]

    class Answerer(ScriptedPolicy):
        def act(self, *a, **k):
            return PolicyOutput(text=call("answer", "answer-4"), usage=Usage(1, 1), latency=0.0)
    llm = lambda model, messages, **kw: LLMResponse(model=model, text="<answer>x</answer>")
    out = run_episodes(tasks, Answerer([]), runtime(llm), LoopConfig(), concurrency=3,
                       on_done=lambda t, r: done.append(t.id))
    assert [r.task_id for r in out] == ["0", "1", "2", "3", "4"] and sorted(done) == ["0", "1", "2", "3", "4"]
