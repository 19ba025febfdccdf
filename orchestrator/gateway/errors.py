"""Errors the gateway raises.  Messages name the model and endpoint, never a key."""
from __future__ import annotations

import re


class GatewayConfigError(ValueError):
    """A problem in configs/models.yaml or an endpoints file, as one line: file, key, problem."""


class UnknownModelError(GatewayConfigError, KeyError):
    """The requested model name is not in the registry."""

    def __str__(self) -> str:   # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class LLMCallError(RuntimeError):
    """A call that failed for good (after its retries, or at once when retrying cannot help).

    Attributes: `model` (registry name), `endpoint` (base URL or "in-process:<path>"),
    `attempts` (how many tries were made), `retryable` (whether the last error was of a
    kind that retries could have fixed).
    """

    def __init__(self, message: str, *, model: str, endpoint: str | None,
                 attempts: int = 0, retryable: bool = False):
        super().__init__(message)
        self.model = model
        self.endpoint = endpoint
        self.attempts = attempts
        self.retryable = retryable

    def __reduce__(self):   # picklable across worker processes despite keyword-only arguments
        return (_rebuild_call_error, (str(self), self.model, self.endpoint, self.attempts, self.retryable))


def _rebuild_call_error(message, model, endpoint, attempts, retryable) -> "LLMCallError":
    return LLMCallError(message, model=model, endpoint=endpoint, attempts=attempts, retryable=retryable)


_MASKED_KEY = re.compile(r"\S*\*{3,}\S*")


def scrub(text: str, secrets: list[str]) -> str:
    """Remove every secret value, and any masked key form, from `text`.

    Provider SDKs sometimes echo part of a key back ("Incorrect API key provided:
    sk-abc***wxyz"), so tokens containing `***` are dropped as well.
    """
    for secret in secrets:
        if secret:
            text = text.replace(secret, "[REDACTED]")
    return _MASKED_KEY.sub("[REDACTED]", text)
