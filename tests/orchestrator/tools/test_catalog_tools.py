"""tools.json with function tools: every error at once with file, JSON path and fix; the registry's
kinds; the schema and the decoding grammar of tools with arbitrary JSON-schema arguments."""
import json
import subprocess
import sys

import pytest

from _episode import REPO, catalog_file, run_calls
from orchestrator.catalog import CatalogError, load_catalog
from orchestrator.tools.registry import KINDS, AliasKind, FunctionKind


def test_every_kind_is_a_registered_module():
    assert {k for k, v in KINDS.items() if isinstance(v, AliasKind)} == {"search", "code", "answer", "expert"}
    assert {k for k, v in KINDS.items() if isinstance(v, FunctionKind)} == {"python", "http", "mcp", "tau2_domain"}
    # runtime.py dispatches through the registry: no tool kind is named there
    runtime = (REPO / "orchestrator" / "runtime.py").read_text()
    assert 'kind == "search"' not in runtime and 'kind == "code"' not in runtime


def test_every_problem_is_reported_at_once_with_path_and_fix(tmp_path):
    bad = {"tools": [
        {"name": "calc", "kind": "python"},                                                    # no handler
        {"name": "web", "kind": "http", "url": "ftp://x", "headers": {"Authorization": "Bearer abc123secret"}},
        {"name": "srv", "kind": "mcp"},                                                        # no command/url
        {"name": "calc2", "kind": "pyhton", "handler": "a:b"},                                 # misspelt kind
        {"name": "search", "kind": "search", "description": "x", "url": "http://x", "aliases": {"s": {"model": "gpt-5", "latency_s": 1}}},
        {"name": "zz", "kind": "python", "handler": "m:f", "timeout_s": "5"},
    ], "prices": {"calc": {"per_cal": 0.1}, "srv": {}}}
    path = catalog_file(tmp_path, bad)
    with pytest.raises(CatalogError) as err:
        load_catalog(path)
    problems = err.value.problems
    text = "\n".join(problems)
    expected = [
        "$.tools[4].handler: Field required (package.module:function)",
        "$.tools[5].url: String should match pattern",
        "$.tools[5].headers: header 'Authorization': write the NAME of an environment variable",
        "$.tools[6]: give exactly one of `command` (a stdio server's argv) and `url`",
        "$.tools[7].kind: 'pyhton' is not a tool kind (did you mean 'python'?)",
        "$.tools[8].url: unknown key 'url'",
        "a search tool picks a model alias: for a web service, a Python function or an MCP server use kind http, python or mcp",
        "$.tools[9].timeout_s: '5' is a string; write the number without quotes",
        "$.prices.calc.per_cal: unknown key 'per_cal' (did you mean 'per_call'?)",
        "$.prices.srv: an empty price row",
        "$.tools[8].name: duplicate tool name 'search' (also tools[0]); rename one",
        "$.tools[5]: tool 'web' has no row 'web' in 'prices'; add \"web\": {\"per_call\": 0.001} there",
    ]
    for line in expected:
        assert line in text, f"{line!r} not in:\n{text}"
    assert all(p.startswith(f"{path}: $") for p in problems)
    assert "abc123secret" not in text
    # the CLI prints them all, one a line, and how many
    proc = subprocess.run([sys.executable, "-m", "orchestrator.catalog", str(path)], cwd=REPO, capture_output=True, text=True)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and lines[-1] == f"{len(problems)} problems in {path}" and len(lines) == len(problems) + 1


