"""Hostile 200 replies against real HTTP (tests/provider_emulator.py's `faults`): a reply of the
wrong shape or with impossible usage is a retryable LLMCallError that fails over like a 5xx, and a
body over `max_reply_bytes` stops at the cap while it streams in (issue 45, finding 2)."""
from __future__ import annotations

import tracemalloc

import httpx2
import pytest
from provider_emulator import SHAPE_FAULTS, ProviderEmulator
from _gateway_fakes import FakeServer, elapsed, write_registry

from LLM_CALL import LLMCallError, get_llm_response
from orchestrator.gateway.endpoints import register_endpoint
from orchestrator.gateway.registry import DEFAULT_MAX_REPLY_BYTES

MSG = [{"role": "user", "content": "hi"}]
MiB = 1024 * 1024

# what the error says for each wrong shape (max_tokens=64)
SHAPE_ERRORS = {
    "choices_string": "choices: Input should be a valid list",
    "choices_object": "choices: Input should be a valid list",
    "no_message": "choices.0.message: Field required",
    "message_null": "choices.0.message: Input should be a valid dictionary",
    "usage_string": "usage: Input should be a valid dictionary",
    "usage_null_counts": "usage.prompt_tokens: Input should be a valid integer",
    "usage_negative": "usage.completion_tokens: Input should be greater than or equal to 0",
    "usage_over_budget": "usage reports 1064 completion tokens, more than the 64 the request allowed",
}


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLORCHESTRA_ENDPOINTS", str(tmp_path / "endpoints.json"))

    def make(models: dict):
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(write_registry(tmp_path / "models.yaml", models)))
    return make


def test_every_shape_fault_has_its_expected_error():
    assert set(SHAPE_ERRORS) == set(SHAPE_FAULTS)


@pytest.mark.parametrize("fault", SHAPE_FAULTS)
def test_wrong_shape_is_a_retried_call_error_naming_the_field(registry, fault):
    with ProviderEmulator({}, faults={"*": fault}) as emu:
        registry({"m": {"backend": "vllm", "base_url": emu.base_url, "price_model": "Qwen3-32B"}})
        err, _ = elapsed(lambda: get_llm_response("m", MSG, max_tokens=64, max_retries=1))
    assert type(err) is LLMCallError, repr(err)          # not AttributeError / KeyError / TypeError
    assert err.retryable and err.attempts == 2 and emu.fault_hits == 2
    assert "malformed reply" in str(err) and SHAPE_ERRORS[fault] in str(err), str(err)
    assert err.endpoint == emu.base_url and emu.base_url in str(err)


@pytest.mark.parametrize("fault", SHAPE_FAULTS)
def test_pool_with_one_bad_replica_answers_10_of_10_calls(registry, tmp_path, fault):
    with ProviderEmulator({}, faults={"*": fault}) as bad, ProviderEmulator({}) as good:
        for url in (bad.base_url, good.base_url):
            register_endpoint(tmp_path / "endpoints.json", "m", url)
        registry({"m": {"backend": "vllm", "price_model": "Qwen3-32B", "max_retries": 2}})
        results = [get_llm_response("m", MSG, max_tokens=64) for _ in range(10)]
    assert len(results) == 10 and all(r.endpoint == good.base_url for r in results)
    assert all(r.usage.completion_tokens > 0 and r.cost > 0 for r in results)     # never a negative cost
    assert bad.fault_hits >= 1 and good.requests == 10


@pytest.mark.parametrize("fault,expected", [
    ("usage_negative", "usage.output_tokens: Input should be greater than or equal to 0"),
    ("usage_string", "usage: Input should be a valid dictionary")])
def test_anthropic_reply_of_the_wrong_shape_is_a_call_error(registry, monkeypatch, fault, expected):
    monkeypatch.setenv("EMULATOR_KEY", "anthropic-test-key-0123")
    with ProviderEmulator({}, faults={"*": fault}) as emu:
        registry({"c": {"backend": "anthropic", "model": "claude-sonnet-4", "base_url": emu.root,
                        "api_key_env": "EMULATOR_KEY", "price_model": "claude-sonnet-4"}})
        err, _ = elapsed(lambda: get_llm_response("c", MSG, max_tokens=64, max_retries=1))
    assert type(err) is LLMCallError and err.retryable and err.attempts == 2, repr(err)
    assert "malformed reply" in str(err) and expected in str(err), str(err)


