"""Asynchronous training on Ray (issue 32 items 1 and 4): the distributed loop with
`algorithm.max_staleness: 1` on a local Ray cluster (CPU, gloo), two DeepSpeed ZeRO-2 trainer
ranks and a rollout engine actor on resources of their own (split mode, broadcast sync), on the
tiny world; the experts take 0.3 s and the trainer ranks' update is followed by a pause before
its weights are synced, so the next batch's rollouts surely run beside the update.

The rollout engine is SIGKILLed (orchestrator/faults.py `kill_actor_on_call`) in its first
generation while step 2's update is made (after the first weight sync): a call of batch 3, in
flight.  Ray restarts it with its start-up weights (version 0); it is refused, sent the trainer's
weights labelled with the version they are (2: the update it is making, which the ranks finish
before they send), and the lost rows are generated again.  The run goes on to the end, every step
logged once, each step training exactly its own tasks x rollouts (the task sampler's order), every
turn stamped with the version of the engine that made it, all within the bound and none dropped.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # a local Ray cluster and DeepSpeed ranks

pytest.importorskip("ray", reason="needs ray[default]")
pytest.importorskip("deepspeed", reason="needs deepspeed")

from _train_world import fake_runtime, logged_batches, overrides, sampled_batches  # noqa: E402

from training.config import load_config  # noqa: E402
from training.distributed.config import DistributedConfig  # noqa: E402
from training.metrics_log import read_metrics  # noqa: E402

STEPS, TASKS, ROLLOUTS = 3, 2, 4
SETTINGS = {"trainer.total_steps": STEPS, "trainer.save_every": 1, "run.threads": 1,
            "algorithm.micro_batch_size": 2, "logging.rollouts_every": 1,
            "rollout.tasks_per_step": TASKS, "rollout.rollouts_per_task": ROLLOUTS,
            "algorithm.max_staleness": 1, "algorithm.old_logprobs": "engine", "engine.share_weights": "false",
            "distributed.backend": "ray", "distributed.mode": "split"}
DIST = DistributedConfig(backend="ray", mode="split", trainer_workers=2, rollout_workers=1, zero_stage=2,
                         cpus_per_worker=0.5, bucket_mb=1, restart_wait_s=120)


def test_async_on_ray_a_rollout_engine_killed_mid_step_loses_and_double_counts_no_sample(
        tmp_path, train_world, ray_local):
    from transformers import AutoTokenizer

    from orchestrator.faults import kill_actor_on_call
    from training.distributed.group import RayPolicy
    from training.distributed.run import RayLearner
    from training.session import run

    policy_dir, tasks_file = train_world
    cfg = load_config(None, overrides(tmp_path, policy_dir, tasks_file, **SETTINGS))
    policy = RayPolicy.start(cfg, DIST, cfg.model.path, AutoTokenizer.from_pretrained(cfg.model.path),
                             total_steps=STEPS)
    updates, refreshes = [], []
    update, refresh = policy.update, policy.engine.refresh

    def slow_update(samples, **kw):   # the update is made; its weights are synced 2 s later
        updates.append(policy.version)
        out = update(samples, **kw)
        time.sleep(2.0)
        return out

    def checked_refresh(names):       # what the restarted engine got: the version and the weights
        version, ahead = policy.version, policy.trainer_ahead
        refresh(names)
        digests = policy.weights_digests()   # the trainer waits in the sync barrier: it holds what was sent
        refreshes.append((version, ahead, ray_local.get(policy.rollouts[0].ready.remote())["version"],
                          digests["trainer"] == digests["rollout-0"]))
    policy.update, policy.engine.refresh = slow_update, checked_refresh

    try:
        first_pid = ray_local.get(policy.rollouts[0].ready.remote())["incarnation"][0]
        kill = kill_actor_on_call(policy.rollouts[0], "generate", at=1, name="rollout-0",
                                  when=lambda: policy.version == 1 and policy.trainer_ahead)
        run(cfg, runtime=fake_runtime(expert_delay=0.3),
            make_learner=lambda c, checkpoint, state, total: RayLearner.start(c, checkpoint, state, total,
                                                                               dist=DIST, policy=policy))
        assert len(kill.killed) == 1 and kill.killed[0][1] == first_pid
        info = ray_local.get(policy.rollouts[0].ready.remote())
        assert info["incarnation"][0] != first_pid, "rollout-0 was not restarted"
        assert policy.engine.restarted == ["rollout-0"]
        assert info["version"] == policy.version == STEPS            # synced after every step
        digests = policy.weights_digests()
        assert digests["trainer"] == digests["rollout-0"]
    finally:
        policy.shutdown()
    assert updates == list(range(STEPS))                             # step k updates weights version k
    # refreshed during step 2's update (version 1 synced, 2 being made): given version 2, and the
    # weights it got are the trainer's after that update (the ranks send once it is made)
    assert refreshes == [(1, True, 2, True)]

    run_dir = tmp_path / "run"
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))   # every step once
    for m in metrics:
        assert m["rollout/count"] == TASKS * ROLLOUTS, m["step"]
        assert m["async/dropped_stale"] == 0, m["step"]
        assert m["async/staleness_0"] + m["async/staleness_1"] == m["train/samples"] > 0, m["step"]
        assert m["async/admitted_staleness"] <= 1
    assert sum(m["async/staleness_1"] for m in metrics[1:]) > 0      # made beside an update: asynchronous

    # each step trained its own batch, each task x rollouts once: the sampler's order
    assert logged_batches(run_dir) == sampled_batches(cfg, STEPS)
    for line in (run_dir / "rollouts.jsonl").read_text().splitlines():
        row = json.loads(line)
        for turn in row["turns"]:   # stamped by the engine actor; step S trains batch S - 1
            assert row["step"] - 1 - turn["policy_version"] in (0, 1), (row["step"], turn["policy_version"])
    assert _checkpoint_versions(run_dir) == list(range(1, STEPS + 1))


def _checkpoint_versions(run_dir: Path) -> list[int]:
    from training import checkpoint as ckpt

    return [ckpt.verify_checkpoint(c).load_state()["policy_version"]
            for c in ckpt.list_checkpoints(run_dir / "checkpoints")]
