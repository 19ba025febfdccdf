"""LLM task synthesis (PAPER.md §7): intents -> task per (intent, tool subset, rows) -> evolve.

For each task: sample an intent, a difficulty and with it a tool subset (the user's
identification tools plus 1 / 3 / 5 others, at least one write for medium and hard),
and database rows (a user and records linked to them).  The model writes the tau2
task; the check insists on known tools from the subset, arguments as objects, and
gold actions that replay on a fresh database (a replay error is sent back to the model).
The kept tasks then pass the same filter as offline ones (tau2 shape, replay, dedup).
"""
from __future__ import annotations

import inspect
import json
import random
from typing import Callable

from orchestrator.domains.folder import Domain, parse_args_doc
from data_synthesis.llm_steps import CheckFailed, StepRunner, extract_json, prompt
from data_synthesis.plausibility import evolved_copy
from data_synthesis.tasks import TaskFilter, to_tau2_task
from data_synthesis.templates import Draft, TaskFactory
from data_synthesis.verify import replay_reason

LEVELS = {"easy": (1, 2), "medium": (3, 4), "hard": (5, 6)}   # extra tools, target gold actions


def tool_lines(domain: Domain, names: list[str] | None = None) -> list[str]:
    """"name(arg, ...): summary [read|write]" per tool, for prompts."""
    out = []
    for name in names or list(domain.tool_types):
        fn = domain.tool(name)
        args = ", ".join(list(inspect.signature(fn).parameters)[1:])
        out.append(f"{name}({args}): {parse_args_doc(fn.__doc__)[0]} [{domain.tool_types[name]}]")
    return out


