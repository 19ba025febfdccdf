"""The one parser of hermes-style tool calls, and the strings constrained decoding allows.

Qwen3 / hermes format (what vLLM's `hermes` parser reads):

    <think>...</think>
    <tool_call>
    {"name": "search", "arguments": {"model": "search-2"}}
    </tool_call>
"""
from __future__ import annotations

import json
import re

from orchestrator.records import ToolCall

_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


class ToolCallError(ValueError):
    """A tool call that does not parse or does not validate; the message says why."""


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall], list[str]]:
    """Split `text` into (content without call markup, parsed calls, parse errors).

    A `<tool_call>` block without a closing tag is still tried (generation may stop
    at the stop string).  Each block that fails becomes one error message.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for i, match in enumerate(_CALL_RE.finditer(text)):
        body = match.group(1).strip()
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as exc:
            errors.append(f"tool call {i}: not JSON ({exc.msg} at char {exc.pos}): {body[:120]!r}")
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            errors.append(f"tool call {i}: expected an object with a string 'name', got {body[:120]!r}")
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):  # some models double-encode arguments
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                errors.append(f"tool call {i}: 'arguments' is a string that is not JSON: {args[:120]!r}")
                continue
        if not isinstance(args, dict):
            errors.append(f"tool call {i}: 'arguments' must be an object, got {type(args).__name__}")
            continue
        calls.append(ToolCall(name=obj["name"], arguments=args))
    content = _CALL_RE.sub("", text).strip()
    return content, calls, errors


def validate_alias_call(call: ToolCall, allowed: dict[str, list[str]]) -> str:
    """Check a QA tool call against `allowed` (tool name -> aliases); return the alias.

    Raises ToolCallError naming what is wrong: unknown tool, missing/extra argument,
    or an alias the tool does not allow.
    """
    if call.name not in allowed:
        raise ToolCallError(f"unknown tool {call.name!r}; allowed tools: {sorted(allowed)}")
    alias = call.arguments.get("model")
    if not isinstance(alias, str):
        raise ToolCallError(f"tool {call.name!r} needs one string argument 'model' (an alias), got {call.arguments!r}")
    extra = set(call.arguments) - {"model"}
    if extra:
        raise ToolCallError(f"tool {call.name!r} takes only 'model'; unexpected {sorted(extra)}")
    if alias not in allowed[call.name]:
        raise ToolCallError(f"alias {alias!r} is not allowed for tool {call.name!r}; allowed: {allowed[call.name]}")
    return alias


def format_tool_call(name: str, arguments: dict) -> str:
    """The exact hermes text of one call (what constrained decoding emits)."""
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def allowed_call_strings(allowed: dict[str, list[str]]) -> list[str]:
    """Every valid call as text: the choices for constrained decoding."""
    return [format_tool_call(tool, {"model": alias}) for tool, aliases in allowed.items() for alias in aliases]
