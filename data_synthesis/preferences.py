"""Preference vectors and how they read in words (PAPER.md §4: R = normalised(M) . P).

Keys are the example's aliases plus "outcome", "cost", "latency" (the keys
`training.rewards.preference_rewards` reads).  A positive weight on "cost"/"latency"
rewards being cheap/fast; a negative weight on an alias rewards calling it less.
Every preset keeps `outcome` = 1: the reward is 0 for a wrong answer anyway.
"""
from __future__ import annotations

import json
import math
import random

# preset -> relative sampling weight (the dataset CLI can change these)
DEFAULT_MIX = {"accuracy": 1.0, "cheapest": 2.0, "fastest": 2.0, "balanced": 1.0, "avoid_tool": 1.5,
               "prefer_alias": 1.5, "avoid_alias": 1.0, "weighted": 2.0}
FIXED = ("accuracy", "cheapest", "fastest", "balanced")         # presets with nothing to draw
TARGETED = ("avoid_tool", "prefer_alias", "avoid_alias")          # written NAME:TOOL or NAME:ALIAS
SYNONYMS = {"cost": "cheapest", "latency": "fastest"}            # short names evaluation accepts too


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
    """Draw what preset `name` leaves open (the tool, the alias, the weights) and state it."""
    if name in FIXED:
        return stated(name, tools)
    if name == "avoid_tool":
        return stated(name, tools, target=rng.choice(sorted(t for t in tools if t not in required)))
    aliases = sorted(a for per in tools.values() for a in per)
    alias = rng.choice(aliases)     # drawn for `weighted` too: a dataset's seeds stay what they were
    if name in ("prefer_alias", "avoid_alias"):
        return stated(name, tools, target=alias)
    if name == "weighted":
        return stated(name, tools, cost=round(rng.uniform(0, 1), 2), latency=round(rng.uniform(0, 1), 2))
    raise ValueError(f"unknown preference preset {name!r}; known: {sorted(DEFAULT_MIX)}")


def stated(name: str, tools: dict[str, dict[str, str]], *, target: str | None = None,
           cost: float = 0.0, latency: float = 0.0) -> tuple[str, dict[str, float], str]:
    """(name, weights, text) of preset `name` over `tools` (tool -> {alias: model}): the one place
    a preference's words are written, for training examples and for evaluation (--preference).

    `target` is the tool of `avoid_tool` and the alias of `prefer_alias` / `avoid_alias`;
    `cost` / `latency` are the weights of `weighted`."""
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
        listed = ", ".join(sorted(tools[target]))
        return f"avoid_tool:{target}", {"outcome": 1.0, **{a: -1.0 for a in tools[target]}}, (
            f"Avoid the {target} tool ({listed}): use it only if there is no other way.")
    if name in ("prefer_alias", "avoid_alias"):
        tool, model = aliases[target]
        if name == "prefer_alias":
            return f"prefer_alias:{target}", {"outcome": 1.0, target: 1.0}, (
                f"Prefer {target} ({model}) for {tool} whenever it can do the job.")
        return f"avoid_alias:{target}", {"outcome": 1.0, target: -1.0}, (
            f"Avoid {target} ({model}): use other models for {tool} when you can.")
    if name == "weighted":
        return "weighted", {"outcome": 1.0, "cost": cost, "latency": latency}, (
            f"Weigh your choices: correctness 1.0, low cost {cost:g}, low latency {latency:g} "
            "(higher means more important).")
    raise ValueError(f"unknown preference preset {name!r}; known: {sorted(DEFAULT_MIX)}")


class PreferenceError(ValueError):
    """A preference that training cannot state (resolve_preference); one line, the fix included."""


