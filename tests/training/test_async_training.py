"""Asynchronous training (algorithm.max_staleness > 0): versions, the staleness bound, the loop.

The decoupled loss's hand-worked numbers are in test_losses.py."""
from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from _train_world import fake_runtime, made_groups, overrides, sampled_groups
from orchestrator.engines.interface import Generation, SamplingParams
from orchestrator.engines.batcher import BatchingEngine
from training.async_rollouts import RolloutProducer, VersionedEngine, VersionedWeights, drop_stale, staleness
from training.config import ConfigError, load_config
from training.metrics_log import read_metrics
from training.samples import TurnSample

ASYNC = {"algorithm.max_staleness": 1, "algorithm.old_logprobs": "engine", "engine.share_weights": "false"}


def _sample(version):
    return TurnSample([1], [2], [1], [0.0], 1.0, "t", 0, policy_version=version)


# ---------------------------------------------------------------------------- config
@pytest.mark.parametrize("extra, field", [
    ({"algorithm.max_staleness": -1}, "algorithm.max_staleness: must be >= 0"),
    ({**ASYNC, "algorithm.behav_weight_cap": 1.0}, "algorithm.behav_weight_cap: must be > 1"),
    ({**ASYNC, "algorithm.old_logprobs": "recompute"}, "algorithm.old_logprobs: algorithm.max_staleness=1"),
    ({**ASYNC, "engine.share_weights": "true"}, "engine.share_weights: algorithm.max_staleness=1"),
    ({**ASYNC, "engine.kind": "vllm", "rollout.constrained": "true"}, "engine.kind: algorithm.max_staleness=1"),
    ({**ASYNC, "distributed.backend": "ray"}, "distributed.mode: algorithm.max_staleness=1 (asynchronous training) on Ray needs mode=split"),
])
def test_async_settings_that_conflict_are_one_error_naming_the_field(extra, field):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{k}={v}" for k, v in extra.items()])
    assert str(err.value).startswith(field), str(err.value)


def test_max_staleness_defaults_to_synchronous_and_an_async_config_loads():
    assert load_config(None, []).algorithm.max_staleness == 0
    assert load_config(None, [f"{k}={v}" for k, v in ASYNC.items()]).algorithm.max_staleness == 1
    on_ray = load_config(None, [f"{k}={v}" for k, v in {**ASYNC, "distributed.backend": "ray",
                                                         "distributed.mode": "split"}.items()])
    assert (on_ray.algorithm.max_staleness, on_ray.distributed.mode) == (1, "split")


# ---------------------------------------------------------------------------- versions
class _Echo:
    """An engine whose generations say which weights made them."""

    tokenizer = None

    def __init__(self):
        self.weights = "w0"

    def generate(self, prompts, params, *, seeds=None, deadlines=None):
        return [Generation(token_ids=[1], logprobs=[0.0], text=self.weights) for _ in prompts]

    def update_weights(self, state_dict):
        self.weights = state_dict


def test_versioned_engine_stamps_the_version_of_the_weights_that_ran_and_keeps_the_batchers_seeds():
    inner = _Echo()
    engine = BatchingEngine(VersionedEngine(inner, version=3), max_batch=4)
    try:
        assert engine._takes_seeds and engine._takes_deadlines   # the wrapped signature is visible
        first = engine.generate([[1]], SamplingParams())[0]
        engine.update_weights(VersionedWeights("w4", 4))
        second = engine.generate([[1]], SamplingParams())[0]
        engine.update_weights(VersionedWeights(None, 5))       # an empty step: version moves, weights stay
        third = engine.generate([[1]], SamplingParams())[0]
    finally:
        engine.close()
    assert (first.text, first.policy_version) == ("w0", 3)
    assert (second.text, second.policy_version) == ("w4", 4)
    assert (third.text, third.policy_version) == ("w4", 5)
    with pytest.raises(TypeError, match="VersionedWeights"):
        VersionedEngine(_Echo()).update_weights({"a": 1})


