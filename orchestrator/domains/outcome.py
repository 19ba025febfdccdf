"""The outcome of a function-calling (tau2-style) episode: tau2's task reward (PAPER.md §4, §7).

An episode is recorded as `DomainStep`s: the domain tool calls it executed (with the result
text the agent read) and the texts it said to the user.  Its outcome is tau2's verdict for
the task's `reward_basis`, multiplied as tau2's `evaluate_simulation` (EvaluationType.ALL)
multiplies them:

- DB: the database after the episode equals (same hash) a fresh database after replaying the
  gold actions (a gold action that raises is skipped, as tau2 does);
- ACTION: every gold action appears among the executed calls (name, and the arguments named
  by `compare_args`, all of the call's arguments when None);
- COMMUNICATE: every `communicate_info` string is in something the agent said (case-folded,
  commas removed).

Two evaluators give that verdict: `builtin_verdict` (this file, no dependency) and
`tau2_verdict` (the `tau2` package's own EnvironmentEvaluator / ActionEvaluator /
CommunicateEvaluator over a tau2 Environment of the domain folder, orchestrator/domains/tau2_env.py).
`verdict(..., evaluator="auto")` uses tau2's when it is installed.  Tests show the two agree.
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any

from orchestrator.domains.folder import Domain, db_hash

SUPPORTED_BASES = {"DB", "ACTION", "COMMUNICATE"}
EVALUATORS = ("auto", "tau2", "builtin")


@dataclass
class DomainStep:
    """One thing the agent did: a tool call (`name`, `arguments`, `result`) or words (`text`)."""

    name: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    result: str = ""
    error: bool = False
    text: str | None = None

    @property
    def is_call(self) -> bool:
        return self.name is not None


def result_text(value: Any) -> str:
    """A tool's return value as the agent reads it: exactly tau2's `Environment.to_json_str`
    (strings as they are; otherwise JSON with numbers and booleans turned into strings), so
    tau2's replay of the trajectory finds the same tool messages."""
    def process(v: Any) -> Any:
        if isinstance(v, (str, type(None))):
            return v
        if isinstance(v, (bool, int, float)):
            return str(v)
        if isinstance(v, (list, tuple)):
            return [process(x) for x in v]
        if isinstance(v, dict):
            return {k: process(x) for k, x in v.items()}
        if isinstance(v, (datetime, date)):
            return v.isoformat()
        raise ValueError(f"Unsupported type: {type(v)}")
    return value if isinstance(value, str) else json.dumps(process(value), default=str)


def check_task(task: dict, where: str) -> None:
    """Refuse tasks these episodes cannot score or start; the message names the task field."""
    criteria = task.get("evaluation_criteria") or {}
    bases = set(criteria.get("reward_basis") or ["DB", "COMMUNICATE"]) - SUPPORTED_BASES
    if bases:
        raise ValueError(f"{where}: tau2_task.evaluation_criteria.reward_basis has {sorted(bases)}; "
                         f"domain episodes score {sorted(SUPPORTED_BASES)} only")
    if task.get("initial_state"):
        raise ValueError(f"{where}: tau2_task.initial_state is set; domain episodes start from the "
                         "domain's db.json and do not apply initial states")


def builtin_verdict(domain: Domain, task: dict, db: dict, steps: list[DomainStep]) -> dict[str, Any]:
    """tau2's verdict computed here; `db` is the database the episode acted on."""
    criteria = task.get("evaluation_criteria")
    if not criteria:
        return {"reward": 1.0, "evaluator": "builtin", "note": "no evaluation criteria"}
    basis = set(criteria.get("reward_basis") or ["DB", "COMMUNICATE"])
    gold_actions = criteria.get("actions")
    out: dict[str, Any] = {"evaluator": "builtin"}
    reward = 1.0
    if "DB" in basis:
        if gold_actions is None and criteria.get("env_assertions") is None:
            out["db_match"] = True
        else:
            gold = domain.fresh_db()
            for action in gold_actions or []:
                try:
                    domain.call(gold, action["name"], action.get("arguments") or {})
                except Exception:  # noqa: BLE001, S110 - tau2 logs and skips a failing gold action
                    pass
            out["db_match"] = db_hash(gold) == db_hash(db)
        reward *= float(out["db_match"])
    if "ACTION" in basis:
        calls = [s for s in steps if s.is_call]
        out["actions_matched"] = [any(_same_action(a, c) for c in calls) for a in gold_actions or []]
        reward *= float(all(out["actions_matched"]))
    if "COMMUNICATE" in basis:
        said = [s.text.lower().replace(",", "") for s in steps if s.text]
        out["communicated"] = [any(info.lower() in t for t in said) for info in criteria.get("communicate_info") or []]
        reward *= float(all(out["communicated"]))
    out["reward"] = reward
    return out


