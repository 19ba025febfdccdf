"""Solo tau2 episodes (`LoopConfig.tau2_user: solo`): no user, the domain's tools plus `call_expert`.

An option for environments without a user; the default for tau2 tasks is the user-simulator
episode, orchestrator/episodes/tau2.py.

A task of `kind: tau2` carries a tau2 task and its domain folder (db.json, tools.py,
policy.md; orchestrator/domains/folder.py) in `Task.metadata` ("tau2_task", "domain_dir").
The episode runs in tau2's *solo* mode: the user's instructions (or the task's ticket) are
the first user message and no simulator answers.

- The policy sees a multi-turn chat: the system prompt (prompts/domain_system.txt: the
  domain policy, then the example's instruction: expert aliases, prices, preference), the
  user's request (prompts/domain_solo_user.txt), then its own earlier calls, each followed
  by the result as a `<tool_response>` user message (how Qwen's template shows tool output).
- Tools: the domain's (tau2's `transfer_to_human_agents` removed), `call_expert(expert=<alias>)`
  (the catalog's expert tool, with this task's aliases and prices) and `done(message=...)`.
- Each turn the policy emits one hermes call, recorded as a QA turn is (token ids, loss mask
  over generated tokens only, usage and cost): tool results are only ever in later prompts.
- A domain call runs on this episode's own copy of the database; its result (or
  "Error: ..." when the tool raises, as tau2 reports it) goes into the context.
- `call_expert`: the expert reads the same chat and proposes the next action (a domain call
  or `done`), which is validated and executed like the policy's own; the turn records the
  expert's cost and latency (`Turn.expert`) and the action (`Turn.action`).
- `done(message)` ends the episode: `message` is the agent's final words to the user (tau2's
  solo `done` takes none; ours carries what tau2's COMMUNICATE check reads).  The turn cap
  ends it unfinished.
- The outcome is tau2's verdict (orchestrator/domains/outcome.py), stored in
  `Rollout.outcome` (0/1) and `Rollout.info`.

The profile's tau2 section (`runtime.section("tau2")`) applies as in the user-simulator
episode for `context` (how the chat is fitted, episodes/tau2_common.py) and `expert_suffix`;
not for `expert_text` or `max_tool_calls`: this episode is ours (its own prompts, `done`, one
action per turn), upstream has no counterpart.

Invalid calls (unparseable, unknown tool, bad arguments) are recorded on the turn, not
executed, and answered with the error in the next context.  Under constrained decoding
(`LoopConfig.constrained`) every turn is one well-typed call to one of the tools
(`orchestrator.toolcall.call_grammar`).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.context import TokenCounter
from orchestrator.domains.folder import Domain, cached_domain
from orchestrator.domains.outcome import DomainStep, check_task, result_text, verdict
from orchestrator.episodes.base import take_turn, task_catalog
from orchestrator.episodes.tau2_common import (DONE_TOOL, EXPERT_TOOL, OMITTED,  # noqa: F401 - OMITTED: tests
                                               TRANSFER_TOOL, fit_context, suffix_for, tool_response, with_suffix)
from orchestrator.records import Rollout, ToolCall
from orchestrator.toolcall import (
    ARG_MAX_CHARS,
    ToolCallError,
    call_grammar,
    format_tool_call,
    validate_schema_call,
)

DONE_SCHEMA = {"type": "function", "function": {
    "name": DONE_TOOL,
    "description": "Call this when the user's request is handled; it ends the conversation.",
    "parameters": {"type": "object", "properties": {"message": {
        "type": "string", "description": "Your final message to the user: what they asked to know, what you changed."}},
        "required": []}}}


@dataclass
class DomainTask:
    """A tau2 task with its loaded domain, and the request the policy reads first."""

    domain: Domain
    task: dict
    request: str


def task_domain(task) -> tuple[Domain, dict]:
    """The loaded domain and the tau2 task of a `kind: tau2` loop Task (errors name the task and field)."""
    meta = task.metadata or {}
    tau2_task, domain_dir = meta.get("tau2_task"), meta.get("domain_dir")
    if not isinstance(tau2_task, dict) or not domain_dir:
        raise ValueError(f"task {task.id}: a tau2 task needs metadata.tau2_task (the tau2 Task) and "
                         "metadata.domain_dir (its domain folder)")
    if not Path(domain_dir).is_dir():
        raise ValueError(f"task {task.id}: metadata.domain_dir {domain_dir!r} is not a folder")
    return cached_domain(domain_dir), tau2_task


def domain_task(task, prompts) -> DomainTask:
    domain, tau2_task = task_domain(task)
    request = tau2_task.get("ticket") or instructions_text(tau2_task)
    return DomainTask(domain, tau2_task, prompts.render("domain_solo_user", request=request))


def instructions_text(task: dict) -> str:
    """The user's instructions of a tau2 task as one text."""
    instr = task["user_scenario"]["instructions"]
    return instr if isinstance(instr, str) else f"{instr.get('reason_for_call', '')} {instr.get('known_info', '')}"


def episode_tools(domain: Domain, catalog) -> tuple[list[dict], list[dict]]:
    """(the policy's tools, the expert's tools): domain tools without the transfer tool, plus
    `done`; the policy also gets `call_expert` with this task's aliases."""
    domain_tools = [s for s in domain.openai_tools() if s["function"]["name"] != TRANSFER_TOOL]
    experts = [t for t in catalog.tools if t.kind == "expert"]
    return domain_tools + catalog.openai_tools(tools=experts) + [DONE_SCHEMA], domain_tools + [DONE_SCHEMA]


