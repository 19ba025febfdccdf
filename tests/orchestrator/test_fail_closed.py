"""Runs that fail closed (issue 15): a configuration error shared by every call stops the
run with that reason and a non-zero exit; an impossible device fails before start-up with
one line; stale checkpoint temp folders are removed at start."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.fail_closed import FailClosed, Watch, config_reason, shared_config_reason

REPO = Path(__file__).resolve().parents[2]
BAD = "GatewayConfigError: models.yaml: models.gpt-5.backend: Input should be 'openai', 'azure'"


def test_shared_config_reason_needs_every_call_failed_for_one_configuration_reason():
    assert shared_config_reason([BAD, BAD, BAD]) == BAD
    assert shared_config_reason([BAD, None, BAD]) is None                      # one call succeeded
    assert shared_config_reason([BAD, "LLMCallError: gpt-5 timed out"]) is None  # transient, not config
    assert shared_config_reason([BAD, "UnknownModelError: 'x' not in models.yaml"]) is None  # two reasons
    assert shared_config_reason([]) is None                                    # no call at all
    # the reason is found inside wrappers: a policy failure, an evaluation error record
    wrapped = f"RuntimeError: error: policy: {BAD} (after 0 turns)"
    assert config_reason(wrapped) == BAD and config_reason("error: policy: " + BAD) == BAD


def test_evaluation_watch_stops_after_a_window_of_config_failures_only():
    watch = Watch(window=3)
    watch.add([BAD])
    watch.add([])              # a task that made no call does not count
    watch.add([BAD, BAD])
    with pytest.raises(FailClosed, match="last 3 tasks.*GatewayConfigError"):
        watch.add([BAD])
    mixed = Watch(window=2)
    for calls in ([BAD], [None], [BAD]):
        mixed.add(calls)       # a success inside the window keeps the run going


def test_evaluation_run_stops_with_the_reason(tmp_path):
    from evaluation.runner import ResultsFile, RunError, run_tasks

    @dataclass
    class T:
        id: str

    def solve(task):
        raise RuntimeError(f"error: policy: {BAD} (after 0 turns)")

    with ResultsFile(tmp_path / "r.jsonl") as results:
        with pytest.raises(RunError, match="every call failed with the same configuration error.*backend"):
            run_tasks([T(f"t{i}") for i in range(50)], solve, results, concurrency=4, progress=False)
    written = (tmp_path / "r.jsonl").read_text().splitlines()
    assert 4 <= len(written) < 50      # stopped after the first window, not at the end


def _bad_registry(tmp_path: Path) -> Path:
    path = tmp_path / "models.yaml"
    names = ("gpt-5", "Qwen3-32B", "Qwen2.5-Coder-32B-Instruct")
    path.write_text("models:\n" + "".join(f"  {n}: {{backend: telepathy, model: {n}}}\n" for n in names))
    return path


def test_training_with_an_invalid_backend_stops_before_start_up_with_exit_1(tmp_path, train_world, monkeypatch, capsys):
    # the preflight (orchestrator/gateway/preflight.py) reads the registry before start-up (issue 28);
    # it used to stop at step 1, every call having failed with this configuration error
    from _train_world import overrides
    from training.metrics_log import read_metrics
    from training.train import main

    policy, tasks = train_world
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(_bad_registry(tmp_path)))
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    code = main(["--config", str(config), *overrides(tmp_path, policy, tasks, **{"trainer.total_steps": 3})])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert err[-1].startswith(f"error: {tmp_path / 'models.yaml'}: models.") and "backend" in err[-1], err[-1]
    metrics = tmp_path / "run" / "metrics.jsonl"
    assert not metrics.exists() or read_metrics(metrics) == []


def test_cuda_on_a_machine_without_it_fails_before_start_up_with_one_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    config = tmp_path / "c.yaml"
    config.write_text("{}\n")
    done = subprocess.run([sys.executable, "training/train.py", "--config", str(config), "run.device=cuda",
                           f"run.dir={tmp_path / 'run'}", f"model.path={tmp_path / 'absent'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: run.device=cuda: this machine has no usable CUDA GPU")
    assert not (tmp_path / "run").exists()   # before start-up: nothing written


def test_check_device_names_the_key_and_the_count(monkeypatch):
    import torch

    from training.config import ConfigError
    from training.preflight import check_device

    check_device("cpu")
    with pytest.raises(ConfigError, match="run.device: 'gpu0' is not a device"):
        check_device("gpu0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda:1")
    with pytest.raises(ConfigError, match=r"run.device=cuda:2: this machine has 2 CUDA GPU\(s\), cuda:0..cuda:1"):
        check_device("cuda:2")


def test_stale_checkpoint_temp_folders_are_removed_live_ones_kept(tmp_path):
    from training.checkpoint import remove_stale_temps

    dead = subprocess.Popen(["true"])
    dead.wait()
    root = tmp_path / "checkpoints"
    stale = root / f".step-00000003.tmp-{dead.pid}"
    (stale / "model").mkdir(parents=True)
    (stale / "model" / "weights.bin").write_bytes(b"x" * 10)
    live = root / f".step-00000004.tmp-{os.getpid()}"
    live.mkdir()
    kept = root / "step-00000002"
    kept.mkdir()
    assert remove_stale_temps(root) == [stale]
    assert not stale.exists() and live.exists() and kept.exists()
    assert remove_stale_temps(tmp_path / "absent") == []


def test_training_start_removes_a_killed_saves_temp_folder(tmp_path, train_world, capsys):
    from _train_world import fake_runtime, overrides
    from training.config import load_config
    from training.session import run

    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / "run" / "checkpoints" / f".step-00000001.tmp-{dead.pid}"
    stale.mkdir(parents=True)
    policy, tasks = train_world
    run(load_config(None, overrides(tmp_path, policy, tasks, **{"trainer.total_steps": 1})), runtime=fake_runtime())
    assert not stale.exists() and f"removed {stale}" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "checkpoints" / "step-00000001" / "manifest.json").read_text())["step"] == 1


def _gateway_errors(tmp_path, monkeypatch) -> dict[str, str]:
    """The gateway's own words for each failure, from real local servers (not hand-written)."""
    sys.path.insert(0, str(REPO / "tests" / "orchestrator" / "gateway"))
    from _gateway_fakes import FakeServer, dead_url, write_registry

    from LLM_CALL import get_llm_response

    out = {}
    with FakeServer(["401"]) as s401, FakeServer(["404"]) as s404, FakeServer(["400"]) as s400, \
            FakeServer(["500"]) as s500:
        entry = {"backend": "vllm", "price_model": "Qwen3-32B", "max_retries": 1}
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(write_registry(tmp_path / "models.yaml", {
            "401": {**entry, "base_url": s401.url}, "404": {**entry, "base_url": s404.url},
            "400": {**entry, "base_url": s400.url}, "500": {**entry, "base_url": s500.url},
            "refused": {**entry, "base_url": dead_url()},
            "nokey": {"backend": "openai", "api_key_env": "UNSET_TEST_KEY", "price_model": "Qwen3-32B"}})))
        monkeypatch.delenv("UNSET_TEST_KEY", raising=False)
        for name in ("401", "404", "400", "500", "refused", "nokey"):
            try:
                get_llm_response(name, [{"role": "user", "content": "x"}])
            except Exception as exc:   # noqa: BLE001 - recorded as the runtime records it
                out[name] = f"{type(exc).__name__}: {exc}"
    return out


