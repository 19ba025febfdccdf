"""The orchestrator as a tau2-bench agent, and tau2's user simulator over LLM_CALL (needs `tau2`).

Adapted as upstream adapts tau2's LLMAgent (ToolOrchestra's evaluation/tau2-bench,
tau2/utils/llm_utils.py `to_litellm_messages` / `generate`):

- the domain policy's passages about `transfer_to_human_agents` are replaced by the
  call-expert policy (`EXPERT_POLICY`, upstream's `EXPERT_POLICT`), and the system prompt ends
  with upstream's format line (`AGENT_FORMAT`: thinking in <think>, the message to the user
  in <message>, the call in <tool_call>);
- the agent's tools: the domain's without `transfer_to_human_agents`, plus `call_expert`
  whose argument is named `expert` (tools.json `argument`), with the price/latency table;
- what the user simulator (and tau2's evaluator) sees of a policy message is the text after
  `</think>`, and only the part inside <message>...</message> when there is one (under
  `expert_text: upstream-train`, as upstream's training reads it: only the <message> part, nothing
  without one; episodes/tau2_common.py `delivered_train`);
- `call_expert(expert=...)`: the expert gets tau2's own system prompt (policy unchanged) and
  tools, reads the same conversation and writes the agent's message (a reply or domain calls);
  that message is what tau2 sees.  An empty reply becomes upstream's "Wait a minute, I will
  take it very soon".

The profile's tau2 section (`runtime.section("tau2")`, orchestrator/settings.py `Tau2Settings`)
picks ours or upstream's variant of each (episodes/tau2_common.py): the expert text (policy
rewrite, `call_expert` schema and format line; upstream's evaluation or training copy), the suffix appended to a model's last message, how the chat
is fitted into the context, and how many tool calls of one message tau2 executes
(`max_tool_calls`: ours 1, the orchestrator's first call, an expert's message as written;
upstream 6 of either, llm_utils.py:588-598; tau2 runs them in order, one MultiToolMessage back).

Every policy turn is recorded on the episode's Rollout by `take_turn` (token ids, loss mask,
decoding constraint, usage, cost); the expert's cost and latency go on the turn's `expert`.
"""
from __future__ import annotations

import json
import os
import re
import time
import uuid
from typing import Callable, Optional

# Before tau2 (and so litellm) is imported: litellm otherwise tries to download its price map at
# import, with retries and sleeps; tau2 logs its registry at DEBUG. We price with tools.json.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LOGURU_LEVEL", "ERROR")

from tau2.agent.base import LocalAgent, ValidAgentInputMessage, is_valid_agent_history_message  # noqa: E402 (env first)
from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT, LLMAgentState  # noqa: E402 (env first)
from tau2.data_model.message import (AssistantMessage, Message, MultiToolMessage,  # noqa: E402 (env first)
                                     SystemMessage, ToolCall, ToolMessage, UserMessage)
from tau2.user.user_simulator import UserSimulator  # noqa: E402 (env first)

from orchestrator.catalog import Catalog  # noqa: E402 (env first)
from orchestrator.context import TokenCounter  # noqa: E402 (env first)
from orchestrator.episodes.base import take_turn  # noqa: E402 (env first)
from orchestrator.episodes.tau2_common import (AGENT_FORMAT, EXPERT_POLICY,  # noqa: E402,F401 (env first; re-exports)
                                               EXPERT_TOOL, OMITTED, TRANSFER_TOOL, WAIT, agent_format, delivered_train,
                                               expert_policy, expert_schema, fit_context, kept_calls,
                                               reads_agent_chat, rewrites, suffix_for, tool_response, with_suffix)
from orchestrator.gateway import get_llm_response  # noqa: E402 (env first)
from orchestrator.records import ExpertCall, LLMResponse, Rollout, Usage  # noqa: E402 (env first)
from orchestrator.toolcall import (ToolCallError, format_tool_call,  # noqa: E402 (env first)
                                   message_or_call_grammar, validate_schema_call)

EMPTY_RETRIES = 2   # the user simulator's empty reply is asked again this many times


class AgentFailure(RuntimeError):
    """The agent or the user simulator could not produce a message; the episode ends in error."""


def _default_llm(*args, **kwargs) -> LLMResponse:
    return get_llm_response(*args, **kwargs)


def user_visible(text: str) -> str:
    """What the user sees of a policy message: the text after `</think>`, the <message> part if any."""
    text = text.split("</think>")[-1]
    text = re.sub(r"<tool_call>.*?(</tool_call>|$)", "", text, flags=re.S)
    if "<message>" in text and "</message>" in text:
        text = text.split("<message>")[-1].split("</message>")[0]
    return text.strip()


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


def _tau2_calls(calls, requestor: str = "assistant") -> list[ToolCall] | None:
    out = [ToolCall(id=getattr(tc, "id", None) or f"call_{uuid.uuid4().hex[:12]}", name=tc.name,
                    arguments=tc.arguments, requestor=requestor) for tc in calls or []]
    return out or None


