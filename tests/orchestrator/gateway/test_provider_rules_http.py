"""The gateway's provider rules against the provider emulator: what the rules send is accepted, and
without them the provider's real error comes back as ProviderRejected, not retried."""
from __future__ import annotations

import pytest
import yaml
from provider_emulator import (
    VLLM_WINDOWS,
    ProviderEmulator,
    count_tokens,
    emulator_registry,
)

from LLM_CALL import ProviderRejected, get_llm_response

MSG = [{"role": "user", "content": "What is the capital of Japan? <answer>"}]


@pytest.fixture(scope="module")
def emu():
    with ProviderEmulator({"What is the capital of Japan?": "Tokyo"}) as server:
        yield server


@pytest.fixture()
def registry(tmp_path, monkeypatch, emu):
    monkeypatch.setenv("EMULATOR_KEY", "k")

    def make(drop_rules=(), rules=None):
        data = emulator_registry(emu.root, drop_rules=set(drop_rules))
        for name, extra in (rules or {}).items():
            data["models"][name]["rules"].update(extra)
        path = tmp_path / "models.yaml"
        path.write_text(yaml.safe_dump(data))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(path))
    return make


def test_gpt5_temperature_zero_is_accepted_with_rules_and_rejected_without(registry, emu):
    registry()
    r = get_llm_response("gpt-5", MSG, temperature=0.0, max_tokens=200000, top_p=0.5)
    assert "Tokyo" in r.text
    assert emu.seen[-1]["max_completion_tokens"] == 128000 and "temperature" not in emu.seen[-1]
    registry(drop_rules={"gpt-5"})
    before = emu.requests
    with pytest.raises(ProviderRejected) as info:
        get_llm_response("gpt-5", MSG, temperature=0.0, max_retries=3)
    assert emu.requests == before + 1                         # not retried
    assert info.value.status == 400 and info.value.provider_message == (
        "Unsupported value: 'temperature' does not support 0.0 with this model. Only the default (1) value is supported.")


def test_anthropic_sampling_is_fitted_to_the_model(registry, emu):
    registry()
    rejected = len(emu.rejected)
    r = get_llm_response("claude-opus-4-1", MSG, temperature=0.5, top_p=0.9)
    assert "Tokyo" in r.text and emu.seen[-1]["temperature"] == 0.5 and "top_p" not in emu.seen[-1]
    get_llm_response("claude-opus-4-1", MSG, temperature=1.5)          # clamped to 1 (the default: not sent)
    assert emu.seen[-1].get("temperature", 1.0) == 1.0 and len(emu.rejected) == rejected
    registry(drop_rules={"claude-opus-4-1"})
    with pytest.raises(ProviderRejected, match="`temperature` and `top_p` cannot both be specified"):
        get_llm_response("claude-opus-4-1", MSG, temperature=0.5, top_p=0.9)


def test_dropping_a_models_rules_leaves_the_gateway_no_window(registry):
    """The last call of the test below gets the provider's own error only if dropping the rules
    really removes the window: configs/models.yaml declares Qwen2.5-Math-7B's window once, as
    `serve: max_model_len`, so dropping `rules:` alone kept it and the gateway shortened the request
    (DID NOT RAISE); emulator_registry now refuses to build such an entry, naming it."""
    from orchestrator.gateway.registry import load_registry

    registry(drop_rules={"Qwen2.5-Math-7B-Instruct"})
    entry = load_registry().entry("Qwen2.5-Math-7B-Instruct")
    assert entry.serve is None and entry.rules.context_window is None
    assert load_registry().entry("Qwen2.5-Math-72B-Instruct").rules.context_window == 4096   # the others keep theirs


def test_vllm_window_request_is_shortened_refused_or_rejected(registry, emu):
    long = [{"role": "user", "content": "What is the capital of Japan? <answer> " + "fact " * 4000}]   # ~5k tokens
    registry()
    r = get_llm_response("Qwen2.5-Math-7B-Instruct", long, max_tokens=2000)
    sent = emu.seen[-1]
    assert "Tokyo" in r.text
    assert count_tokens(sent["messages"]) + sent["max_completion_tokens"] <= VLLM_WINDOWS[sent["model"]]
    before = emu.requests
    registry(rules={"Qwen2.5-Math-7B-Instruct": {"overflow": "refuse"}})
    with pytest.raises(ProviderRejected, match="refused before sending.*context window is 4096"):
        get_llm_response("Qwen2.5-Math-7B-Instruct", long, max_tokens=2000)
    assert emu.requests == before          # no chat request was sent (only /tokenize was asked)
    registry(drop_rules={"Qwen2.5-Math-7B-Instruct"})
    with pytest.raises(ProviderRejected, match="This model's maximum context length is 4096 tokens"):
        get_llm_response("Qwen2.5-Math-7B-Instruct", long, max_tokens=2000)
