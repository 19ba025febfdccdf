"""Timeouts, retries, failover and key hygiene of the gateway against real local HTTP servers."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest

from LLM_CALL import LLMCallError, ProviderRejected, get_llm_response
from orchestrator.gateway.endpoints import register_endpoint
from _gateway_fakes import FakeServer, dead_url, elapsed, write_registry

MSG = [{"role": "user", "content": "hi"}]
SECRET = "sk-test-SECRETVALUE-0123456789abcdef"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """Write a registry and point the gateway at it; returns a function(models) -> path."""
    monkeypatch.setenv("TOOLORCHESTRA_ENDPOINTS", str(tmp_path / "endpoints.json"))

    def make(models: dict):
        path = write_registry(tmp_path / "models.yaml", models)
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(path))
        return path
    return make


def _pool(tmp_path, key: str, *urls: str) -> None:
    for url in urls:
        register_endpoint(tmp_path / "endpoints.json", key, url)


def test_succeeds_on_third_attempt_after_two_500s(registry):
    with FakeServer(["500", "500", "ok"]) as srv:
        registry({"m": {"backend": "vllm", "model": "served-m", "base_url": srv.url, "price_model": "Qwen3-32B"}})
        r = get_llm_response("m", MSG, max_retries=3)
    assert srv.hits == 3
    assert r.text == "hello" and r.endpoint == srv.url
    assert srv.requests[0]["body"]["model"] == "served-m"


def test_gives_up_after_bounded_attempts_and_names_model_and_endpoint(registry):
    with FakeServer(["500"]) as srv:
        registry({"m": {"backend": "vllm", "base_url": srv.url, "price_model": "Qwen3-32B"}})
        err, seconds = elapsed(lambda: get_llm_response("m", MSG, max_retries=2))
    assert isinstance(err, LLMCallError)
    assert srv.hits == 3 and err.attempts == 3
    assert "m:" in str(err) and srv.url in str(err) and "HTTP 500" in str(err)
    assert err.model == "m" and err.endpoint == srv.url
    assert seconds < 3.0     # 2 waits of <= 0.1 s (+ jitter 0.05 s) and three fast 500s


def test_stalling_server_times_out_each_attempt_within_the_bound(registry):
    with FakeServer(["stall"], stall_s=30) as srv:
        registry({"m": {"backend": "vllm", "base_url": srv.url, "price_model": "Qwen3-32B"}})
        err, seconds = elapsed(lambda: get_llm_response("m", MSG, timeout=0.5, max_retries=2))
    assert isinstance(err, LLMCallError), err
    assert srv.hits == 3
    assert "timed out after 0.5 s" in str(err) and srv.url in str(err)
    # three 0.5 s timeouts plus two waits of at most 0.15 s; nowhere near the 30 s stall
    assert 1.5 <= seconds < 4.0


def test_bad_request_is_not_retried(registry):
    with FakeServer(["400"]) as srv:
        registry({"m": {"backend": "vllm", "base_url": srv.url, "price_model": "Qwen3-32B"}})
        err, _ = elapsed(lambda: get_llm_response("m", MSG, max_retries=3))
    assert isinstance(err, ProviderRejected) and srv.hits == 1 and err.status == 400
    assert f"request rejected (HTTP 400 from {srv.url}, not retried)" in str(err) and err.provider_message == "bad request"


def test_rate_limit_is_retried(registry):
    with FakeServer(["429", "ok"]) as srv:
        registry({"m": {"backend": "vllm", "base_url": srv.url, "price_model": "Qwen3-32B"}})
        r = get_llm_response("m", MSG, max_retries=1)
    assert srv.hits == 2 and r.text == "hello"


def test_refused_connection_retries_then_names_endpoint(registry):
    url = dead_url()
    registry({"m": {"backend": "vllm", "base_url": url, "price_model": "Qwen3-32B"}})
    err, _ = elapsed(lambda: get_llm_response("m", MSG, max_retries=1))
    assert isinstance(err, LLMCallError) and err.attempts == 2
    assert url in str(err) and "connection failed" in str(err)


def test_pool_fails_over_from_dead_replica(registry, tmp_path):
    bad = dead_url()
    with FakeServer(["ok"]) as good:
        _pool(tmp_path, "m", bad, good.url)
        registry({"m": {"backend": "vllm", "price_model": "Qwen3-32B"}})
        results = [get_llm_response("m", MSG, max_retries=1) for _ in range(3)]
    assert all(r.endpoint == good.url for r in results)
    assert good.hits == 3        # the dead replica cools down instead of being retried each call


def test_pool_round_robins_over_healthy_replicas(registry, tmp_path):
    with FakeServer(["ok"]) as a, FakeServer(["ok"]) as b:
        _pool(tmp_path, "served-m", a.url, b.url)     # keyed by the served id: also found
        registry({"m": {"backend": "vllm", "model": "served-m", "price_model": "Qwen3-32B"}})
        for _ in range(4):
            get_llm_response("m", MSG)
    assert (a.hits, b.hits) == (2, 2)


def test_failed_replica_makes_the_pool_reread_the_endpoints_file(registry, tmp_path):
    endpoints = tmp_path / "endpoints.json"
    with FakeServer(["ok"]) as good:
        def replace_me(server, n):   # a launcher swaps the broken replica for a new one
            endpoints.write_text(json.dumps({"m": [{"base_url": good.url}]}))
        with FakeServer(["500"], on_hit=replace_me) as broken:
            _pool(tmp_path, "m", broken.url)
            registry({"m": {"backend": "vllm", "price_model": "Qwen3-32B"}})
            r = get_llm_response("m", MSG, max_retries=2)
    assert broken.hits == 1 and good.hits == 1
    assert r.endpoint == good.url


def test_empty_pool_fails_at_once_and_says_how_to_fix(registry, tmp_path):
    registry({"m": {"backend": "vllm", "price_model": "Qwen3-32B"}})
    err, _ = elapsed(lambda: get_llm_response("m", MSG))
    assert isinstance(err, LLMCallError) and err.attempts == 1
    assert "no replicas for 'm'" in str(err) and "endpoints.json" in str(err)
    assert "orchestrator.vllm_servers.launch" in str(err)


def test_key_never_appears_in_errors_or_results(registry, monkeypatch):
    monkeypatch.setenv("MY_TEST_KEY", SECRET)
    with FakeServer(["401"]) as srv:
        registry({"m": {"backend": "openai", "model": "gpt-x", "base_url": srv.url,
                        "api_key_env": "MY_TEST_KEY", "price_model": "gpt-5"}})
        err, _ = elapsed(lambda: get_llm_response("m", MSG))
    assert srv.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"   # the key was sent ...
    assert isinstance(err, LLMCallError) and "HTTP 401" in str(err)
    assert SECRET not in str(err) and SECRET not in repr(err.args)           # ... but never surfaces
    assert err.__cause__ is None and SECRET not in str(err.__context__)     # the chain is scrubbed too

    with FakeServer(["500", "ok"]) as srv:    # 500 body echoes the key; the retry succeeds
        registry({"m": {"backend": "openai", "base_url": srv.url, "api_key_env": "MY_TEST_KEY",
                        "price_model": "gpt-5"}})
        r = get_llm_response("m", MSG, max_retries=1)
    assert SECRET not in json.dumps(asdict(r)) and SECRET not in repr(r)


def test_openai_backend_without_key_fails_naming_the_variable(registry, monkeypatch):
    monkeypatch.delenv("MISSING_KEY_VAR", raising=False)
    registry({"m": {"backend": "openai", "api_key_env": "MISSING_KEY_VAR", "price_model": "gpt-5"}})
    err, _ = elapsed(lambda: get_llm_response("m", MSG))
    assert isinstance(err, LLMCallError) and err.attempts == 1
    assert "MISSING_KEY_VAR is not set" in str(err)


def test_azure_backend_sends_deployment_version_and_key(registry, monkeypatch):
    monkeypatch.setenv("AZ_KEY", SECRET)
    with FakeServer(["ok"]) as srv:
        registry({"m": {"backend": "azure", "model": "my-deployment", "base_url": srv.root,
                        "api_version": "2024-10-21", "api_key_env": "AZ_KEY", "price_model": "gpt-5"}})
        r = get_llm_response("m", MSG)
    req = srv.requests[0]
    assert req["path"].startswith("/openai/deployments/my-deployment/chat/completions")
    assert "api-version=2024-10-21" in req["path"]
    assert req["headers"]["api-key"] == SECRET
    assert r.text == "hello" and SECRET not in repr(r)


@pytest.mark.parametrize("kind,backend", [("openai", "vllm"), ("anthropic", "anthropic")])
@pytest.mark.parametrize("action,content_type", [("html", "text/html"), ("truncated", "application/json")])
def test_a_200_reply_that_is_not_json_is_the_gateways_error_naming_model_endpoint_and_type(
        registry, monkeypatch, kind, backend, action, content_type):
    """A proxy's HTML login page or a cut JSON body answered with 200 is retried like a broken
    reply, then fails as LLMCallError naming model, endpoint and content type (not a bare
    JSONDecodeError / AttributeError from inside the SDK)."""
    monkeypatch.setenv("TEST_KEY", "k")
    with FakeServer([action, action], kind=kind) as srv:
        url = srv.url if kind == "openai" else srv.root
        registry({"m": {"backend": backend, "base_url": url, "max_retries": 1, "api_key_env": "TEST_KEY",
                        "price_model": "Qwen3-32B"}})
        with pytest.raises(LLMCallError) as info:
            get_llm_response("m", MSG)
    message = str(info.value)
    assert message.startswith("m: gave up after 2 attempt(s)") and url in message, message
    assert f"Content-Type {content_type}" in message and "not JSON" in message, message
    assert srv.hits == 2 and info.value.endpoint == url


def test_a_non_json_reply_then_a_good_one_succeeds(registry):
    with FakeServer(["truncated", "ok"]) as srv:
        registry({"m": {"backend": "vllm", "base_url": srv.url, "max_retries": 2, "price_model": "Qwen3-32B"}})
        assert get_llm_response("m", MSG).text == "hello" and srv.hits == 2
