"""Anthropic Messages API through the `anthropic` client.

OpenAI-style inputs are converted: system messages become `system`, tools become
{name, description, input_schema}, assistant tool_calls become `tool_use` blocks and
`tool` messages become `tool_result` blocks.  Tested against a fake local HTTP server
that speaks the Messages API (tests/orchestrator/gateway/test_gateway_backends.py), not against Anthropic.
"""
from __future__ import annotations

import json
import threading
from typing import Any

import anthropic

from orchestrator.gateway.backends.base import BackendRequest, BackendResult, attempt_error, read_key
from orchestrator.gateway.registry import PROVIDER_URLS, ModelEntry
from orchestrator.gateway.replies import MessageReply, read_reply
from orchestrator.gateway.retry import AttemptError, http_client
from orchestrator.records import ToolCall, Usage
from orchestrator.redaction import redact

ANTHROPIC_DEFAULT_URL = PROVIDER_URLS["anthropic"]
_clients: dict[tuple, anthropic.Anthropic] = {}
_clients_lock = threading.Lock()


def _client(base_url: str, key: str | None, max_reply_bytes: int) -> anthropic.Anthropic:
    cache_key = (base_url, hash(key), max_reply_bytes)
    with _clients_lock:
        if cache_key not in _clients:
            _clients[cache_key] = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0,
                                                      http_client=http_client(max_reply_bytes))
        return _clients[cache_key]


def convert_tools(tools: list[dict] | None) -> list[dict] | None:
    """OpenAI function schemas -> Anthropic tool definitions."""
    if not tools:
        return None
    out = []
    for tool in tools:
        fn = tool.get("function", tool)
        out.append({"name": fn["name"], "description": fn.get("description", ""),
                    "input_schema": fn.get("parameters", {"type": "object", "properties": {}})})
    return out


def convert_messages(messages: list[dict[str, Any]]) -> tuple[str | None, list[dict]]:
    """OpenAI chat messages -> (system text, Anthropic messages)."""
    system = [m["content"] for m in messages if m["role"] == "system" and m.get("content")]
    out: list[dict] = []
    for m in messages:
        role = m["role"]
        if role == "system":
            continue
        if role == "tool":
            out.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.get("tool_call_id", ""),
                                                     "content": str(m.get("content", ""))}]})
            continue
        blocks: list[dict] = []
        if m.get("content"):
            blocks.append({"type": "text", "text": m["content"]})
        for tc in m.get("tool_calls") or []:
            fn = tc["function"]
            args = fn.get("arguments", {})
            blocks.append({"type": "tool_use", "id": tc.get("id", ""), "name": fn["name"],
                           "input": json.loads(args) if isinstance(args, str) else args})
        out.append({"role": role, "content": blocks})
    return ("\n\n".join(system) or None), out


class AnthropicBackend:
    def __init__(self, name: str, entry: ModelEntry):
        self.name, self.entry = name, entry
        self.served = entry.model or name
        self.endpoint = entry.base_url or ANTHROPIC_DEFAULT_URL

    def attempt(self, request: BackendRequest) -> BackendResult:
        if request.choices is not None:
            raise AttemptError(f"{self.name}: `choices` (constrained decoding) needs backend vllm or "
                               "transformers, not anthropic", endpoint=None, retryable=False)
        if "response_format" in request.extra:   # e.g. the hle judge's structured output
            raise AttemptError(f"{self.name}: `response_format` (OpenAI structured output) needs an "
                               "OpenAI-compatible backend (openai, azure, vllm), not anthropic",
                               endpoint=None, retryable=False)
        key = read_key(self.entry.key_env(), self.name, required=True)
        system, messages = convert_messages(request.messages)
        extra = dict(request.extra)
        # This SDK (anthropic 2.x) no longer types sampling parameters; models that still take
        # them read them from the body.  Temperature 1.0 is the API default, so it is left out.
        sampling = {k: extra.pop(k) for k in ("top_p", "top_k") if k in extra}
        if request.temperature is not None and request.temperature != 1.0:
            sampling["temperature"] = request.temperature
        body: dict[str, Any] = dict(model=self.served, messages=messages, max_tokens=request.max_tokens,
                                    timeout=request.timeout, **extra)
        if sampling:
            body["extra_body"] = {**body.get("extra_body", {}), **sampling}
        if system:
            body["system"] = system
        if request.tools:
            body["tools"] = convert_tools(request.tools)
        try:
            raw = _client(self.endpoint, key, self.entry.max_reply_bytes).messages.with_raw_response.create(**body)
            reply = read_reply(raw.http_response, MessageReply, endpoint=self.endpoint, max_tokens=request.max_tokens,
                               context_window=self.entry.rules.context_window)
        except (anthropic.AnthropicError, AttemptError) as exc:
            err = attempt_error(exc, anthropic, endpoint=self.endpoint, timeout=request.timeout)
            if err is None:
                raise
            raise err from None
        text = redact("".join(b.text or "" for b in reply.content if b.type == "text"), patterns=False)
        calls = [ToolCall(name=b.name, arguments=dict(b.input), id=b.id)
                 for b in reply.content if b.type == "tool_use" and b.name and b.input is not None]
        return BackendResult(text=text, tool_calls=calls or None, usage=Usage(*reply.counts()),
                             endpoint=self.endpoint, finish_reason=reply.stop_reason)
