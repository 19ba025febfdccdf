"""Our orchestrator as a tau2-bench agent, and a tau2 user simulator over LLM_CALL.

The agent sees the domain's tools (tau2's `transfer_to_human_agents` removed) plus
`call_expert(model=<alias>)` from tools.json (PAPER.md §1). When it calls an expert, the
expert model gets the same conversation and domain tools and writes the agent's next
message (a reply to the user or domain tool calls); the call_expert step itself stays
inside the agent and is recorded in the message's `raw_data`. Each message's `cost` is the
orchestrator's tokens plus the expert's, priced by the tools.json price table, so tau2's
own `agent_cost` is the real cost (upstream zeroed it).

Modes: "all" (call_expert with the catalog's experts), "basic" (every expert alias is the
orchestrator model itself), "none" (domain tools only: a plain tau2 agent).
"""
from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Optional

# Before tau2 (and so litellm) is imported: litellm otherwise tries to download its price map at
# import, with retries and sleeps; tau2 logs its registry at DEBUG. We price with tools.json.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LOGURU_LEVEL", "ERROR")

from tau2.agent.base import LocalAgent, ValidAgentInputMessage, is_valid_agent_history_message
from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT, LLMAgentState
from tau2.data_model.message import (AssistantMessage, Message, MultiToolMessage, SystemMessage, ToolCall,
                                     ToolMessage, UserMessage)
from tau2.user.user_simulator import UserSimulator

from orchestrator.catalog import Catalog
from orchestrator.domain_episode import EXPERT_TOOL, TRANSFER_TOOL  # the training episode's names, one place
from orchestrator.records import LLMResponse, Usage

EMPTY_RETRIES = 2   # an empty reply (no text, no call) is asked again this many times


class AgentFailure(RuntimeError):
    """The agent could not produce a message; the simulation becomes an error record."""


def _default_llm(*args, **kwargs) -> LLMResponse:
    from LLM_CALL import get_llm_response

    return get_llm_response(*args, **kwargs)


def to_openai_messages(messages: list[Message]) -> list[dict]:
    """tau2 messages -> OpenAI chat messages (standard `tool_calls` / `tool_call_id` fields)."""
    out = []
    for m in messages:
        if isinstance(m, ToolMessage):
            out.append({"role": "tool", "content": m.content or "", "tool_call_id": m.id})
        elif isinstance(m, (AssistantMessage, UserMessage)) and m.tool_calls:
            out.append({"role": m.role, "content": m.content or None, "tool_calls": [
                {"id": tc.id, "type": "function",
                 "function": {"name": tc.name, "arguments": json.dumps(tc.arguments)}} for tc in m.tool_calls]})
        else:
            out.append({"role": m.role, "content": m.content or ""})
    return out


def _tau2_calls(response: LLMResponse, requestor: str = "assistant") -> list[ToolCall] | None:
    calls = [ToolCall(id=tc.id or f"call_{uuid.uuid4().hex[:12]}", name=tc.name, arguments=tc.arguments,
                      requestor=requestor) for tc in response.tool_calls]
    return calls or None


def _usage(*responses: LLMResponse) -> dict[str, int]:
    total = sum((r.usage for r in responses), Usage())
    return {"prompt_tokens": total.prompt_tokens, "completion_tokens": total.completion_tokens}


@dataclass
class AgentConfig:
    """What the agent needs besides tau2's tools and policy. Temperatures, tokens per call."""

    model: str                      # served orchestrator (configs/models.yaml name)
    price_model: str                # its row in tools.json prices
    catalog: Catalog
    mode: str = "all"
    profile: str | None = None
    temperature: float = 0.0
    max_tokens: int = 1024
    expert_temperature: float = 0.0
    expert_max_tokens: int = 1024
    llm: Callable[..., LLMResponse] = _default_llm


@dataclass
class Step:
    """One agent message as our results record shows it."""

    index: int
    reasoning: str
    tool: str | None
    alias: str | None = None
    model: str | None = None
    output: str | None = None
    tokens: dict = field(default_factory=dict)
    cost: float = 0.0
    latency: float = 0.0           # seconds in the expert (the tool), 0 without one
    policy_latency: float = 0.0


