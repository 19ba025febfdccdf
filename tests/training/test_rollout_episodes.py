"""collect_rollouts tells a BatchingEngine which episodes are in flight (its lingering)."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from orchestrator.engines.batcher import BatchingEngine
from training import rollouts


class NoEngine:
    tokenizer = None

    def generate(self, prompts, params, *, seeds=None):
        raise AssertionError("not called")

    def update_weights(self, weights):
        pass


def test_each_running_episode_is_registered_with_the_engine(monkeypatch):
    """Every episode runs inside `engine.episodes()`: 6 episodes held at a barrier see 6
    registered; after the collection none is."""
    barrier, seen = threading.Barrier(6), []
    with BatchingEngine(NoEngine(), linger_ms=100) as engine:
        def episode(task, policy, runtime, config):
            barrier.wait(timeout=10)
            seen.append(engine._episodes)
            barrier.wait(timeout=10)
            return task

        monkeypatch.setattr(rollouts, "run_episode", episode)
        groups = rollouts.collect_rollouts(list(range(3)), engine, SimpleNamespace(), None, rollouts_per_task=2,
                                           seed=0, step=0, price_model="Qwen3-8B", concurrency=6)
        assert seen == [6] * 6 and engine._episodes == 0
    assert groups == [[0, 0], [1, 1], [2, 2]]


def test_episodes_are_registered_before_any_starts(monkeypatch):
    """4 episodes, 2 threads: the first two already count the two not started (their first
    requests would otherwise find nobody away and run without the others); each that ends
    leaves the count."""
    seen, lock = [], threading.Lock()
    with BatchingEngine(NoEngine(), linger_ms=100) as engine:
        def episode(task, policy, runtime, config):
            with lock:
                seen.append(engine._episodes)
            return task

        monkeypatch.setattr(rollouts, "run_episode", episode)
        rollouts.collect_rollouts(list(range(4)), engine, SimpleNamespace(), None, rollouts_per_task=1, seed=0,
                                  step=0, price_model="Qwen3-8B", concurrency=2)
        assert engine._episodes == 0
    assert seen[0] == 4 and sorted(seen, reverse=True) == seen and seen[-1] >= 1, seen


def test_abandoned_episodes_leave_the_count(monkeypatch):
    """A collection that fails part-way (here an episode raises) unregisters the rest at once,
    and an abandoned episode that ends later does not count twice."""
    with BatchingEngine(NoEngine(), linger_ms=100) as engine:
        def episode(task, policy, runtime, config):
            if task == 0:
                raise RuntimeError("boom")
            time.sleep(0.3)                   # still running (or never started) when the collection fails
            return task

        monkeypatch.setattr(rollouts, "run_episode", episode)
        with pytest.raises(RuntimeError, match="boom"):
            rollouts.collect_rollouts(list(range(3)), engine, SimpleNamespace(), None, rollouts_per_task=1, seed=0,
                                      step=0, price_model="Qwen3-8B", concurrency=1)
        assert engine._episodes == 0
        time.sleep(0.5)
        assert engine._episodes == 0


def test_an_engine_without_episodes_still_runs_them(monkeypatch):
    monkeypatch.setattr(rollouts, "run_episode", lambda task, policy, runtime, config: task)
    assert rollouts.collect_rollouts(["a"], NoEngine(), SimpleNamespace(), None, rollouts_per_task=2, seed=0,
                                     step=0, price_model="Qwen3-8B", concurrency=2) == [["a", "a"]]


def test_slots_give_a_tasks_rollouts_the_seeds_of_its_place_in_the_batch_and_groups_are_reported_once(monkeypatch):
    """A resumed asynchronous run makes a batch's leftover task alone (`slots=[1]`): its rollouts get
    the seeds they had as slot 1 of the whole batch; `on_group` follows each task's last rollout."""
    monkeypatch.setattr(rollouts, "run_episode", lambda task, policy, runtime, config: (task, policy.engine._seed))
    common = dict(runtime=SimpleNamespace(), config=None, rollouts_per_task=3, seed=7, step=4,
                  price_model="Qwen3-8B", concurrency=2)
    whole = rollouts.collect_rollouts(["a", "b"], NoEngine(), **common)
    reported = []
    alone = rollouts.collect_rollouts(["b"], NoEngine(), slots=[1], on_group=lambda i, g: reported.append((i, list(g))),
                                      **common)
    assert alone == [whole[1]] and reported == [(0, whole[1])]
    assert whole[1] == [("b", rollouts.rollout_seed(7, 4, 1, j)) for j in range(3)]
    with pytest.raises(ValueError, match="2 slots for 1 tasks"):
        rollouts.collect_rollouts(["b"], NoEngine(), slots=[0, 1], **common)
