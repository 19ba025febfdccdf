"""tau2's trials and pass^k, without importing tau2 (the report runs where the `tau2` extra is not
installed, and tau2's metrics module costs pandas and ~1.5 s to import).

- A trial is one simulation of one task; `--num-trials k` runs k of each.  Its record id is
  `<domain>/<task id>#<trial>` (`trial_id`); a record written before trials existed
  (`<domain>/<task id>`) is trial 0.
- Trial seeds are tau2's (tau2/run.py `run_tasks`): `random.seed(seed)` then one
  `random.randint(0, 1000000)` per trial, so trial t's seed does not depend on k.
- pass^k is tau2's (tau2/metrics/agent_metrics.py): per task C(c, k) / C(n, k) for n trials of
  which c succeeded (reward 1 within 1e-6), averaged over the domain's tasks, for k = 1 .. the
  fewest trials any task of the domain has.  An error trial counts as a failure, as tau2 counts a
  failed simulation under `skip_failed_samples` (and as our `tau2_<domain>.json` stores it).
  tests/evaluation/test_tau2_trials.py checks both against tau2's own functions.
"""
from __future__ import annotations

import math
import random
from typing import Any

TRIAL_SEP = "#"


def trial_seeds(seed: int | None, num_trials: int) -> list[int]:
    """The seed of each trial, as tau2's `run_tasks` draws them from the run's seed."""
    rng = random.Random(seed)
    return [rng.randint(0, 1000000) for _ in range(num_trials)]


def trial_id(domain: str, task_id: str, trial: int) -> str:
    return f"{domain}/{task_id}{TRIAL_SEP}{trial}"


def parse_trial_id(record_id: str) -> tuple[str, str, int]:
    """(domain, task id, trial) of a tau2 record id; an id without `#<trial>` is trial 0."""
    domain, _, rest = record_id.partition("/")
    task, sep, trial = rest.rpartition(TRIAL_SEP)
    if sep and trial.isdigit():
        return domain, task, int(trial)
    return domain, rest, 0


def record_key(record: dict) -> tuple[str, str, int]:
    """(domain, task id, trial) of a record: its own fields, else its id (error records have only the id)."""
    domain, task, trial = parse_trial_id(record["id"])
    if record.get("domain") is not None and record.get("task_id") is not None:
        domain, task = record["domain"], str(record["task_id"])
    return domain, task, int(record.get("trial", trial))


def is_successful(reward: float | None) -> bool:
    """tau2's success: reward 1 within 1e-6."""
    return reward is not None and (1 - 1e-6) <= reward <= (1 + 1e-6)


def pass_hat_k(num_trials: int, success_count: int, k: int) -> float:
    """tau2's pass^k of one task: C(c, k) / C(n, k) (arXiv 2406.12045)."""
    if num_trials < k:
        raise ValueError(f"Number of trials {num_trials} is less than k {k}.")
    return math.comb(success_count, k) / math.comb(num_trials, k)


def trial_table(records: list[dict]) -> dict[str, Any]:
    """Per task and per domain: trials, successes, reward per trial, pass^1..k (see module docstring).

    `records`: tau2 records (last record per id wins).  Returns
    {"domains": {domain: {tasks, trials, errors, trials_per_task: [min, max], avg_reward,
                          pass_hat_k: {k: value}}},
     "tasks": [{domain, task_id, trials, successes, errors, rewards: {trial: reward or None (error)}}]}.
    """
    by_id = {r["id"]: r for r in records}
    tasks: dict[tuple[str, str], dict[int, float | None]] = {}
    for r in by_id.values():
        domain, task, trial = record_key(r)
        reward = None if r.get("status") == "error" else float(r.get("reward") or 0.0)
        tasks.setdefault((domain, task), {})[trial] = reward
    rows = []
    for (domain, task), rewards in tasks.items():
        ordered = dict(sorted(rewards.items()))
        rows.append({"domain": domain, "task_id": task, "trials": len(ordered),
                     "successes": sum(map(is_successful, ordered.values())),
                     "errors": sum(v is None for v in ordered.values()), "rewards": ordered})
    rows.sort(key=lambda t: (t["domain"], _task_order(t["task_id"])))
    domains: dict[str, dict] = {}
    for domain in sorted({t["domain"] for t in rows}):
        mine = [t for t in rows if t["domain"] == domain]
        counts = [t["trials"] for t in mine]
        rewards = [v or 0.0 for t in mine for v in t["rewards"].values()]
        domains[domain] = {
            "tasks": len(mine), "trials": sum(counts), "errors": sum(t["errors"] for t in mine),
            "trials_per_task": [min(counts), max(counts)], "avg_reward": sum(rewards) / len(rewards),
            "pass_hat_k": {k: sum(pass_hat_k(t["trials"], t["successes"], k) for t in mine) / len(mine)
                           for k in range(1, min(counts) + 1)}}
    return {"domains": domains, "tasks": rows}


def _task_order(task_id: str) -> tuple:
    return (0, int(task_id), "") if task_id.isdigit() else (1, 0, task_id)