class PolicyAgent(LocalAgent[LLMAgentState]):
    """A tau2 LocalAgent driven by a policy (`act(messages, tools, ...)`); see the module docstring."""

    def __init__(self, tools, domain_policy: str, *, policy, runtime, catalog: Catalog, config, rollout: Rollout,
                 counter: TokenCounter, instruction: str = "", experts: bool = True):
        domain_tools = [t for t in tools if t.name != TRANSFER_TOOL]
        super().__init__(tools=domain_tools, domain_policy=domain_policy)
        self.policy, self.runtime, self.catalog, self.config = policy, runtime, catalog, config
        self.rollout, self.counter, self.instruction = rollout, counter, instruction
        self.settings = runtime.section("tau2")                         # orchestrator/settings.py Tau2Settings
        self.expert_schemas = [t.openai_schema for t in tools]          # tau2's own tools, as upstream
        self.expert = catalog.tool(EXPERT_TOOL) if experts and any(t.name == EXPERT_TOOL for t in catalog.tools) else None
        self.schemas = [t.openai_schema for t in domain_tools] + (
            [expert_schema(catalog, self.expert, self.settings.expert_text)] if self.expert else [])
        self.grammar = None
        if config.constrained:
            self.grammar = message_or_call_grammar(self.schemas, config.max_string_chars)

    @property
    def system_prompt(self) -> str:
        """tau2's prompt with the call-expert policy (when `call_expert` is offered) and the format
        line; a model the settings' `rewrite_models` leave out keeps tau2's prompt as it is."""
        if not rewrites(self.settings, getattr(self.policy, "model", None)):
            text = self.expert_system_prompt
        else:
            policy = expert_policy(self.domain_policy, self.settings.expert_text) if self.expert else self.domain_policy
            text = SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION) + \
                agent_format(self.settings.expert_text)
        return text + (f"\n\n{self.instruction}" if self.instruction else "")

    @property
    def expert_system_prompt(self) -> str:
        return SYSTEM_PROMPT.format(domain_policy=self.domain_policy, agent_instruction=AGENT_INSTRUCTION)

    def get_init_state(self, message_history: Optional[list[Message]] = None) -> LLMAgentState:
        history = list(message_history or [])
        assert all(is_valid_agent_history_message(m) for m in history)
        return LLMAgentState(system_messages=[SystemMessage(role="system", content=self.system_prompt)],
                             messages=history)

    # ---- what the policy reads ----------------------------------------------------------
    def policy_messages(self, state: LLMAgentState) -> list[dict]:
        """The conversation as the policy reads it: its own earlier text as it wrote it, an
        expert's message with its calls in hermes markup, tool results as `<tool_response>` user
        messages (Qwen's rendering), fitted into the context (episodes/tau2_common.py
        `fit_context`), the profile's suffix for the policy's model on the last message."""
        context, budgets = self.settings.context, self.config.budgets
        messages = [{"role": "system", "content": self.system_prompt}]
        for m in state.messages:
            if isinstance(m, ToolMessage):
                messages.append({"role": "user", "content": tool_response(m.content or "", context, budgets,
                                                                          self.counter)})
            elif isinstance(m, AssistantMessage):
                said = (m.raw_data or {}).get("policy_text")
                if said is None:
                    said = "\n".join([m.content or ""] + [format_tool_call(tc.name, tc.arguments)
                                                          for tc in m.tool_calls or []]).strip()
                messages.append({"role": "assistant", "content": said})
            else:
                messages.append({"role": "user", "content": m.content or ""})
        messages = fit_context(messages, context, budgets, self.counter, self.schemas)
        return with_suffix(messages, suffix_for(self.settings, getattr(self.policy, "model", None),
                                                getattr(self.policy, "price_model", None)))

    # ---- one agent message ---------------------------------------------------------------
    def generate_next_message(self, message: ValidAgentInputMessage, state: LLMAgentState
                              ) -> tuple[AssistantMessage, LLMAgentState]:
        state.messages.extend(message.tool_messages if isinstance(message, MultiToolMessage) else [message])
        chat = self.policy_messages(state)
        taken = take_turn(self.policy, chat, self.schemas, len(self.rollout.turns), self.catalog, self.config,
                          self.rollout, grammar=self.grammar)
        if taken is None:
            raise AgentFailure(self.rollout.stop_reason)
        turn, out, calls, errors = taken
        raw = {"policy_text": out.text, "orchestrator": {"text": out.text, "cost": turn.policy_cost}}
        said = delivered_train(out.text) if self.settings.expert_text == "upstream-train" else user_visible(out.text)
        content, tool_calls, cost, usage = said, None, turn.policy_cost, out.usage
        calls = kept_calls(calls, self.settings.max_tool_calls)
        if calls:
            # every call is sent, valid or not: tau2's environment answers the errors, as upstream
            reasons = [r for r in map(self._invalid, calls) if r]
            turn.tool_call, turn.valid, turn.invalid_reason = calls[0], not reasons, (reasons or [None])[0]
            # the expert named last wins and its message replaces the policy's calls (upstream's mode_to_call)
            asked = next((c for c in reversed(calls) if c.name == EXPERT_TOOL and not self._invalid(c)), None)
            if asked is not None:
                turn.tool_call = asked
                turn.expert, reply = self._ask_expert(asked.arguments[self.expert.argument], state)
                cost += turn.expert.cost
                usage = usage + turn.expert.usage
                raw["expert"] = {"alias": turn.expert.alias, "model": turn.expert.model, "cost": turn.expert.cost}
                content, tool_calls = (reply.text.split("</think>")[-1].strip(),
                                       _tau2_calls(self._expert_calls(reply.tool_calls))) \
                    if reply is not None else (WAIT, None)
            else:
                content, tool_calls = None, _tau2_calls(calls)
                turn.action = calls[0]
        else:
            turn.invalid_reason = errors[0] if errors else None
            turn.valid = bool(content) and not errors
        if tool_calls:
            content = None   # tau2's protocol: text or tool calls, never both; calls win
        elif not content:
            content = WAIT
        msg = AssistantMessage(role="assistant", content=content, tool_calls=tool_calls, cost=cost,
                               usage={"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
                               raw_data=raw)
        state.messages.append(msg)
        return msg, state

    def _invalid(self, call) -> str | None:
        """Why `call` does not fit the policy's tools (None: it does).  An expert name the catalog
        lacks is refused here too: upstream's schema has no `enum` to refuse it."""
        try:
            validate_schema_call(call, self.schemas)
        except ToolCallError as exc:
            return str(exc)
        if call.name == EXPERT_TOOL and call.arguments.get(self.expert.argument) not in self.expert.aliases:
            return (f"{EXPERT_TOOL}: unknown {self.expert.argument} {call.arguments.get(self.expert.argument)!r}; "
                    f"this task has {list(self.expert.aliases)}")
        return None

    def _expert_calls(self, calls) -> list:
        """The expert's calls sent to tau2: upstream cuts them as any agent message (max_tool_calls
        > 1); ours (1, the policy's single call) sends the expert's message as it wrote it."""
        cap = self.settings.max_tool_calls
        return kept_calls(calls, cap) if cap > 1 else list(calls or [])

    def expert_messages(self, model: str, state: LLMAgentState) -> list[dict]:
        """What the expert `model` reads: tau2's own system prompt and the conversation, the
        profile's suffix for its model on the last message; under upstream's evaluation text a
        Qwen3 expert reads the agent's chat instead (`reads_agent_chat`), cut as the agent's is."""
        if reads_agent_chat(self.settings, model):
            chat = to_openai_messages([SystemMessage(role="system", content=self.system_prompt), *state.messages])
            chat = fit_context(chat, "cut_middle_turns", self.config.budgets, self.counter, self.expert_schemas)
        else:
            chat = to_openai_messages([SystemMessage(role="system", content=self.expert_system_prompt),
                                       *state.messages])
        return with_suffix(chat, suffix_for(self.settings, model))

    def _ask_expert(self, alias: str, state: LLMAgentState) -> tuple[ExpertCall, LLMResponse | None]:
        """The alias's expert writes the agent's next message from `expert_messages` and tau2's tools."""
        call = ExpertCall(tool=EXPERT_TOOL, alias=alias, model=self.expert.aliases[alias].model)
        messages = self.expert_messages(call.model, state)
        started, reply = time.monotonic(), None
        try:
            reply = self.runtime.ask(call, messages, self.catalog, kind="tau2", tools=self.expert_schemas)
            if not reply.tool_calls and not reply.text.strip():
                call.error, reply = "the expert sent an empty message", None
            else:
                call.output = reply.text[:2000] if not reply.tool_calls else json.dumps(
                    [[tc.name, tc.arguments] for tc in reply.tool_calls])
        except Exception as exc:  # noqa: BLE001 - recorded on the turn; the user gets upstream's wait message
            call.error = f"{type(exc).__name__}: {exc}"
        call.latency = time.monotonic() - started
        return call, reply

    def set_seed(self, seed: int) -> None:
        pass   # the policy's sampling seed is the rollout's (training.rollouts.SeededEngine)


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
        calls = _tau2_calls(r.tool_calls, requestor="user")
        out = UserMessage(role="user", content=None if calls else r.text, tool_calls=calls, cost=r.cost,
                          usage={"prompt_tokens": r.usage.prompt_tokens, "completion_tokens": r.usage.completion_tokens})
        state.messages.append(out)
        return out, state

    def set_seed(self, seed: int) -> None:
        pass


__all__ = ["AgentFailure", "LLMCallUser", "PolicyAgent", "expert_policy", "to_openai_messages", "user_visible",
           "EXPERT_POLICY", "EXPERT_TOOL", "OMITTED", "TRANSFER_TOOL", "WAIT", "Usage"]
