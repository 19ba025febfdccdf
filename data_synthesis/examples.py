"""Turn QA items and tau2 tasks into randomised `TrainingExample`s.

Per example (seeded, so a fixed seed gives the same dataset):
- tool subset: each optional tool is kept with probability `tool_keep`; required tools
  (`answer` for QA, `call_expert` for tau2) always stay; each tool keeps >= 1 alias;
- aliases: renumbered and shuffled, so "search-1" may be any of the search models;
- prices: every model's $/1M in and out price times a log-uniform factor in
  [1/price_jitter, price_jitter], from the catalog (tools.json, the one price table);
- a preference vector (preferences.py);
and the tools, prices, latencies and preference are written into `instruction`.
"""
from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.catalog import Catalog
from data_synthesis.preferences import DEFAULT_MIX, sample_preference
from data_synthesis.records import Price, TrainingExample
from data_synthesis.tasks import task_meta

REQUIRED = {"qa": {"answer"}, "tau2": {"call_expert"}}


@dataclass
class Randomization:
    tool_keep: float = 0.8          # probability an optional tool is offered
    alias_keep: float = 0.75        # probability each alias is offered (>= 1 per tool)
    shuffle_aliases: bool = True
    price_jitter: float = 2.0       # factor range [1/j, j], log-uniform; 1 = catalog prices
    preference_mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))


def _alias_prefix(aliases: list[str]) -> str:
    head = aliases[0].rsplit("-", 1)[0]
    return head if all(a.startswith(head + "-") for a in aliases) else aliases[0].split("-")[0]


def sample_tools(catalog: Catalog, kind: str, rng: random.Random, cfg: Randomization) -> dict[str, dict[str, str]]:
    """tool -> {alias: model} for one example."""
    out: dict[str, dict[str, str]] = {}
    for tool in catalog.tools_for(kind):
        if not tool.alias_tool:
            continue        # a function tool (python/http/mcp): every task offers it (episodes/base.py task_catalog)
        if tool.name not in REQUIRED[kind] and rng.random() >= cfg.tool_keep:
            continue
        names = list(tool.aliases)
        kept = [a for a in names if rng.random() < cfg.alias_keep] or [rng.choice(names)]
        models = [tool.aliases[a].model for a in kept]
        if cfg.shuffle_aliases:
            rng.shuffle(models)
            prefix = _alias_prefix(names)
            kept = [f"{prefix}-{i + 1}" for i in range(len(models))]
        out[tool.name] = dict(zip(kept, models))
    missing = REQUIRED[kind] - set(out)
    if missing:
        raise ValueError(f"tools.json offers no {sorted(missing)} tool for {kind!r} tasks; add it to the catalog")
    return out


def perturb_prices(catalog: Catalog, models: list[str], rng: random.Random, jitter: float) -> dict[str, Price]:
    if jitter < 1:
        raise ValueError(f"price_jitter must be >= 1 (a factor range [1/j, j]), got {jitter}")
    out = {}
    for model in sorted(set(models)):
        base = catalog.price(model)
        factor = lambda: math.exp(rng.uniform(-math.log(jitter), math.log(jitter)))  # noqa: E731 (a one-line closure over rng)
        out[model] = Price(input=_round(base.input * factor()), output=_round(base.output * factor()))
    return out


def _round(x: float) -> float:
    return float(f"{x:.3g}")


def latencies(catalog: Catalog, tools: dict[str, dict[str, str]]) -> dict[str, float]:
    """alias -> the catalog's listed latency of the alias's model for that tool (seconds)."""
    out = {}
    for tool_name, per in tools.items():
        by_model = {spec.model: spec.latency_s for spec in catalog.tool(tool_name).aliases.values()}
        out.update({a: by_model[m] for a, m in per.items()})
    return out


