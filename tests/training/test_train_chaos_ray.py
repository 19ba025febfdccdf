"""Training under chaos on Ray (issue 28 item 3): the distributed loop on a local Ray cluster
(CPU, gloo), two DeepSpeed ZeRO-2 trainer ranks and a rollout engine (split mode, broadcast
sync) on the tiny world, with an actor's process SIGKILLed while one of its calls is in flight
(bench/faults.py `kill_actor_on_call`):

- the rollout engine killed in its first generation of step 2: Ray restarts it (max_restarts)
  with its start-up weights (policy version 0); the step waits for it, sends it the current
  weights (version 1), generates the lost rows again on it, and re-forms the sync group at the
  step's end (a chunk moving to another live engine instead: test_distributed_cpu.py);
- trainer rank 1 killed in step 2's update: the job stops every actor, starts them again and
  resumes from the step-1 checkpoint by itself (distributed.trainer_restarts).

Either run ends with the uninterrupted run's weights, bit for bit, each step logged once.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # a local Ray cluster and DeepSpeed ranks

pytest.importorskip("ray", reason="needs ray[default]")
pytest.importorskip("deepspeed", reason="needs deepspeed")

import torch  # noqa: E402
from _train_world import fake_runtime, overrides  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from training import checkpoint as ckpt  # noqa: E402
from training.config import load_config  # noqa: E402
from training.distributed.config import DistributedConfig  # noqa: E402
from training.metrics_log import read_metrics  # noqa: E402

STEPS = 3
SETTINGS = {"trainer.total_steps": STEPS, "trainer.save_every": 1, "run.threads": 1,
            "algorithm.micro_batch_size": 2}
DIST = DistributedConfig(backend="ray", mode="split", trainer_workers=2, rollout_workers=1, zero_stage=2,
                         cpus_per_worker=0.5, bucket_mb=1, restart_wait_s=120)


def _config(root: Path, train_world):
    policy, tasks = train_world
    return load_config(None, overrides(root, policy, tasks, **SETTINGS))


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    last = ckpt.list_checkpoints(run_dir / "checkpoints")[-1]
    assert last.name == f"step-{STEPS:08d}"
    return load_file(str(ckpt.verify_checkpoint(last).model_dir / "model.safetensors"))


def _same_run(uninterrupted, run_dir: Path) -> None:
    """The uninterrupted run's final weights (every tensor equal) and its steps, each logged once
    with the same loss and reward."""
    weights, full = uninterrupted
    got = _weights(run_dir)
    assert got.keys() == weights.keys()
    differ = [k for k in got if not torch.equal(got[k], weights[k])]
    assert not differ, f"{len(differ)} tensors differ from the uninterrupted run's, e.g. {differ[:3]}"
    logged = read_metrics(run_dir / "metrics.jsonl")
    assert [m["step"] for m in logged] == list(range(1, STEPS + 1))
    for a, b in zip(full, logged):
        assert a["train/loss"] == b["train/loss"] and a["reward/mean"] == b["reward/mean"], a["step"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, train_world, ray_local):
    from training.session import run_distributed

    root = tmp_path_factory.mktemp("ray-uninterrupted")
    run_distributed(_config(root, train_world), DIST, runtime=fake_runtime())
    return _weights(root / "run"), read_metrics(root / "run" / "metrics.jsonl")


def test_a_rollout_engine_killed_mid_step_restarts_with_the_current_weights(
        tmp_path, train_world, ray_local, uninterrupted):
    from transformers import AutoTokenizer

    from faults import kill_actor_on_call
    from training.distributed.group import RayPolicy
    from training.session import run_distributed

    cfg = _config(tmp_path, train_world)
    policy = RayPolicy.start(cfg, DIST, cfg.model.path, AutoTokenizer.from_pretrained(cfg.model.path),
                             total_steps=STEPS)
    try:
        first_pid = ray_local.get(policy.rollouts[0].ready.remote())["incarnation"][0]
        # rollout-0's first generation of step 2 (it holds version 1 then; restarted, version 0)
        kill = kill_actor_on_call(policy.rollouts[0], "generate", at=1, when=lambda: policy.version == 1,
                                  name="rollout-0")
        run_distributed(cfg, DIST, runtime=fake_runtime(), policy=policy)
        assert len(kill.killed) == 1 and kill.killed[0][1] == first_pid
        info = ray_local.get(policy.rollouts[0].ready.remote())
        assert info["incarnation"][0] != first_pid, "rollout-0 was not restarted"
        assert info["version"] == policy.version == STEPS        # and holds the last step's weights
        assert policy.engine.restarted == ["rollout-0"]          # back within step 2, refreshed there
        digests = policy.weights_digests()
        assert digests["trainer"] == digests["rollout-0"]
    finally:
        policy.shutdown()
    _same_run(uninterrupted, tmp_path / "run")


def test_a_trainer_rank_killed_mid_update_resumes_from_the_last_checkpoint_by_itself(
        tmp_path, train_world, ray_local, uninterrupted, monkeypatch, capfd):
    from faults import kill_actor_on_call
    from training.distributed.group import RayPolicy
    from training.session import run_distributed

    started, kills = [], []
    start = RayPolicy.start.__func__

    def start_and_arm(cls, cfg, dist, model_path, *a, **kw):
        policy = start(cls, cfg, dist, model_path, *a, **kw)
        if not started:             # the first job's rank 1 dies in its 2nd update (step 2)
            kills.append(kill_actor_on_call(policy.trainers[1], "update", at=2, name="trainer-1"))
        started.append(Path(model_path))
        return policy
    monkeypatch.setattr(RayPolicy, "start", classmethod(start_and_arm))

    run_distributed(_config(tmp_path, train_world), DIST, runtime=fake_runtime())
    err = capfd.readouterr().err
    assert len(started) == 2 and len(kills[0].killed) == 1, err[-3000:]
    assert "trainer rank 1 died" in err and "restart 1 of 2: resuming from the newest checkpoint" in err, err[-3000:]
    # started again from step 1's checkpoint (its weights; the ranks load its optimizer partitions)
    assert started[1].parent.name == "step-00000001", started
    _same_run(uninterrupted, tmp_path / "run")
