"""LLM_CALL.get_llm_response: cost arithmetic, price models, tool-call parsing, request shape."""
from __future__ import annotations

import json

import pytest

from LLM_CALL import LLMCallError, LLMResponse, ToolCall, Usage, get_llm_response
from orchestrator.catalog import DEFAULT_CATALOG, parse_catalog
from _gateway_fakes import FakeServer, write_registry

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture
def registry(tmp_path, monkeypatch):
    def make(models: dict):
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(write_registry(tmp_path / "models.yaml", models)))
    return make


def _call(registry, server, model_entry=None, **kwargs) -> LLMResponse:
    registry({"m": {"backend": "vllm", "base_url": server.url, **(model_entry or {})}})
    return get_llm_response("m", MSG, **kwargs)


@pytest.mark.parametrize("price_model, usage, dollars", [
    # gpt-5: $1.25 / 1M in, $10 / 1M out: 1000 x 1.25e-6 + 500 x 10e-6 = 0.00125 + 0.005
    ("gpt-5", (1000, 500), 0.00625),
    # gpt-5-mini: 0.25 / 2: 2000 x 0.25e-6 + 300 x 2e-6 = 0.0005 + 0.0006
    ("gpt-5-mini", (2000, 300), 0.0011),
    # Qwen3-32B 0.8 / 0.8: 1500 tokens x 0.8e-6
    ("Qwen3-32B", (1000, 500), 0.0012),
    # claude-opus-4-1 15 / 75: 10 x 15e-6 + 20 x 75e-6 = 0.00015 + 0.0015
    ("claude-opus-4-1", (10, 20), 0.00165),
])
def test_cost_is_price_table_times_reported_usage(registry, price_model, usage, dollars):
    with FakeServer(["ok"], usage=usage) as srv:
        r = _call(registry, srv, price_model=price_model)
    assert r.usage == Usage(*usage)
    assert r.cost == pytest.approx(dollars, rel=1e-12)


def test_price_model_precedence_argument_then_entry_then_name(registry):
    with FakeServer(["ok"], usage=(1_000_000, 0)) as srv:
        r = _call(registry, srv, {"price_model": "Qwen2.5-Math-7B-Instruct"})         # entry: $0.2 / 1M in
        assert r.cost == pytest.approx(0.2)
        r = _call(registry, srv, {"price_model": "Qwen2.5-Math-7B-Instruct"}, price_model="gpt-5")
        assert r.cost == pytest.approx(1.25)                                         # argument wins


def test_caller_catalog_overrides_default_prices(registry):
    data = json.loads(DEFAULT_CATALOG.read_text())
    data["prices"]["gpt-5"] = {"input": 2.0, "output": 4.0}
    catalog = parse_catalog(data, "per-example prices")
    with FakeServer(["ok"], usage=(250, 125)) as srv:
        r = _call(registry, srv, price_model="gpt-5", catalog=catalog)
    assert r.cost == pytest.approx(250 * 2.0e-6 + 125 * 4.0e-6)    # 0.0005 + 0.0005 = 0.001


def test_hermes_markup_in_text_is_parsed_by_the_one_parser(registry):
    text = 'Let me search.\n<tool_call>\n{"name": "search", "arguments": {"model": "search-2"}}\n</tool_call>'
    with FakeServer(["ok"], text=text) as srv:
        r = _call(registry, srv, price_model="Qwen3-8B")
    assert r.tool_calls == [ToolCall(name="search", arguments={"model": "search-2"})]
    assert r.text == "Let me search."          # markup removed once parsed


def test_malformed_markup_stays_in_text_so_the_caller_sees_it(registry):
    text = '<tool_call>\n{"name": "search", "arguments": {"model": \n</tool_call>'
    with FakeServer(["ok"], text=text) as srv:
        r = _call(registry, srv, price_model="Qwen3-8B")
    assert r.tool_calls == [] and r.text == text


def test_structured_openai_tool_calls_become_toolcalls(registry):
    calls = [{"id": "call_1", "type": "function",
              "function": {"name": "answer", "arguments": json.dumps({"model": "answer-1"})}},
             {"id": "call_2", "type": "function", "function": {"name": "bad", "arguments": "{not json"}}]
    with FakeServer(["ok"], text="", tool_calls=calls) as srv:
        r = _call(registry, srv, price_model="Qwen3-8B")
    assert r.tool_calls == [ToolCall(name="answer", arguments={"model": "answer-1"}, id="call_1")]


def test_request_carries_limits_tools_choices_and_extras(registry):
    tools = [{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}]
    with FakeServer(["ok"], text="yes") as srv:
        r = _call(registry, srv, {"extra_body": {"top_k": 5}}, tools=tools, temperature=0.0, max_tokens=7,
                  choices=["yes", "no"], price_model="Qwen3-8B", seed=3)
    body = srv.requests[0]["body"]
    assert body["max_completion_tokens"] == 7 and body["temperature"] == 0.0 and body["seed"] == 3
    assert body["tools"] == tools and body["tool_choice"] == "none"     # vLLM: template renders, we parse
    assert body["structured_outputs"] == {"choice": ["yes", "no"]}       # vLLM 0.32 field
    assert body["top_k"] == 5                                           # registry extra_body merged
    assert r.text == "yes" and r.latency > 0 and r.raw_finish_reason == "stop"


def test_choices_on_a_backend_without_constrained_decoding_is_refused(registry, monkeypatch):
    monkeypatch.setenv("K", "x")
    with FakeServer(["ok"]) as srv:
        registry({"m": {"backend": "openai", "base_url": srv.url, "api_key_env": "K", "price_model": "gpt-5"}})
        with pytest.raises(LLMCallError, match="choices.*needs backend vllm or transformers"):
            get_llm_response("m", MSG, choices=["a", "b"])
        assert srv.hits == 0
