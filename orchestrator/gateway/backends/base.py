"""What every backend takes and gives back, and the SDK-error translation they share."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.gateway.retry import AttemptError, is_retryable_status, parse_retry_after
from orchestrator.records import ToolCall, Usage
from orchestrator.redaction import add_secret


@dataclass
class BackendRequest:
    """One chat request.  `timeout` is seconds for this attempt; `max_tokens` counts completion tokens."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    temperature: float | None = 1.0   # None: not sent (the provider's default)
    max_tokens: int = 1024
    choices: list[str] | None = None
    timeout: float = 120.0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class BackendResult:
    """What one successful attempt produced.

    `tool_calls` is None when the backend gave raw text only; the gateway then parses
    the text with orchestrator.toolcall.parse_tool_calls (the one parser).
    """

    text: str
    usage: Usage
    endpoint: str
    tool_calls: list[ToolCall] | None = None
    finish_reason: str | None = None


class Backend(Protocol):
    def attempt(self, request: BackendRequest) -> BackendResult:
        """One try; raises retry.AttemptError (redacted when created) on failure."""
        ...


def read_key(env_name: str | None, model: str, required: bool) -> str | None:
    """The key from the environment (keys never live in files or results); registered with
    orchestrator.redaction so no text the process keeps can show it."""
    if not env_name:
        return None
    value = os.environ.get(env_name)
    add_secret(value)
    if not value and required:
        raise AttemptError(f"{model}: environment variable {env_name} is not set (it must hold the API key)",
                           endpoint=None, retryable=False)
    return value or None


def attempt_error(exc: Exception, sdk, *, endpoint: str, timeout: float) -> AttemptError | None:
    """Translate what one attempt raised into an AttemptError at `endpoint` (None: neither an SDK
    error nor an AttemptError): the SDK's errors, and the gateway's own from inside the HTTP client
    (a reply over the size cap) or from reading the reply.  Texts are redacted by AttemptError."""
    if isinstance(exc.__cause__, AttemptError):     # the anthropic SDK wraps what the HTTP client raised
        exc = exc.__cause__
    if isinstance(exc, AttemptError):
        if exc.endpoint is None:
            exc.endpoint = endpoint
        return exc
    if isinstance(exc, sdk.APITimeoutError):
        return AttemptError(f"timed out after {timeout:g} s (attempt deadline)", endpoint=endpoint, retryable=True,
                            timed_out=True)
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc
        return AttemptError(f"connection failed: {type(cause).__name__}: {cause}", endpoint=endpoint, retryable=True)
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        detail = re.sub(r"^Error code: \d+ - ", "", str(getattr(exc, "message", exc)))[:500]
        provider = (provider_message(getattr(exc, "body", None)) or detail)[:500]
        return AttemptError(f"HTTP {status}: {detail}", endpoint=endpoint, retryable=is_retryable_status(status),
                            status=status, provider_message=provider,
                            retry_after=parse_retry_after(getattr(getattr(exc, "response", None), "headers", None)))
    return None


def provider_message(body: Any) -> str | None:
    """The provider's own error text from an error body: OpenAI {"error": {"message"}},
    Anthropic {"type": "error", "error": {"message"}}, vLLM {"message": ...} (or the SDK's
    already-unwrapped inner object)."""
    if not isinstance(body, dict):
        return body if isinstance(body, str) and body else None
    inner = body.get("error", body)
    if isinstance(inner, dict) and isinstance(inner.get("message"), str):
        return inner["message"]
    if isinstance(inner, str):
        return inner
    return body.get("message") if isinstance(body.get("message"), str) else None
