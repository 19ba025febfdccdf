"""Typed records shared by the gateway, the loop, the trainer and the evaluators.

Units: tokens are counts reported by the backend, cost is US dollars, latency is
wall-clock seconds.  Everything here is plain data (dataclasses) so it serialises
to JSON with `dataclasses.asdict` and round-trips with `from_dict`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Usage:
    """Token usage of one LLM call, as the backend reported it."""

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens)


@dataclass
class ToolCall:
    """A parsed tool call: `name` of the tool and its JSON `arguments`."""

    name: str
    arguments: dict[str, Any]
    id: str | None = None


@dataclass
class LLMResponse:
    """What `LLM_CALL.get_llm_response` returns."""

    model: str                      # the model name the caller asked for
    text: str                       # assistant text (tool-call markup removed when parsed)
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0               # dollars, from the price table
    latency: float = 0.0            # wall-clock seconds of the call, retries included
    endpoint: str | None = None     # where it was served (never holds a key)
    raw_finish_reason: str | None = None


@dataclass
class ExpertCall:
    """What a tool did in one turn: which expert ran, what it cost, what came back."""

    tool: str
    alias: str
    model: str
    output: str = ""
    usage: Usage = field(default_factory=Usage)
    cost: float = 0.0               # dollars: expert tokens + code seconds + search fees
    reply: str | None = None        # the answer tool: the expert's whole reply (`output` is cut; HLE's judge reads it all)
    latency: float = 0.0            # seconds of wall clock spent in the tool
    error: str | None = None


@dataclass
class Turn:
    """One orchestrator turn, recorded as token ids end to end.

    `prompt_ids` is the rebuilt context of this turn, `response_ids` what the policy
    generated; `loss_mask` covers `response_ids` and is 1 only on policy-generated
    tokens.  `logprobs` are the sampled log-probs (None when the engine gives none).
    """

    index: int
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    logprobs: list[float] | None = None
    loss_mask: list[int] | None = None
    # the decoding constraint that produced `response_ids` ({"choices": [...]} or {"grammar": EBNF};
    # None: free decoding): the trainer replays exactly this one for the loss mask
    constraint: dict[str, Any] | None = None
    # the policy weights' version that generated this turn (asynchronous training,
    # training/async_rollouts.py; None: synchronous, the step's own weights)
    policy_version: int | None = None
    response_text: str = ""
    tool_call: ToolCall | None = None
    valid: bool = False              # the call parsed, names a known tool and an allowed alias
    invalid_reason: str | None = None
    policy_usage: Usage = field(default_factory=Usage)
    policy_cost: float = 0.0         # dollars for the orchestrator's own tokens
    policy_latency: float = 0.0
    expert: ExpertCall | None = None
    # function-calling (tau2) episodes: the domain action this turn executed (the policy's own
    # call, or the one `call_expert`'s expert proposed) and what it returned to the context
    action: ToolCall | None = None
    observation: str | None = None


@dataclass
class Rollout:
    """One episode of the loop on one task."""

    task_id: str
    turns: list[Turn] = field(default_factory=list)
    final_answer: str | None = None
    finished: bool = False           # an `answer` call produced a final answer (tau2: `done` was called)
    stop_reason: str = ""            # "answer", "done", "max_turns", "error: ..."
    outcome: float | None = None     # set by a judge / environment
    kind: str = "qa"                 # the task's kind: "qa" or "tau2" (function calling)
    reward: float | None = None      # preference-weighted reward (training's score_groups), finished rollouts
    info: dict[str, Any] = field(default_factory=dict)   # tau2 episodes: the evaluator's verdict

    @property
    def cost(self) -> float:
        """Dollars: the orchestrator's tokens plus every expert, code and search fee."""
        return sum(t.policy_cost + (t.expert.cost if t.expert else 0.0) for t in self.turns)

    @property
    def latency(self) -> float:
        """Seconds of wall clock spent in tool calls (the paper's latency)."""
        return sum(t.expert.latency for t in self.turns if t.expert)

    @property
    def tool_calls(self) -> dict[str, int]:
        """Calls per alias (valid calls only)."""
        counts: dict[str, int] = {}
        for t in self.turns:
            if t.expert is not None:
                counts[t.expert.alias] = counts.get(t.expert.alias, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(cost=self.cost, latency=self.latency, tool_calls=self.tool_calls)
        return d
