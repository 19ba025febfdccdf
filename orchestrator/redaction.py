"""Secrets out of every text we keep: errors, logs, records, reports.

    from orchestrator.redaction import redact, add_secret
    add_secret(os.environ["MY_TOOL_TOKEN"])     # a credential this process holds
    redact("key sk-abc123... rejected")        # -> "key sk-***REDACTED*** rejected"

Two rules: by value (every secret registered with add_secret, e.g. each API key the gateway's
registry or a tool reads from the environment) and by pattern (`sk-...` keys, half-masked forms
such as `sk-abc***wxyz` or any other token holding `***`, `Bearer ...` tokens, `x-api-key: ...` / `api_key=...` pairs), so a provider
that echoes a key we never registered is still masked.

Where it is applied: the gateway's errors redact their own message when they are created
(orchestrator/gateway/errors.py, retry.AttemptError), so every record, report and log line built
from them is clean; a model's reply text is redacted by value only (`patterns=False`: code that
mentions `api_key=...` stays as the model wrote it); log records of every logger are redacted
when they are created (`install_log_redaction`, installed by the gateway on import and by every
entry point that configures logging).
"""
from __future__ import annotations

import logging
import re
import threading

MASK = "***REDACTED***"
MIN_SECRET_CHARS = 8          # shorter values ("1", "abc") would mask ordinary words

_secrets: set[str] = set()
_lock = threading.Lock()
_PATTERNS = (
    re.compile(r"(?<![A-Za-z0-9])(sk-)(?!(?:ant-|proj-)?\*{3}REDACTED\*{3})[A-Za-z0-9_\-]*\*{3,}[A-Za-z0-9_\-]*"),
    # any other key a provider echoed half-masked ("key emu-12***89 is invalid"): the whole token
    re.compile(r"(?<!\S)()(?=\S*\*{3})(?!\S*REDACTED)\S+"),
    re.compile(r"(?<![A-Za-z0-9])(sk-(?:ant-|proj-)?)[A-Za-z0-9_\-]{8,}"),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9_\-.=:+/]{8,}"),
    re.compile(r"(?i)((?:x-api-key|api[_-]?key|authorization|access[_-]?token)[\"']?\s*[:=]\s*[\"']?)"
               r"(?!\*\*\*)[^\s\"',;&]{8,}"),
)


def add_secret(value: str | None) -> None:
    """Register a secret value to be masked wherever it appears (ignored when empty or short)."""
    if value and len(value) >= MIN_SECRET_CHARS:
        with _lock:
            _secrets.add(value)


def redact(text: str, *, patterns: bool = True) -> str:
    """`text` with every registered secret (and, unless `patterns=False`, every key-like
    pattern) masked."""
    if not text:
        return text
    with _lock:
        values = sorted(_secrets, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    if patterns:
        for pattern in _PATTERNS:
            text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text


# ---- log records ---------------------------------------------------------------------------
_installed = False


def _redacted_record_factory(inner):
    formatter = logging.Formatter()

    def make(*args, **kwargs) -> logging.LogRecord:
        record = inner(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string: leave it to the handler to report
            return record
        record.msg, record.args = redact(message), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(formatter.formatException(record.exc_info))
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return record
    make.redacting = True  # type: ignore[attr-defined]
    return make


def install_log_redaction() -> None:
    """Redact every log record of this process when it is created, whatever logger or handler
    (root, lastResort, files) later writes it: the message with its arguments, the traceback
    text and the stack.  Idempotent; installed by the gateway on import."""
    global _installed
    with _lock:
        if _installed:
            return
        current = logging.getLogRecordFactory()
        if not getattr(current, "redacting", False):
            logging.setLogRecordFactory(_redacted_record_factory(current))
        _installed = True


def loguru_patcher(record: dict) -> None:
    """For loguru (tau2 logs through it): `logger.configure(patcher=loguru_patcher)` redacts each
    message as the logging records above are."""
    record["message"] = redact(record["message"])
