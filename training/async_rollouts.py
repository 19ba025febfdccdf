"""Asynchronous training with bounded staleness (`algorithm.max_staleness: s > 0`, docs/training.md).

The rollouts of later steps are generated while the trainer updates on earlier ones:

    producer thread:  batch k+1 rollouts | batch k+2 rollouts | ...
    trainer thread:   update on batch k  | update on batch k+1 | ...

Versions: the weights after v updates are version v (a run that resumes from step k starts at
version k).  The engine stamps every generation with the version of the weights that produced
it (`VersionedEngine`, inside the BatchingEngine, so a weight update lands between two engine
calls: a running episode's next turn uses the new weights, the turns it already took keep their
version).  Step k trains batch k; a turn of version v in it has staleness k - v.

The bound holds by admission: the producer starts batch j only once the trainer has published
version >= j - s (`RolloutProducer`), so every turn of batch j has staleness <= s when step j
trains it.  `drop_stale` checks it again per sample and drops (does not regenerate) any turn
over the bound; the count is logged as `async/dropped_stale` (0 unless something broke).
"""
from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.loop import Task
from orchestrator.records import Rollout
from training.samples import TurnSample


# ---------------------------------------------------------------------------- versions
@dataclass
class VersionedWeights:
    """What `VersionedEngine.update_weights` takes: new weights (None: unchanged, e.g. a step
    whose batch was filtered empty) and the version they are."""

    state_dict: Any
    version: int


class VersionedEngine:
    """An engine that stamps each `Generation` with its weights' version (`policy_version`).

    Put it *inside* a BatchingEngine: the batcher's worker is then the one caller of both
    `generate` and `update_weights`, so the version read at a call is that of the weights the
    call runs with.  `generate` keeps the wrapped engine's signature (the batcher looks for
    `seeds=` / `deadlines=` on it)."""

    def __init__(self, engine, version: int = 0):
        self.engine, self.version, self.tokenizer = engine, version, engine.tokenizer

        @functools.wraps(engine.generate)
        def generate(prompts, params, **kwargs):
            version = self.version
            out = engine.generate(prompts, params, **kwargs)
            for gen in out:
                gen.policy_version = version
            return out
        self.generate = generate

    def update_weights(self, weights: VersionedWeights) -> None:
        if not isinstance(weights, VersionedWeights):
            raise TypeError(f"VersionedEngine.update_weights: expected VersionedWeights(state_dict, version), "
                            f"got {type(weights).__name__}")
        if weights.state_dict is not None:
            self.engine.update_weights(weights.state_dict)
        self.version = weights.version

    def close(self) -> None:
        getattr(self.engine, "close", lambda: None)()


# ---------------------------------------------------------------------------- staleness (pure)
def staleness(samples: Sequence[TurnSample], step: int) -> list[int]:
    """step - policy_version of each sample (a sample without a version counts as fresh)."""
    return [0 if s.policy_version is None else step - s.policy_version for s in samples]


def drop_stale(samples: Sequence[TurnSample], step: int, max_staleness: int) -> tuple[list[TurnSample], dict[str, float]]:
    """The samples step `step` may train on (staleness <= `max_staleness`) and the metrics:
    `async/dropped_stale` (samples over the bound, dropped), `async/staleness_<d>` (kept samples of
    staleness d, every d in 0..max_staleness), `async/staleness_mean` (over the kept)."""
    ages = staleness(samples, step)
    if any(a < 0 for a in ages):
        raise ValueError(f"step {step}: a sample's policy_version is newer than the step ({max(-min(ages), 0)} "
                         "ahead); versions must count the updates applied before the sample was generated")
    kept = [s for s, a in zip(samples, ages) if a <= max_staleness]
    kept_ages = [a for a in ages if a <= max_staleness]
    metrics = {"async/dropped_stale": float(len(samples) - len(kept)),
               "async/staleness_mean": sum(kept_ages) / len(kept_ages) if kept_ages else 0.0}
    for d in range(max_staleness + 1):
        metrics[f"async/staleness_{d}"] = float(sum(a == d for a in kept_ages))
    return kept, metrics


# ---------------------------------------------------------------------------- the producer
@dataclass
class Produced:
    """One step's rollouts, made by the producer thread."""

    step: int
    batch: list[Task]
    groups: list[list[Rollout]] | None
    position: int                       # the task sampler's position before this batch was taken
    rollout_time: float                 # seconds from its first rollout's start to its last's end
    admitted_version: int               # the trainer's published version when the batch started
    error: BaseException | None = None


class RolloutProducer:
    """Makes batches `start`, `start + 1`, ... `stop - 1` in a background thread, in order.

    Batch j starts once the trainer's published version is >= j - `max_staleness` (`publish`),
    so it never runs ahead of the bound.  `take(j)` -> (tasks, sampler position before them);
    `collect(j, tasks, should_stop)` -> the rollout groups (training.rollouts.collect_rollouts).
    `get(timeout)` returns the next `Produced` in step order (None on timeout)."""

    def __init__(self, take: Callable[[int], tuple[list[Task], int]],
                 collect: Callable[[int, list[Task], Callable[[], bool]], list[list[Rollout]]], *,
                 start: int, stop: int, max_staleness: int, version: int):
        if max_staleness < 0:   # (0: each batch waits for the previous update: synchronous, used by tests)
            raise ValueError(f"RolloutProducer: max_staleness must be >= 0, got {max_staleness}")
        self._take, self._collect = take, collect
        self.start, self.stop_at, self.max_staleness = start, stop, max_staleness
        self._version, self._stopped = version, False
        self._cond = threading.Condition()
        self._positions: dict[int, int] = {}
        self._out: queue.Queue[Produced] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    def begin(self) -> RolloutProducer:
        self._thread.start()
        return self

    def publish(self, version: int) -> None:
        """The trainer's weights are now `version` (the engine already has them)."""
        with self._cond:
            self._version = version
            self._cond.notify_all()

    def stop(self) -> None:
        """Stop admitting batches and abandon the running one (its episodes' threads finish alone)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def stopped(self) -> bool:
        return self._stopped

    def position(self, step: int, current: int) -> int:
        """The sampler position before batch `step` (`current` when it is not taken yet)."""
        with self._cond:
            return self._positions.get(step, current)

    def get(self, timeout: float) -> Produced | None:
        try:
            return self._out.get(timeout=timeout)
        except queue.Empty:
            return None

    def _run(self) -> None:
        for step in range(self.start, self.stop_at):
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or self._version >= step - self.max_staleness)
                if self._stopped:
                    return
                admitted = self._version
                batch, position = self._take(step)
                self._positions[step] = position
            started = time.monotonic()
            try:
                groups = self._collect(step, batch, self.stopped)
            except BaseException as exc:   # handed to the trainer, which raises it
                self._out.put(Produced(step, batch, None, position, time.monotonic() - started, admitted, exc))
                return
            self._out.put(Produced(step, batch, groups, position, time.monotonic() - started, admitted))