def test_a_running_episode_takes_new_weights_between_turns_and_its_turns_keep_their_versions():
    """Turn 1 of an episode runs on version 0; a weight update lands while the episode waits for a
    tool; turn 2 runs on version 1 without the episode being stopped."""
    engine = BatchingEngine(VersionedEngine(_Echo(), version=0))
    tool_running, updated = threading.Event(), threading.Event()
    versions = []

    def episode():
        versions.append(engine.generate([[1]], SamplingParams())[0].policy_version)
        tool_running.set()
        updated.wait(5)                                            # the tool call
        versions.append(engine.generate([[1]], SamplingParams())[0].policy_version)

    try:
        thread = threading.Thread(target=episode)
        thread.start()
        assert tool_running.wait(5)
        engine.update_weights(VersionedWeights("w1", 1))
        updated.set()
        thread.join(5)
    finally:
        engine.close()
    assert versions == [0, 1]


def test_hf_engine_reports_log_probs_before_the_constraint_when_asked(train_world):
    """Under a choice constraint the sampler's log-prob is renormalised over the allowed tokens;
    `unconstrained_logprobs` gives the model's own (what the trainer recomputes)."""
    from orchestrator.engines.hf import HFEngine

    engine = HFEngine(str(train_world[0]), device="cpu")
    prompt = engine.tokenizer("What is 1 + 1?")["input_ids"]
    choices = ["yes", "no"]
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=7, choices=choices)
    sampled = engine.generate([prompt], params)[0]
    free = engine.generate([prompt], SamplingParams(**{**params.__dict__, "unconstrained_logprobs": True}))[0]
    assert free.token_ids == sampled.token_ids                     # the same draw
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt])).logits[0, -1].float()
    expected = logits.log_softmax(-1)[free.token_ids[0]].item()
    assert free.logprobs[0] == pytest.approx(expected, abs=1e-5)
    assert sampled.logprobs[0] > free.logprobs[0] + 1e-3         # renormalised: larger


def test_a_ray_rollout_engine_serves_the_version_it_holds_and_stamps_it_only_when_asynchronous(train_world):
    """The rollout actor's class, called directly (no Ray): synchronous calls are for its version
    exactly (issue 28's StaleWeights for a restarted engine) and come back unstamped; asynchronous
    ones (`at_least`) are served by an engine at that version or newer and stamped with its own."""
    from training.distributed.rollout_worker import RolloutWorker, StaleWeights

    worker = RolloutWorker("hf", str(train_world[0]), {}, device="cpu", version=3)
    prompt, params = [[5, 6, 7]], SamplingParams(max_tokens=2, seed=1)
    assert worker.generate(prompt, params, [1], 3)[0].policy_version is None
    with pytest.raises(StaleWeights, match="holds policy version 3, the call is for 2"):
        worker.generate(prompt, params, [1], 2)
    assert worker.generate(prompt, params, [1], 3, True)[0].policy_version == 3
    assert worker.generate(prompt, params, [1], 2, True)[0].policy_version == 3   # newer than asked: serves
    with pytest.raises(StaleWeights, match="holds policy version 3, the call is for at least 4"):
        worker.generate(prompt, params, [1], 4, True)                             # older: refused


# ---------------------------------------------------------------------------- the bound
def test_drop_stale_keeps_samples_within_the_bound_and_counts_the_rest():
    samples = [_sample(v) for v in (5, 4, 4, 3, 2, None)]
    assert staleness(samples, 5) == [0, 1, 1, 2, 3, 0]
    kept, metrics = drop_stale(samples, 5, max_staleness=1)
    assert [s.policy_version for s in kept] == [5, 4, 4, None]
    assert metrics == {"async/dropped_stale": 2.0, "async/staleness_mean": 0.5,
                       "async/staleness_0": 2.0, "async/staleness_1": 2.0}
    with pytest.raises(ValueError, match="newer than the step"):
        drop_stale([_sample(6)], 5, 1)


def _one_task(j):
    return [f"task {j}"], j


