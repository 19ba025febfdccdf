"""Asynchronous training on Ray (issue 32 items 1 and 4): the distributed loop with
`algorithm.max_staleness: 1` on a local Ray cluster (CPU, gloo), two DeepSpeed ZeRO-2 trainer
ranks and a rollout engine actor on resources of their own (split mode, broadcast sync), on the
tiny world; the experts take 0.3 s, so the next batch's rollouts run beside the update.

- The rollout engine SIGKILLed (bench/faults.py `kill_actor_on_call`) in its first
  generation while step 2's update is made (after the first weight sync; the update is followed
  by a 2 s pause before its weights are synced): a call of batch 3, in flight.  Ray restarts it
  with its start-up weights (version 0); it is refused, sent the trainer's weights labelled with
  the version they are (2: the update it is making, which the ranks finish before they send), and
  the lost rows are generated again.
- Trainer rank 1 SIGKILLed in step 2's update (batch 3 in flight on the engine): the run stops
  every actor, starts them again and resumes from its step-1 checkpoint by itself; the producer
  starts again from the checkpoint's data position and version, the old producer's episodes end
  on the closed engine and none of them is trained.  A variant: the engine killed in step 2's
  update and rank 1 killed just as the restarted engine is to be refreshed, so the refresh
  raises `TrainerWorkerDead` inside an engine call; the step's sync then restarts the run.
- A second run resumed (run.resume auto) from a copy of the first run's step-1 checkpoint.

Each run goes on to the end, every step logged once, each step training exactly its own tasks x
rollouts (the task sampler's order), every turn stamped with the version of the engine that made
it, all within the bound and none dropped.
"""
from __future__ import annotations

import json
import shutil
import threading
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


def _config(root: Path, train_world):
    policy_dir, tasks_file = train_world
    return load_config(None, overrides(root, policy_dir, tasks_file, **SETTINGS))


def _train(cfg, policy=None):
    from training.distributed.run import RayLearner
    from training.session import run

    run(cfg, runtime=fake_runtime(expert_delay=0.3),
        make_learner=lambda c, checkpoint, state, total: RayLearner.start(c, checkpoint, state, total,
                                                                           dist=DIST, policy=policy))


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]


def _checkpoint_versions(run_dir: Path) -> list[int]:
    from training import checkpoint as ckpt

    return [ckpt.verify_checkpoint(c).load_state()["policy_version"]
            for c in ckpt.list_checkpoints(run_dir / "checkpoints")]


def _each_step_once_within_the_bound(cfg, run_dir: Path, first: int = 1) -> list[dict]:
    """Steps `first`..STEPS each logged once, each with its own tasks x rollouts (the sampler's
    order from the start), every turn's version within the bound, none dropped; the metrics."""
    metrics = read_metrics(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(first, STEPS + 1))   # every step once
    for m in metrics:
        assert m["rollout/count"] == TASKS * ROLLOUTS, m["step"]
        assert m["async/dropped_stale"] == 0, m["step"]
        assert m["async/staleness_0"] + m["async/staleness_1"] == m["train/samples"] > 0, m["step"]
        assert m["async/admitted_staleness"] <= 1
    # each step trained its own batch, each task x rollouts once: the sampler's order
    assert logged_batches(run_dir) == {k: v for k, v in sampled_batches(cfg, STEPS).items() if k >= first}
    for row in _rows(run_dir):
        for turn in row["turns"]:   # stamped by the engine actor; step S trains batch S - 1
            assert row["step"] - 1 - turn["policy_version"] in (0, 1), (row["step"], turn["policy_version"])
    return metrics