def resolve_preference(spec: str, tools: dict[str, dict[str, str]],
                       required: set[str]) -> tuple[str, dict[str, float], str]:
    """A preset name or a weight vector -> (name, weights, text) exactly as a training example
    states it (`stated`), over `tools` (tool -> {alias: model}).

    Names: accuracy, cheapest (or cost), fastest (or latency), balanced, avoid_tool:TOOL,
    prefer_alias:ALIAS, avoid_alias:ALIAS.  A vector, `accuracy=1,cost=0.5` or JSON
    (`{"cost": 0.5}`), weighs "accuracy" (or "outcome"), "cost", "latency", a tool (-1: avoid
    it) or an alias (1: prefer it, -1: avoid it); it must be one that training states:
    accuracy 1 (the default), cost and latency in [0, 1], and at most one tool or alias weight,
    which then comes alone.  A vector equal to a fixed preset's is stated in that preset's words.
    """
    spec = spec.strip()
    if "=" not in spec and not spec.startswith("{"):
        return _named(spec, tools, required)
    weights = _vector(spec)
    outcome = weights.pop("outcome", 1.0)
    if outcome != 1.0:
        raise PreferenceError(f"accuracy weight {outcome:g}: every training preference weighs correctness 1; "
                              f"scale the vector so that accuracy=1")
    cost, latency = weights.pop("cost", 0.0), weights.pop("latency", 0.0)
    for key, w in (("cost", cost), ("latency", latency)):
        if not 0 <= w <= 1:
            raise PreferenceError(f"{key} weight {w:g}: training states {key} weights in [0, 1] (1 = "
                                  f"{'cheapest' if key == 'cost' else 'fastest'}); negative weights are not a preference it knows")
    aliases = {a for per in tools.values() for a in per}
    targets = {k: w for k, w in weights.items() if w != 0}
    unknown = sorted(k for k in targets if k not in tools and k not in aliases)
    if unknown:
        raise PreferenceError(f"unknown key {unknown[0]!r}: weigh accuracy, cost, latency, a tool "
                              f"({', '.join(sorted(tools))}) or an alias ({', '.join(sorted(aliases))})")
    if not targets:
        fixed = {(0.0, 0.0): "accuracy", (1.0, 0.0): "cheapest", (0.0, 1.0): "fastest", (0.5, 0.5): "balanced"}
        name = fixed.get((cost, latency))
        return stated(name, tools) if name else stated("weighted", tools, cost=cost, latency=latency)
    if len(targets) > 1 or cost or latency:
        raise PreferenceError(f"{', '.join(sorted(targets))} with other weights: training states one tool or alias "
                              f"preference alone, never combined with cost, latency or another tool")
    [(key, w)] = targets.items()
    if key in tools:
        if w != -1 or key in required:
            why = f"the {key} tool is always offered" if key in required else f"weight {w:g}"
            raise PreferenceError(f"{key}={w:g}: training states a tool preference only as avoiding a tool "
                                  f"that is not required (TOOL=-1); {why}")
        return stated("avoid_tool", tools, target=key)
    if w not in (1, -1):
        raise PreferenceError(f"{key}={w:g}: training states an alias preference as {key}=1 (prefer it) "
                              f"or {key}=-1 (avoid it)")
    return stated("prefer_alias" if w == 1 else "avoid_alias", tools, target=key)


def _named(spec: str, tools: dict[str, dict[str, str]], required: set[str]) -> tuple[str, dict[str, float], str]:
    name, _, target = spec.partition(":")
    name = SYNONYMS.get(name, name)
    known = [*FIXED, *SYNONYMS, *(f"{n}:..." for n in TARGETED)]
    if name in FIXED and not target:
        return stated(name, tools)
    if name not in TARGETED or not target:
        raise PreferenceError(f"unknown preset {spec!r}; name one of {', '.join(known)} or give a weight vector "
                              f"such as accuracy=1,cost=0.5")
    if name == "avoid_tool":
        if target not in tools or target in required:
            choices = sorted(t for t in tools if t not in required)
            raise PreferenceError(f"avoid_tool:{target}: not a tool that can be avoided here; choose one of {choices}")
    elif not any(target in per for per in tools.values()):
        raise PreferenceError(f"{name}:{target}: no such alias; choose one of "
                              f"{sorted(a for per in tools.values() for a in per)}")
    return stated(name, tools, target=target)


def _vector(spec: str) -> dict[str, float]:
    """`k=v,k=v` or a JSON object -> {key: weight}; "accuracy" is stored as training's "outcome"."""
    if spec.startswith("{"):
        try:
            raw = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise PreferenceError(f"not a JSON object ({exc.msg}); write e.g. {{\"accuracy\": 1, \"cost\": 0.5}}") from None
        if not isinstance(raw, dict):
            raise PreferenceError("a JSON vector must be an object of key -> weight")
        items = list(raw.items())
    else:
        items = []
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, eq, value = part.partition("=")
            if not eq:
                raise PreferenceError(f"{part!r} has no '=': write KEY=WEIGHT, e.g. accuracy=1,cost=0.5")
            items.append((key.strip(), value.strip()))
    out: dict[str, float] = {}
    for key, value in items:
        try:
            w = float(value)
        except (TypeError, ValueError):
            w = math.nan
        if isinstance(value, bool) or not math.isfinite(w):
            raise PreferenceError(f"{key}={value}: a weight must be a finite number")
        key = "outcome" if key == "accuracy" else key
        if key in out:
            raise PreferenceError(f"{key!r} is given twice")
        out[key] = w
    return out
