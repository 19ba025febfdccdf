"""Provider rules: what a model accepts, declared per model in configs/models.yaml (`rules:`).

The gateway applies them to every request before it is sent, so no caller needs to know
that GPT-5 refuses `temperature: 0`, that Anthropic needs `max_tokens` in 0..1 range
temperatures, or that Qwen2.5-Math-7B has a 4,096-token window:

    rules:
      sampling: default_only        # OpenAI reasoning models: temperature/top_p omitted
      max_output_tokens: 128000     # completion tokens (reasoning included) are lowered to this
      reasoning_effort: medium      # sent as `reasoning_effort` (OpenAI reasoning models)
      temperature_range: [0, 1]     # Anthropic: a temperature outside is clamped into it
      exclusive_sampling: true      # temperature and top_p never both (Claude Opus 4.1)
      context_window: 4096          # prompt + completion tokens (vLLM --max-model-len)
      overflow: shorten             # shorten | refuse a request that would not fit

A request that would exceed `context_window` is shortened (completion budget first down
to `min_completion_tokens`, then the oldest middle turns dropped, then the longest
message cut in its middle) or, with `overflow: refuse` or when even that cannot fit,
refused before it is sent (`RuleRefusal`).  Prompt tokens are estimated at
`chars_per_token` characters per token (3.0: below the ~4 of English text for Qwen and
Llama tokenizers, so the estimate errs on the long side); when the estimate says a
request would not fit, a vLLM server is asked for the exact count (POST /tokenize), so
a request that really fits is sent unchanged.
"""
from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger("toolorchestra.gateway")
CUT_MARK = "\n...[cut to fit the model's context window]...\n"
_MESSAGE_OVERHEAD_TOKENS = 8   # role markers / template tokens per message


class RuleRefusal(ValueError):
    """A request the model's rules say the provider would refuse; it is not sent."""


