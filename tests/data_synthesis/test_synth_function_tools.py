"""Synthesised examples over a catalog with a function tool (docs/tools.md): per-example tool sampling
randomises the alias tools only, and every example's task still offers the function tool."""
import json
import random
from pathlib import Path

from data_synthesis.examples import Randomization, sample_tools
from orchestrator.catalog import parse_catalog
from orchestrator.loop import Task, task_catalog

REPO = Path(__file__).resolve().parents[2]


def test_sampled_examples_keep_the_function_tool():
    data = json.loads((REPO / "tools.json").read_text())
    data["tools"].append({"name": "calculator", "kind": "python", "handler": "examples.tools.calculator:calculate"})
    data["prices"]["calculator"] = {"per_call": 0.0001}
    catalog = parse_catalog(data)
    rng = random.Random(0)
    for _ in range(20):
        tools = sample_tools(catalog, "qa", rng, Randomization())
        assert "calculator" not in tools and "answer" in tools
        offered = task_catalog(catalog, Task("t", "q", tools=tools))
        assert offered.tool("calculator").handler == "examples.tools.calculator:calculate"
