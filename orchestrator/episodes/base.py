"""What every episode kind shares: the task, the loop's settings, the catalog a task sees,
and one recorded policy turn."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrator.catalog import Catalog, Price, parse_catalog
from orchestrator.context import Budgets
from orchestrator.records import Rollout, Turn
from orchestrator.toolcall import ARG_MAX_CHARS, parse_tool_calls


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
    tau2_evaluator: str = "auto"  # solo tau2 outcome: auto (tau2 when installed) | tau2 | builtin
    tau2_user: str = "simulator"  # tau2 tasks: "simulator" (tau2's user simulator) | "solo" (no user)
    tau2_user_model: str | None = None   # the simulator, a configs/models.yaml name (None: the policy's model)
    tau2_user_temperature: float = 0.0
    tau2_user_max_tokens: int = 512      # the simulator's reply cap (ours: upstream's GPT-5 user has none)
    tau2_max_steps: int = 40     # tau2's max_steps (every message counts); upstream trains with 40
    tau2_max_errors: int = 10    # tau2: tool errors before a simulation stops
    tau2_seed: int = 300         # tau2 simulation seed
    budgets: Budgets = field(default_factory=Budgets)
    # called with the rollout so far before each policy turn; a non-empty return ends the episode with
    # that stop_reason (orchestrator/serve/: a request's dollar or turn budget, a client gone)
    before_turn: Callable[[Rollout], str | None] | None = None


def task_catalog(base: Catalog, task: Task) -> Catalog:
    """The catalog this task sees: its tool subset, alias names and prices over `base`."""
    if task.tools is None and task.prices is None:
        return base
    data = base.model_dump()
    if task.prices:
        data["prices"] = {**data["prices"], **{m: Price(**p).model_dump() for m, p in task.prices.items()}}
    if task.tools is not None:
        # function tools (python, http, mcp, ...) are the catalog's additions: offered whatever the
        # task's alias tools are (a task may list one with no aliases, `{}`: it is offered too)
        tools = []
        for name, aliases in task.tools.items():
            tool = base.tool(name)
            if not tool.alias_tool:
                tools.append(tool.model_dump())
                continue
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
        tools += [t.model_dump() for t in base.tools if not t.alias_tool and t.name not in task.tools]
        data["tools"] = tools
    return parse_catalog(data, source=f"task {task.id}")


def take_turn(policy, messages: list[dict], tools: list[dict], index: int, catalog: Catalog, config: LoopConfig,
              rollout: Rollout, **constraint):
    """Ask the policy for turn `index` and record it on `rollout`: token ids, loss mask (every
    generated token; the trainer narrows it to the decisions `constraint` left), the decoding
    constraint itself, usage, the price of the orchestrator's own tokens.  Returns (turn, output,
    parsed calls, parse errors), or None when the policy failed or `config.before_turn` stopped the
    episode (`rollout.stop_reason` says why)."""
    stop = config.before_turn(rollout) if config.before_turn is not None else None
    if stop:
        rollout.stop_reason = stop
        return None
    try:
        out = policy.act(messages, tools, temperature=config.temperature, max_tokens=config.max_tokens, **constraint)
    except Exception as exc:  # the policy's server gave up: end cleanly, keep what we have
        rollout.stop_reason = f"error: policy: {type(exc).__name__}: {exc}"
        return None
    turn = Turn(index=index, prompt_ids=out.prompt_ids, response_ids=out.response_ids,
                logprobs=out.logprobs, response_text=out.text, policy_usage=out.usage,
                policy_cost=catalog.llm_cost(policy.price_model, out.usage), policy_latency=out.latency,
                loss_mask=[1] * len(out.response_ids) if out.response_ids is not None else None,
                constraint={k: v for k, v in constraint.items() if v is not None} or None,
                policy_version=out.policy_version)
    rollout.turns.append(turn)
    calls, errors = (out.tool_calls, []) if out.tool_calls else parse_tool_calls(out.text)[1:]
    return turn, out, calls, errors
