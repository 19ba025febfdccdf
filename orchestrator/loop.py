"""The orchestration loop (PAPER.md §1), shared by training and evaluation.

Each turn: rebuild the context, let the policy emit one hermes tool call, validate it
(known tool, allowed alias), let the chosen expert carry it out, record everything.
The episode ends at an `answer` call or at the turn cap.  Invalid calls are recorded
on the turn and the loop goes on.  Function-calling (tau2-style) tasks run their own
episode, orchestrator/domain_episode.py, through the same `run_episode`.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from orchestrator.catalog import Catalog, Price, parse_catalog
from orchestrator.context import Budgets, EpisodeState, TokenCounter, build_messages
from orchestrator.gateway.errors import ProviderRejected
from orchestrator.records import Rollout, Turn
from orchestrator.runtime import ToolRuntime
from orchestrator.toolcall import (
    ARG_MAX_CHARS,
    ToolCallError,
    allowed_call_strings,
    parse_tool_calls,
    validate_alias_call,
)


@dataclass
class Task:
    """One problem.  Per-example tools, aliases and prices (training randomises them)."""

    id: str
    question: str
    answer: str | None = None
    kind: str = "qa"
    tools: dict[str, dict[str, str]] | None = None   # tool -> {alias: model}; None = catalog's
    prices: dict[str, dict[str, float]] | None = None  # model -> {"input", "output"} $/1M overrides
    preference: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopConfig:
    max_turns: int = 50          # 30 in training, 50 in evaluation (PAPER §1)
    temperature: float = 1.0
    max_tokens: int = 1024       # per orchestrator turn
    constrained: bool = False    # force a valid call by constrained decoding
    max_string_chars: int = ARG_MAX_CHARS   # constrained function calls: longest string argument
    tau2_evaluator: str = "auto"  # function-calling outcome: auto (tau2 when installed) | tau2 | builtin
    budgets: Budgets = field(default_factory=Budgets)


def task_catalog(base: Catalog, task: Task) -> Catalog:
    """The catalog this task sees: its tool subset, alias names and prices over `base`."""
    if task.tools is None and task.prices is None:
        return base
    data = base.model_dump()
    if task.prices:
        data["prices"] = {**data["prices"], **{m: Price(**p).model_dump() for m, p in task.prices.items()}}
    if task.tools is not None:
        tools = []
        for name, aliases in task.tools.items():
            tool = base.tool(name)
            # listed latency belongs to the model (within this tool), whatever the alias is called
            by_model = {spec.model: spec.latency_s for spec in tool.aliases.values()}
            data_tool = tool.model_dump()
            data_tool["aliases"] = {
                a: {"model": m, "latency_s": by_model.get(m, tool.aliases[a].latency_s if a in tool.aliases else 0.0)}
                for a, m in aliases.items()}
            if any(tool.aliases.get(a) is None or tool.aliases[a].model != m for a, m in aliases.items()):
                # the catalog's prose describes its own alias names; it would mislead here
                data_tool["argument_description"] = "Which model performs this step (see the table)."
            tools.append(data_tool)
        data["tools"] = tools
    return parse_catalog(data, source=f"task {task.id}")


def take_turn(policy, messages: list[dict], tools: list[dict], index: int, catalog: Catalog, config: LoopConfig,
              rollout: Rollout, **constraint):
    """Ask the policy for turn `index` and record it on `rollout`: token ids, loss mask (every
    generated token), usage, the price of the orchestrator's own tokens.  Returns (turn, output,
    parsed calls, parse errors), or None when the policy failed (`rollout.stop_reason` says why)."""
    try:
        out = policy.act(messages, tools, temperature=config.temperature, max_tokens=config.max_tokens, **constraint)
    except Exception as exc:  # the policy's server gave up: end cleanly, keep what we have
        rollout.stop_reason = f"error: policy: {type(exc).__name__}: {exc}"
        return None
    turn = Turn(index=index, prompt_ids=out.prompt_ids, response_ids=out.response_ids,
                logprobs=out.logprobs, response_text=out.text, policy_usage=out.usage,
                policy_cost=catalog.llm_cost(policy.price_model, out.usage), policy_latency=out.latency,
                loss_mask=[1] * len(out.response_ids) if out.response_ids is not None else None)
    rollout.turns.append(turn)
    calls, errors = (out.tool_calls, []) if out.tool_calls else parse_tool_calls(out.text)[1:]
    return turn, out, calls, errors


def run_episode(task: Task, policy, runtime: ToolRuntime, config: LoopConfig,
                counter: TokenCounter | None = None) -> Rollout:
    """Run the loop on one task and return the recorded rollout.  Function-calling tasks
    (`kind: tau2`) run the domain episode (orchestrator/domain_episode.py)."""
    if task.kind == "tau2":
        from orchestrator.domain_episode import run_domain_episode
        return run_domain_episode(task, policy, runtime, config, counter)
    if task.kind != "qa":
        raise ValueError(f"task {task.id}: unknown kind {task.kind!r}; expected 'qa' or 'tau2'")
    catalog = task_catalog(runtime.catalog, task)
    qa_tools = [t for t in catalog.tools if t.kind in ("search", "code", "answer")]
    allowed = {t.name: list(t.aliases) for t in qa_tools}
    schemas = runtime.tool_schemas(catalog, qa_tools)
    choices = allowed_call_strings(allowed) if config.constrained else None
    counter = counter or TokenCounter(getattr(getattr(policy, "engine", None), "tokenizer", None))
    state = EpisodeState(task.question, task_id=task.id)
    rollout = Rollout(task_id=task.id)
    for index in range(config.max_turns):
        messages = build_messages(state, runtime.prompts, config.budgets, counter)
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


def run_episodes(jobs: Iterable[Task], policy, runtime: ToolRuntime, config: LoopConfig,
                 concurrency: int = 8, on_done: Callable[[Task, Rollout], None] | None = None) -> list[Rollout]:
    """Run many episodes concurrently (threads): while some wait on tools, others generate.

    Results come back in input order; `on_done` is called as each finishes (e.g. to
    append it to a results file).
    """
    jobs = list(jobs)

    def one(task: Task) -> Rollout:
        rollout = run_episode(task, policy, runtime, config)
        if on_done is not None:
            on_done(task, rollout)
        return rollout

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(one, jobs))