@pytest.fixture(scope="module")
def rollout_engine_killed(tmp_path_factory, train_world, ray_local):
    """The run whose rollout engine is killed mid-step (module docstring): what it observed."""
    from transformers import AutoTokenizer

    from faults import kill_actor_on_call
    from training.distributed.group import RayPolicy

    root = tmp_path_factory.mktemp("async-ray-engine-killed")
    cfg = _config(root, train_world)
    policy = RayPolicy.start(cfg, DIST, cfg.model.path, AutoTokenizer.from_pretrained(cfg.model.path),
                             total_steps=STEPS)
    seen = {"updates": [], "refreshes": []}
    update, refresh = policy.update, policy.engine.refresh

    def slow_update(samples, **kw):   # the update is made; its weights are synced 2 s later
        seen["updates"].append(policy.version)
        out = update(samples, **kw)
        time.sleep(2.0)
        return out

    def checked_refresh(names):       # what the restarted engine got: the version and the weights
        version, ahead = policy.version, policy.trainer_ahead
        refresh(names)
        digests = policy.weights_digests()   # the trainer waits in the sync barrier: it holds what was sent
        seen["refreshes"].append((version, ahead, ray_local.get(policy.rollouts[0].ready.remote())["version"],
                                  digests["trainer"] == digests["rollout-0"]))
    policy.update, policy.engine.refresh = slow_update, checked_refresh

    try:
        first_pid = ray_local.get(policy.rollouts[0].ready.remote())["incarnation"][0]
        kill = kill_actor_on_call(policy.rollouts[0], "generate", at=1, name="rollout-0",
                                  when=lambda: policy.version == 1 and policy.trainer_ahead)
        _train(cfg, policy)
        info = ray_local.get(policy.rollouts[0].ready.remote())
        digests = policy.weights_digests()
        seen.update(killed=kill.killed, first_pid=first_pid, info=info, restarted=list(policy.engine.restarted),
                    version=policy.version, same_weights=digests["trainer"] == digests["rollout-0"])
    finally:
        policy.shutdown()
    return cfg, root / "run", seen


def test_async_on_ray_a_rollout_engine_killed_mid_step_loses_and_double_counts_no_sample(rollout_engine_killed):
    cfg, run_dir, seen = rollout_engine_killed
    assert len(seen["killed"]) == 1 and seen["killed"][0][1] == seen["first_pid"]
    assert seen["info"]["incarnation"][0] != seen["first_pid"], "rollout-0 was not restarted"
    assert seen["restarted"] == ["rollout-0"]
    assert seen["info"]["version"] == seen["version"] == STEPS      # synced after every step
    assert seen["same_weights"]
    assert seen["updates"] == list(range(STEPS))                    # step k updates weights version k
    # refreshed during step 2's update (version 1 synced, 2 being made): given version 2, and the
    # weights it got are the trainer's after that update (the ranks send once it is made)
    assert seen["refreshes"] == [(1, True, 2, True)]
    metrics = _each_step_once_within_the_bound(cfg, run_dir)
    assert sum(m["async/staleness_1"] for m in metrics[1:]) > 0     # made beside an update: asynchronous
    assert _checkpoint_versions(run_dir) == list(range(1, STEPS + 1))


def test_async_on_ray_a_trainer_rank_killed_mid_update_resumes_from_this_runs_checkpoint(
        tmp_path, train_world, ray_local, monkeypatch, capfd):
    """Rank 1 dies in step 2's update while batch 3 (admitted at version 1) runs on the engine.
    The run restarts its actors from its step-1 checkpoint; the new producer takes the tasks from
    the checkpoint's data position (batch 2 again, not batch 4) at the checkpoint's version, so
    step 2 is made again from version 1, with no turn of the abandoned batches in it."""
    from faults import kill_actor_on_call

    kills = []
    _restarted_run(tmp_path, train_world, monkeypatch, capfd, lambda policy: kills.append(
        kill_actor_on_call(policy.trainers[1], "update", at=2, name="trainer-1")))
    assert len(kills[0].killed) == 1


def test_async_on_ray_a_refresh_failing_on_a_dead_rank_errors_episodes_only_and_the_run_restarts(
        tmp_path, train_world, ray_local, monkeypatch, capfd):
    """The engine dies during step 2's update (as in the first test) and trainer rank 1 dies (SIGKILL)
    just as the restarted engine is to be refreshed: `TrainerWorkerDead` is raised inside an engine
    call (the BatchingEngine's worker), where it can end only the episodes of that call; the step's
    weight sync then meets the dead rank and the run restarts from its step-1 checkpoint.  The
    restarted run does not wait for the first attempt's producer, trains none of its episodes,
    and ends as an undisturbed run does."""
    import os
    import signal

    from faults import actor_pid, kill_actor_on_call
    from training.distributed.group import TrainerWorkerDead

    kills, refreshes, rank_killed = [], [], []

    def arm(policy):
        update, refresh = policy.update, policy.engine.refresh
        rank1 = actor_pid(policy.trainers[1])

        def slow_update(samples, **kw):   # the window between the update and its sync: 2 s
            out = update(samples, **kw)
            time.sleep(2.0)
            return out

        def refresh_after_a_rank_died(names):
            if not rank_killed:
                os.kill(rank1, signal.SIGKILL)
                rank_killed.append(rank1)
                time.sleep(0.2)
            try:
                refresh(names)
            except BaseException as exc:
                refreshes.append(exc)
                raise
            refreshes.append(None)
        policy.update, policy.engine.refresh = slow_update, refresh_after_a_rank_died
        kills.append(kill_actor_on_call(policy.rollouts[0], "generate", at=1, name="rollout-0",
                                        when=lambda: policy.version == 1 and policy.trainer_ahead))
    _restarted_run(tmp_path, train_world, monkeypatch, capfd, arm)
    assert len(kills[0].killed) == 1 and len(rank_killed) == 1
    assert refreshes and all(isinstance(e, TrainerWorkerDead) for e in refreshes), refreshes