def render_instruction(question: str, tools: dict[str, dict[str, str]], prices: dict[str, Price],
                       latency_s: dict[str, float], preference_text: str) -> str:
    """The text the policy reads: the problem, then tools/models/prices, then the preference."""
    lines = [question.strip(), ""] if question.strip() else []
    lines.append("Models you can call through each tool (price per 1M input / output tokens, average latency):")
    for tool, per in tools.items():
        rows = [f"{a} = {m} (${prices[m].input:g} / ${prices[m].output:g}, {latency_s[a]:g} s)"
                for a, m in per.items()]
        lines.append(f"- {tool}: " + "; ".join(rows))
    lines += ["", f"Preference: {preference_text}"]
    return "\n".join(lines)


def make_example(*, kind: str, ex_id: str, domain: str, question: str, catalog: Catalog, seed: int,
                 cfg: Randomization, difficulty: str = "unrated", answer: str | None = None,
                 tau2_task: dict | None = None, domain_dir: str | None = None, source: str = "") -> TrainingExample:
    rng = random.Random(seed)
    tools = sample_tools(catalog, kind, rng, cfg)
    prices = perturb_prices(catalog, [m for per in tools.values() for m in per.values()], rng, cfg.price_jitter)
    lat = latencies(catalog, tools)
    name, weights, text = sample_preference(tools, REQUIRED[kind], rng, cfg.preference_mix)
    return TrainingExample(id=ex_id, kind=kind, domain=domain, difficulty=difficulty, question=question,
                           instruction=render_instruction(question if kind == "qa" else "", tools, prices, lat, text),
                           answer=answer, tau2_task=tau2_task, domain_dir=domain_dir, tools=tools, prices=prices,
                           latency_s=lat, preference=weights, preference_name=name, preference_text=text,
                           seed=seed, source=source)


def _example_seed(seed: int, key: str) -> int:
    """A per-example seed that depends on the run seed and the example id, not on order."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{key}".encode()).digest()[:4], "big")


def load_qa(path: str | Path) -> list[dict]:
    """FRAMES-style JSONL rows {id, question, answer}; errors name the file and line."""
    path = Path(path)
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read QA file: {exc.strerror}") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: line {n}: invalid JSON: {exc.msg}") from None
        missing = [k for k in ("id", "question", "answer") if not isinstance(row.get(k), (str, int)) or row.get(k) == ""]
        if missing:
            raise ValueError(f"{path}: line {n}: needs non-empty {missing} (FRAMES-style {{id, question, answer}})")
        rows.append({"id": str(row["id"]), "question": row["question"], "answer": str(row["answer"])})
    return rows


def qa_examples(rows: list[dict], domain: str, catalog: Catalog, seed: int, cfg: Randomization,
                per_item: int = 1, source: str = "") -> list[TrainingExample]:
    out = []
    for row in rows:
        for k in range(per_item):
            ex_id = f"{domain}/{row['id']}" + (f"#{k}" if per_item > 1 else "")
            out.append(make_example(kind="qa", ex_id=ex_id, domain=domain, question=row["question"],
                                    catalog=catalog, seed=_example_seed(seed, ex_id), cfg=cfg,
                                    answer=row["answer"], source=source))
    return out


def tau2_examples(tasks: list[dict], domain: str, catalog: Catalog, seed: int, cfg: Randomization,
                  domain_dir: str | None = None, per_item: int = 1, source: str = "") -> list[TrainingExample]:
    out = []
    for task in tasks:
        instr = task["user_scenario"]["instructions"]
        question = instr if isinstance(instr, str) else instr.get("reason_for_call", "")
        level = task_meta(task).get("difficulty", "unrated")
        for k in range(per_item):
            ex_id = f"{domain}/{task['id']}" + (f"#{k}" if per_item > 1 else "")
            out.append(make_example(kind="tau2", ex_id=ex_id, domain=domain, question=question, catalog=catalog,
                                    seed=_example_seed(seed, ex_id), cfg=cfg, difficulty=level, tau2_task=task,
                                    domain_dir=domain_dir, source=source))
    return out
