"""Does a synthesised task read like something a user would ask?  Reasons to reject one.

- `code_repr`: the request pastes a Python / JSON literal ("{'city': ...}", "[{...}]"): a user
  says what they want in words.
- `answer_in_request`: a question whose answer (a communicate_info value) is already in the
  request or in what the user knows ("the observation id of observation 59" -> "59").
- `inconsistent_value`: a write sets a field to a value the record's other fields contradict,
  learnt from the database itself: where one field determines another across the collection
  (every record in Chicago has timezone America/Chicago), a new value must follow it (Chicago
  -> America/Los_Angeles is rejected).  A dependency counts when it holds in every group of
  at least two records sharing the determining value, over at least `min_groups` groups.

- `evolved_copy`: an evolved ("harder") task must add at least one gold action its base does
  not have (a new action, or one with other arguments); a reworded or reordered copy, or one
  that only repeats a step, is not harder.  Applied where tasks are evolved (tasks.py, llm_tasks.py).
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from typing import Any

from data_synthesis import toolkit_runtime as rt

_CODE = re.compile(r"[{\[]\s*['\"]|['\"]\s*:\s*['\"\[{\d]|\b(None|True|False)\b[,)}\]]")
MIN_GROUPS = 3


def _instructions(task: dict) -> dict:
    instr = (task.get("user_scenario") or {}).get("instructions") or {}
    return instr if isinstance(instr, dict) else {"reason_for_call": str(instr)}


def evolved_copy(base: list[dict], evolved: list[dict]) -> str | None:
    def key(a: dict) -> str:
        return json.dumps([a["name"], a.get("arguments") or {}], sort_keys=True, default=str)

    if not {key(a) for a in evolved} - {key(a) for a in base}:
        return "implausible: evolved task adds no action to its base"
    return None


def code_repr(task: dict) -> str | None:
    instr = _instructions(task)
    for key in ("reason_for_call", "known_info", "task_instructions"):
        if _CODE.search(str(instr.get(key) or "")):
            return f"implausible: a code literal in the user's {key.replace('_', ' ')}"
    return None


def answer_in_request(task: dict, kinds: dict[str, str]) -> str | None:
    criteria = task.get("evaluation_criteria") or {}
    if any(kinds.get(a["name"]) == "write" for a in criteria.get("actions") or []):
        return None
    instr = _instructions(task)
    said = f"{instr.get('reason_for_call') or ''} {instr.get('known_info') or ''}".lower()
    for value in criteria.get("communicate_info") or []:
        v = str(value).strip().lower()
        if v and re.search(rf"(?<![\w-]){re.escape(v)}(?![\w-])", said):
            return "implausible: the answer is already in the request"
    return None


class Dependencies:
    """Field -> field dependencies of each collection of `db` (see the module docstring)."""

    def __init__(self, db: dict, schema, min_groups: int = MIN_GROUPS):
        self.map: dict[tuple[str, str, str], dict[str, str]] = {}   # (coll, g, f) -> {g value: f value}
        for cname, coll in schema.collections.items():
            scalars = [f for f, s in coll.fields.items() if s.type in ("string", "enum") and f != coll.id_field]
            records = list((db.get(cname) or {}).values())
            for g in scalars:
                for f in scalars:
                    if f == g:
                        continue
                    groups: dict[str, set[str]] = defaultdict(set)
                    sizes: dict[str, int] = defaultdict(int)
                    for rec in records:
                        gv, fv = rt._at(rec, g), rt._at(rec, f)
                        if isinstance(gv, str) and isinstance(fv, str) and gv and fv:
                            groups[gv].add(fv)
                            sizes[gv] += 1
                    multi = [k for k in groups if sizes[k] >= 2]
                    if len(multi) >= min_groups and all(len(groups[k]) == 1 for k in multi) \
                            and len({next(iter(groups[k])) for k in multi}) > 1:
                        self.map[(cname, g, f)] = {k: next(iter(groups[k])) for k in multi}

    def conflict(self, cname: str, record: dict[str, Any], fname: str, value: Any) -> str | None:
        for (c, g, f), table in self.map.items():
            if c != cname or f != fname:
                continue
            expected = table.get(rt._at(record, g))
            if expected is not None and str(value) != expected:
                return f"implausible: {fname} {value!r} contradicts {g} {rt._at(record, g)!r} (the data has {expected!r})"
        return None


class Plausibility:
    """All checks for one domain; `reason(task)` is the first failed check's reason, or None."""

    def __init__(self, schema, tools: list, db: dict, kinds: dict[str, str]):
        self.schema, self.db, self.kinds = schema, db, kinds
        self.tools = {t.name: t for t in tools}
        self.deps = Dependencies(db, schema)

    def inconsistent_value(self, task: dict) -> str | None:
        for action in (task.get("evaluation_criteria") or {}).get("actions") or []:
            tool, args = self.tools.get(action["name"]), action.get("arguments") or {}
            if tool is None or tool.collection is None:
                continue
            coll = self.schema.collections[tool.collection]
            if tool.op == "update" and tool.field and len(tool.params) > 1:
                record = (self.db.get(tool.collection) or {}).get(args.get(coll.id_field or f"{coll.entity}_id"))
                if record is not None:
                    why = self.deps.conflict(tool.collection, record, tool.field, args.get(tool.params[1].name))
                    if why:
                        return why
            elif tool.op == "create":
                for fname, value in args.items():
                    why = self.deps.conflict(tool.collection, args, fname, value)
                    if why:
                        return why
        return None

    def reason(self, task: dict) -> str | None:
        return code_repr(task) or answer_in_request(task, self.kinds) or self.inconsistent_value(task)
