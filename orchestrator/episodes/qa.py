"""The QA episode (PAPER.md §1), shared by training and evaluation.

Each turn: rebuild the context, let the policy emit one hermes tool call, validate it
(known tool, allowed alias), let the chosen expert carry it out, record everything.
The episode ends at an `answer` call or at the turn cap.  Invalid calls are recorded
on the turn and the loop goes on.
"""
from __future__ import annotations

from orchestrator.context import EpisodeState, TokenCounter
from orchestrator.episodes.base import LoopConfig, Task, take_turn, task_catalog
from orchestrator.prompt_style import turn_messages
from orchestrator.records import Rollout
from orchestrator.runtime import REJECTED, ToolRuntime
from orchestrator.toolcall import ToolCallError, allowed_call_strings, validate_alias_call


def run_qa_episode(task: Task, policy, runtime: ToolRuntime, config: LoopConfig,
                   counter: TokenCounter | None = None) -> Rollout:
    """Run the QA loop on one task and return the recorded rollout.  `task.metadata["files"]`
    ({name: host path}, a GAIA task's attachment) is copied into every code run's folder."""
    catalog = task_catalog(runtime.catalog, task)
    # no retriever: no search tool to offer (every call of it would fail)
    kinds = ("search", "code", "answer") if runtime.retriever is not None else ("code", "answer")
    offered = first = _Offer([t for t in catalog.tools if t.kind in kinds], runtime, catalog, config)
    counter = counter or TokenCounter(getattr(getattr(policy, "engine", None), "tokenizer", None))
    state = EpisodeState(task.question, task_id=task.id, files=dict(task.metadata.get("files") or {}))
    rollout = Rollout(task_id=task.id)
    single_search = runtime.qa.search.single_search
    for index in range(config.max_turns):
        if single_search and state.documents:   # upstream's FRAMES: search no longer offered once documents
            offered = offered.without("search")  # exist (eval_frames.py:477-482); a call to it still runs
        allowed, schemas, choices = first.allowed, offered.schemas, offered.choices
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
        except REJECTED as exc:   # not the orchestrator's to fix: the episode ends with it
            rollout.stop_reason = f"error: {exc}"
            return rollout
        if catalog.tool(calls[0].name).kind == "answer" and turn.expert.error is None:
            rollout.final_answer, rollout.finished, rollout.stop_reason = answer, True, "answer"
            return rollout
    rollout.stop_reason = "max_turns"
    return rollout


class _Offer:
    """The tools offered this turn: their aliases, schemas and (constrained decoding) call strings."""

    def __init__(self, tools, runtime: ToolRuntime, catalog, config: LoopConfig):
        self.tools, self._runtime, self._catalog, self._config = tools, runtime, catalog, config
        self.allowed = {t.name: list(t.aliases) for t in tools}
        self.schemas = runtime.tool_schemas(catalog, tools)
        self.choices = allowed_call_strings(self.allowed) if config.constrained else None

    def without(self, kind: str) -> "_Offer":
        if not any(t.kind == kind for t in self.tools):
            return self
        return _Offer([t for t in self.tools if t.kind != kind], self._runtime, self._catalog, self._config)
