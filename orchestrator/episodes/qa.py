"""The QA episode (PAPER.md §1), shared by training and evaluation.

Each turn: rebuild the context, let the policy emit one hermes tool call, validate it
(known tool, allowed alias; a function tool's arguments against its schema), let the chosen
expert (or the function tool) carry it out, record everything.  A function tool's output, or its
error, joins the evidence as a document (`[tool] name(arguments)`), which the next turn's context
and the experts read.  The episode ends at an `answer` call or at the turn cap.  Invalid calls
are recorded on the turn and the loop goes on.
"""
from __future__ import annotations

import json

from orchestrator.context import Document, EpisodeState, TokenCounter
from orchestrator.episodes.base import LoopConfig, Task, take_turn, task_catalog
from orchestrator.prompt_style import turn_messages
from orchestrator.records import Rollout
from orchestrator.runtime import REJECTED, ToolRuntime
from orchestrator.toolcall import (ToolCallError, allowed_call_strings, call_grammar, validate_alias_call,
                                   validate_schema_call)
from orchestrator.tools.registry import alias_kind


def run_qa_episode(task: Task, policy, runtime: ToolRuntime, config: LoopConfig,
                   counter: TokenCounter | None = None) -> Rollout:
    """Run the QA loop on one task and return the recorded rollout.  `task.metadata["files"]`
    ({name: host path}, a GAIA task's attachment) is copied into every code run's folder."""
    catalog = task_catalog(runtime.catalog, task)
    # no retriever: no search tool to offer (every call of it would fail)
    qa_tools = [t for t in catalog.tools if (k := alias_kind(t.kind)) is not None and k.qa
                and (runtime.retriever is not None or not k.needs_retriever)]
    functions = runtime.functions(catalog, "qa", taken={t.name for t in qa_tools})
    offered = first = _Offer(qa_tools, functions, runtime, catalog, config)
    counter = counter or TokenCounter(getattr(getattr(policy, "engine", None), "tokenizer", None))
    state = EpisodeState(task.question, task_id=task.id, files=dict(task.metadata.get("files") or {}))
    rollout = Rollout(task_id=task.id)
    single_search = runtime.qa.search.single_search
    for index in range(config.max_turns):
        if single_search and state.documents:   # upstream's FRAMES: search no longer offered once documents
            offered = offered.without("search")  # exist (eval_frames.py:477-482); a call to it still runs
        allowed, schemas = first.allowed, offered.schemas
        messages = turn_messages(state, runtime.prompts, config.budgets, counter)
        taken = take_turn(policy, messages, schemas, index, catalog, config, rollout, **offered.constraint)
        if taken is None:
            return rollout
        turn, _, calls, errors = taken
        if not calls:
            turn.invalid_reason = errors[0] if errors else "no <tool_call> in the response"
            continue
        turn.tool_call = calls[0]
        fn = first.functions.get(calls[0].name)
        try:
            if fn is not None:
                validate_schema_call(calls[0], [first.function_schemas[fn.name]])
            elif calls[0].name not in allowed and first.functions:
                raise ToolCallError(f"unknown tool {calls[0].name!r}; allowed tools: "
                                    f"{sorted([*allowed, *first.functions])}")
            else:
                alias = validate_alias_call(calls[0], allowed)
        except ToolCallError as exc:
            turn.invalid_reason = str(exc)
            continue
        turn.valid = True
        if fn is not None:
            turn.expert, text = runtime.call_function(fn, calls[0].arguments, state, catalog)
            state.add_documents([Document(id=f"{fn.name}#{index}", source="tool",
                                          contents=f"[tool] {fn.name}({json.dumps(calls[0].arguments)}):\n{text}")])
            continue
        try:
            turn.expert, answer = runtime.call(calls[0].name, alias, state, catalog)
        except REJECTED as exc:   # not the orchestrator's to fix: the episode ends with it
            rollout.stop_reason = f"error: {exc}"
            return rollout
        if alias_kind(catalog.tool(calls[0].name).kind).ends_episode and turn.expert.error is None:
            rollout.final_answer, rollout.finished, rollout.stop_reason = answer, True, "answer"
            return rollout
    rollout.stop_reason = "max_turns"
    return rollout


class _Offer:
    """The tools offered this turn: alias tools (their aliases) and function tools, their schemas,
    and the decoding constraint: the list of every call (alias tools only: `choices`), or a
    grammar of one call with typed arguments (any function tool offered: `grammar`)."""

    def __init__(self, tools, functions, runtime: ToolRuntime, catalog, config: LoopConfig):
        self.tools, self._runtime, self._catalog, self._config = tools, runtime, catalog, config
        self.functions = {f.name: f for f in functions}
        self.allowed = {t.name: list(t.aliases) for t in tools}
        self.function_schemas = {f.name: function_schema(f, catalog) for f in functions}
        self.schemas = runtime.tool_schemas(catalog, tools) + list(self.function_schemas.values())
        self.constraint: dict = {}
        if config.constrained and functions:
            # the alias tools as the catalog renders them (an `enum` of aliases) for decoding
            decoding = catalog.openai_tools(tools=tools) + list(self.function_schemas.values())
            self.constraint = {"grammar": call_grammar(decoding, config.max_string_chars)}
        elif config.constrained:
            self.constraint = {"choices": allowed_call_strings(self.allowed)}

    def without(self, kind: str) -> "_Offer":
        if not any(t.kind == kind for t in self.tools):
            return self
        return _Offer([t for t in self.tools if t.kind != kind], list(self.functions.values()),
                      self._runtime, self._catalog, self._config)


def function_schema(fn, catalog) -> dict:
    """A function tool in the OpenAI tools format: its own arguments, its price after its description."""
    from orchestrator.catalog import price_note

    return {"type": "function", "function": {"name": fn.name, "description": fn.description + price_note(catalog, fn.spec),
                                             "parameters": fn.parameters}}
