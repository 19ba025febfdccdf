"""ToolOrchestra's preference-weighted reward for one group of rollouts (PAPER.md §4).

For rollout t of a task's group build

    M_t = [n_1, ..., n_K, r_outcome, -cost, -latency]

where n_k counts calls to alias k (every alias that appears in the group or in the
preference; absent = 0), r_outcome is 0 or 1, cost is dollars and latency seconds.
Each coordinate is min-max normalised over the whole group, (x - min) / (max - min),
and set to 0 where max == min.  Then

    R_t = normalised(M_t) . P    if r_outcome = 1, else 0.

We follow the paper's signs: the cheapest / fastest rollout of a group gets the
normalised cost / latency coordinate 1, the most expensive / slowest 0 (upstream
code negates the wrong way; PAPER.md calls that a bug).

Pure: no I/O, no tensors; `preference_rewards` is the whole public contract.
In the core because training (training/rewards.py re-exports it) and evaluation's preference
report (evaluation/preference.py) both score with it.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.records import Rollout

# Preference keys that are not aliases.
OUTCOME, COST, LATENCY = "outcome", "cost", "latency"
_RESERVED = (OUTCOME, COST, LATENCY)


def preference_rewards(group: Sequence[Mapping[str, Any]],
                       preference: Mapping[str, float]) -> list[float]:
    """Rewards of one group of rollouts of the same task, in the group's order.

    Args:
        group: one dict per rollout, `{"tool_calls": {alias: count}, "outcome": 0 or 1,
            "cost": dollars >= 0, "latency": seconds >= 0}`.
        preference: weight per alias and per "outcome", "cost", "latency"; keys that
            are missing weigh 0.  Weights on "cost" / "latency" reward being cheap /
            fast (the coordinates are -cost and -latency before normalisation).

    Returns:
        One float per rollout; 0.0 for every rollout whose outcome is 0.

    Raises:
        ValueError / TypeError naming the rollout index and field that is wrong.
    """
    rollouts = [_checked_rollout(i, r) for i, r in enumerate(_checked_group(group))]
    weights = _checked_preference(preference)
    aliases = sorted({a for r in rollouts for a in r["tool_calls"]}
                     | {k for k in weights if k not in _RESERVED})
    clash = [a for r in rollouts for a in r["tool_calls"] if a in _RESERVED]
    if clash:
        raise ValueError(f"tool alias {clash[0]!r} collides with a reserved preference key "
                         f"{_RESERVED}; rename the alias in the task's tool mapping")

    keys = [*aliases, OUTCOME, COST, LATENCY]
    # M: rows = rollouts, columns = keys; cost and latency enter negated (paper's sign).
    matrix = [[float(r["tool_calls"].get(a, 0)) for a in aliases]
              + [float(r["outcome"]), -r["cost"], -r["latency"]] for r in rollouts]
    columns = [_min_max([row[j] for row in matrix]) for j in range(len(keys))]
    rewards = []
    for t, r in enumerate(rollouts):
        if r["outcome"] != 1:
            rewards.append(0.0)
            continue
        rewards.append(sum(columns[j][t] * weights.get(k, 0.0) for j, k in enumerate(keys)))
    return rewards


def reward_inputs(rollout: Rollout) -> dict[str, Any]:
    """The `group` entry of one finished, judged `Rollout` (its outcome must be 0 or 1)."""
    if rollout.outcome is None:
        raise ValueError(f"rollout of task {rollout.task_id!r} has no outcome yet; "
                         "judge it (or run the environment's evaluator) before rewarding")
    return {"tool_calls": rollout.tool_calls, "outcome": rollout.outcome,
            "cost": rollout.cost, "latency": rollout.latency}


def _min_max(values: list[float]) -> list[float]:
    """(x - min) / (max - min) per value; all zeros when max == min."""
    lo, hi = min(values), max(values)
    if hi == lo:
        return [0.0] * len(values)
    return [(v - lo) / (hi - lo) for v in values]


def _checked_group(group: Any) -> Sequence[Mapping[str, Any]]:
    if isinstance(group, (str, bytes, Mapping)) or not isinstance(group, Sequence):
        raise TypeError(f"group must be a list of rollout dicts, got {type(group).__name__}")
    if not group:
        raise ValueError("group is empty: pass the rollouts of one task (at least one)")
    return group


def _checked_rollout(i: int, r: Any) -> dict[str, Any]:
    where = f"group[{i}]"
    if not isinstance(r, Mapping):
        raise TypeError(f"{where} must be a dict with tool_calls/outcome/cost/latency, "
                        f"got {type(r).__name__}")
    missing = [k for k in ("tool_calls", OUTCOME, COST, LATENCY) if k not in r]
    if missing:
        raise ValueError(f"{where} is missing {missing}; expected keys "
                         "'tool_calls', 'outcome', 'cost', 'latency'")
    calls = r["tool_calls"]
    if not isinstance(calls, Mapping):
        raise TypeError(f"{where}['tool_calls'] must map alias -> count, got {type(calls).__name__}")
    for alias, n in calls.items():
        if not isinstance(alias, str):
            raise TypeError(f"{where}['tool_calls'] key {alias!r} must be an alias string")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"{where}['tool_calls'][{alias!r}] = {n!r}: must be a count (int >= 0)")
    outcome = r[OUTCOME]
    if isinstance(outcome, bool) or outcome not in (0, 1):
        raise ValueError(f"{where}['outcome'] = {outcome!r}: must be 0 or 1 "
                         "(threshold a graded score before rewarding)")
    checked = {"tool_calls": dict(calls), OUTCOME: int(outcome)}
    for key, unit in ((COST, "dollars"), (LATENCY, "seconds")):
        v = r[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{where}[{key!r}] = {v!r}: must be a finite number of {unit} >= 0")
        checked[key] = float(v)
    return checked


def _checked_preference(preference: Any) -> dict[str, float]:
    if not isinstance(preference, Mapping):
        raise TypeError(f"preference must map alias/'outcome'/'cost'/'latency' -> weight, "
                        f"got {type(preference).__name__}")
    weights: dict[str, float] = {}
    for key, w in preference.items():
        if not isinstance(key, str):
            raise TypeError(f"preference key {key!r} ({type(key).__name__}) must be a string: "
                            "an alias or one of 'outcome', 'cost', 'latency'")
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
            raise ValueError(f"preference[{key!r}] = {w!r}: must be a finite number")
        weights[key] = float(w)
    return weights
