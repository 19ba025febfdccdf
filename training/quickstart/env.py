"""The quickstart's local tool-use world: tasks, tools with different prices, real experts.

World (data_synthesis/toyworld.py over the data-synthesis `people` domain): 200 fictional people; two
kinds of question, each solvable by exactly one tool kind:
- lookup ("In which city was Mira Tallow born?"): only `search` over the local corpus
  (MiniLM + FAISS index built here) brings the fact into the context;
- arithmetic ("What is 37 * 41 + 12?"): only `enhance_reasoning` (the expert writes
  Python, the sandbox runs it) gives the number; the small expert cannot multiply.

Tools: every alias of a tool is served by the same local model (SmolLM2-135M-Instruct,
greedy), so aliases are equally able and differ only in what tools.json says they
cost (e.g. answer-1 priced as gpt-5, answer-math-2 as Qwen2.5-Math-7B).  The policy
has to learn, from the reward alone, which tool each question needs and that the cheap
aliases do as well; the preference vector adds a weight on one alias (`search-3`,
"prefer the local search tool"), which is not the cheapest search alias (search-2 is).

Nothing here reads ../shared or downloads anything.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict
from pathlib import Path

from orchestrator.catalog import load_catalog
from orchestrator.loop import Task
from data_synthesis.toyworld import build_people, build_tasks

PROMPTS_DIR = Path(__file__).resolve().parent / "prompts"
# tool -> the aliases of tools.json offered in every quickstart task
TOOL_ALIASES = {
    "search": ["search-1", "search-2", "search-3"],
    "enhance_reasoning": ["reasoner-1", "reasoner-2"],
    "answer": ["answer-1", "answer-math-2"],
}
FAVOURED_ALIAS = "search-3"
PREFERENCE = {"outcome": 1.0, "cost": 1.0, FAVOURED_ALIAS: 1.0}
# Short prose: in this world all aliases of a tool are the same local model, so tools.json's
# capability descriptions do not apply (and would lengthen, and price up, every prompt).
DESCRIPTIONS = {
    "search": "Search the local corpus for the missing information.",
    "enhance_reasoning": "Write Python code for the problem, run it and return its output.",
    "answer": "Give the final answer.",
}


def quickstart_catalog(out: Path) -> Path:
    """tools.json for the quickstart: the repository's tools, aliases and prices (the one
    price table), with the short `DESCRIPTIONS` instead of the capability prose."""
    catalog = load_catalog()
    data = catalog.model_dump()
    for tool in data["tools"]:
        if tool["name"] in DESCRIPTIONS:
            tool["description"], tool["argument_description"] = DESCRIPTIONS[tool["name"]], ""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "tools.json"
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def task_tools() -> dict[str, dict[str, str]]:
    """The per-task tool mapping (tool -> {alias: model}) from the repository's catalog."""
    catalog = load_catalog()
    return {tool: {a: catalog.tool(tool).aliases[a].model for a in aliases} for tool, aliases in TOOL_ALIASES.items()}


def _with_tools(tasks: list[Task]) -> list[Task]:
    tools = task_tools()
    for t in tasks:
        t.tools, t.preference = tools, dict(PREFERENCE)
    return tasks


def build_world(out: Path, *, n_train: int, n_eval: int, n_warmup: int = 0, n_people: int = 200,
                seed: int = 0) -> dict[str, Path]:
    """Write corpus.jsonl and train / eval / warmup .jsonl (half lookup, half arithmetic each).

    The splits ask about different people and different numbers; `warmup` holds the tasks
    whose demonstrations the starting policy is taught on (never evaluated).
    """
    out.mkdir(parents=True, exist_ok=True)
    people = build_people(n_people, seed)
    sizes = {"train": n_train, "eval": n_eval, "warmup": n_warmup}
    n_lookup = sum(n // 2 for n in sizes.values())
    tasks = build_tasks(people, n_lookup, sum(sizes.values()) - n_lookup, seed)
    lookup = [t for t in tasks if t.metadata["type"] == "lookup"]
    arith = [t for t in tasks if t.metadata["type"] == "arithmetic"]
    rng = random.Random(seed)
    paths = {"corpus": out / "corpus.jsonl"}
    paths["corpus"].write_text("".join(json.dumps({"id": p.id, "contents": p.passage()}) + "\n" for p in people))
    for name, n in sizes.items():
        split = lookup[:n // 2] + arith[:n - n // 2]
        lookup, arith = lookup[n // 2:], arith[n - n // 2:]
        rng.shuffle(split)
        rows = [{**asdict(t), "metadata": json.dumps(t.metadata)} for t in _with_tools(split)]
        paths[name] = out / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def build_index(corpus: Path, out: Path) -> Path:
    """The MiniLM + FAISS index of the corpus (reused when already built)."""
    from retrieval.build_index import build

    if not (out / "meta.json").exists():
        build(corpus, out, progress=False)
    return out
