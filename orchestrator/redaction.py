"""Secrets out of every text we keep: errors, logs, records, reports.

    from orchestrator.redaction import redact, add_secret
    add_secret(os.environ["MY_TOOL_TOKEN"])     # a credential this process holds
    redact("key sk-abc123... rejected")        # -> "key sk-***REDACTED*** rejected"

Two rules: by value (every secret registered with add_secret, e.g. each API key the gateway's
registry or a tool reads from the environment) and by pattern (`sk-...` keys, `Bearer ...`
tokens, `x-api-key: ...` / `api_key=...` pairs), so a provider that echoes a key we never
registered is still masked.
"""
from __future__ import annotations

import re
import threading

MASK = "***REDACTED***"
MIN_SECRET_CHARS = 8          # shorter values ("1", "abc") would mask ordinary words

_secrets: set[str] = set()
_lock = threading.Lock()
_PATTERNS = (
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


def redact(text: str) -> str:
    """`text` with every registered secret and every key-like pattern masked."""
    if not text:
        return text
    with _lock:
        values = sorted(_secrets, key=len, reverse=True)
    for value in values:
        if value in text:
            text = text.replace(value, MASK)
    for pattern in _PATTERNS:
        text = pattern.sub(lambda m: m.group(1) + MASK, text)
    return text