def test_a_function_tool_schema_and_grammar_take_any_json_schema_arguments(tmp_path):
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string

    from orchestrator.toolcall import format_tool_call

    params = {"type": "object", "properties": {
        "x": {"type": "number"}, "n": {"type": "integer"}, "flag": {"type": "boolean"}, "s": {"type": "string"},
        "unit": {"type": "string", "enum": ["m", "km"]}}, "required": ["x", "unit"]}
    addition = {"tools": [{"name": "calc", "kind": "python", "handler": "examples.tools.calculator:calculate",
                           "parameters": params}], "prices": {"calc": {"per_call": 0.0}}}
    rollout, policy = run_calls(catalog_file(tmp_path, addition), [], answer_after=True, constrained=True)
    seen = policy.seen[0]
    assert seen["choices"] is None and seen["grammar"] is not None and rollout.turns[0].constraint == {"grammar": seen["grammar"]}
    assert next(s for s in seen["tools"] if s["function"]["name"] == "calc")["function"]["parameters"] == params
    grammar = xgr.Grammar.from_ebnf(seen["grammar"])
    ok = [("calc", {"x": 1.5, "n": 3, "flag": True, "s": "hi", "unit": "km"}), ("calc", {"x": -2, "unit": "m"}),
          ("answer", {"model": "answer-2"}), ("enhance_reasoning", {"model": "reasoner-1"})]
    bad = [("calc", {"x": "a", "unit": "km"}), ("calc", {"x": 1, "unit": "mi"}), ("calc", {"x": 1}),
           ("calc", {"x": 1, "unit": "m", "extra": 1}), ("answer", {"model": "answer-9"}), ("search", {"model": "search-1"})]
    assert all(_is_grammar_accept_string(grammar, format_tool_call(*c)) for c in ok)
    assert not any(_is_grammar_accept_string(grammar, format_tool_call(*c)) for c in bad)
    # without function tools the constraint stays the list of every alias call
    _, plain = run_calls(REPO / "tools.json", [], constrained=True)
    assert plain.seen[0]["grammar"] is None and '"answer-2"' in "".join(plain.seen[0]["choices"])


def test_a_call_with_wrong_arguments_is_an_invalid_turn(tmp_path):
    addition = {"tools": [{"name": "calculator", "kind": "python", "handler": "examples.tools.calculator:calculate"}],
                "prices": {"calculator": {"per_call": 0.0}}}
    rollout, _ = run_calls(catalog_file(tmp_path, addition), [("calculator", {"expr": "1"}), ("calculator", {"expression": 3}),
                                                              ("nope", {})])
    reasons = [t.invalid_reason for t in rollout.turns[:3]]
    assert "missing argument(s) ['expression']" in reasons[0]
    assert "argument 'expression' must be string" in reasons[1]
    assert "unknown tool 'nope'" in reasons[2] and "calculator" in reasons[2]
    assert rollout.finished and rollout.tool_calls == {"answer-2": 1}


def test_a_task_with_its_own_alias_tools_still_offers_the_function_tools(tmp_path):
    from orchestrator.loop import Task, task_catalog

    addition = {"tools": [{"name": "calculator", "kind": "python", "handler": "examples.tools.calculator:calculate"}],
                "prices": {"calculator": {"per_call": 0.0}}}
    base = load_catalog(catalog_file(tmp_path, addition))
    sub = task_catalog(base, Task("t", "q", tools={"answer": {"a-1": "gpt-5"}}, prices={"gpt-5": {"input": 2.0, "output": 3.0}}))
    assert [t.name for t in sub.tools] == ["answer", "calculator"] and sub.price("gpt-5").input == 2.0


def test_the_tau2_domain_kind_offers_a_domain_folders_tools(tmp_path):
    domain = tmp_path / "shop"
    domain.mkdir()
    (domain / "db.json").write_text(json.dumps({"items": {"i1": {"name": "pen", "stock": 3}}}))
    (domain / "tools.py").write_text(
        "TOOL_TYPES = {'stock': 'read', 'take': 'write'}\n\n"
        "def stock(db, item_id: str) -> int:\n    \"\"\"Units in stock.\n\n    Args:\n        item_id: the item\n    \"\"\"\n"
        "    return db['items'][item_id]['stock']\n\n"
        "def take(db, item_id: str) -> int:\n    \"\"\"Take one unit.\n\n    Args:\n        item_id: the item\n    \"\"\"\n"
        "    db['items'][item_id]['stock'] -= 1\n    return db['items'][item_id]['stock']\n")
    addition = {"tools": [{"name": "shop", "kind": "tau2_domain", "domain": str(domain)}], "prices": {"shop": {"per_call": 0.0}}}
    path = catalog_file(tmp_path, addition)
    calls = [("take", {"item_id": "i1"}), ("take", {"item_id": "i1"}), ("stock", {"item_id": "i1"})]
    for _ in range(2):     # each episode acts on its own copy of the database
        rollout, _ = run_calls(path, calls)
        assert [t.expert.output for t in rollout.turns[:3]] == ["2", "1", "1"]
