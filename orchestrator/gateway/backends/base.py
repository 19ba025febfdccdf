"""What every backend takes and gives back, and the SDK-error translation they share."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

from orchestrator.gateway.errors import scrub
from orchestrator.gateway.retry import AttemptError, is_retryable_status
from orchestrator.records import ToolCall, Usage


@dataclass
class BackendRequest:
    """One chat request.  `timeout` is seconds for this attempt; `max_tokens` counts completion tokens."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    temperature: float = 1.0
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
        """One try; raises retry.AttemptError (already scrubbed of secrets) on failure."""
        ...


def read_key(env_name: str | None, model: str, required: bool) -> str | None:
    """The key from the environment (keys never live in files or results)."""
    if not env_name:
        return None
    value = os.environ.get(env_name)
    if not value and required:
        raise AttemptError(f"{model}: environment variable {env_name} is not set (it must hold the API key)",
                           endpoint=None, retryable=False)
    return value or None


def sdk_attempt_error(exc: Exception, sdk, *, endpoint: str, timeout: float,
                      secrets: list[str | None]) -> AttemptError | None:
    """Translate an openai/anthropic SDK exception into AttemptError (None: not an SDK error)."""
    keys = [s for s in secrets if s]
    if isinstance(exc, sdk.APITimeoutError):
        return AttemptError(f"timed out after {timeout:g} s", endpoint=endpoint, retryable=True)
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc
        return AttemptError(scrub(f"connection failed: {type(cause).__name__}: {cause}", keys),
                            endpoint=endpoint, retryable=True)
    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        detail = scrub(re.sub(r"^Error code: \d+ - ", "", str(getattr(exc, "message", exc))), keys)[:500]
        return AttemptError(f"HTTP {status}: {detail}", endpoint=endpoint, retryable=is_retryable_status(status))
    return None
