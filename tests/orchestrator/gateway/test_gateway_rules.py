"""Provider rules (orchestrator/gateway/rules.py) with hand-worked numbers, and the shipped registry's rules."""
from __future__ import annotations

import pytest

from orchestrator.gateway.backends.base import BackendRequest
from orchestrator.gateway.registry import load_registry
from orchestrator.gateway.rules import (
    CUT_MARK,
    ProviderRules,
    RuleRefusal,
    apply_rules,
    estimate_tokens,
)


def req(content="hi", **kw):
    return BackendRequest(messages=[{"role": "user", "content": content}], **kw)


def test_reasoning_model_gets_no_temperature_or_top_p_and_a_capped_budget():
    rules = ProviderRules(sampling="default_only", max_output_tokens=128000, reasoning_effort="high")
    out = apply_rules(rules, req(temperature=0.0, max_tokens=200000, extra={"top_p": 0.9, "seed": 1}))
    assert out.temperature is None and "top_p" not in out.extra
    assert out.max_tokens == 128000 and out.extra == {"seed": 1, "reasoning_effort": "high"}


def test_anthropic_temperature_is_clamped_into_range_and_top_p_dropped_when_exclusive():
    rules = ProviderRules(temperature_range=(0, 1), exclusive_sampling=True)
    out = apply_rules(rules, req(temperature=1.6, extra={"top_p": 0.7}))
    assert out.temperature == 1.0 and "top_p" not in out.extra
    assert apply_rules(rules, req(temperature=0.2)).temperature == 0.2


def test_estimate_is_characters_over_chars_per_token_plus_per_message_overhead():
    # 9,000 characters / 3 = 3,000 tokens + 8 for the one message
    assert estimate_tokens([{"role": "user", "content": "x" * 9000}], None, 3.0) == 3008


def test_a_request_that_fits_only_with_less_completion_gets_a_lower_budget():
    rules = ProviderRules(context_window=4096)
    out = apply_rules(rules, req("x" * 9000, max_tokens=2000))
    # 3,008 prompt tokens + 2,000 > 4,096: the completion budget becomes 4,096 - 3,008
    assert out.max_tokens == 1088 and out.messages[0]["content"] == "x" * 9000


def test_a_prompt_too_long_for_the_window_is_cut_in_the_middle():
    rules = ProviderRules(context_window=4096)
    text = "a" * 6000 + "b" * 6000          # 4,008 tokens: 4,008 + 256 floor > 4,096
    out = apply_rules(rules, req(text, max_tokens=2000))
    cut = out.messages[0]["content"]
    # excess = ceil((4008 + 256 - 4096) x 3) + 64 = 568 characters removed (mark included)
    assert len(cut) == 12000 - 568 and CUT_MARK in cut
    assert cut.startswith("a") and cut.endswith("b")
    assert out.max_tokens == 4096 - estimate_tokens(out.messages, None, 3.0) == 277


def test_middle_turns_are_dropped_before_any_message_is_cut():
    rules = ProviderRules(context_window=1024, min_completion_tokens=100)
    msgs = [{"role": "system", "content": "policy"}, {"role": "user", "content": "first request"},
            {"role": "assistant", "content": "old " * 500, "tool_calls": [{"id": "1"}]},
            {"role": "tool", "content": "old result " * 200},
            {"role": "user", "content": "latest"}]
    out = apply_rules(rules, BackendRequest(messages=msgs, max_tokens=500))
    assert [m["content"] for m in out.messages] == ["policy", "first request", "latest"]
    assert out.max_tokens == 500


def test_overflow_refuse_and_impossible_requests_are_refused_before_sending():
    with pytest.raises(RuleRefusal, match="context window is 4096"):
        apply_rules(ProviderRules(context_window=4096, overflow="refuse"), req("x" * 30000))
    tools = [{"type": "function", "function": {"name": "t", "description": "d" * 30000}}]
    with pytest.raises(RuleRefusal, match="cannot be shortened"):   # the tool schemas alone overflow
        apply_rules(ProviderRules(context_window=4096), req("hi", tools=tools))


def test_shipped_registry_declares_the_documented_rules():
    reg = load_registry()
    for name in ("gpt-5", "gpt-5-mini", "o3-mini"):
        assert reg.entry(name).rules.sampling == "default_only", name
    assert reg.entry("claude-opus-4-1").rules.temperature_range == (0, 1)
    for name in ("Qwen2.5-Math-7B-Instruct", "Qwen2.5-Math-72B-Instruct"):
        assert reg.entry(name).rules.context_window == 4096, name


def test_bad_rules_name_the_field(tmp_path):
    from orchestrator.gateway.errors import GatewayConfigError
    from orchestrator.gateway.registry import parse_registry

    with pytest.raises(GatewayConfigError, match=r"models\.m\.rules\.sampling"):
        parse_registry({"models": {"m": {"backend": "vllm", "rules": {"sampling": "greedy"}}}}, "x.yaml")