def _traced(fn):
    """fn()'s result and the peak bytes Python allocated while it ran."""
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_endless_body_stops_at_the_cap_without_holding_it(registry):
    cap = 256 * 1024
    with ProviderEmulator({}, faults={"*": "endless"}) as emu:
        registry({"m": {"backend": "vllm", "base_url": emu.base_url, "price_model": "Qwen3-32B",
                        "max_reply_bytes": cap}})
        (err, _), peak = _traced(lambda: elapsed(lambda: get_llm_response("m", MSG, max_retries=1)))
        streamed = emu.bytes_streamed
    assert type(err) is LLMCallError and err.retryable and err.attempts == 2, repr(err)
    assert f"reply body over max_reply_bytes {cap} (0.25 MiB): stopped reading at the cap" in str(err)
    assert "raise max_reply_bytes" in str(err)
    assert peak < 16 * MiB, peak                 # two attempts of 0.25 MiB each, not the endless body
    assert streamed < 64 * MiB, streamed         # the client hung up: the server stopped streaming


def test_anthropic_endless_body_stops_at_the_cap(registry, monkeypatch):
    monkeypatch.setenv("EMULATOR_KEY", "anthropic-test-key-0123")
    with ProviderEmulator({}, faults={"*": "endless"}) as emu:
        registry({"c": {"backend": "anthropic", "model": "claude-sonnet-4", "base_url": emu.root,
                        "api_key_env": "EMULATOR_KEY", "price_model": "claude-sonnet-4", "max_reply_bytes": MiB}})
        err, _ = elapsed(lambda: get_llm_response("c", MSG, max_retries=0))
    assert type(err) is LLMCallError and err.retryable, repr(err)
    assert f"{emu.root}: reply body over max_reply_bytes {MiB} (1 MiB)" in str(err), str(err)


def test_300_mb_content_length_is_refused_before_reading(registry):
    with ProviderEmulator({}, faults={"*": "huge_declared"}) as emu:
        registry({"m": {"backend": "vllm", "base_url": emu.base_url, "price_model": "Qwen3-32B"}})
        (err, _), peak = _traced(lambda: elapsed(lambda: get_llm_response("m", MSG, max_retries=0)))
    assert type(err) is LLMCallError and err.attempts == 1, repr(err)
    assert (f"reply declares Content-Length 300000000 (286 MiB), over max_reply_bytes {DEFAULT_MAX_REPLY_BYTES} "
            f"(16 MiB): not read") in str(err), str(err)
    assert peak < 16 * MiB, peak


def test_gzip_bomb_is_cut_at_the_cap_while_inflating(registry):
    cap = MiB
    with ProviderEmulator({}, faults={"*": "gzip_bomb"}) as emu:
        registry({"m": {"backend": "vllm", "base_url": emu.base_url, "price_model": "Qwen3-32B",
                        "max_reply_bytes": cap}})
        (err, _), peak = _traced(lambda: elapsed(lambda: get_llm_response("m", MSG, max_retries=0)))
    assert type(err) is LLMCallError, repr(err)
    assert f"reply body over max_reply_bytes {cap} (1 MiB)" in str(err), str(err)
    assert peak < 16 * MiB, peak                 # 64 MiB inflated would show here


def test_gzip_replies_are_inflated_and_read(registry):
    with ProviderEmulator({}, gzip=True) as emu:
        raw = httpx2.post(f"{emu.base_url}/chat/completions", headers={"accept-encoding": "gzip"},
                          json={"model": "m", "messages": MSG})
        assert raw.headers.get("content-encoding") == "gzip"       # the emulator does compress
        registry({"m": {"backend": "vllm", "base_url": emu.base_url, "price_model": "Qwen3-32B"}})
        r = get_llm_response("m", MSG, max_tokens=64)
    assert r.text.startswith("```python") and r.usage.completion_tokens > 0


def test_content_given_as_a_list_of_parts_is_read(registry):
    parts = [{"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "Tokyo"}, {"type": "text", "text": "!"}]
    with FakeServer(["ok"], text=parts, usage=(10, 5)) as srv:
        registry({"m": {"backend": "vllm", "base_url": srv.url, "price_model": "Qwen3-32B"}})
        r = get_llm_response("m", MSG, max_tokens=64)
    assert r.text == "Tokyo!" and (r.usage.prompt_tokens, r.usage.completion_tokens) == (10, 5)