def _step(*errors: str | None):
    from orchestrator.records import ExpertCall, Rollout, Turn

    turns = [Turn(index=i, expert=ExpertCall(tool="answer", alias="a", model="m", error=e)) for i, e in enumerate(errors)]
    return [[Rollout(task_id="t", turns=turns)]]


def test_permanent_and_unreachable_failures_are_told_apart_from_transient_ones(tmp_path, monkeypatch):
    from orchestrator.fail_closed import PERMANENT, UNREACHABLE, check_step

    errors = _gateway_errors(tmp_path, monkeypatch)
    assert [n for n in errors if PERMANENT.search(errors[n])] == ["401", "404", "nokey"]
    assert [n for n in errors if UNREACHABLE.search(errors[n])] == ["refused"]
    # one refused key among good calls stops the step; transient errors (400 context, 500) never do
    with pytest.raises(FailClosed, match=r"step 3: 1 of 3 calls failed with an error no retry can fix.*HTTP 401"):
        check_step(_step(None, errors["500"], errors["401"]), 3)
    check_step(_step(errors["400"], errors["500"], None), 3)
    # unreachable endpoints stop it only when every call failed so
    check_step(_step(errors["refused"], None), 1)
    with pytest.raises(FailClosed, match=r"step 1: every call failed, no endpoint could be reached.*refused"):
        check_step(_step(errors["refused"], errors["refused"]), 1)


def test_expert_watch_counts_failures_in_a_row_and_steps_whose_calls_all_failed():
    """Training's expert calls (orchestrator/fail_closed.py ExpertWatch): `limit` failures in a row
    trip it (later calls fail at once, without reaching the expert); a step whose calls all failed
    fails `check`; a request the provider refuses as such (400) is an answer, not a failure."""
    from orchestrator.fail_closed import ExpertWatch
    from orchestrator.gateway.errors import LLMCallError, ProviderRejected

    script, reached = [], []

    def llm(model, messages, **kw):
        reached.append(model)
        outcome = script.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    down = LLMCallError("m: gave up after 4 attempt(s); last endpoint http://h:1/v1: HTTP 500: internal error",
                        model="m", endpoint="http://h:1/v1", attempts=4, retryable=True)
    too_long = ProviderRejected("m: request rejected (HTTP 400 from http://h:1/v1, not retried): too long",
                                model="m", endpoint="http://h:1/v1", status=400)
    watch = ExpertWatch(llm, limit=3)

    def call():
        try:
            return watch("m", [{"role": "user", "content": "x"}])
        except Exception as exc:   # noqa: BLE001 - the runtime records it on the turn
            return exc

    script += [down, down, too_long, down, "ok", down, "ok"]
    for _ in range(7):
        call()
    watch.check(1)                 # failures, but never 3 in a row and not all of the step's
    script += [down, down, down]
    for _ in range(3):
        call()
    assert isinstance(call(), FailClosed) and len(reached) == 10     # tripped: the 11th never reached the expert
    with pytest.raises(FailClosed, match=r"^step 2: 3 expert calls in a row failed, stopping .*tools\.max_consecutive"
                                         r"_failures.*the last: m at http://h:1/v1: LLMCallError: after 4 attempt\(s\): "
                                         r"HTTP 500: internal error$"):
        watch.check(2)

    every = ExpertWatch(llm, limit=0)     # no limit in a row; a step of failed calls still stops
    script += [down, down]
    for _ in range(2):
        try:
            every("m", [])
        except LLMCallError:
            pass
    with pytest.raises(FailClosed, match=r"^step 5: no usable sample, all 2 expert calls failed"):
        every.check(5)
    every.check(6)                 # a step with no call at all is not a failed one
