"""slurm/train.sbatch + the babysitter (training/babysitter.py) against a real Slurm cluster.

Uses the Slurm found on this machine (CI starts a one-node cluster with
slurm/ci_setup_local_slurm.sh); skips, saying so, when there is none.  The training job is
training/train.py's `run` on the tiny world of tests/_train_world.py (tiny random policy,
scripted experts: CPU, ~2 s a step); this file is its stand-in entry point (`__main__`).

The story: the babysitter submits a training job and a (fake) expert service; the service
registers itself in the endpoints file; we scancel both mid-run; the next babysitter pass
removes the dead replica, resubmits both, and training resumes from its checkpoint: the
step counter continues instead of starting over.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # real Slurm jobs (~2-3 min)

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS = 6

FAKE_SERVICE = """#!/usr/bin/env bash
#SBATCH --output={out}/%x-%j.out
exec {python} -c '
import http.server, socket, sys
sys.path.insert(0, "{repo}")
from orchestrator.gateway.endpoints import register_endpoint

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("0.0.0.0", 0), Health)
register_endpoint("{endpoints}", "fake-expert", f"http://{{socket.gethostname()}}:{{server.server_port}}/v1")
server.serve_forever()
'
"""


def _slurm_or_skip():
    from training.distributed.slurm import Slurm

    reason = Slurm.unavailable_reason()
    if reason:
        pytest.skip(f"no usable Slurm here ({reason}); CI starts one with `sudo slurm/ci_setup_local_slurm.sh`")
    return Slurm()


def _wait(what: str, predicate, timeout: float, logs: list[Path] = ()):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    tails = "\n".join(f"--- {p}\n{p.read_text()[-3000:]}" for p in logs if p.exists())
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what}\n{tails}")


def _babysit(config: Path, *flags: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "training.babysitter", "--config", str(config), *flags],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stderr


def _steps_logged(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line)["step"] for line in path.read_text().splitlines()] if path.exists() else []


def _checkpoint_steps(run_dir: Path) -> list[int]:
    from training.checkpoint import list_checkpoints

    return [int(p.name.split("-")[1]) for p in list_checkpoints(run_dir / "checkpoints")]


def test_cancelled_training_and_service_are_resubmitted_and_training_resumes(tmp_path):
    slurm = _slurm_or_skip()
    from _train_world import build_policy, overrides, write_tasks
    from orchestrator.gateway.endpoints import read_endpoints
    from training.config import load_config, save_config

    # the tiny world and a training config: checkpoint every step, TOTAL_STEPS steps
    policy, tasks = build_policy(tmp_path / "policy"), write_tasks(tmp_path / "tasks.jsonl")
    run_dir, logs, endpoints = tmp_path / "run", tmp_path / "logs", tmp_path / "endpoints.json"
    logs.mkdir()
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **{
        "trainer.total_steps": TOTAL_STEPS, "logging.console": "true", "run.threads": 1}))
    save_config(cfg, tmp_path / "train.yaml")
    (tmp_path / "fake_service.sbatch").write_text(FAKE_SERVICE.format(
        out=logs, python=sys.executable, repo=REPO, endpoints=endpoints))
    sitter_config = tmp_path / "cluster.yaml"
    sitter_config.write_text(json.dumps({
        "state_dir": str(tmp_path / "sitter"), "endpoints_file": str(endpoints), "poll_s": 1,
        "unhealthy_after": 1, "max_resubmits": 3,
        "sbatch_args": ["--cpus-per-task=1", "--time=10", f"--output={logs}/%x-%j.out"],
        "env": {"PYTHON": sys.executable, "REPO": str(REPO)},
        "jobs": [
            {"name": "train", "kind": "batch", "script": "slurm/train.sbatch", "checkpoints": str(run_dir / "checkpoints"),
             "env": {"CONFIG": str(tmp_path / "train.yaml"), "RUN_DIR": str(run_dir),
                     "TRAIN_ENTRY": "tests/training/test_slurm.py", "EXPERT_DELAY": "0.3"}},
            {"name": "fake-expert", "kind": "service", "script": str(tmp_path / "fake_service.sbatch"),
             "keys": ["fake-expert"], "start_timeout_s": 120}]}))
    jobs = lambda: json.loads((tmp_path / "sitter" / "jobs.json").read_text())["jobs"]  # noqa: E731
    log_files = lambda: sorted(logs.glob("*.out"))  # noqa: E731
    try:
        # pass 1 submits both jobs
        _babysit(sitter_config, "--once")
        first = {name: j["job_id"] for name, j in jobs().items()}
        assert all(first.values()) and {j["submits"] for j in jobs().values()} == {1}
        replicas = _wait("the fake expert to register", lambda: read_endpoints(endpoints).get("fake-expert"), 90,
                         log_files())
        _wait("training to write its step-2 checkpoint", lambda: max(_checkpoint_steps(run_dir), default=0) >= 2,
              120, log_files())

        # pre-empt both; the trainer checkpoints on SIGTERM and exits 143
        slurm.cancel(first["train"])
        slurm.cancel(first["fake-expert"])
        _wait("both jobs to end", lambda: not any(slurm.job(j).active for j in first.values()), 60, log_files())
        stopped_at = max(_checkpoint_steps(run_dir))
        assert stopped_at < TOTAL_STEPS, "training finished before it was cancelled: slow the steps down"
        assert _steps_logged(run_dir) == list(range(1, stopped_at + 1))

        # pass 2: the dead replica leaves the endpoints file, both jobs are resubmitted
        log = _babysit(sitter_config, "--once")
        assert "CANCELLED" in log and f"resuming from checkpoint step {stopped_at}" in log, log
        second = {name: j["job_id"] for name, j in jobs().items()}
        assert all(second[n] != first[n] for n in first) and {j["submits"] for j in jobs().values()} == {2}
        assert replicas[0].base_url not in [r.base_url for r in read_endpoints(endpoints).get("fake-expert", [])]
        _wait("the resubmitted expert to register again", lambda: read_endpoints(endpoints).get("fake-expert"), 90,
              log_files())
        _wait("the resubmitted training to finish",
              lambda: slurm.job(second["train"]).state not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"),
              150, log_files())
        assert slurm.job(second["train"]).succeeded, slurm.job(second["train"])

        # resumed, not restarted: steps 1..N exactly once, the second job started at the checkpoint
        assert _steps_logged(run_dir) == list(range(1, TOTAL_STEPS + 1))
        second_log = (logs / f"train-{second['train']}.out").read_text()
        assert f"(step {stopped_at})" in second_log and "starting fresh" not in second_log, second_log[-2000:]
        assert (run_dir / "TRAINING_COMPLETE").exists()

        # pass 3: training is done and stays done; the service keeps running
        _babysit(sitter_config, "--once")
        assert jobs()["train"]["done"] and jobs()["train"]["submits"] == 2
    finally:
        for state in (jobs() if (tmp_path / "sitter" / "jobs.json").exists() else {}).values():
            if state["job_id"]:
                subprocess.run(["scancel", state["job_id"]], capture_output=True)


def test_train_sbatch_starts_ray_with_the_cpus_slurm_gave_the_job(tmp_path):
    slurm = _slurm_or_skip()
    pytest.importorskip("ray", reason="needs ray[default] (pip install 'ray[default]==2.60.*')")
    out = tmp_path / "probe.json"
    env = {"CONFIG": "/dev/null", "RUN_DIR": str(tmp_path / "run"), "RAY": "on", "TRAIN_ENTRY": "tests/training/test_slurm.py",
           "SLURM_TEST_PROBE": str(out), "PYTHON": sys.executable, "REPO": str(REPO)}
    job = slurm.submit("slurm/train.sbatch", ["--cpus-per-task=1", "--time=5", "--signal=B:USR1@10",
                                              f"--output={tmp_path}/%j.out"], env=env, cwd=str(REPO))
    log = tmp_path / f"{job}.out"
    try:
        _wait("the Ray probe job to finish", lambda: not slurm.job(job).active, 150, [log])
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    assert slurm.job(job).succeeded, (slurm.job(job), log.read_text()[-3000:])
    probe = json.loads(out.read_text())
    assert probe["resources"]["CPU"] == 1.0 and probe["nodes"] == 1      # what --cpus-per-task gave the job
    assert "distributed.ray_address=auto" in probe["argv"] and probe["ray_address"]


if __name__ == "__main__":
    if os.environ.get("SLURM_TEST_PROBE"):   # stand-in entry for the Ray test: report what Ray offers
        import ray

        ray.init(address="auto", logging_level="ERROR")
        Path(os.environ["SLURM_TEST_PROBE"]).write_text(json.dumps({
            "resources": ray.cluster_resources(), "nodes": sum(n["Alive"] for n in ray.nodes()),
            "argv": sys.argv[1:], "ray_address": os.environ.get("RAY_ADDRESS")}))
        raise SystemExit(0)
    # The stand-in TRAIN_ENTRY for slurm/train.sbatch: training/train.py's command line, with
    # the scripted tools of tests/_train_world.py instead of real experts.
    sys.path[:0] = [str(REPO), str(REPO / "tests")]
    from _train_world import fake_runtime
    from training.config import load_config
    from training.session import run

    args = sys.argv[1:]
    i = args.index("--config")
    config_path, overrides_ = args[i + 1], args[:i] + args[i + 2:]
    run(load_config(config_path, overrides_), runtime=fake_runtime(float(os.environ.get("EXPERT_DELAY", "0"))))