@pytest.mark.parametrize("bound", [1, 2])
def test_the_producer_never_starts_a_batch_beyond_the_bound(bound):
    """A producer much faster than the trainer: batch j must wait for version j - bound (without
    the admission check every batch would start at version 0, staleness up to 5)."""
    started = {}

    def collect(step, batch, slots, should_stop, on_group):
        started[step] = producer._version
        on_group(0, [])

    producer = RolloutProducer(_one_task, collect, start=0, stop=6, max_staleness=bound, version=0, per_step=1)
    producer.begin()
    try:
        for step in range(6):
            item = producer.get(step, timeout=5)
            assert item.error is None and item.step == step
            time.sleep(0.05)                                       # a slow update
            producer.publish(step + 1)
    finally:
        producer.stop()
    assert all(step - started[step] <= bound for step in started), started
    assert max(step - started[step] for step in started) == bound  # and it does run ahead that far


def test_the_next_batch_starts_beside_the_current_batchs_tail():
    """Bound 1, trainer at version 0: batch 1 is admitted while batch 0's rollouts still run
    (a producer making one batch at a time would wait for batch 0 to end); batch 2 is not."""
    release, started = threading.Event(), []

    def collect(step, batch, slots, should_stop, on_group):
        started.append(step)
        release.wait(5)
        on_group(0, [])

    producer = RolloutProducer(_one_task, collect, start=0, stop=3, max_staleness=1, version=0, per_step=1)
    producer.begin()
    try:
        deadline = time.monotonic() + 5
        while len(started) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)
        assert sorted(started) == [0, 1]                           # batch 0 still running, 2 not admitted
        release.set()
        assert producer.get(0, timeout=5).error is None and producer.get(1, timeout=5).error is None
    finally:
        producer.stop()


def _two_slot_producer(order, release, made):
    """Batches of two tasks; slot 1 of batch 0 waits for `release`, every other group ends at once."""
    def collect(j, batch, slots, should_stop, on_group):
        made.append((j, list(slots)))
        for k, slot in enumerate(slots):
            if (j, slot) == (0, 1):
                threading.Thread(target=lambda k=k: (release.wait(5), on_group(k, [f"{j}.{slot}"]))).start()
            else:
                on_group(k, [f"{j}.{slot}"])
    return RolloutProducer(lambda j: ([f"t{j}a", f"t{j}b"], 2 * j), collect, start=0, stop=4, max_staleness=1,
                           version=0, per_step=2, order=order)


def test_completion_order_trains_the_oldest_groups_done_so_a_slow_group_does_not_hold_a_step_back():
    """AReaL's queue: step 0 takes (0, 0) and batch 1's first group while (0, 1) is still running;
    the slow group is trained by the first step after it ends; every group once."""
    release, made = threading.Event(), []
    producer = _two_slot_producer("completion", release, made).begin()
    try:
        first = producer.get(0, timeout=5)
        assert first.keys == [(0, 0), (1, 0)] and first.groups == [["0.0"], ["1.0"]]
        assert first.batch == ["t0a", "t1a"] and first.admitted_versions == [0, 0]
        assert producer.resume_point(current=lambda: -1) == (0, 0, {0: [0], 1: [0]})   # batch 0 not wholly trained
        producer.publish(1)
        second = producer.get(1, timeout=5)
        assert second.keys == [(1, 1), (2, 0)]                     # (0, 1) still running
        release.set()
        deadline = time.monotonic() + 5
        while (0, 1) not in producer._ready and time.monotonic() < deadline:   # it ends before version 2
            time.sleep(0.01)
        producer.publish(2)
        third = producer.get(2, timeout=5)
        assert third.keys == [(0, 1), (2, 1)]                      # oldest first, once it is done
        producer.publish(3)
        assert producer.get(3, timeout=5).keys == [(3, 0), (3, 1)]
        assert producer.resume_point(current=lambda: 8) == (4, 8, {})      # all four batches trained
    finally:
        producer.stop()


