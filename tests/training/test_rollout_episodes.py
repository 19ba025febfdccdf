"""collect_rollouts tells a BatchingEngine which episodes are in flight (its lingering)."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from orchestrator.engines.batcher import BatchingEngine
from training import rollouts


class NoEngine:
    tokenizer = None

    def generate(self, prompts, params, *, seeds=None):
        raise AssertionError("not called")

    def update_weights(self, weights):
        pass


def test_each_running_episode_is_registered_with_the_engine(monkeypatch):
    """Every episode runs inside `engine.episode()`: 6 episodes held at a barrier see 6
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


def test_an_engine_without_episodes_still_runs_them(monkeypatch):
    monkeypatch.setattr(rollouts, "run_episode", lambda task, policy, runtime, config: task)
    assert rollouts.collect_rollouts(["a"], NoEngine(), SimpleNamespace(), None, rollouts_per_task=2, seed=0,
                                     step=0, price_model="Qwen3-8B", concurrency=2) == [["a", "a"]]