def task_grammar(task, catalog, max_string_chars: int = ARG_MAX_CHARS) -> str:
    """The grammar constrained decoding uses for `task` (also what the trainer's decision mask replays)."""
    return call_grammar(episode_tools(task_domain(task)[0], task_catalog(catalog, task))[0], max_string_chars)


class Transcript:
    """The chat the policy reads, fitted into the context as the tau2 agent's is
    (episodes/tau2_common.py: ours cuts each output and drops the oldest first; upstream's
    `cut_middle_turns` drops whole middle messages).  The system prompt and request always stay."""

    def __init__(self, system: str, request: str, budgets, counter: TokenCounter, context: str = "per_output",
                 tools: list[dict] | None = None):
        self.messages = [{"role": "system", "content": system}, {"role": "user", "content": request}]
        self.budgets, self.counter, self.context, self.tools = budgets, counter, context, tools or []

    def add(self, said: str, observation: str) -> None:
        self.messages += [{"role": "assistant", "content": said},
                          {"role": "user", "content": tool_response(observation, self.context, self.budgets,
                                                                    self.counter)}]

    def fit(self) -> list[dict]:
        """The messages within `budgets.context_tokens` (a copy)."""
        return fit_context([dict(m) for m in self.messages], self.context, self.budgets, self.counter, self.tools)


def _said(out) -> str:
    """The policy's message as the chat shows it: its text, with the call's markup."""
    if out.tool_calls and "<tool_call>" not in out.text:
        return (out.text + "\n" + format_tool_call(out.tool_calls[0].name, out.tool_calls[0].arguments)).strip()
    return out.text


def execute(domain: Domain, db: dict, call: ToolCall) -> DomainStep:
    """Run one domain call on `db`; a raising tool gives "Error: ..." (tau2's wording)."""
    try:
        return DomainStep(name=call.name, arguments=call.arguments, result=result_text(domain.call(db, call.name, call.arguments)))
    except Exception as exc:  # noqa: BLE001 - every tool error goes back to the agent, as in tau2
        return DomainStep(name=call.name, arguments=call.arguments, result=f"Error: {exc}", error=True)


def _expert_action(call, turn, messages, runtime, catalog, settings, expert_tools):
    """(the action the expert named by `call` proposes, checked against the domain's tools; the
    observation's prefix naming it), or (None, the error the orchestrator reads).  Sets `turn.expert`."""
    alias = call.arguments[catalog.tool(EXPERT_TOOL).argument]
    suffix = suffix_for(settings, catalog.tool(EXPERT_TOOL).aliases[alias].model)
    turn.expert, action = runtime.propose(EXPERT_TOOL, alias, with_suffix(messages, suffix), expert_tools, catalog)
    if action is not None:
        try:
            validate_schema_call(action, expert_tools)
        except ToolCallError as exc:
            turn.expert.error, action = f"invalid proposal: {exc}", None
    if action is None:
        return None, f"Error: {alias} proposed no valid action ({turn.expert.error})"
    return action, f"[{alias} called {action.name}({json.dumps(action.arguments)})]\n"


def run_solo_episode(task, policy, runtime, config, counter: TokenCounter | None = None) -> Rollout:
    """One solo function-calling episode of `task` (kind tau2); see the module docstring."""
    dt = domain_task(task, runtime.prompts)
    check_task(dt.task, f"task {task.id} (solo mode)")
    catalog = task_catalog(runtime.catalog, task)
    tools, expert_tools = episode_tools(dt.domain, catalog)
    extra: dict[str, Any] = {"grammar": call_grammar(tools, config.max_string_chars)} if config.constrained else {}
    counter = counter or TokenCounter(getattr(getattr(policy, "engine", None), "tokenizer", None))
    system = runtime.prompts.render("domain_system", policy=dt.domain.policy, instruction=task.question)
    settings = runtime.section("tau2")
    transcript = Transcript(system, dt.request, config.budgets, counter, settings.context, tools)
    db, steps = dt.domain.fresh_db(), []
    rollout = Rollout(task_id=task.id, stop_reason="max_turns", kind="tau2")
    for index in range(config.max_turns):
        messages = transcript.fit()
        taken = take_turn(policy, messages, tools, index, catalog, config, rollout, **extra)
        if taken is None:
            return rollout
        turn, out, calls, errors = taken
        try:
            if not calls:
                raise ToolCallError(errors[0] if errors else "no <tool_call> in the response")
            turn.tool_call = calls[0]
            validate_schema_call(calls[0], tools)
        except ToolCallError as exc:
            turn.invalid_reason = str(exc)
            transcript.add(_said(out), f"Error: {exc}")
            continue
        turn.valid = True
        action, prefix = calls[0], ""
        if action.name == EXPERT_TOOL:
            action, prefix = _expert_action(action, turn, messages, runtime, catalog, settings, expert_tools)
            if action is None:
                transcript.add(_said(out), prefix)
                continue
        turn.action = action
        if action.name == DONE_TOOL:
            message = action.arguments.get("message") or ""
            if message:
                steps.append(DomainStep(text=message))
            rollout.final_answer, rollout.finished, rollout.stop_reason = message, True, "done"
            break
        step = execute(dt.domain, db, action)
        steps.append(step)
        turn.observation = prefix + step.result
        transcript.add(_said(out), turn.observation)
    if rollout.finished:
        try:
            rollout.info = verdict(dt.domain, dt.task, db, dt.request, steps, config.tau2_evaluator)
            rollout.outcome = float(rollout.info["reward"])
        except Exception as exc:  # noqa: BLE001 - an evaluator that cannot score: the rollout is dropped
            rollout.finished, rollout.stop_reason = False, f"error: evaluator: {type(exc).__name__}: {exc}"
    return rollout