def test_batch_order_waits_for_its_own_batchs_slowest_group():
    release, made = threading.Event(), []
    producer = _two_slot_producer("batch", release, made).begin()
    try:
        assert producer.get(0, timeout=0.3) is None                # (0, 1) holds step 0 back
        release.set()
        assert producer.get(0, timeout=5).keys == [(0, 0), (0, 1)]
        producer.publish(1)
        assert producer.get(1, timeout=5).keys == [(1, 0), (1, 1)]
        assert producer.resume_point(current=lambda: -1) in ((2, -1, {}), (2, 4, {}))   # batch 2 (at position 4) may be taken
        deadline = time.monotonic() + 5
        while producer.resume_point(current=lambda: -1)[1] == -1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert producer.resume_point(current=lambda: -1) == (2, 4, {})
    finally:
        producer.stop()


def test_a_resumed_producer_makes_only_the_groups_its_checkpoint_had_not_trained():
    """From a checkpoint at version 1 whose first untrained batch is 0 (slot 1) with batch 1's slot 0
    trained: batch 0 makes slot 1 alone, batch 1 slot 1 alone, later batches whole; the take order
    (hence each slot's task) is the sampler's."""
    made = []

    def collect(j, batch, slots, should_stop, on_group):
        made.append((j, list(slots), list(batch)))
        for k in range(len(slots)):
            on_group(k, [])
    producer = RolloutProducer(lambda j: ([f"t{j}a", f"t{j}b"], 2 * j), collect, start=1, stop=3, max_staleness=1,
                               version=1, per_step=2, order="completion", first_batch=0, trained={0: [0], 1: [0]})
    producer.begin()
    try:
        assert producer.get(1, timeout=5).keys == [(0, 1), (1, 1)]
        producer.publish(2)
        assert producer.get(2, timeout=5).keys == [(2, 0), (2, 1)]
    finally:
        producer.stop()
    assert made == [(0, [1], ["t0b"]), (1, [1], ["t1b"]), (2, [0, 1], ["t2a", "t2b"])]


# ---------------------------------------------------------------------------- the loop
def _train(tmp_path, train_world, slow_update: float = 0.0, **extra):
    from training.learner import LocalLearner
    from training.session import run

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **extra))

    def make_learner(*args):
        learner = LocalLearner(*args)
        if slow_update:
            update = learner.update
            learner.update = lambda samples, step: (time.sleep(slow_update), update(samples, step))[1]
        return learner
    run(cfg, runtime=fake_runtime(), make_learner=make_learner)
    return read_metrics(tmp_path / "run" / "metrics.jsonl")


def test_async_run_trains_on_turns_within_the_bound_and_logs_their_versions(tmp_path, train_world):
    # the update sleeps, so the next batch's first turns surely run on the previous weights
    metrics = _train(tmp_path, train_world, slow_update=1.0, **ASYNC, **{"trainer.total_steps": 3,
                                                                         "logging.rollouts_every": 1})
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert m["async/dropped_stale"] == 0
        assert m["async/staleness_0"] + m["async/staleness_1"] == m["train/samples"] > 0
        assert m["train/grad_norm"] > 0
    assert metrics[0]["async/staleness_1"] == 0                      # step 0: nothing older exists
    assert sum(m["async/staleness_1"] for m in metrics[1:]) > 0    # later: made during the update
    assert all(0.2 < m["train/behav_weight_mean"] < 5 for m in metrics)
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    for row in rows:
        for turn in row["turns"]:
            assert row["step"] - 1 - turn["policy_version"] in (0, 1), (row["step"], turn["policy_version"])


