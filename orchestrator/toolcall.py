"""The one parser of hermes-style tool calls, and the strings constrained decoding allows.

Qwen3 / hermes format (what vLLM's `hermes` parser reads):

    <think>...</think>
    <tool_call>
    {"name": "search", "arguments": {"model": "search-2"}}
    </tool_call>
"""
from __future__ import annotations

import functools
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


# ---------------------------------------------------------------------------- calls with arguments
ARG_MAX_CHARS = 64          # default cap of string arguments under grammar-constrained decoding (rollout.max_string_chars)
ARG_INT_BOUND = 10**9       # integer arguments under grammar-constrained decoding lie in [-bound, bound]


def _json_types(spec: dict) -> list[str]:
    kind = spec.get("type", [])
    return [kind] if isinstance(kind, str) else list(kind)


def validate_schema_call(call: ToolCall, schemas: list[dict]) -> None:
    """Check a call against OpenAI function `schemas` (name, required / unknown arguments,
    JSON types, enums).  Raises ToolCallError naming the tool and argument."""
    by_name = {s["function"]["name"]: s["function"] for s in schemas}
    if call.name not in by_name:
        raise ToolCallError(f"unknown tool {call.name!r}; allowed tools: {sorted(by_name)}")
    params = by_name[call.name].get("parameters") or {}
    props = params.get("properties") or {}
    missing = [p for p in params.get("required", []) if p not in call.arguments]
    if missing:
        raise ToolCallError(f"tool {call.name!r}: missing argument(s) {missing}")
    unknown = sorted(set(call.arguments) - set(props))
    if unknown and params.get("additionalProperties") is not True:
        raise ToolCallError(f"tool {call.name!r}: unknown argument(s) {unknown}; it takes {sorted(props)}")
    checks = {"string": lambda v: isinstance(v, str), "boolean": lambda v: isinstance(v, bool),
              "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "null": lambda v: v is None, "object": lambda v: isinstance(v, dict),
              "array": lambda v: isinstance(v, list)}
    for name, value in call.arguments.items():
        if name not in props:
            continue
        types = _json_types(props[name])
        if types and not any(checks.get(t, lambda v: True)(value) for t in types):
            raise ToolCallError(f"tool {call.name!r}: argument {name!r} must be {' or '.join(types)}, "
                                f"got {type(value).__name__} {value!r:.60}")
        enum = props[name].get("enum")
        if enum is not None and value not in enum:
            raise ToolCallError(f"tool {call.name!r}: argument {name!r} must be one of {enum}, got {value!r:.60}")


def _bounded(spec: dict, max_chars: int) -> dict:
    """A parameter schema for decoding: no descriptions, strings and integers bounded, at every
    depth (object properties, array items, `anyOf` branches); `$ref`s kept (`$defs` travel along)."""
    out = {k: v for k, v in spec.items() if k in ("type", "enum", "items", "properties", "required", "$ref", "anyOf")}
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: _bounded(v, max_chars) for k, v in out["properties"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _bounded(out["items"], max_chars)
    if isinstance(out.get("anyOf"), list):
        out["anyOf"] = [_bounded(v, max_chars) for v in out["anyOf"]]
    types = _json_types(out)
    if "string" in types and "enum" not in out:   # no control characters: JSON forbids them raw
        out["pattern"] = r'^[^"\\\x00-\x1f]{0,%d}$' % max_chars
    if types == ["integer"]:
        out.update(minimum=-ARG_INT_BOUND, maximum=ARG_INT_BOUND)
    return out


def call_grammar(schemas: list[dict], max_string_chars: int = ARG_MAX_CHARS) -> str:
    """An EBNF grammar (xgrammar's dialect, read by both engines) of exactly one hermes call
    to one of `schemas`, arguments typed as the schema says, in its order:

        <tool_call>\\n{"name": "<tool>", "arguments": {...}}\\n</tool_call>

    the text `format_tool_call` writes.  String arguments are cut at `max_string_chars`
    characters (default ARG_MAX_CHARS: an untrained policy's calls end within a few dozen
    tokens; raise it for tasks whose arguments are longer) and integers bounded.
    """
    if max_string_chars < 1:
        raise ValueError(f"call_grammar: max_string_chars must be >= 1, got {max_string_chars}")
    return _call_grammar(json.dumps(schemas), max_string_chars)   # key order kept: it is the arguments' order


def message_or_call_grammar(schemas: list[dict], max_string_chars: int = ARG_MAX_CHARS) -> str:
    """`call_grammar(schemas)` or a message to the user, `<message>text</message>` (no `<` in
    the text, at most `max_string_chars` characters): the two things a tau2 agent's turn can be."""
    import xgrammar as xgr  # lazy: heavy; only for constrained decoding

    message = xgr.Grammar.from_ebnf(f'root ::= "<message>" [^<]{{1,{int(max_string_chars)}}} "</message>"')
    return str(xgr.Grammar.union(xgr.Grammar.from_ebnf(call_grammar(schemas, max_string_chars)), message))


@functools.lru_cache(maxsize=64)
def _call_grammar(schemas_json: str, max_chars: int) -> str:
    import xgrammar as xgr  # lazy: heavy; only for constrained decoding

    alternatives = []
    for schema in json.loads(schemas_json):
        fn = schema["function"]
        params = fn.get("parameters") or {}
        props = {k: _bounded(v, max_chars) for k, v in (params.get("properties") or {}).items()}
        args = {"type": "object", "properties": props, "required": list(params.get("required", [])),
                "additionalProperties": False}
        call = {"type": "object", "properties": {"name": {"const": fn["name"]}, "arguments": args},
                "required": ["name", "arguments"], "additionalProperties": False}
        for key in ("$defs", "definitions"):   # pydantic-made schemas (tau2's tools) refer into these
            if params.get(key):
                call[key] = {k: _bounded(v, max_chars) for k, v in params[key].items()}
        alternatives.append(xgr.Grammar.from_json_schema(json.dumps(call), any_whitespace=False))
    if not alternatives:
        raise ValueError("call_grammar: no tool schemas given")
    body = xgr.Grammar.union(*alternatives) if len(alternatives) > 1 else alternatives[0]
    return str(xgr.Grammar.concat(xgr.Grammar.from_ebnf('root ::= "<tool_call>\\n"'), body,
                                  xgr.Grammar.from_ebnf('root ::= "\\n</tool_call>"')))
