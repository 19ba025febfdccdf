"""Asynchronous training with bounded staleness (`algorithm.max_staleness: s > 0`, docs/training.md).

The rollouts of later steps are generated while the trainer updates on earlier ones, and a
batch's slow tail no longer holds back the next batch's start (s = 1):

    rollouts:  batch k   ......... tail |
               batch k+1     .............. tail |             (admitted at version k)
    trainer:   update k-1 |  (waits)    | update k |  (waits) | update k+1

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
    """Makes batches `start`, `start + 1`, ... `stop - 1`, each in a thread of its own.

    Batch j is admitted (its tasks taken, its rollouts started) once the trainer's published
    version is >= j - `max_staleness` (`publish`), so it never runs ahead of the bound; admission
    is in step order, and up to `max_staleness + 1` batches are in flight at once (a batch's slow
    tail overlaps the next batch's start).  `take(j)` -> (tasks, sampler position before them);
    `collect(j, tasks, should_stop)` -> the rollout groups (training.rollouts.collect_rollouts).
    `get(step, timeout)` returns that step's `Produced` (None on timeout)."""

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
        self._done: dict[int, Produced] = {}
        self._thread = threading.Thread(target=self._admit, name="rollout-producer", daemon=True)

    def begin(self) -> RolloutProducer:
        self._thread.start()
        return self

    def publish(self, version: int) -> None:
        """The trainer's weights are now `version` (the engine already has them)."""
        with self._cond:
            self._version = version
            self._cond.notify_all()

    def stop(self) -> None:
        """Stop admitting batches and abandon the running ones (their episodes' threads finish alone)."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def stopped(self) -> bool:
        return self._stopped

    def position(self, step: int, current: int) -> int:
        """The sampler position before batch `step` (`current` when it is not taken yet)."""
        with self._cond:
            return self._positions.get(step, current)

    def get(self, step: int, timeout: float) -> Produced | None:
        with self._cond:
            if not self._cond.wait_for(lambda: step in self._done, timeout):
                return None
            return self._done.pop(step)

    def _admit(self) -> None:
        for step in range(self.start, self.stop_at):
            with self._cond:
                self._cond.wait_for(lambda: self._stopped or self._version >= step - self.max_staleness)
                if self._stopped:
                    return
                admitted = self._version
                batch, position = self._take(step)
                self._positions[step] = position
            threading.Thread(target=self._make, args=(step, batch, position, admitted),
                             name=f"rollouts-step-{step}", daemon=True).start()

    def _make(self, step: int, batch: list[Task], position: int, admitted: int) -> None:
        started = time.monotonic()
        try:
            groups, error = self._collect(step, batch, self.stopped), None
        except BaseException as exc:   # handed to the trainer, which raises it
            groups, error = None, exc
        with self._cond:
            self._done[step] = Produced(step, batch, groups, position, time.monotonic() - started, admitted, error)
            self._cond.notify_all()