def _restarted_run(tmp_path, train_world, monkeypatch, capfd, arm) -> None:
    """Run with `arm(policy)` applied to the first attempt's actors; check the run restarted once
    from its step-1 checkpoint and ended with every step trained once, as an undisturbed run."""
    from training.distributed.group import RayPolicy

    started = []
    start = RayPolicy.start.__func__

    def start_and_arm(cls, cfg, dist, model_path, *a, **kw):
        policy = start(cls, cfg, dist, model_path, *a, **kw)
        if not started:
            arm(policy)
        started.append((Path(model_path), kw.get("version")))
        return policy
    monkeypatch.setattr(RayPolicy, "start", classmethod(start_and_arm))

    cfg = _config(tmp_path, train_world)
    _train(cfg)
    err = capfd.readouterr().err
    assert len(started) == 2, err[-3000:]
    assert "trainer rank 1 died" in err and "restart 1 of 2: resuming from the newest checkpoint" in err, err[-3000:]
    # started again from step 1's checkpoint: its weights, at its policy version
    assert started[1][0].parent.name == "step-00000001" and started[1][1] == 1, started
    run_dir = tmp_path / "run"
    _each_step_once_within_the_bound(cfg, run_dir)
    rows = _rows(run_dir)
    assert {t["policy_version"] for r in rows if r["step"] == 2 for t in r["turns"]} == {1}   # made again at v1
    assert not [r["stop_reason"] for r in rows if (r.get("stop_reason") or "").startswith("error: policy")]
    assert _checkpoint_versions(run_dir) == list(range(1, STEPS + 1))
    # the first attempt's producer and its episodes ended (on the closed engine): nothing left running
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _producer_threads():
        time.sleep(0.5)
    assert not _producer_threads()


def _producer_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("rollout-producer", "rollouts-step-"))]


def test_async_on_ray_resume_trains_the_same_tasks_from_the_checkpoints_version(
        tmp_path, train_world, ray_local, rollout_engine_killed):
    """A run resumed from the first run's step-1 checkpoint trains steps 2-3 on the same tasks
    (the checkpoint holds the position of the first batch not trained, though the producer had
    taken batch 3's too), and its first batch comes from the checkpoint's weights (version 1)."""
    _, full_dir, _ = rollout_engine_killed
    checkpoint = full_dir / "checkpoints" / "step-00000001"
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    shutil.copytree(checkpoint, tmp_path / "run" / "checkpoints" / checkpoint.name)
    cfg = _config(tmp_path, train_world)
    _train(cfg)
    _each_step_once_within_the_bound(cfg, tmp_path / "run", first=2)
    assert logged_batches(tmp_path / "run") == {k: v for k, v in logged_batches(full_dir).items() if k >= 2}
    rows = _rows(tmp_path / "run")
    assert {t["policy_version"] for r in rows if r["step"] == 2 for t in r["turns"]} == {1}
    assert _checkpoint_versions(tmp_path / "run") == [1, 2, 3]


def test_async_on_ray_in_completion_order_overtakes_a_slow_group_and_trains_every_group_once(
        tmp_path, train_world, ray_local):
    """`algorithm.async_order: completion` on Ray: the producer hands a step the first groups done
    (the Ray engine makes them; the slow task's group is trained by a later step), every group of
    the three batches trained once, the staleness buckets add up to the samples trained."""
    from _train_world import made_groups, sampled_groups, slow_on_one_task

    from training.distributed.run import RayLearner
    from training.session import run

    cfg = load_config(None, overrides(tmp_path, *train_world, **{**SETTINGS, "algorithm.async_order": "completion"}))
    run(cfg, runtime=slow_on_one_task(1.5, expert_delay=0.3),
        make_learner=lambda c, checkpoint, state, total: RayLearner.start(c, checkpoint, state, total, dist=DIST))
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert made_groups(_rows(tmp_path / "run")) == {k: (q, ROLLOUTS) for k, q in sampled_groups(cfg, STEPS).items()}
    assert sum(m["async/groups_of_other_batches"] for m in metrics) > 0
    for m in metrics:
        assert m["rollout/count"] == TASKS * ROLLOUTS
        assert m["async/staleness_0"] + m["async/staleness_1"] == m["train/samples"]
