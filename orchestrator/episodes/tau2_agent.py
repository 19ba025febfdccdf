"""The orchestrator as a tau2-bench agent, and tau2's user simulator over LLM_CALL (needs `tau2`).

Adapted as upstream adapts tau2's LLMAgent (ToolOrchestra's evaluation/tau2-bench,
tau2/utils/llm_utils.py `to_litellm_messages` / `generate`):

- the domain policy's paragraphs about `transfer_to_human_agents` are replaced by the
  call-expert policy (`EXPERT_POLICY`, upstream's `EXPERT_POLICT`), and the system prompt ends
  with upstream's format line (`AGENT_FORMAT`: thinking in <think>, the message to the user
  in <message>, the call in <tool_call>);
- the agent's tools: the domain's without `transfer_to_human_agents`, plus `call_expert`
  whose argument is named `expert` (tools.json `argument`), with the price/latency table;
- what the user simulator (and tau2's evaluator) sees of a policy message is the text after
  `</think>`, and only the part inside <message>...</message> when there is one;
- `call_expert(expert=...)`: the expert gets tau2's own system prompt (policy unchanged) and
  tools, reads the same conversation and writes the agent's message (a reply or domain calls);
  that message is what tau2 sees.  An empty reply becomes upstream's "Wait a minute, I will
  take it very soon".

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

from tau2.agent.base import LocalAgent, ValidAgentInputMessage, is_valid_agent_history_message  # noqa: E402
from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT, LLMAgentState  # noqa: E402
from tau2.data_model.message import (AssistantMessage, Message, MultiToolMessage, SystemMessage,  # noqa: E402
                                     ToolCall, ToolMessage, UserMessage)
from tau2.user.user_simulator import UserSimulator  # noqa: E402

from orchestrator.catalog import Catalog  # noqa: E402
from orchestrator.context import TokenCounter  # noqa: E402
from orchestrator.episodes.base import take_turn  # noqa: E402
from orchestrator.records import ExpertCall, LLMResponse, Rollout, Usage  # noqa: E402
from orchestrator.toolcall import ToolCallError, format_tool_call, validate_schema_call  # noqa: E402

EXPERT_TOOL = "call_expert"
TRANSFER_TOOL = "transfer_to_human_agents"   # tau2's; call_expert replaces it (PAPER.md §1)
EMPTY_RETRIES = 2   # the user simulator's empty reply is asked again this many times
WAIT = "Wait a minute, I will take it very soon"   # upstream's stand-in for an empty agent message
OMITTED = "[earlier output omitted]"
EXPERT_POLICY = (
    "You should transfer the user to an expert if you are not confident about how to reply or which tool to "
    "use. To transfer, first make a tool call to call_expert, and then choose an expert based on the task "
    "difficulty, i.e. strong expert on tricky task, and weaker expert on simpler task. Think carefully about "
    "whether you are confident to meet user expectation, or call an appropriate expert based on both expert "
    "cost and performance.")
AGENT_FORMAT = ("  You are dedicated to provide the best service. Wrap thinking process between <think> </think>, "
                "message between <message> </message> and the tool call between <tool_call> </tool_call> .")
_TRANSFER_LINE = re.compile(r"transfer_to_human_agents|\b(transfer|escalat)\w*\b[^.\n]*\bhuman agent", re.I)


class AgentFailure(RuntimeError):
    """The agent or the user simulator could not produce a message; the episode ends in error."""


def _default_llm(*args, **kwargs) -> LLMResponse:
    from LLM_CALL import get_llm_response

    return get_llm_response(*args, **kwargs)


def expert_policy(domain_policy: str) -> str:
    """The domain policy with its human-transfer lines replaced by the call-expert policy (once)."""
    out, replaced = [], False
    for line in domain_policy.split("\n"):
        if _TRANSFER_LINE.search(line):
            if not replaced:
                out.append(EXPERT_POLICY)
                replaced = True
            continue
        out.append(line)
    if not replaced:
        out += ["", EXPERT_POLICY]
    return "\n".join(out)


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
        self.expert_schemas = [t.openai_schema for t in tools]          # tau2's own tools, as upstream
        self.expert = catalog.tool(EXPERT_TOOL) if experts and any(t.name == EXPERT_TOOL for t in catalog.tools) else None
        self.schemas = [t.openai_schema for t in domain_tools] + (catalog.openai_tools(tools=[self.expert])
                                                                 if self.expert else [])
        self.grammar = None
        if config.constrained:
            from orchestrator.toolcall import message_or_call_grammar
            self.grammar = message_or_call_grammar(self.schemas, config.max_string_chars)

    @property
    def system_prompt(self) -> str:
        policy = expert_policy(self.domain_policy) if self.expert else self.domain_policy
        text = SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION) + AGENT_FORMAT
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
        messages (Qwen's rendering); the oldest tool results are cut to fit the context budget."""
        budgets = self.config.budgets
        messages = [{"role": "system", "content": self.system_prompt}]
        for m in state.messages:
            if isinstance(m, ToolMessage):
                output = self.counter.head(m.content or "", budgets.doc_tokens)
                messages.append({"role": "user", "content": f"<tool_response>\n{output}\n</tool_response>"})
            elif isinstance(m, AssistantMessage):
                said = (m.raw_data or {}).get("policy_text")
                if said is None:
                    said = "\n".join([m.content or ""] + [format_tool_call(tc.name, tc.arguments)
                                                          for tc in m.tool_calls or []]).strip()
                messages.append({"role": "assistant", "content": said})
            else:
                messages.append({"role": "user", "content": m.content or ""})
        total = sum(self.counter.count(m["content"]) for m in messages)
        for m in messages:
            if total <= budgets.context_tokens:
                break
            if m["role"] == "user" and m["content"].startswith("<tool_response>"):
                total -= self.counter.count(m["content"]) - self.counter.count(OMITTED)
                m["content"] = OMITTED
        return messages

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
        content, tool_calls, cost, usage = user_visible(out.text), None, turn.policy_cost, out.usage
        if calls:
            call = turn.tool_call = calls[0]
            try:
                validate_schema_call(call, self.schemas)
                turn.valid = True
            except ToolCallError as exc:   # sent anyway: tau2's environment answers the error, as upstream
                turn.invalid_reason = str(exc)
            if turn.valid and call.name == EXPERT_TOOL:
                turn.expert, reply = self._ask_expert(call.arguments[self.expert.argument], state)
                cost += turn.expert.cost
                usage = usage + turn.expert.usage
                raw["expert"] = {"alias": turn.expert.alias, "model": turn.expert.model, "cost": turn.expert.cost}
                content, tool_calls = (reply.text.split("</think>")[-1].strip(), _tau2_calls(reply.tool_calls)) \
                    if reply is not None else (WAIT, None)
            else:
                content, tool_calls = None, _tau2_calls([call])
                turn.action = call
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

    def _ask_expert(self, alias: str, state: LLMAgentState) -> tuple[ExpertCall, LLMResponse | None]:
        """The alias's expert writes the agent's next message from tau2's own prompt and tools."""
        call = ExpertCall(tool=EXPERT_TOOL, alias=alias, model=self.expert.aliases[alias].model)
        messages = to_openai_messages([SystemMessage(role="system", content=self.expert_system_prompt),
                                       *state.messages])
        started, reply = time.monotonic(), None
        try:
            reply = self.runtime._ask(call, messages, self.catalog, tools=self.expert_schemas)
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
           "EXPERT_TOOL", "TRANSFER_TOOL", "Usage"]
