"""Checks every synthesised task passes: tau2 shape, gold-action replay, de-duplication.

- `replay_reason`: run the gold actions on a fresh database; a task is dropped when an
  action raises, or when a write task leaves the database unchanged (tau2 scores by
  comparing database hashes, so such a task could not tell a right agent from a wrong one).
- `Deduper`: drops a task whose gold actions (names + arguments) equal a kept task's, or
  whose instructions are near-identical (word-set Jaccard >= 0.9) to a kept task's with
  the same sequence of tool names.
- `task_shape_reason`: the task validates against tau2's pydantic `Task` when the
  `tau2` package is installed, else against the same required fields checked by hand.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any, Callable

from pydantic import ValidationError


NEAR_DUPLICATE = 0.9


def replay_reason(call: Callable[[dict, str, dict], Any], pristine: dict, fresh_db: Callable[[], dict],
                  actions: list[dict], write: bool) -> str | None:
    """Why the gold `actions` fail on a fresh database, or None when they pass.

    `call(db, name, arguments)` runs one tool; `fresh_db()` returns a deep copy of
    `pristine` (never mutated here); `write` says the task must change the database.
    """
    db = fresh_db()
    for i, action in enumerate(actions):
        try:
            call(db, action["name"], action["arguments"])
        except Exception as exc:  # the tool's own error is the reason the task is dropped
            return f"gold action {i} {action['name']} failed: {type(exc).__name__}: {exc}"
    # Plain equality is what tau2's hash comparison decides, without hashing 1 MB twice.
    if write and db == pristine:
        return "write task leaves the database unchanged"
    return None


def action_key(actions: list[dict]) -> str:
    return json.dumps([[a["name"], a["arguments"]] for a in actions], sort_keys=True, default=str)


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w+", text.lower()))


class Deduper:
    """Remembers kept tasks; `reason(...)` says why a new one duplicates them (or None)."""

    def __init__(self, threshold: float = NEAR_DUPLICATE):
        self.threshold = threshold
        self.actions: set[str] = set()
        self.texts: dict[str, list[set[str]]] = {}

    def reason(self, actions: list[dict], instructions: str) -> str | None:
        key = action_key(actions)
        if key in self.actions:
            return "duplicate gold actions"
        bucket = json.dumps([a["name"] for a in actions])
        words = _words(instructions)
        for seen in self.texts.get(bucket, []):
            union = len(words | seen)
            if union and len(words & seen) / union >= self.threshold:
                return "near-duplicate instructions"
        return None

    def add(self, actions: list[dict], instructions: str) -> None:
        self.actions.add(action_key(actions))
        self.texts.setdefault(json.dumps([a["name"] for a in actions]), []).append(_words(instructions))


def tau2_available() -> bool:
    try:
        import tau2.data_model.tasks  # noqa: F401 (only whether it imports)
    except Exception:  # not installed, or its heavy deps missing
        return False
    return True


def task_shape_reason(task: dict, tool_names: set[str]) -> str | None:
    """Why `task` is not a valid tau2 task over `tool_names`, or None."""
    actions = ((task.get("evaluation_criteria") or {}).get("actions")) or []
    unknown = sorted({a.get("name") for a in actions} - tool_names)
    if unknown:
        return f"gold actions call unknown tools {unknown}"
    if tau2_available():
        from tau2.data_model.tasks import Task  # lazy: optional (tau2 extra), heavy
        try:
            Task.model_validate(task)
        except ValidationError as exc:
            err = exc.errors()[0]
            return f"not a tau2 Task: {'.'.join(map(str, err['loc']))}: {err['msg']}"
        return None
    instr = (task.get("user_scenario") or {}).get("instructions")
    if not task.get("id") or not isinstance(instr, (dict, str)):
        return "not a tau2 Task: needs id and user_scenario.instructions"
    if isinstance(instr, dict):
        missing = [k for k in ("domain", "reason_for_call", "task_instructions") if not instr.get(k)]
        if missing:
            return f"not a tau2 Task: user_scenario.instructions missing {missing}"
    for i, a in enumerate(actions):
        if not isinstance(a.get("arguments"), dict) or not a.get("action_id"):
            return f"not a tau2 Task: evaluation_criteria.actions[{i}] needs action_id and arguments"
    return None


def reason_head(reason: str) -> str:
    """A reason with its quoted values and ids replaced by "…", so that the table groups alike reasons."""
    return re.sub(r"'[^']*'|\"[^\"]*\"|\b[A-Z0-9_-]*\d[A-Z0-9_-]*\b", "…", reason)[:120]


class Tally:
    """Counts of generated / kept / dropped-by-reason, for the summary table."""

    def __init__(self) -> None:
        self.generated = 0
        self.kept = 0
        self.dropped: Counter[str] = Counter()

    def drop(self, reason: str) -> str:
        """Count `reason` under its head (reason_head); return the head."""
        head = reason_head(reason)
        self.dropped[head] += 1
        return head

    def as_dict(self) -> dict:
        return {"generated": self.generated, "kept": self.kept,
                "dropped": dict(sorted(self.dropped.items(), key=lambda kv: (-kv[1], kv[0])))}
