"""Asynchronous training with bounded staleness (`algorithm.max_staleness: s > 0`, docs/async-training.md).

The rollouts of later steps are generated while the trainer updates on earlier ones, and a
batch's slow tail no longer holds back the next batch's start (s = 1):

    rollouts:  batch k   ......... tail |
               batch k+1     .............. tail |             (admitted at version k)
    trainer:   update k-1 |  (waits)    | update k |  (waits) | update k+1

Versions: the weights after v updates are version v (a run that resumes from step k starts at
version k).  The engine stamps every generation with the version of the weights that produced
it (`VersionedEngine`, inside the BatchingEngine, so a weight update lands between two engine
calls: a running episode's next turn uses the new weights, the turns it already took keep their
version).  A turn of version v trained by step k has staleness k - v.

The bound holds by admission: the producer starts batch j only once the trainer has published
version >= j - s (`RolloutProducer`).  With `algorithm.async_order: batch` step k trains batch k,
so every turn has staleness <= s; with `completion` step k trains the oldest groups done (AReaL's
rollout queue), so a slow group may be trained later than its batch's step.  Either way
`drop_stale` checks each sample and drops (does not regenerate) any turn over the bound; the count
is logged as `async/dropped_stale` (0 in batch order unless something broke).
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
Key = tuple[int, int]   # (batch, slot): the slot-th task of batch j, as the task sampler took it


@dataclass
class Produced:
    """One step's rollout groups, as the producer hands them to the trainer."""

    step: int
    batch: list[Task]                   # the groups' tasks
    groups: list[list[Rollout]] | None
    keys: list[Key]                     # each group's (batch, slot)
    rollout_time: float                 # the longest group's seconds from its batch's start to its last rollout's end
    admitted_versions: list[int]        # each group's: the trainer's published version when its batch started
    error: BaseException | None = None


@dataclass
class _Group:
    task: Task
    rollouts: list[Rollout]
    admitted_version: int
    seconds: float


class RolloutProducer:
    """Makes batches `first_batch`, ... `stop - 1` of rollout groups, each batch in a thread of its
    own, and hands the trainer `per_step` groups a step.

    Batch j is admitted (its tasks taken, its rollouts started) once the trainer's published
    version is >= j - `max_staleness` (`publish`), in batch order, so up to `max_staleness + 1`
    batches' worth of groups are in flight at once (a batch's slow tail overlaps the next batch's
    start) and no more than (version + max_staleness + 1) x `per_step` groups are ever started
    (AReaL's capacity rule).
    What step k trains (`get`) is `order`'s choice:
      - "batch": the groups of batch k, once all of them are done (a step waits for its batch's
        slowest group; every turn is within the bound by admission);
      - "completion": the `per_step` oldest (batch, slot) among the groups done, once that many are
        (AReaL's rollout queue: a slow group no longer holds a step back; it is trained by a later
        step, and its turns that are then more than `max_staleness` versions old are dropped by
        `drop_stale` and counted).
    `take(j)` -> (tasks, sampler position before them); `collect(j, tasks, slots, should_stop,
    on_group)` makes the tasks' groups (training.rollouts.collect_rollouts) and calls
    `on_group(i, rollouts)` as task i's group ends.  `trained` ({batch: slots}) are groups a
    resumed run trained before its checkpoint: their batch is taken again, those slots are not made."""

    def __init__(self, take: Callable[[int], tuple[list[Task], int]], collect: Callable[..., Any], *,
                 start: int, stop: int, max_staleness: int, version: int, per_step: int,
                 order: str = "batch", first_batch: int | None = None, trained: dict[int, Sequence[int]] | None = None):
        if max_staleness < 0:   # (0: each batch waits for the previous update: synchronous, used by tests)
            raise ValueError(f"RolloutProducer: max_staleness must be >= 0, got {max_staleness}")
        if order not in ("batch", "completion"):
            raise ValueError(f"RolloutProducer: order must be 'batch' or 'completion', got {order!r}")
        self._take, self._collect = take, collect
        self.stop_at, self.max_staleness = stop, max_staleness
        self.per_step, self.order = per_step, order
        self.first_batch = start if first_batch is None else first_batch
        self._trained: dict[int, set[int]] = {int(j): set(v) for j, v in (trained or {}).items()}
        self._version, self._stopped = version, False
        self._cond = threading.Condition()
        self._positions: dict[int, int] = {}
        self._slots: dict[int, list[int]] = {}          # admitted batch -> the slots it makes
        self._ready: dict[Key, _Group] = {}
        self._error: BaseException | None = None
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

    def resume_point(self, current: Callable[[], int]) -> tuple[int, int, dict[int, list[int]]]:
        """Where a checkpoint written now resumes: (the first batch with a group not trained, the
        sampler position before it (`current()`, read under the lock `take` runs under, when it is
        not taken yet), the slots of it and of the batches after it that were trained)."""
        with self._cond:
            j = self.first_batch
            while j in self._slots and set(self._slots[j]) <= self._trained.get(j, set()):
                j += 1
            trained = {b: sorted(v) for b, v in self._trained.items() if b >= j and v}
            return j, self._positions[j] if j in self._positions else current(), trained

    def get(self, step: int, timeout: float) -> Produced | None:
        """Step `step`'s groups (None on timeout); a batch's failure is returned as `error`."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._error is not None or self._choose(step) is not None, timeout):
                return None
            if self._error is not None:
                return Produced(step, [], None, [], 0.0, [], self._error)
            keys = self._choose(step)
            chosen = [self._ready.pop(k) for k in keys]
            for j, i in keys:
                self._trained.setdefault(j, set()).add(i)
        return Produced(step, [g.task for g in chosen], [g.rollouts for g in chosen], keys,
                        max((g.seconds for g in chosen), default=0.0), [g.admitted_version for g in chosen])

    def _choose(self, step: int) -> list[Key] | None:
        if self.order == "batch":
            if step not in self._slots:
                return None
            keys = [(step, i) for i in self._slots[step]]
            return keys if all(k in self._ready for k in keys) else None
        return sorted(self._ready)[:self.per_step] if len(self._ready) >= self.per_step else None

    def _admit(self) -> None:
        try:
            for j in range(self.first_batch, self.stop_at):
                with self._cond:
                    self._cond.wait_for(lambda: self._stopped or self._version >= j - self.max_staleness)
                    if self._stopped:
                        return
                    admitted = self._version
                    batch, position = self._take(j)
                    self._positions[j] = position
                    slots = [i for i in range(len(batch)) if i not in self._trained.get(j, ())]
                    self._slots[j] = slots
                threading.Thread(target=self._make, args=(j, [batch[i] for i in slots], slots, admitted),
                                 name=f"rollouts-step-{j}", daemon=True).start()
        except BaseException as exc:   # (a failing take): the trainer raises it instead of waiting forever
            with self._cond:
                self._error = self._error or exc
                self._cond.notify_all()

    def _make(self, j: int, tasks: list[Task], slots: list[int], admitted: int) -> None:
        started = time.monotonic()

        def on_group(k: int, rollouts: list[Rollout]) -> None:
            with self._cond:
                self._ready[(j, slots[k])] = _Group(tasks[k], list(rollouts), admitted, time.monotonic() - started)
                self._cond.notify_all()
        try:
            self._collect(j, tasks, slots, self.stopped, on_group)
        except BaseException as exc:   # handed to the trainer, which raises it
            with self._cond:
                if self._error is None:
                    self._error = exc
                self._cond.notify_all()