class LLMTaskWriter:
    def __init__(self, runner: StepRunner, domain: Domain, factory: TaskFactory, description: str, seed: int):
        self.runner, self.domain, self.factory, self.description = runner, domain, factory, description
        self.rng = random.Random(seed)

    def intents(self, n: int) -> list[str]:
        def check(text: str) -> list[str]:
            items = extract_json(text)
            if not isinstance(items, list):
                raise CheckFailed("answer with a JSON array of strings")
            out = sorted({s.strip() for s in items if isinstance(s, str) and s.strip()})
            if not out:
                raise CheckFailed("no intents in the reply")
            return out

        got = self.runner.ask("intents", prompt("intents", domain=self.domain.name, description=self.description,
                                                 tools="\n".join(tool_lines(self.domain)), n=n), check)
        return got or ["ask about one of your records", "change one of your records"]

    def _rows_and_tools(self, level: str) -> tuple[str, list[str], str]:
        """(rows JSON, tool subset, user) for one task."""
        f, kinds = self.factory, self.domain.tool_types
        user = f.sample_user() or f.any_record()
        cname, rid = user
        rows = {"user": {"collection": cname, "id": rid, "record": self.domain.db[cname][rid]}, "linked": []}
        base = [t.name for t in f.by_op.values() if t.collection == cname and t.op in ("find", "get")]
        for child, fname, cid in f.linked_records(cname, rid)[:3]:
            rows["linked"].append({"collection": child, "id": cid, "record": self.domain.db[child][cid]})
            base.append(f.by_op[("list_by", child, fname)].name)
        extra, _ = LEVELS[level]
        others = sorted(set(kinds) - set(base) - {"transfer_to_human_agents"})
        picked = self.rng.sample(others, min(extra, len(others)))
        writes = [n for n in others if kinds[n] == "write"]
        if level != "easy" and writes and not any(kinds[n] == "write" for n in picked):
            picked[-1:] = [self.rng.choice(writes)]
        return json.dumps(rows, default=str)[:6000], sorted(set(base + picked)), f"{cname} {rid}"

    def _checker(self, subset: list[str], user: str, min_actions: int = 1) -> Callable[[str], Draft]:
        kinds = self.domain.tool_types

        def check(text: str) -> Draft:
            data = extract_json(text)
            if not isinstance(data, dict) or not str(data.get("reason_for_call") or "").strip():
                raise CheckFailed("answer with a JSON object that has a non-empty 'reason_for_call'")
            actions = data.get("actions")
            if not isinstance(actions, list) or not actions:
                raise CheckFailed("'actions' must be a non-empty list of {name, arguments}")
            acts = []
            for i, a in enumerate(actions):
                if not isinstance(a, dict) or a.get("name") not in subset or not isinstance(a.get("arguments", {}), dict):
                    raise CheckFailed(f"actions[{i}]: 'name' must be one of {subset} and 'arguments' an object")
                acts.append({"name": a["name"], "arguments": a.get("arguments", {})})
            if len(acts) < min_actions:
                raise CheckFailed(f"the harder task needs at least {min_actions} gold actions")
            write = any(kinds[a["name"]] == "write" for a in acts)
            info = [str(s) for s in data.get("communicate_info") or [] if str(s).strip()]
            if not write and not info:
                raise CheckFailed("a task without write actions must list what the agent tells the user in communicate_info")
            reason = replay_reason(self.domain.call, self.domain.db, self.domain.fresh_db, acts, write)
            if reason:
                raise CheckFailed(f"the gold actions do not replay on the database: {reason}")
            return Draft("llm", "write" if write else "read", acts, user, "", str(data.get("known_info") or ""),
                         str(data.get("unknown_info") or ""), [str(data["reason_for_call"]).strip()],
                         info, [str(s) for s in data.get("nl_assertions") or []],
                         task_instructions=str(data.get("task_instructions") or ""), source="llm")
        return check

    def write_task(self, intent: str) -> Draft | None:
        level = self.rng.choice(sorted(LEVELS))
        rows, subset, user = self._rows_and_tools(level)
        text = prompt("task", domain=self.domain.name, intent=intent, steps=LEVELS[level][1],
                      tools="\n".join(tool_lines(self.domain, subset)), rows=rows)
        draft = self.runner.ask("task", text, self._checker(subset, user))
        if draft is not None:
            draft.evolved = []
            self._context = (rows, subset)
        return draft

    def evolve(self, draft: Draft) -> Draft | None:
        rows, subset = self._context
        task = {"reason_for_call": draft.wants[0], "known_info": draft.known_info, "actions": draft.actions,
                "communicate_info": draft.communicate_info}
        text = prompt("evolve", domain=self.domain.name, task=json.dumps(task, default=str),
                      tools="\n".join(tool_lines(self.domain, subset)), rows=rows)
        harder = self.runner.ask("evolve", text, self._checker(subset, draft.user, len(draft.actions) + 1))
        if harder is not None:
            harder.evolved = ["llm"]
        return harder


def synthesize_llm_tasks(writer: LLMTaskWriter, task_filter: TaskFilter, n: int, evolve_fraction: float = 0.3,
                         progress: Callable[[int], None] | None = None, max_tries: int | None = None) -> list[dict]:
    """Up to `n` verified LLM-written tasks (tries at most `max_tries` drafts, default 3n)."""
    intents = writer.intents(max(10, min(100, 2 * n)))
    kept: list[dict] = []
    for _ in range(max_tries or 3 * n):
        if len(kept) >= n:
            break
        draft = writer.write_task(writer.rng.choice(intents))
        if draft is None:
            task_filter.tally.generated += 1
            task_filter.tally.drop("LLM reply failed its checks after retries")
            continue
        candidates = [draft]
        if writer.rng.random() < evolve_fraction:
            harder = writer.evolve(draft)
            copy = harder is not None and evolved_copy(draft.actions, harder.actions)
            if copy:
                task_filter.tally.generated += 1
                task_filter.tally.drop(copy)
            elif harder is not None:
                candidates.append(harder)
        for cand in candidates:
            task = to_tau2_task(cand, writer.domain.name, f"{writer.domain.name}_llm_{len(kept):04d}")
            if len(kept) < n and task_filter.admit(task):
                kept.append(task)
                if progress:
                    progress(1)
    return kept
