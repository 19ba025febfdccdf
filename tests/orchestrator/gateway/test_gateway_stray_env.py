"""A stray provider variable never reroutes a call: OPENAI_BASE_URL, OPENAI_API_BASE,
ANTHROPIC_BASE_URL and the proxy variables all point at a trap, and every call still goes where
configs/models.yaml says (issue 28 item 2; upstream's forks report calls silently rerouted so)."""
from __future__ import annotations

import json
import socket
import threading

import pytest
import yaml
from provider_emulator import ProviderEmulator

STRAY = ("OPENAI_BASE_URL", "OPENAI_API_BASE", "ANTHROPIC_BASE_URL", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY",
         "http_proxy", "https_proxy", "all_proxy")
QUESTION = "Which city hosts the Louvre?"


@pytest.fixture()
def trap(monkeypatch):
    """A listener that records every connection made to it; every stray variable names it."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.settimeout(0.2)
    url, hits, stop = f"http://127.0.0.1:{sock.getsockname()[1]}", [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            hits.append(conn.recv(200))
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    for var in STRAY:
        monkeypatch.setenv(var, url + ("/v1" if "BASE" in var else ""))
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    yield hits
    stop.set()
    thread.join(2)
    sock.close()


def test_stray_provider_and_proxy_variables_never_reroute_a_call(trap, tmp_path, monkeypatch):
    from LLM_CALL import get_llm_response
    from orchestrator.gateway.backends.openai_compat import OpenAICompatBackend, _client
    from orchestrator.gateway.registry import PROVIDER_URLS, load_registry

    with ProviderEmulator(answers={QUESTION: "Paris"}) as emulator:
        endpoints = tmp_path / "endpoints.json"
        endpoints.write_text(json.dumps({"pooled": [{"base_url": f"{emulator.root}/v1"}]}))
        models = {
            "oa": {"backend": "openai", "model": "gpt-4o-mini", "base_url": f"{emulator.root}/v1", "api_key_env": "K"},
            "an": {"backend": "anthropic", "model": "claude-x", "base_url": emulator.root, "api_key_env": "K"},
            "pooled": {"backend": "vllm", "model": "Qwen3-8B", "endpoints_file": str(endpoints)},
            "fixed": {"backend": "vllm", "model": "Qwen3-8B", "base_url": f"{emulator.root}/v1"},
            "provider": {"backend": "openai", "model": "gpt-4o-mini", "api_key_env": "K"},
        }
        for entry in models.values():
            entry.update(max_retries=0, price_model="Qwen3-8B")
        (tmp_path / "models.yaml").write_text(yaml.safe_dump({"models": models}))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(tmp_path / "models.yaml"))
        monkeypatch.setenv("K", "sk-test")
        for name in ("oa", "an", "pooled", "fixed"):
            reply = get_llm_response(name, [{"role": "user", "content": f"{QUESTION} <answer></answer>"}],
                                     max_tokens=32)
            assert "Paris" in reply.text and reply.endpoint.startswith(emulator.root), (name, reply.endpoint)
        assert emulator.requests == 4
        # a provider entry without base_url: the provider's own URL, whatever OPENAI_BASE_URL says
        registry = load_registry()
        entry = registry.entry("provider")
        backend = OpenAICompatBackend("provider", entry)
        assert backend._endpoint() == PROVIDER_URLS["openai"] == "https://api.openai.com/v1"
        assert str(_client(entry, backend._endpoint(), "sk-test").base_url).rstrip("/") == PROVIDER_URLS["openai"]
        # what run_config.json records: the registry's resolution
        assert registry.endpoint("provider") == {"backend": "openai", "base_url": "https://api.openai.com/v1"}
        assert registry.endpoint("pooled") == {"backend": "vllm", "endpoints_file": str(endpoints),
                                               "replicas": [f"{emulator.root}/v1"]}
        assert registry.endpoint("an") == {"backend": "anthropic", "base_url": emulator.root}
    assert trap == []
