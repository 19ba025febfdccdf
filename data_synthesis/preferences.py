"""Preference vectors and how they read in words (PAPER.md §4: R = normalised(M) . P).

Keys are the example's aliases plus "outcome", "cost", "latency" (the keys
`training.rewards.preference_rewards` reads).  A positive weight on "cost"/"latency"
rewards being cheap/fast; a negative weight on an alias rewards calling it less.
Every preset keeps `outcome` = 1: the reward is 0 for a wrong answer anyway.
"""
from __future__ import annotations

import random

# preset -> relative sampling weight (the dataset CLI can change these)
DEFAULT_MIX = {"accuracy": 1.0, "cheapest": 2.0, "fastest": 2.0, "balanced": 1.0, "avoid_tool": 1.5,
               "prefer_alias": 1.5, "avoid_alias": 1.0, "weighted": 2.0}


def sample_preference(tools: dict[str, dict[str, str]], required: set[str], rng: random.Random,
                      mix: dict[str, float] | None = None) -> tuple[str, dict[str, float], str]:
    """(name, weights, text) for one example whose tools are `tools` (tool -> {alias: model}).

    `required` tools (e.g. `answer`) are never the tool to avoid.
    """
    mix = mix or DEFAULT_MIX
    unknown = sorted(set(mix) - set(DEFAULT_MIX))
    if unknown:
        raise ValueError(f"preference mix: unknown presets {unknown}; known: {sorted(DEFAULT_MIX)}")
    names = [n for n in sorted(mix) if mix[n] > 0 and _applicable(n, tools, required)]
    if not names:
        raise ValueError("preference mix: every preset has weight 0 or does not apply to these tools")
    name = rng.choices(names, [mix[n] for n in names])[0]
    return _build(name, tools, required, rng)


def _applicable(name: str, tools: dict[str, dict[str, str]], required: set[str]) -> bool:
    if name == "avoid_tool":
        return any(t not in required for t in tools)
    return True


def _build(name: str, tools: dict[str, dict[str, str]], required: set[str],
           rng: random.Random) -> tuple[str, dict[str, float], str]:
    aliases = {a: (t, m) for t, per in sorted(tools.items()) for a, m in sorted(per.items())}
    if name == "accuracy":
        return name, {"outcome": 1.0}, "Only correctness matters: cost and time are no concern."
    if name == "cheapest":
        return name, {"outcome": 1.0, "cost": 1.0}, (
            "Solve it correctly while spending as little money as possible: prefer the cheapest models "
            "and make as few calls as you can.")
    if name == "fastest":
        return name, {"outcome": 1.0, "latency": 1.0}, (
            "Solve it correctly as fast as possible: prefer the models with the lowest latency.")
    if name == "balanced":
        return name, {"outcome": 1.0, "cost": 0.5, "latency": 0.5}, (
            "Solve it correctly, keeping both cost and waiting time low.")
    if name == "avoid_tool":
        tool = rng.choice(sorted(t for t in tools if t not in required))
        listed = ", ".join(sorted(tools[tool]))
        return f"avoid_tool:{tool}", {"outcome": 1.0, **{a: -1.0 for a in tools[tool]}}, (
            f"Avoid the {tool} tool ({listed}): use it only if there is no other way.")
    alias = rng.choice(sorted(aliases))
    tool, model = aliases[alias]
    if name == "prefer_alias":
        return f"prefer_alias:{alias}", {"outcome": 1.0, alias: 1.0}, (
            f"Prefer {alias} ({model}) for {tool} whenever it can do the job.")
    if name == "avoid_alias":
        return f"avoid_alias:{alias}", {"outcome": 1.0, alias: -1.0}, (
            f"Avoid {alias} ({model}): use other models for {tool} when you can.")
    cost, latency = round(rng.uniform(0, 1), 2), round(rng.uniform(0, 1), 2)
    return "weighted", {"outcome": 1.0, "cost": cost, "latency": latency}, (
        f"Weigh your choices: correctness 1.0, low cost {cost:g}, low latency {latency:g} "
        "(higher means more important).")
