"""The preflight every run makes before start-up (orchestrator/gateway/preflight.py): each model
it will call has its key or a server that accepts a connection; all problems in one line."""
from __future__ import annotations

import json

import pytest
from _gateway_fakes import FakeServer, dead_url, write_registry

from orchestrator.gateway.endpoints import register_endpoint
from orchestrator.gateway.preflight import PreflightError, check_models


@pytest.fixture
def registry(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLORCHESTRA_ENDPOINTS", str(tmp_path / "endpoints.json"))

    def make(models: dict):
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(write_registry(tmp_path / "models.yaml", models)))
    return make


def test_every_problem_is_named_in_one_line_with_its_fix(registry, tmp_path, monkeypatch):
    monkeypatch.delenv("UNSET_TEST_KEY", raising=False)
    dead = dead_url()
    with FakeServer() as live:
        registry({"paid": {"backend": "anthropic", "api_key_env": "UNSET_TEST_KEY"},
                  "pool": {"backend": "vllm", "model": "org/pool"},
                  "dead": {"backend": "vllm", "base_url": dead},
                  "live": {"backend": "vllm", "base_url": live.url},
                  "local": {"backend": "transformers", "path": "embedded:smollm2-135m"}})
        check_models({"live": "--model", "local": "expert"})     # reachable / in-process: nothing to say
        assert live.hits == 0                                    # a TCP connect, no request sent
        with pytest.raises(PreflightError) as info:
            check_models({"live": "--model", "paid": "--judge-model", "pool": "expert", "dead": "expert",
                          "ghost": "expert"})
    message = str(info.value)
    assert "\n" not in message and message.startswith("preflight: 4 model(s) the run calls cannot be called: ")
    assert "--judge-model paid needs the environment variable UNSET_TEST_KEY" in message
    assert f"expert pool has no replicas in {tmp_path / 'endpoints.json'}: start one" in message
    assert f"expert dead cannot be reached ({dead}: connection refused): start its server" in message
    assert "expert ghost is not in" in message and "--model live" not in message


def test_a_pool_needs_one_live_replica_not_all(registry, tmp_path):
    registry({"pool": {"backend": "vllm", "model": "org/pool"}})
    with FakeServer() as live:
        register_endpoint(tmp_path / "endpoints.json", "org/pool", dead_url())   # keyed by the served id,
        register_endpoint(tmp_path / "endpoints.json", "org/pool", live.url)    # as the gateway's pool reads it
        check_models({"pool": "expert"})
        (tmp_path / "endpoints.json").write_text(json.dumps({"org/pool": [{"base_url": dead_url()}]}))
        with pytest.raises(PreflightError, match="expert pool cannot be reached"):
            check_models({"pool": "expert"})


def test_evaluation_fails_before_the_run_when_an_expert_is_on_a_dead_port(tmp_path, monkeypatch, capsys):
    from evaluation.qa_cli import main
    from orchestrator.catalog import load_catalog

    dead = dead_url()
    models = {m: {"backend": "vllm", "base_url": dead, "price_model": "Qwen3-32B"}
              for m in {s.model for t in load_catalog().tools for s in t.aliases.values()}}
    models["smollm2-135m"] = {"backend": "transformers", "path": "embedded:smollm2-135m", "price_model": "Qwen3-8B"}
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(write_registry(tmp_path / "models.yaml", models)))
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"id": "q1", "question": "2+2?", "answer": "4"}) + "\n")
    code = main("frames", ["--profile", "paper", "--data", str(data), "--judge-model", "exact",
                           "--output", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "error: preflight: " in err and f"({dead}: connection refused)" in err, err
    assert not (tmp_path / "o" / "results.jsonl").exists()
