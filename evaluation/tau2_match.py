"""Which task a saved tau2 simulation really is, read from its content, not its `task_id` label.

Published tau2 results files can carry wrong labels: a simulation's `task_id` may be its
position in the run rather than its task, and a file made with an older task set numbers
its tasks differently (tau2 0.1.3's retail has 115 tasks; the current one 114, ids >= 96
shifted by one).  Scoring such a file against its labels grades each conversation against
another task's checks.  `match_simulations` finds each simulation's task from, in order:

1. its stored action checks: the actions the evaluator expected (name + arguments) equal one
   task's gold actions: the strongest evidence, and independent of how tasks are numbered
   (ties between tasks with the same gold actions are broken by the stored action ids,
   `<task id>_<n>`, then by step 2);
2. the ids in its conversation (user ids, order / reservation ids, as the task set spells
   them) that only one task's scenario and gold actions mention, most shared ids wins;
3. elimination: within a trial, one simulation left over and one task not yet taken.

A simulation with none of these is reported as unmatched, never guessed.
"""
from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

# user ids (noah_muller_9847), retail order ids (#W6390527), airline reservation codes (SDZQKO),
# payment ids (paypal_7644869, credit_card_4466831): only tokens a task of the set mentions count.
_ID_RE = re.compile(r"#W\d+|\b[a-z]+(?:_[a-z]+)*_\d{3,}\b|\b[A-Z0-9]{6}\b")


@dataclass
class Match:
    """The task a simulation belongs to (None: unmatched) and why."""

    label: str
    task_id: str | None
    how: str                           # "actions" | "ids" | "elimination" | "unmatched"
    label_ok: bool                     # the label agrees with the content (or nothing contradicts it)


@dataclass
class MatchReport:
    matches: list[Match] = field(default_factory=list)

    @property
    def mislabelled(self) -> int:
        return sum(not m.label_ok for m in self.matches)

    @property
    def unmatched(self) -> int:
        return sum(m.task_id is None for m in self.matches)

    def counts(self) -> dict[str, int]:
        return dict(Counter(m.how for m in self.matches))


def _action_key(name: str, arguments: dict[str, Any] | None) -> str:
    return json.dumps([name, arguments or {}], sort_keys=True)


def _task_actions(task) -> list[str]:
    actions = (task.evaluation_criteria.actions or []) if task.evaluation_criteria else []
    return sorted(_action_key(a.name, a.arguments) for a in actions)


def _stored_actions(sim) -> tuple[list[str], set[str]]:
    """The expected actions stored with the simulation's reward, and their task-id prefixes."""
    checks = (sim.reward_info.action_checks or []) if sim.reward_info else []
    keys = sorted(_action_key(c.action.name, c.action.arguments) for c in checks)
    prefixes = {c.action.action_id.rsplit("_", 1)[0] for c in checks if getattr(c.action, "action_id", None)}
    return keys, prefixes


def _ids(text: str) -> set[str]:
    return set(_ID_RE.findall(text))


def _task_ids_mentioned(task) -> set[str]:
    text = task.user_scenario.model_dump_json() if task.user_scenario else ""
    if task.evaluation_criteria:
        text += task.evaluation_criteria.model_dump_json()
    return _ids(text)


def _conversation_text(sim) -> str:
    parts = []
    for m in sim.messages or []:
        parts.append(str(getattr(m, "content", None) or ""))
        for call in getattr(m, "tool_calls", None) or []:
            parts.append(json.dumps(call.arguments, sort_keys=True))
    return "\n".join(parts)


def _best_by_ids(found: set[str], mentions: dict[str, set[str]], among: list[str]) -> str | None:
    scores = {tid: len(found & mentions[tid]) for tid in among}
    top = max(scores.values(), default=0)
    best = [tid for tid, s in scores.items() if s == top]
    return best[0] if top > 0 and len(best) == 1 else None


def match_simulations(simulations: list, tasks: dict[str, Any]) -> MatchReport:
    """Match each simulation to a task of `tasks` (id -> tau2 Task) by content; see the module doc."""
    by_actions: dict[str, list[str]] = defaultdict(list)
    for tid, task in tasks.items():
        by_actions["\n".join(_task_actions(task))].append(tid)
    mentions = {tid: _task_ids_mentioned(task) for tid, task in tasks.items()}
    vocabulary = set().union(*mentions.values()) if mentions else set()

    report = MatchReport()
    for sim in simulations:
        label = str(sim.task_id)
        keys, prefixes = _stored_actions(sim)
        found = _ids(_conversation_text(sim)) & vocabulary
        task_id, how = None, "unmatched"
        if keys:
            same = by_actions.get("\n".join(keys), [])
            if len(same) > 1:   # tasks with the same gold actions: the stored ids, then the conversation
                by_prefix = [t for t in same if t in prefixes]
                same = by_prefix if len(by_prefix) == 1 else [t for t in [_best_by_ids(found, mentions, same)] if t]
            if len(same) == 1:
                task_id, how = same[0], "actions"
        if task_id is None and found:
            task_id = _best_by_ids(found, mentions, list(tasks))
            how = "ids" if task_id else "unmatched"
        if task_id is not None:
            label_ok = task_id == label
        elif keys:   # stored checks that are not the labelled task's gold actions contradict the label
            label_ok = label in tasks and _task_actions(tasks[label]) == keys
        else:
            label_ok = label in tasks
        report.matches.append(Match(label, task_id, how, label_ok))

    # elimination, per trial: one simulation left and one task not taken
    trials: dict[Any, list[int]] = defaultdict(list)
    for i, sim in enumerate(simulations):
        trials[getattr(sim, "trial", 0)].append(i)
    for indices in trials.values():
        left = [i for i in indices if report.matches[i].task_id is None]
        free = set(tasks) - {report.matches[i].task_id for i in indices}
        if len(left) == 1 and len(free) == 1 and len(indices) == len(tasks):
            m = report.matches[left[0]]
            m.task_id, m.how = free.pop(), "elimination"
            m.label_ok = m.task_id == m.label
    return report
