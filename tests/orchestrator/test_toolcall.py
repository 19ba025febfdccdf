import pytest

from orchestrator.records import ToolCall
from orchestrator.toolcall import (ToolCallError, allowed_call_strings, format_tool_call, parse_tool_calls,
                                   validate_alias_call)

ALLOWED = {"search": ["search-1", "search-2"], "answer": ["answer-1"]}


def test_parse_valid_hermes_call_after_think():
    text = '<think>need facts</think>\n<tool_call>\n{"name": "search", "arguments": {"model": "search-2"}}\n</tool_call>'
    content, calls, errors = parse_tool_calls(text)
    assert errors == [] and content == "<think>need facts</think>"
    assert calls == [ToolCall("search", {"model": "search-2"})]
    assert validate_alias_call(calls[0], ALLOWED) == "search-2"


def test_unclosed_block_and_string_arguments_still_parse():
    _, calls, errors = parse_tool_calls('<tool_call>{"name": "answer", "arguments": "{\\"model\\": \\"answer-1\\"}"}')
    assert errors == [] and calls[0].arguments == {"model": "answer-1"}


@pytest.mark.parametrize("body, fragment", [
    ('{"name": "search", "arguments": {"model": "search-2"', "not JSON"),
    ('["search"]', "string 'name'"),
    ('{"name": "search", "arguments": [1]}', "must be an object"),
])
def test_malformed_calls_are_errors(body, fragment):
    _, calls, errors = parse_tool_calls(f"<tool_call>{body}</tool_call>")
    assert calls == [] and len(errors) == 1 and fragment in errors[0]


@pytest.mark.parametrize("call, fragment", [
    (ToolCall("browse", {"model": "search-1"}), "unknown tool 'browse'"),
    (ToolCall("search", {"model": "answer-1"}), "alias 'answer-1' is not allowed for tool 'search'"),
    (ToolCall("search", {}), "needs one string argument 'model'"),
    (ToolCall("search", {"model": "search-1", "query": "x"}), "unexpected ['query']"),
])
def test_invalid_calls_name_the_problem(call, fragment):
    with pytest.raises(ToolCallError, match=None) as err:
        validate_alias_call(call, ALLOWED)
    assert fragment in str(err.value)


def test_allowed_call_strings_round_trip():
    strings = allowed_call_strings(ALLOWED)
    assert len(strings) == 3
    for s in strings:
        _, calls, errors = parse_tool_calls(s)
        assert not errors and validate_alias_call(calls[0], ALLOWED)
    assert format_tool_call("answer", {"model": "answer-1"}) in strings
