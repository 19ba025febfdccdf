"""Task synthesis: sample drafts, evolve some to be harder, keep the ones that verify.

Each kept task is a tau2 `Task` dict:

    {"id", "description": {"purpose", "notes"}, "user_scenario": {"instructions": {
        "domain", "reason_for_call", "known_info", "unknown_info", "task_instructions"}},
     "evaluation_criteria": {"actions": [{"action_id", "requestor", "name", "arguments"}],
                             "communicate_info", "nl_assertions", "reward_basis"}}

`description.notes` holds JSON metadata: template, difficulty, evolution steps.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from data_synthesis.plausibility import evolved_copy
from data_synthesis.templates import CONFIRM, Draft, TaskFactory
from data_synthesis.verify import Deduper, Tally, replay_reason, task_shape_reason
from orchestrator.episodes.tau2_solo import instructions_text  # the one definition (tests import it from here too)

EVOLVE_FRACTION = 0.35     # share of kept tasks that also get a harder variant


def difficulty(n_actions: int, evolved: list[str]) -> str:
    """easy: <= 2 gold actions; medium: 3-4; hard: >= 5 or evolved with a condition."""
    if n_actions >= 5 or "conditional" in evolved:
        return "hard"
    return "easy" if n_actions <= 2 else "medium"


def to_tau2_task(draft: Draft, domain: str, task_id: str) -> dict:
    """The tau2 Task dict of a draft (ids of actions are `<name>_<index>`)."""
    actions = [{"action_id": f"{a['name']}_{i}", "requestor": "assistant", "name": a["name"],
                "arguments": a["arguments"], "info": None, "compare_args": None}
               for i, a in enumerate(draft.actions)]
    level = difficulty(len(actions), draft.evolved)
    meta = {"template": draft.template, "kind": draft.kind, "difficulty": level,
            "evolved": draft.evolved, "user": draft.user, "source": draft.source}
    return {
        "id": task_id,
        "description": {"purpose": f"{draft.template.replace('_', ' ')} ({level}): " + " ".join(draft.wants),
                        "relevant_policies": None, "notes": json.dumps(meta)},
        "user_scenario": {"persona": None, "instructions": {
            "domain": domain,
            "reason_for_call": " ".join(draft.wants),
            "known_info": draft.known_info,
            "unknown_info": draft.unknown_info,
            "task_instructions": draft.task_instructions or (
                "Give the agent only the information it asks for. " + CONFIRM
                + (" Ask for all your requests in this one conversation." if len(draft.wants) > 1 else "")),
        }},
        "ticket": None,
        "initial_state": None,
        "evaluation_criteria": {"actions": actions, "env_assertions": None,
                                "communicate_info": draft.communicate_info,
                                "nl_assertions": draft.nl_assertions,
                                "reward_basis": ["DB", "COMMUNICATE"]},
    }


def task_meta(task: dict) -> dict:
    """The metadata a synthesised task carries in description.notes ({} if none)."""
    try:
        return json.loads((task.get("description") or {}).get("notes") or "{}")
    except json.JSONDecodeError:
        return {}


class TaskFilter:
    """Shape check -> replay -> de-duplication, counting what is dropped and why."""

    def __init__(self, call: Callable[[dict, str, dict], Any], pristine: dict, fresh_db: Callable[[], dict],
                 tool_kinds: dict[str, str], checks: list[Callable[[dict], str | None]] | None = None):
        self.call, self.pristine, self.fresh_db, self.kinds = call, pristine, fresh_db, tool_kinds
        self.checks = list(checks or [])   # policy.md rules, plausibility: reason or None
        self.dedup = Deduper()
        self.tally = Tally()

    def admit(self, task: dict) -> bool:
        self.tally.generated += 1
        actions = [{"name": a["name"], "arguments": a["arguments"]}
                   for a in (task.get("evaluation_criteria") or {}).get("actions") or []]
        write = any(self.kinds.get(a["name"]) == "write" for a in actions)
        reason = (task_shape_reason(task, set(self.kinds))
                  or next((r for r in (check(task) for check in self.checks) if r), None)
                  or replay_reason(self.call, self.pristine, self.fresh_db, actions, write)
                  or self.dedup.reason(actions, instructions_text(task)))
        if reason:
            self.tally.drop(reason)
            return False
        self.dedup.add(actions, instructions_text(task))
        self.tally.kept += 1
        return True


def synthesize_tasks(factory: TaskFactory, task_filter: TaskFilter, domain: str, n: int,
                     progress: Callable[[int], None] | None = None, max_tries: int | None = None) -> list[dict]:
    """Up to `n` verified tasks: sampled drafts, plus harder evolved variants of some.

    Deterministic given the factory's seed.  Tries at most `max_tries` drafts (default 8n).
    """
    rng = factory.rng
    names = sorted(factory.templates)
    weights = {"read_own": 1, "read_linked": 1, "update_own": 2, "update_linked": 3,
               "create_linked": 2, "delete_linked": 1, "read_record": 1, "update_record": 1}
    kept: list[dict] = []
    tries = 0
    while len(kept) < n and tries < (max_tries or 8 * n):
        tries += 1
        draft = factory.templates[rng.choices(names, [weights.get(t, 1) for t in names])[0]]()
        if draft is None:
            task_filter.tally.drop("template not applicable to the sampled rows")
            task_filter.tally.generated += 1
            continue
        candidates = [draft]
        if rng.random() < EVOLVE_FRACTION:
            harder = factory.evolve(draft)
            copy = harder is not None and evolved_copy(draft.actions, harder.actions)
            if copy:   # a reworded copy, not a harder task
                task_filter.tally.generated += 1
                task_filter.tally.drop(copy)
            elif harder is not None:
                candidates.append(harder)
        for cand in candidates:
            if len(kept) >= n:
                break
            task = to_tau2_task(cand, domain, f"{domain}_{len(kept):04d}")
            if task_filter.admit(task):
                kept.append(task)
                if progress:
                    progress(1)
    return kept