class ProviderRules(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sampling: Literal["any", "default_only"] = Field(
        "any", description="default_only: the model takes only its default temperature/top_p (omitted)")
    max_tokens_param: Literal["max_completion_tokens", "max_tokens"] = Field(
        "max_completion_tokens", description="OpenAI-compatible: the body field carrying the completion budget")
    max_output_tokens: int | None = Field(None, ge=1, description="largest completion budget the model accepts")
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    temperature_range: tuple[float, float] | None = Field(None, description="[low, high] accepted temperatures")
    exclusive_sampling: bool = Field(False, description="temperature and top_p may not both be sent")
    context_window: int | None = Field(None, ge=256, description="prompt + completion tokens the server accepts")
    overflow: Literal["shorten", "refuse"] = "shorten"
    min_completion_tokens: int = Field(256, ge=1, description="shortening never leaves less completion budget")
    chars_per_token: float = Field(3.0, gt=0, description="characters per token when estimating prompt length")

    @model_validator(mode="after")
    def _check(self) -> ProviderRules:
        if self.temperature_range and self.temperature_range[0] > self.temperature_range[1]:
            raise ValueError("temperature_range: expected [low, high] with low <= high")
        if self.context_window and self.min_completion_tokens >= self.context_window:
            raise ValueError("min_completion_tokens: must be below context_window")
        return self


def estimate_tokens(messages: list[dict], tools: list[dict] | None, chars_per_token: float) -> int:
    """Prompt tokens of `messages` (+ tool schemas), estimated from their length in characters."""
    chars = 0
    for m in messages:
        chars += len(str(m.get("content") or ""))
        if m.get("tool_calls"):
            chars += len(json.dumps(m["tool_calls"], default=str))
    if tools:
        chars += len(json.dumps(tools))
    return math.ceil(chars / chars_per_token) + _MESSAGE_OVERHEAD_TOKENS * len(messages)


def _drop_middle_turn(messages: list[dict]) -> bool:
    """Drop the oldest turn after the system message(s) and the first request; keep the last."""
    head = next((i for i, m in enumerate(messages) if m.get("role") != "system"), len(messages)) + 1
    if len(messages) - head < 2:
        return False
    del messages[head]
    while head < len(messages) - 1 and messages[head].get("role") == "tool":   # its tool results go too
        del messages[head]
    return True


def _cut_longest(messages: list[dict], excess_chars: int) -> bool:
    """Cut `excess_chars` out of the middle of the longest text message; False if too little is left."""
    lengths = [len(m["content"]) if isinstance(m.get("content"), str) else 0 for m in messages]
    i = max(range(len(messages)), key=lengths.__getitem__)
    keep = lengths[i] - excess_chars - len(CUT_MARK)
    if keep < 200:
        return False
    text = messages[i]["content"]
    messages[i] = {**messages[i], "content": text[:keep // 2] + CUT_MARK + text[len(text) - (keep - keep // 2):]}
    return True


def fit_context(messages: list[dict], tools: list[dict] | None, max_tokens: int,
                rules: ProviderRules, count: Callable[[list[dict], list[dict] | None], int | None] | None = None,
                ) -> tuple[list[dict], int]:
    """(messages, max_tokens) that fit `rules.context_window`; raises RuleRefusal when impossible.

    `count(messages, tools)`, when given, is the server's exact prompt length (vLLM's
    /tokenize), asked only when the estimate says the request would not fit; None from it
    means "unknown" and the estimate stands.
    """
    window = rules.context_window
    cpt = rules.chars_per_token
    prompt = estimate_tokens(messages, tools, cpt)
    if window is None or prompt + max_tokens <= window:
        return messages, max_tokens
    exact = count(messages, tools) if count is not None else None
    if exact is not None:
        if exact + max_tokens <= window:
            return messages, max_tokens
        prompt = max(prompt, exact) if exact > window else exact
    floor = min(max_tokens, rules.min_completion_tokens)
    if prompt + floor <= window:
        return messages, window - prompt
    why = (f"the prompt is ~{prompt} tokens and the model's context window is {window} "
           f"(with at least {floor} completion tokens)")
    if rules.overflow == "refuse":
        raise RuleRefusal(f"{why}; overflow: refuse")
    messages = [dict(m) for m in messages]
    while prompt + floor > window and _drop_middle_turn(messages):
        prompt = estimate_tokens(messages, tools, cpt)
    while prompt + floor > window:
        excess = math.ceil((prompt + floor - window) * cpt) + 64
        if not _cut_longest(messages, excess):
            raise RuleRefusal(f"{why}; it cannot be shortened enough")
        prompt = estimate_tokens(messages, tools, cpt)
    log.info("request shortened to ~%d prompt tokens to fit a %d-token window", prompt, window)
    return messages, min(max_tokens, window - prompt)


def apply_rules(rules: ProviderRules, request, count=None):
    """The BackendRequest to send under `rules` (a new object; `request` is not changed).
    `count`: the server's exact prompt-token count, see fit_context."""
    extra = dict(request.extra)
    temperature = request.temperature
    if rules.sampling == "default_only":
        temperature = None
        extra.pop("top_p", None)
    elif temperature is not None and rules.temperature_range:
        low, high = rules.temperature_range
        if not low <= temperature <= high:
            log.info("temperature %s outside the model's range [%s, %s]; clamped", temperature, low, high)
            temperature = min(max(temperature, low), high)
    if rules.exclusive_sampling and temperature is not None and "top_p" in extra:
        extra.pop("top_p")
    if rules.reasoning_effort and "reasoning_effort" not in extra:
        extra["reasoning_effort"] = rules.reasoning_effort
    max_tokens = request.max_tokens
    if rules.max_output_tokens is not None:
        max_tokens = min(max_tokens, rules.max_output_tokens)
    messages, max_tokens = fit_context(request.messages, request.tools, max_tokens, rules, count)
    return replace(request, messages=messages, temperature=temperature, max_tokens=max_tokens, extra=extra)
