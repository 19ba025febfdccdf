"""The babysitter's decisions (training/babysitter.py) against a scripted Slurm and real HTTP servers.

tests/training/test_slurm.py runs the same code against a real Slurm; here every branch is driven
on purpose: give-up limits, stalled training, hung services, the endpoints sweep, config
errors.
"""
from __future__ import annotations

import http.server
import json
import threading

import pytest

from orchestrator.gateway.endpoints import read_endpoints, register_endpoint
from training.distributed.slurm import JobInfo, SlurmError
from training.babysitter import (Babysitter, BabysitterConfig, BabysitterConfigError, load_babysitter_config,
                             server_root)


class FakeSlurm:
    """Jobs get ids 100, 101, ...; the test sets their states."""

    def __init__(self):
        self.jobs: dict[str, JobInfo] = {}
        self.submitted: list[tuple[str, list[str], dict]] = []
        self.cancelled: list[str] = []
        self.fail_next_submit = False

    def submit(self, script, sbatch_args=(), env=None, cwd=None):
        if self.fail_next_submit:
            self.fail_next_submit = False
            raise SlurmError("sbatch: error: QOSMaxSubmitJobPerUserLimit")
        job_id = str(100 + len(self.submitted))
        self.submitted.append((script, list(sbatch_args), dict(env or {})))
        self.jobs[job_id] = JobInfo(job_id, "PENDING")
        return job_id

    def job(self, job_id):
        return self.jobs.get(job_id, JobInfo(job_id, "UNKNOWN"))

    def cancel(self, job_id, signal=None):
        self.cancelled.append(job_id)
        self.jobs[job_id] = JobInfo(job_id, "CANCELLED", "0:15", self.jobs[job_id].nodes)

    def end(self, job_id, state, exit_code="0:0", nodes=("node1",)):
        self.jobs[job_id] = JobInfo(job_id, state, exit_code, nodes)

    def run(self, job_id, nodes=("node1",)):
        self.jobs[job_id] = JobInfo(job_id, "RUNNING", None, nodes)