def test_an_engine_call_failing_mid_step_ends_one_episode_and_the_step_counts_it_once(tmp_path, train_world):
    """In one process the engine is part of the trainer (it cannot die alone: a killed process
    resumes from its checkpoint, test_async_resume_* and test_train_chaos.py).  An engine call that
    raises mid-step is retried request by request (the BatchingEngine looks for the culprit: the
    episodes merged into the call with it go on), the batch is not made again, and the episode
    whose request fails again ends there ("error: policy: ...", as in synchronous training),
    unfinished, so the filter keeps it out of the update; the batch still holds its tasks x
    rollouts once each, and the run goes on."""
    from _train_world import logged_batches, sampled_batches

    from training.learner import LocalLearner
    from training.session import run

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **ASYNC, **{"trainer.total_steps": 3,
                                                                           "logging.rollouts_every": 1}))
    failed = []

    def failing_learner(*args):   # on version 1 (after step 1's update) one episode's turn keeps failing
        learner = LocalLearner(*args)
        versioned, generate = learner.engine.engine, learner.engine.engine.generate

        def generate_or_fail(prompts, params, *, seeds, **kw):
            if versioned.version == 1 and not failed:
                failed.append(seeds[0])            # the victim: the first row's seed (one turn of one rollout)
            if failed and failed[0] in seeds:
                raise RuntimeError(f"engine failed mid-step ({len(seeds)} rows)")
            return generate(prompts, params, seeds=seeds, **kw)
        versioned.generate = generate_or_fail
        update = learner.update
        learner.update = lambda samples, step: (time.sleep(0.5), update(samples, step))[1]
        return learner

    run(cfg, runtime=fake_runtime(), make_learner=failing_learner)
    metrics = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert failed and [m["step"] for m in metrics] == [1, 2, 3]
    assert logged_batches(tmp_path / "run") == sampled_batches(cfg, 3)
    rows = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    broken = [r for r in rows if "engine failed mid-step" in (r.get("stop_reason") or "")]
    assert len(broken) == 1 and not broken[0]["finished"] and broken[0]["step"] in (2, 3)
    assert "(1 rows)" in broken[0]["stop_reason"]                  # it failed alone, after the retry
    m = metrics[broken[0]["step"] - 1]
    assert m["rollout/count"] == 8 and m["rollout/finished"] < 1 and m["filter/rollouts_kept"] <= 7


