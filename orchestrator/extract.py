"""Pulling the expert's payload out of its reply: a query, a code block, an answer."""
from __future__ import annotations

import re

_QUERY_RE = re.compile(r"<query>(.*?)(?:</query>|$)", re.DOTALL)
_CODE_RE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)
_ANSWER_RE = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.DOTALL)
_THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL)
MAX_QUERY_CHARS = 390


def strip_think(text: str) -> str:
    return _THINK_RE.sub("", text).strip()


def extract_query(text: str, fallback: str) -> str:
    """The expert's `<query>`, cut to 390 characters; the question when there is none."""
    match = _QUERY_RE.search(strip_think(text))
    query = match.group(1).strip() if match else ""
    return (query or fallback.strip())[:MAX_QUERY_CHARS]


def extract_code(text: str) -> str | None:
    """The first fenced Python block of the reply (None when there is none)."""
    match = _CODE_RE.search(strip_think(text))
    return match.group(1).strip() if match else None


# Upstream's extractions (eval_hle.py:159, 302; generation_quick3.py): plain string splits, nothing
# stripped.  A reply without the tags gives the whole reply (for code: up to its first ```).
def split_query(text: str) -> str:
    return (text or "").split("<query>")[-1].split("</query>")[0]


def split_code(text: str) -> str:
    return (text or "").split("```python")[-1].split("```")[0]


def extract_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}`, with nested braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return text[i:].strip()


def extract_answer(text: str) -> str:
    """`<answer>` tags, else the last `\\boxed{}`, else the last non-empty line."""
    text = strip_think(text)
    match = _ANSWER_RE.search(text)
    if match and match.group(1).strip():
        return match.group(1).strip()
    boxed = extract_boxed(text)
    if boxed:
        return boxed
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def answer_style(model: str) -> str:
    """Which answer prompt an expert gets: GPT/Claude-style models answer in tags, others box."""
    name = model.lower()
    return "tags" if any(k in name for k in ("gpt", "claude", "o3", "o4", "smollm")) else "boxed"