def _same_action(action: dict, call: DomainStep) -> bool:
    if action["name"] != call.name:
        return False
    keys = action.get("compare_args")
    keys = call.arguments.keys() if keys is None else keys
    expected = action.get("arguments") or {}
    return {k: v for k, v in call.arguments.items() if k in keys} == {k: v for k, v in expected.items() if k in keys}


def tau2_messages(request: str, steps: list[DomainStep]) -> list:
    """The episode as a tau2 message list: the user's request, then the agent's calls with
    their tool messages and its words."""
    from tau2.data_model.message import (  # lazy: optional (tau2 extra), heavy
        AssistantMessage,
        ToolCall,
        ToolMessage,
        UserMessage,
    )

    messages: list = [UserMessage(role="user", content=request)]
    for i, step in enumerate(steps):
        if step.is_call:
            call = ToolCall(id=f"call_{i}", name=step.name, arguments=step.arguments)
            messages += [AssistantMessage(role="assistant", tool_calls=[call]),
                         ToolMessage(id=call.id, role="tool", content=step.result, requestor="assistant",
                                     error=step.error)]
        elif step.text:
            messages.append(AssistantMessage(role="assistant", content=step.text))
    return messages


def tau2_verdict(domain_dir, task: dict, request: str, steps: list[DomainStep]) -> dict[str, Any]:
    """tau2's own evaluators over a tau2 Environment of `domain_dir` (needs `tau2`)."""
    # orchestrator.domains.tau2_env first: it quiets tau2's logging
    from orchestrator.domains.tau2_env import get_environment
    # isort: split
    from tau2.data_model.tasks import Task as Tau2Task
    from tau2.evaluator.evaluator_action import ActionEvaluator  # lazy: optional (tau2 extra), heavy
    from tau2.evaluator.evaluator_communicate import CommunicateEvaluator
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    t = Tau2Task.model_validate(task)
    if t.evaluation_criteria is None:
        return {"reward": 1.0, "evaluator": "tau2", "note": "no evaluation criteria"}
    messages = tau2_messages(request, steps)
    env = EnvironmentEvaluator.calculate_reward(lambda solo_mode=False: get_environment(domain_dir, solo_mode),
                                                t, messages, solo_mode=False)
    action = ActionEvaluator.calculate_reward(t, messages)
    said = CommunicateEvaluator.calculate_reward(t, messages)
    basis = {b.value for b in t.evaluation_criteria.reward_basis}
    reward, out = 1.0, {"evaluator": "tau2"}
    if basis & {"DB", "ENV_ASSERTION"}:
        reward *= env.reward
        out["db_match"] = env.db_check.db_match if env.db_check else None
    if "ACTION" in basis:
        reward *= action.reward
        out["actions_matched"] = [c.action_match for c in action.action_checks or []]
    if "COMMUNICATE" in basis:
        reward *= said.reward
        out["communicated"] = [c.met for c in said.communicate_checks or []]
    out["reward"] = reward
    return out


def tau2_installed() -> bool:
    return importlib.util.find_spec("tau2") is not None


def verdict(domain: Domain, task: dict, db: dict, request: str, steps: list[DomainStep],
            evaluator: str = "auto") -> dict[str, Any]:
    """The episode's verdict by `evaluator`: "tau2", "builtin", or "auto" (tau2 when installed)."""
    if evaluator not in EVALUATORS:
        raise ValueError(f"tau2 evaluator {evaluator!r}: choose one of {EVALUATORS}")
    if evaluator == "tau2" or (evaluator == "auto" and tau2_installed()):
        return tau2_verdict(domain.path, task, request, steps)
    return builtin_verdict(domain, task, db, steps)
