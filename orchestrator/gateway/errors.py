"""Errors the gateway raises.  Messages name the model and endpoint, never a key: an error built
from a provider's text is redacted when it is created (orchestrator/redaction.py), so every
record, report and log line made from it is clean."""
from __future__ import annotations

from orchestrator.redaction import redact

from retrieval.endpoints import GatewayConfigError  # defined in the bottom layer, beside the endpoints file it reports on


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
        super().__init__(redact(message))
        self.model = model
        self.endpoint = endpoint
        self.attempts = attempts
        self.retryable = retryable

    def __reduce__(self):   # picklable across worker processes despite keyword-only arguments
        return (_rebuild_call_error, (str(self), self.model, self.endpoint, self.attempts, self.retryable))


def _rebuild_call_error(message, model, endpoint, attempts, retryable) -> "LLMCallError":
    return LLMCallError(message, model=model, endpoint=endpoint, attempts=attempts, retryable=retryable)


class ProviderRejected(LLMCallError):
    """The provider refused the request itself (HTTP 400/401/403/404/422: unsupported parameter,
    context too long, wrong key, unknown model), or the gateway refused to send a request the
    model's declared rules say would be refused.  Retrying cannot help and an orchestrator
    cannot act on it: callers end the task with this error instead of feeding it back.

    `status` is the HTTP status (None: refused before sending); `provider_message` the
    provider's own words.  The message has the form
    "<model>: request rejected (<why>): <provider message>".
    """

    def __init__(self, message: str, *, model: str, endpoint: str | None, status: int | None = None,
                 provider_message: str = "", attempts: int = 1):
        super().__init__(message, model=model, endpoint=endpoint, attempts=attempts, retryable=False)
        self.status = status
        self.provider_message = redact(provider_message)

    def __reduce__(self):
        return (_rebuild_rejected, (str(self), self.model, self.endpoint, self.status, self.provider_message,
                                    self.attempts))


def _rebuild_rejected(message, model, endpoint, status, provider_message, attempts) -> "ProviderRejected":
    return ProviderRejected(message, model=model, endpoint=endpoint, status=status,
                            provider_message=provider_message, attempts=attempts)


def find_rejection(exc: BaseException | None) -> "ProviderRejected | None":
    """The ProviderRejected behind `exc` (itself, or along its cause/context chain)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ProviderRejected):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None