def test_with_every_sample_fresh_the_async_path_learns_what_the_synchronous_one_does(tmp_path, train_world,
                                                                                    monkeypatch):
    """A producer that waits for each update (bound 0) makes every turn fresh: pi_behav = pi_prox,
    w = 1, and the decoupled loss is the recompute loss, so the numbers match the synchronous run
    (up to the engine's incremental vs the trainer's full forward, ~1e-6)."""
    import training.session as session

    sync = _train(tmp_path / "sync", train_world, **{"trainer.total_steps": 2})
    monkeypatch.setattr(session, "RolloutProducer",
                        lambda *a, **k: RolloutProducer(*a, **{**k, "max_staleness": 0}))
    fresh = _train(tmp_path / "async", train_world, **ASYNC, **{"trainer.total_steps": 2})
    for a, b in zip(sync, fresh):
        assert b["async/staleness_1"] == 0
        assert b["train/behav_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        for key in ("reward/mean", "train/samples", "train/loss", "train/pg_loss", "train/grad_norm"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), key


def test_async_resume_trains_the_same_tasks_from_the_checkpoints_version(tmp_path, train_world):
    """The producer runs a batch ahead, so the sampler's position is past the next step's tasks when
    a checkpoint is written; the checkpoint must hold the position of the first batch *not trained*
    and the policy version = its step.  Resumed from step 1, steps 2-3 train the same tasks as the
    uninterrupted run, and the first resumed batch starts from the checkpoint's weights (version 1)."""
    import shutil

    from training.checkpoint import verify_checkpoint

    run = {**ASYNC, "trainer.total_steps": 3, "logging.rollouts_every": 1, "rollout.tasks_per_step": 1}
    _train(tmp_path / "full", train_world, slow_update=0.5, **run)
    state = verify_checkpoint(tmp_path / "full" / "run" / "checkpoints" / "step-00000001").load_state()
    assert (state["data_position"], state["policy_version"]) == (1, 1)   # 1 task per step, 1 step trained
    (tmp_path / "resumed" / "run" / "checkpoints").mkdir(parents=True)
    shutil.copytree(tmp_path / "full" / "run" / "checkpoints" / "step-00000001",
                    tmp_path / "resumed" / "run" / "checkpoints" / "step-00000001")
    resumed = _train(tmp_path / "resumed", train_world, **run)
    assert [m["step"] for m in resumed] == [2, 3]

    def tasks(folder):
        rows = [json.loads(line) for line in (folder / "run" / "rollouts.jsonl").read_text().splitlines()]
        return {(r["step"], r["question"]) for r in rows}, rows
    full_tasks, _ = tasks(tmp_path / "full")
    resumed_tasks, rows = tasks(tmp_path / "resumed")
    assert resumed_tasks == {t for t in full_tasks if t[0] >= 2}
    first = [turn["policy_version"] for r in rows if r["step"] == 2 for turn in r["turns"]]
    assert first and min(first) == 1                                   # made by the checkpoint's weights


# ------------------------------------------------------------- CUDA-graph capture vs update
@pytest.mark.parametrize("asynchronous", [True, False])
def test_an_asynchronous_update_holds_the_capture_lock_so_no_graph_capture_runs_beside_it(
        tmp_path, train_world, monkeypatch, asynchronous):
    """On an H200 a capture in the rollout thread failed while the update's autotuner synchronized
    the device (capture_lock.py): asynchronous updates hold the lock, synchronous ones need not."""
    import training.learner as learner_module
    from orchestrator.engines.capture_lock import CAPTURE_LOCK

    held = []
    real = learner_module.ppo_update

    def recording(*args, **kwargs):
        held.append(CAPTURE_LOCK.locked())
        return real(*args, **kwargs)
    monkeypatch.setattr(learner_module, "ppo_update", recording)
    _train(tmp_path, train_world, **(ASYNC if asynchronous else {}), **{"trainer.total_steps": 2})
    assert held == [asynchronous] * 2
    assert not CAPTURE_LOCK.locked()


def test_the_static_decoder_captures_its_graphs_under_the_capture_lock():
    from types import SimpleNamespace

    from orchestrator.engines.capture_lock import CAPTURE_LOCK
    from orchestrator.engines.hf_static import StaticDecoder

    decoder = SimpleNamespace(_capture_exclusive=lambda *args: CAPTURE_LOCK.locked())
    assert StaticDecoder._capture(decoder, None, 1.0, 1.0, 128, 8) is True
    assert not CAPTURE_LOCK.locked()


# ------------------------------------------------------------- completion order (AReaL's queue)
COMPLETION = {**ASYNC, "algorithm.async_order": "completion", "trainer.total_steps": 4, "logging.rollouts_every": 1}


def _train_slow(root, train_world, **extra):
    from _train_world import slow_on_one_task

    from training.session import run

    policy, tasks = train_world
    cfg = load_config(None, overrides(root, policy, tasks, **extra))
    run(cfg, runtime=slow_on_one_task(1.5))
    rows = [json.loads(line) for line in (root / "run" / "rollouts.jsonl").read_text().splitlines()]
    return cfg, read_metrics(root / "run" / "metrics.jsonl"), rows


def test_completion_order_run_overtakes_a_slow_group_and_trains_every_group_once(tmp_path, train_world):
    cfg, metrics, rows = _train_slow(tmp_path, train_world, **COMPLETION)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    expected = {key: (q, cfg.rollout.rollouts_per_task) for key, q in sampled_groups(cfg, 4).items()}
    assert made_groups(rows) == expected                                  # none lost, none trained twice
    assert sum(m["async/groups_of_other_batches"] for m in metrics) > 0   # the slow group was overtaken
    for m in metrics:
        assert m["async/staleness_0"] + m["async/staleness_1"] == m["train/samples"]
    by_step = {}
    for r in rows:
        by_step.setdefault(r["step"], set()).add((r["batch_step"], r["slot"]))
    assert all(len(keys) == cfg.rollout.tasks_per_step for keys in by_step.values())


def test_batch_order_run_trains_each_batch_at_its_own_step(tmp_path, train_world):
    cfg, metrics, rows = _train_slow(tmp_path, train_world, **{**COMPLETION, "algorithm.async_order": "batch",
                                                              "trainer.total_steps": 2})
    assert all(r["batch_step"] == r["step"] for r in rows)
    assert all(m["async/groups_of_other_batches"] == 0 and m["async/dropped_stale"] == 0 for m in metrics)


def test_completion_order_resume_trains_exactly_the_groups_its_checkpoint_had_not(tmp_path, train_world):
    """The checkpoint after step 2 names the first batch not wholly trained and the slots trained
    from it on; a run resumed from a copy of it trains exactly the rest (every group of the four
    batches once across the two runs), the first of them from the checkpoint's weights or later."""
    import shutil

    from training.checkpoint import verify_checkpoint

    cfg, _, rows = _train_slow(tmp_path / "full", train_world, **COMPLETION)
    step2 = tmp_path / "full" / "run" / "checkpoints" / "step-00000002"
    state = verify_checkpoint(step2).load_state()
    before = {k for k, r in zip(((r["batch_step"] - 1, r["slot"]) for r in rows), rows) if r["step"] <= 2}
    first = state["first_batch"]
    told = {(j, i) for j in range(first) for i in range(2)} | {(j, i) for j, v in state["trained_slots"].items()
                                                                for i in v}
    assert told == before and state["policy_version"] == 2
    assert first < 2 or state["trained_slots"]                     # groups were trained out of order
    assert state["data_position"] == 2 * first                     # 2 tasks a batch, taken in order
    (tmp_path / "resumed" / "run" / "checkpoints").mkdir(parents=True)
    shutil.copytree(step2, tmp_path / "resumed" / "run" / "checkpoints" / step2.name)
    for other in ({"algorithm.async_order": "batch"}, {"algorithm.max_staleness": 0}):   # would lose or retrain groups
        with pytest.raises(ConfigError, match="algorithm.async_order: .* was written in completion order"):
            _train_slow(tmp_path / "resumed", train_world, **{**COMPLETION, **other})
    _, metrics, resumed = _train_slow(tmp_path / "resumed", train_world, **COMPLETION)
    assert [m["step"] for m in metrics] == [3, 4]
    sampled = sampled_groups(cfg, 4)
    assert made_groups(resumed) == {k: (q, cfg.rollout.rollouts_per_task) for k, q in sampled.items() if k not in before}
    assert min(t["policy_version"] for r in resumed for t in r["turns"]) >= 2


SIGTERM_ASYNC = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from pathlib import Path
from _train_world import overrides, slow_on_one_task
from training.config import load_config
from training.session import run
root, policy, tasks = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
cfg = load_config(None, overrides(root, policy, tasks, **{settings!r}))
run(cfg, runtime=slow_on_one_task(1.5))
"""


@pytest.mark.slow
def test_sigterm_in_completion_order_then_resume_trains_every_group_once(tmp_path, train_world):
    """SIGTERM after step 1 (groups of batch 1 trained ahead of batch 0's slow one): the job saves a
    checkpoint and exits 143; rerun, it resumes there and the two attempts together train every
    group of the sampler's four batches exactly once."""
    from pathlib import Path

    from _train_world import sigterm_after_step_1

    from training import checkpoint as ckpt

    root = Path(__file__).resolve().parents[2]
    policy, tasks = train_world
    settings = {**COMPLETION, "trainer.save_every": 100}
    script = tmp_path / "job.py"
    script.write_text(SIGTERM_ASYNC.format(root=str(root), tests=str(root / "tests"), settings=settings))
    code, output = sigterm_after_step_1(script, tmp_path, policy, tasks)
    assert code == ckpt.PREEMPTED_EXIT_CODE, output
    saved = ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")
    assert len(saved) == 1 and saved[0].name in ("step-00000001", "step-00000002"), output
    state = ckpt.verify_checkpoint(saved[0]).load_state()
    assert state["first_batch"] < state["step"] or state["trained_slots"], state   # saved mid-queue
    cfg, _, rows = _train_slow(tmp_path, train_world, **settings)   # run.resume auto: the same run folder
    # each step logged once over both attempts, every group trained once
    assert [m["step"] for m in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3, 4]
    assert made_groups(rows) == {k: (q, cfg.rollout.rollouts_per_task) for k, q in sampled_groups(cfg, 4).items()}