class OrchestratorAgent(LocalAgent[LLMAgentState]):
    """A tau2 LocalAgent driven by the orchestrator model; see the module docstring."""

    def __init__(self, tools, domain_policy: str, config: AgentConfig):
        domain_tools = [t for t in tools if t.name != TRANSFER_TOOL]
        super().__init__(tools=domain_tools, domain_policy=domain_policy)
        self.config = config
        self.domain_schemas = [t.openai_schema for t in domain_tools]
        self.experts: dict[str, str] = {}      # alias -> model that the price table charges
        expert_schemas: list[dict] = []
        if config.mode != "none":
            tool = config.catalog.tool(EXPERT_TOOL)
            self.experts = {a: (config.price_model if config.mode == "basic" else s.model)
                            for a, s in tool.aliases.items()}
            expert_schemas = config.catalog.openai_tools(tools=[tool])
        self.schemas = self.domain_schemas + expert_schemas
        self.steps: list[Step] = []

    @property
    def system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(domain_policy=self.domain_policy, agent_instruction=AGENT_INSTRUCTION)

    def get_init_state(self, message_history: Optional[list[Message]] = None) -> LLMAgentState:
        history = list(message_history or [])
        assert all(is_valid_agent_history_message(m) for m in history)
        return LLMAgentState(system_messages=[SystemMessage(role="system", content=self.system_prompt)],
                             messages=history)

    def _ask(self, model: str, price_model: str, messages: list[dict], tools: list[dict],
             temperature: float, max_tokens: int) -> LLMResponse:
        c = self.config
        for _ in range(EMPTY_RETRIES + 1):
            r = c.llm(model, messages, tools=tools, temperature=temperature, max_tokens=max_tokens,
                      price_model=price_model, catalog=c.catalog)
            if r.tool_calls or r.text.strip():
                return r
        raise AgentFailure(f"{model} sent an empty message {EMPTY_RETRIES + 1} times")

    def _served(self, model: str) -> str:
        if self.config.mode == "basic":
            return self.config.model
        return self.config.catalog.served_model(model, self.config.profile)

    def generate_next_message(self, message: ValidAgentInputMessage, state: LLMAgentState
                              ) -> tuple[AssistantMessage, LLMAgentState]:
        c = self.config
        state.messages.extend(message.tool_messages if isinstance(message, MultiToolMessage) else [message])
        chat = to_openai_messages(state.system_messages + state.messages)
        started = time.perf_counter()
        policy = self._ask(c.model, c.price_model, chat, self.schemas, c.temperature, c.max_tokens)
        step = Step(index=len(self.steps), reasoning=policy.text, tool=None,
                    policy_latency=time.perf_counter() - started)
        call = policy.tool_calls[0] if policy.tool_calls else None
        alias = (call.arguments.get("model") or call.arguments.get("expert")) if call and call.name == EXPERT_TOOL else None
        responses, raw = [policy], {"orchestrator": {"text": policy.text, "cost": policy.cost}}
        if alias in self.experts:
            model = self.experts[alias]
            expert = self._ask(self._served(model), model, chat, self.domain_schemas,
                               c.expert_temperature, c.expert_max_tokens)
            responses.append(expert)
            step.tool, step.alias, step.model, step.latency = EXPERT_TOOL, alias, model, expert.latency
            raw["expert"] = {"alias": alias, "model": model, "cost": expert.cost}
            source = expert
        else:
            # A domain call, text to the user, or an invalid call_expert (tau2's environment then
            # answers "tool not found", as for any unknown tool).
            source = policy
            step.tool = call.name if call else None
        calls = _tau2_calls(source)
        step.output = json.dumps([[tc.name, tc.arguments] for tc in calls]) if calls else source.text
        step.cost = sum(r.cost for r in responses)
        step.tokens = _usage(*responses)
        self.steps.append(step)
        # tau2's protocol: a message is text or tool calls, never both; calls win.
        out = AssistantMessage(role="assistant", content=None if calls else source.text, tool_calls=calls,
                               cost=step.cost, usage=step.tokens, raw_data=raw)
        state.messages.append(out)
        return out, state

    def set_seed(self, seed: int) -> None:
        pass   # LLM_CALL backends take no seed through this interface; runs use temperature 0


class LLMCallUser(UserSimulator):
    """tau2's user simulator (its prompts and stop rules) with replies from any LLM_CALL model."""

    def __init__(self, tools=None, instructions=None, llm: str | None = None, llm_args: dict | None = None,
                 catalog: Catalog | None = None, call: Callable[..., LLMResponse] = _default_llm):
        super().__init__(tools=tools, instructions=instructions, llm=llm, llm_args=llm_args or {})
        self.catalog, self.call = catalog, call

    def _generate_next_message(self, message, state):
        state.messages.extend(message.tool_messages if isinstance(message, MultiToolMessage) else [message])
        chat = to_openai_messages(state.system_messages + state.flip_roles())
        tools = [t.openai_schema for t in self.tools] if self.tools else None
        for _ in range(EMPTY_RETRIES + 1):
            r = self.call(self.llm, chat, tools=tools, temperature=self.llm_args.get("temperature", 0.0),
                          max_tokens=self.llm_args.get("max_tokens", 512), catalog=self.catalog)
            if r.tool_calls or r.text.strip():
                break
        else:   # as in tau2: an empty user message cannot go on; the simulation becomes an error
            raise AgentFailure(f"user simulator {self.llm} sent an empty message {EMPTY_RETRIES + 1} times")
        calls = _tau2_calls(r, requestor="user")
        out = UserMessage(role="user", content=None if calls else r.text, tool_calls=calls, cost=r.cost,
                          usage=_usage(r))
        state.messages.append(out)
        return out, state

    def set_seed(self, seed: int) -> None:
        pass
