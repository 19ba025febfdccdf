"""Training fails closed on models it cannot call (issue 28): before start-up, every model the
run will call must be reachable or have its key (orchestrator/gateway/preflight.py, the one check
evaluation uses too); during the run, a step whose calls fail with an error no retry can fix
(a refused key, an unknown model) stops the run instead of training on nothing."""
from __future__ import annotations

import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "orchestrator" / "gateway"))
from test_gateway_fakes import FakeServer, dead_url, write_registry  # noqa: E402

KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY")


def _train(tmp_path, train_world, capsys, *extra) -> tuple[int, list[str]]:
    from _train_world import overrides
    from training.train import main

    policy, tasks = train_world
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    code = main(["--config", str(config), *overrides(tmp_path, policy, tasks, **{"trainer.total_steps": 2}), *extra])
    return code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _nothing_trained(tmp_path) -> bool:
    from training.metrics_log import read_metrics

    metrics = tmp_path / "run" / "metrics.jsonl"
    return not metrics.exists() or read_metrics(metrics) == []


def test_paper_profile_without_keys_or_replicas_fails_before_start_up(tmp_path, train_world, monkeypatch, capsys):
    """The probe: `tools.profile=paper`, no API keys, no vLLM replicas; it used to run its steps
    with every expert call failing (`train/samples 0.0`) and exit 0."""
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("TOOLORCHESTRA_ENDPOINTS", str(tmp_path / "endpoints.json"))   # no replicas
    code, err = _train(tmp_path, train_world, capsys, "tools.profile=paper")
    assert code == 1 and err[-1].startswith("error: preflight: "), err
    line = err[-1]
    assert "expert gpt-5" in line and "OPENAI_API_KEY" in line and "set it" in line, line
    assert "expert Qwen3-32B" in line and "no replicas" in line and "endpoints.json" in line, line
    assert _nothing_trained(tmp_path)


def test_experts_on_a_dead_port_fail_before_start_up_naming_the_endpoint(tmp_path, train_world, monkeypatch, capsys):
    url = dead_url()
    names = ("gpt-5", "Qwen3-32B", "Qwen2.5-Coder-32B-Instruct")
    registry = write_registry(tmp_path / "models.yaml", {n: {"backend": "vllm", "base_url": url,
                                                                 "price_model": "Qwen3-32B"} for n in names})
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(registry))
    code, err = _train(tmp_path, train_world, capsys, "tools.profile=paper")
    assert code == 1 and err[-1].startswith("error: preflight: "), err
    assert f"{url}: connection refused" in err[-1] and "expert Qwen3-32B" in err[-1], err[-1]
    assert _nothing_trained(tmp_path)


def test_a_key_the_provider_refuses_stops_the_run_at_step_1(tmp_path, train_world, monkeypatch, capsys):
    """Reachable and keyed at start-up, but the provider answers 401 to every call: the step stops
    the run (exit 1) before it updates anything, naming model, endpoint and the provider's words."""
    names = ("gpt-5", "Qwen3-32B", "Qwen2.5-Coder-32B-Instruct")
    with FakeServer(["401"]) as srv:
        registry = write_registry(tmp_path / "models.yaml", {n: {"backend": "vllm", "base_url": srv.url,
                                                                     "price_model": "Qwen3-32B"} for n in names})
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(registry))
        code, err = _train(tmp_path, train_world, capsys, "tools.profile=paper")
    assert code == 1, err
    assert err[-1].startswith("error: step 1: ") and "HTTP 401" in err[-1] and srv.url in err[-1], err[-1]
    assert _nothing_trained(tmp_path)