@pytest.fixture()
def health_server():
    """A real HTTP server whose /health answers 200 until `.healthy = False`."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" and server.healthy else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.healthy = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()


def _config(tmp_path, **extra) -> BabysitterConfig:
    data = {"state_dir": str(tmp_path / "state"), "endpoints_file": str(tmp_path / "endpoints.json"),
            "unhealthy_after": 2, "max_resubmits": 2, "max_stalled": 2,
            "jobs": [{"name": "train", "kind": "batch", "script": "slurm/train.sbatch",
                      "checkpoints": str(tmp_path / "ckpt"), "env": {"CONFIG": "c.yaml"}},
                     {"name": "experts", "kind": "service", "script": "slurm/serve_experts.sbatch",
                      "keys": ["Qwen3-32B"], "start_timeout_s": 0.01}]}
    data.update(extra)
    return BabysitterConfig.model_validate(data)


def _checkpoint(tmp_path, step: int) -> None:
    folder = tmp_path / "ckpt" / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{}")


def test_first_pass_submits_every_job_with_its_env_and_name(tmp_path):
    slurm = FakeSlurm()
    Babysitter(_config(tmp_path, sbatch_args=["--account=abc"]), slurm).tick()
    (script, args, env), (script2, _, _) = slurm.submitted
    assert script == "slurm/train.sbatch" and script2 == "slurm/serve_experts.sbatch"
    assert args == ["--job-name=train", "--account=abc"]
    assert env["CONFIG"] == "c.yaml" and env["TOOLORCHESTRA_ENDPOINTS"].endswith("endpoints.json")
    saved = json.loads((tmp_path / "state" / "jobs.json").read_text())["jobs"]
    assert saved["train"]["job_id"] == "100" and saved["experts"]["job_id"] == "101"


def test_training_is_resubmitted_after_timeout_until_it_completes(tmp_path):
    slurm, cfg = FakeSlurm(), _config(tmp_path)
    sitter = Babysitter(cfg, slurm)
    sitter.tick()
    _checkpoint(tmp_path, 5)
    slurm.end("100", "TIMEOUT", "0:15")
    sitter.tick()
    assert sitter.job_state("train")["job_id"] == "102" and sitter.job_state("train")["last_step"] == 5
    slurm.end("102", "COMPLETED", "0:0")
    sitter.tick()
    sitter.tick()
    assert sitter.job_state("train")["done"] and len([s for s in slurm.submitted if "train" in s[1][0]]) == 2
    assert sitter.finished()


def test_training_that_ends_without_new_checkpoints_is_given_up(tmp_path):
    slurm, sitter = FakeSlurm(), Babysitter(_config(tmp_path, max_resubmits=10), FakeSlurm())
    sitter.slurm = slurm
    _checkpoint(tmp_path, 3)
    sitter.tick()
    for _ in range(2):   # max_stalled = 2: two crashes at the same checkpoint
        slurm.end(sitter.job_state("train")["job_id"], "FAILED", "1:0")
        sitter.tick()
    assert "without a new checkpoint" in sitter.job_state("train")["gave_up"]
    assert sitter.job_state("train")["submits"] == 2


def test_resubmits_are_bounded(tmp_path):
    slurm = FakeSlurm()
    sitter = Babysitter(_config(tmp_path), slurm)
    sitter.tick()
    for step in range(1, 5):   # progress every time, so only max_resubmits (2) stops it
        _checkpoint(tmp_path, step)
        slurm.end(sitter.job_state("train")["job_id"], "PREEMPTED", "0:15")
        sitter.tick()
    st = sitter.job_state("train")
    assert st["submits"] == 3 and "max_resubmits" in st["gave_up"]


def test_dead_service_loses_its_replicas_and_is_resubmitted(tmp_path, health_server):
    slurm, cfg = FakeSlurm(), _config(tmp_path)
    sitter = Babysitter(cfg, slurm)
    sitter.tick()
    ep = tmp_path / "endpoints.json"
    register_endpoint(ep, "Qwen3-32B", "http://node1:8000/v1")      # on the job's node
    register_endpoint(ep, "Qwen3-32B", f"http://127.0.0.1:{health_server.server_port}/v1")   # another, healthy
    slurm.end("101", "NODE_FAIL", "0:0", nodes=("node1",))
    sitter.tick()
    urls = [r.base_url for r in read_endpoints(ep)["Qwen3-32B"]]
    assert urls == [f"http://127.0.0.1:{health_server.server_port}/v1"]
    assert sitter.job_state("experts")["job_id"] == "102"


def test_sweep_drops_a_replica_after_unhealthy_after_failed_checks(tmp_path, health_server):
    cfg = _config(tmp_path, jobs=[{"name": "t", "kind": "batch", "script": "x.sbatch"}])
    sitter = Babysitter(cfg, FakeSlurm())
    ep = tmp_path / "endpoints.json"
    url = f"http://127.0.0.1:{health_server.server_port}/v1"
    register_endpoint(ep, "retrieval", url)
    sitter.sweep_endpoints()
    health_server.healthy = False
    sitter.sweep_endpoints()                       # 1 failure: kept (unhealthy_after = 2)
    assert read_endpoints(ep)["retrieval"][0].base_url == url
    sitter.sweep_endpoints()                       # 2 in a row: removed
    assert "retrieval" not in read_endpoints(ep)


def test_running_service_without_a_healthy_replica_is_cancelled_after_start_timeout(tmp_path):
    slurm, now = FakeSlurm(), [1000.0]
    sitter = Babysitter(_config(tmp_path), slurm, clock=lambda: now[0])   # start_timeout_s = 0.01
    sitter.tick()
    slurm.run("101", nodes=("node7",))
    register_endpoint(tmp_path / "endpoints.json", "Qwen3-32B", "http://node7:1/v1")   # nothing listens
    sitter.tick()                                  # first seen RUNNING: the start timeout begins
    assert slurm.cancelled == []
    now[0] += 1.0
    sitter.tick()                                  # 1 unhealthy pass (unhealthy_after = 2)
    assert slurm.cancelled == []
    sitter.tick()
    assert slurm.cancelled == ["101"]
    sitter.tick()                                  # seen ended: resubmitted
    assert sitter.job_state("experts")["job_id"] != "101"


def test_failed_sbatch_is_retried_next_pass_and_stop_file_pauses(tmp_path):
    slurm = FakeSlurm()
    slurm.fail_next_submit = True
    sitter = Babysitter(_config(tmp_path), slurm)
    sitter.tick()
    assert sitter.job_state("train")["job_id"] is None and sitter.job_state("experts")["job_id"] == "100"
    (tmp_path / "state" / "STOP").touch()
    sitter.tick()
    assert sitter.job_state("train")["job_id"] is None
    (tmp_path / "state" / "STOP").unlink()
    sitter.tick()
    assert sitter.job_state("train")["job_id"] == "101"


def test_config_errors_name_the_field(tmp_path, monkeypatch):
    path = tmp_path / "c.yaml"
    path.write_text("state_dir: s\njobs: [{name: a, kind: batch, script: x, sbatch_args: ['--account=${NO_SUCH_VAR}']}]")
    monkeypatch.delenv("NO_SUCH_VAR", raising=False)
    with pytest.raises(BabysitterConfigError, match=r"sbatch_args\[0\]: \$NO_SUCH_VAR is not set"):
        load_babysitter_config(path)
    monkeypatch.setenv("NO_SUCH_VAR", "proj1")
    assert load_babysitter_config(path).jobs[0].sbatch_args == ["--account=proj1"]
    path.write_text("state_dir: s\njobs: [{name: a, kind: daemon, script: x}]")
    with pytest.raises(BabysitterConfigError, match=r"jobs\.0\.kind"):
        load_babysitter_config(path)
    path.write_text("state_dir: s\npoll: 3\njobs: [{name: a, kind: batch, script: x}]")
    with pytest.raises(BabysitterConfigError, match="poll"):
        load_babysitter_config(path)


def test_server_root_strips_the_openai_suffix():
    assert server_root("http://n1:8000/v1") == "http://n1:8000"
    assert server_root("http://n1:8000/v1/") == "http://n1:8000"
    assert server_root("http://n1:8001") == "http://n1:8001"


def test_the_example_cluster_config_loads(monkeypatch):
    from pathlib import Path

    for var in ("SLURM_ACCOUNT", "SLURM_PARTITION", "RUN", "MODELS_DIR"):
        monkeypatch.setenv(var, f"/x/{var.lower()}")
    cfg = load_babysitter_config(Path(__file__).resolve().parents[2] / "slurm" / "cluster.example.yaml")
    assert [j.name for j in cfg.jobs] == ["experts-a", "experts-b", "retrieval", "train"]
    assert cfg.sbatch_args == ["--account=/x/slurm_account", "--partition=/x/slurm_partition"]
    assert cfg.jobs[0].env["MODELS"].split() == ["Qwen3-32B=/x/models_dir/Qwen3-32B:4",
                                                 "Qwen2.5-Coder-32B-Instruct=/x/models_dir/Qwen2.5-Coder-32B-Instruct:4"]
