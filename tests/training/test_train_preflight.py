"""Training fails closed on models it cannot call (issues 28, 45): before start-up, every model the
run will call must be reachable or have its key (orchestrator/gateway/preflight.py, the one check
evaluation uses too) and answer one tiny real request (a port that accepts TCP but answers 500, an
HTML page or nothing fails it); during the run, a step whose calls fail with an error no retry can
fix (a refused key, an unknown model), `tools.max_consecutive_failures` expert calls failing in a
row, or a step whose expert calls all failed stops the run instead of training on nothing."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "orchestrator" / "gateway"))
from _gateway_fakes import FakeServer, dead_url, write_registry  # noqa: E402

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
        code, err = _train(tmp_path, train_world, capsys, "tools.profile=paper", "tools.preflight_timeout=0")
    assert code == 1, err
    assert err[-1].startswith("error: step 1: ") and "HTTP 401" in err[-1] and srv.url in err[-1], err[-1]
    assert _nothing_trained(tmp_path)


NAMES = ("gpt-5", "Qwen3-32B", "Qwen2.5-Coder-32B-Instruct")
REPO = Path(__file__).resolve().parents[2]


def _train_subprocess(tmp_path, train_world, registry: Path, *extra) -> subprocess.CompletedProcess:
    """`python -m training.train` on the tiny world (tests/_train_world.py) with `registry` as the models."""
    env = {**os.environ, "TOOLORCHESTRA_MODELS": str(registry)}
    return subprocess.run([sys.executable, "-m", "training.train", *_cli_args(tmp_path, train_world, *extra)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _train_cli(tmp_path, train_world, registry: Path, monkeypatch, capsys, *extra) -> SimpleNamespace:
    """The same command line as `_train_subprocess`, through `training.train.main` in this process
    (the subprocess's ~5 s of imports saved; the test above runs the real command): its exit code
    and stderr, as a CompletedProcess has them."""
    from training.train import main

    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(registry))
    capsys.readouterr()
    code = main(_cli_args(tmp_path, train_world, *extra))
    return SimpleNamespace(returncode=code, stderr=capsys.readouterr().err)


def _cli_args(tmp_path, train_world, *extra) -> list[str]:
    from _train_world import overrides

    policy, tasks = train_world
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    return ["--config", str(config), *overrides(tmp_path, policy, tasks), "tools.profile=paper", *extra]


def _one_error_line(proc: subprocess.CompletedProcess | SimpleNamespace) -> str:
    """The run's error: the last line of stderr, one line, no traceback anywhere."""
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1 and lines and lines[-1].startswith("error: "), (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[-1]


def test_experts_answering_500_html_or_nothing_fail_the_start_up_check_in_one_line(tmp_path, train_world):
    """The probe of issue 45: each port accepts TCP, so the TCP check passed and training ran its steps
    with every call failing, then exited 0.  Now the start-up request to each expert fails, naming the
    endpoint and what came back, before anything is trained."""
    with FakeServer(["500"]) as s500, FakeServer(["html"]) as html, FakeServer(["stall"], stall_s=60) as silent:
        servers = dict(zip(NAMES, (s500, html, silent)))
        registry = write_registry(tmp_path / "models.yaml", {n: {"backend": "vllm", "base_url": srv.url,
                                                                     "price_model": "Qwen3-32B"}
                                                                 for n, srv in servers.items()})
        proc = _train_subprocess(tmp_path, train_world, registry, "tools.preflight_timeout=2")
    line = _one_error_line(proc)
    assert line.startswith("error: preflight: 3 model(s) the run calls cannot be called: "), line
    for part in (f"expert gpt-5 failed its test request at {s500.url}: LLMCallError: after 1 attempt(s): HTTP 500",
                 f"expert Qwen3-32B failed its test request at {html.url}: LLMCallError: after 1 attempt(s): "
                 f"HTTP 200 reply is not JSON",
                 f"expert Qwen2.5-Coder-32B-Instruct failed its test request at {silent.url}: LLMCallError: after "
                 f"1 attempt(s): timed out"):
        assert part in line, (part, line)
    assert line.endswith(f"(a test request: max_tokens 1, no retry, 2 s): fix each server or its entry in {registry}")
    assert [s.hits for s in (s500, html, silent)] == [1, 1, 1]     # one request each, no retry
    assert _nothing_trained(tmp_path)


def test_expert_calls_failing_in_a_row_stop_the_run_naming_the_endpoint(tmp_path, train_world, monkeypatch, capsys):
    """Healthy at start-up (the first 3 requests, one per expert, are answered), then every call
    answers 500: the 3rd failure in a row (tools.max_consecutive_failures=3) stops step 1, exit 1."""
    with FakeServer(["ok", "ok", "ok", "500"]) as srv:
        registry = write_registry(tmp_path / "models.yaml", {n: {"backend": "vllm", "base_url": srv.url,
                                                                     "price_model": "Qwen3-32B", "max_retries": 0}
                                                                 for n in NAMES})
        proc = _train_cli(tmp_path, train_world, registry, monkeypatch, capsys, "tools.max_consecutive_failures=3")
    line = _one_error_line(proc)
    assert line.startswith("error: step 1: 3 expert calls in a row failed, stopping"), line
    assert f"at {srv.url}: LLMCallError: after 1 attempt(s): HTTP 500: internal error" in line, line
    assert "tools.max_consecutive_failures" in line, line
    assert srv.hits < 3 + 3 + 4     # stopped at the limit: the calls in flight then, no more
    assert _nothing_trained(tmp_path)


def test_a_step_whose_expert_calls_all_failed_stops_the_run(tmp_path, train_world, monkeypatch, capsys):
    """No limit on failures in a row, but every expert call of step 1 failed: the step has no usable
    sample (each rollout was scored on failed tools), so the run stops instead of training on it."""
    with FakeServer(["ok", "ok", "ok", "500"]) as srv:
        registry = write_registry(tmp_path / "models.yaml", {n: {"backend": "vllm", "base_url": srv.url,
                                                                     "price_model": "Qwen3-32B", "max_retries": 0}
                                                                 for n in NAMES})
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(registry))
        code, err = _train(tmp_path, train_world, capsys, "tools.profile=paper", "tools.max_consecutive_failures=0")
    assert code == 1, err
    calls = srv.hits - 3
    assert err[-1].startswith(f"error: step 1: no usable sample, all {calls} expert calls failed"), err[-1]
    assert f"at {srv.url}: LLMCallError: after 1 attempt(s): HTTP 500" in err[-1], err[-1]
    assert _nothing_trained(tmp_path)


def test_the_settings_are_validated(tmp_path):
    from training.config import ConfigError, load_config

    for key, value in (("tools.max_consecutive_failures", -1), ("tools.preflight_timeout", -2)):
        with pytest.raises(ConfigError, match=rf"^{key}: must be >= 0"):
            load_config(None, [f"{key}={value}"])
    assert load_config(None, []).tools.max_consecutive_failures == 16


@pytest.mark.parametrize("case", ["empty train file", "misspelt profile"])
def test_bad_inputs_are_one_line_before_anything_is_written(tmp_path, train_world, case, monkeypatch, capsys):
    """An empty data.train_files JSONL was a 26-line traceback from `datasets`; a misspelt
    tools.profile failed after the run folder was made.  Both are one line now, naming the file or
    the key (with the closest profile name), exit 1, and the run folder is not created."""
    registry = write_registry(tmp_path / "models.yaml", {n: {"backend": "vllm", "base_url": dead_url(),
                                                                 "price_model": "Qwen3-32B"} for n in NAMES})
    if case == "empty train file":
        empty = tmp_path / "empty.jsonl"
        empty.write_text("\n")
        proc = _train_cli(tmp_path, train_world, registry, monkeypatch, capsys, f"data.train_files=[{empty}]")
        expected = f"error: data.train_files: {empty} holds no task records (empty); write one JSON object per line"
    else:
        proc = _train_cli(tmp_path, train_world, registry, monkeypatch, capsys, "tools.profile=papr")
        expected = "error: tools.profile: profile "
    line = _one_error_line(proc)
    assert line.startswith(expected), line
    if case == "misspelt profile":
        assert "papr.yaml: no such file; did you mean 'paper'?" in line, line
    assert not (tmp_path / "run").exists()


def test_paths_the_config_names_are_checked_before_start_up(tmp_path):
    from training.config import ConfigError, load_config
    from training.preflight import check_paths

    cases = {"tools.catalog": ("tools.catalog", "no such file"), "tools.index": ("tools.index", "no such folder"),
             "tools.prompts": ("tools.prompts", "no such folder"), "model.path": ("model.path", "no such folder"),
             "model.reference": ("model.reference", "no such folder")}
    for key, (named, problem) in cases.items():
        with pytest.raises(ConfigError, match=rf"^{named}: {tmp_path}/nope: {problem}"):
            check_paths(load_config(None, [f"{key}={tmp_path}/nope"]))
    check_paths(load_config(None, ["model.path=Qwen/Qwen3-8B", f"tools.index={tmp_path}"]))   # a hub id; a folder
