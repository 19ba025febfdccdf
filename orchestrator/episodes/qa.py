"""The QA episode (PAPER.md §1), shared by training and evaluation.

Each turn: rebuild the context, let the policy emit one hermes tool call, validate it
(known tool, allowed alias), let the chosen expert carry it out, record everything.
The episode ends at an `answer` call or at the turn cap.  Invalid calls are recorded
on the turn and the loop goes on.
"""
from __future__ import annotations

from orchestrator.context import EpisodeState, TokenCounter
from orchestrator.episodes.base import LoopConfig, Task, take_turn, task_catalog
from orchestrator.gateway.errors import ProviderRejected
from orchestrator.prompt_style import turn_messages
from orchestrator.records import Rollout
from orchestrator.runtime import ToolRuntime
from orchestrator.toolcall import ToolCallError, allowed_call_strings, validate_alias_call


def run_qa_episode(task: Task, policy, runtime: ToolRuntime, config: LoopConfig,
                   counter: TokenCounter | None = None) -> Rollout:
    """Run the QA loop on one task and return the recorded rollout."""
    catalog = task_catalog(runtime.catalog, task)
    qa_tools = [t for t in catalog.tools if t.kind in ("search", "code", "answer")]
    allowed = {t.name: list(t.aliases) for t in qa_tools}
    schemas = runtime.tool_schemas(catalog, qa_tools)
    choices = allowed_call_strings(allowed) if config.constrained else None
    counter = counter or TokenCounter(getattr(getattr(policy, "engine", None), "tokenizer", None))
    state = EpisodeState(task.question, task_id=task.id)
    rollout = Rollout(task_id=task.id)
    for index in range(config.max_turns):
        messages = turn_messages(state, runtime.prompts, config.budgets, counter)
        taken = take_turn(policy, messages, schemas, index, catalog, config, rollout, choices=choices)
        if taken is None:
            return rollout
        turn, _, calls, errors = taken
        if not calls:
            turn.invalid_reason = errors[0] if errors else "no <tool_call> in the response"
            continue
        turn.tool_call = calls[0]
        try:
            alias = validate_alias_call(calls[0], allowed)
        except ToolCallError as exc:
            turn.invalid_reason = str(exc)
            continue
        turn.valid = True
        try:
            turn.expert, answer = runtime.call(calls[0].name, alias, state, catalog)
        except ProviderRejected as exc:   # not the orchestrator's to fix: the episode ends with it
            rollout.stop_reason = f"error: {exc}"
            return rollout
        if catalog.tool(calls[0].name).kind == "answer" and turn.expert.error is None:
            rollout.final_answer, rollout.finished, rollout.stop_reason = answer, True, "answer"
            return rollout
    rollout.stop_reason = "max_turns"
    return rollout
