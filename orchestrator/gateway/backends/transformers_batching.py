"""Batch concurrent in-process generations of one model into one `generate` call.

Threads that call the transformers backend at the same time hand their prompts to the
model's `Batcher`.  Whoever finds the model idle becomes the leader: it waits a few
milliseconds for company, takes up to `max_batch` queued jobs that share the same
generation settings, left-pads them into one batch, runs `generate` and hands each job its
own generated ids.  The others wait for their result (or for their turn to lead).  A lone
request runs exactly as it would unbatched.

Why: on CPU one batched forward pass costs little more than a single one, so 8 concurrent
expert calls run ~3-4x faster together than one after another.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

GATHER_S = 0.05     # how long a leader waits for other requests to join its batch (s)
log = logging.getLogger("toolorchestra.gateway")


@dataclass
class Job:
    """One request: prompt ids, the generate kwargs (a batch shares them) and the result."""

    prompt: list[int]
    kwargs: dict[str, Any]
    group: tuple                                          # jobs batch together only within a group
    deadline: float = float("inf")                        # time.monotonic() by which it must end
    allowed: Callable[[tuple[int, ...]], list[int]] | None = None   # constrained decoding
    seed: int | None = None                               # seeded jobs run alone (group is unique)
    generated: list[int] | None = None                    # ids after the prompt (padding included)
    error: BaseException | None = None
    done: threading.Event = field(default_factory=threading.Event)


class Batcher:
    """One per loaded model; thread-safe."""

    def __init__(self, model, pad_id: int, max_batch: int = 8):
        self.model, self.pad_id, self.max_batch = model, pad_id, max_batch
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: list[Job] = []
        self._busy = False
        self.stats = {"generate_calls": 0, "jobs": 0}     # mean batch size = jobs / generate_calls

    def run(self, job: Job) -> list[int]:
        """Generate for `job` (possibly batched with others); return its generated ids."""
        with self._lock:
            self._queue.append(job)
        while not job.done.is_set():
            with self._lock:
                lead = not self._busy and job in self._queue
                if lead:
                    self._busy = True
                elif not job.done.is_set():
                    self._wake.wait(timeout=0.5)
                    continue
            if lead:
                time.sleep(GATHER_S)
                self._lead(job)
        if job.error is not None:
            raise job.error
        return job.generated

    def _take(self, leader: Job) -> list[Job]:
        with self._lock:
            batch = [j for j in self._queue if j.group == leader.group][:self.max_batch]
            if leader not in batch:          # the leader always runs in its own batch
                batch = [leader] + batch[:self.max_batch - 1]
            for j in batch:
                self._queue.remove(j)
        return batch

    def _lead(self, leader: Job) -> None:
        batch = self._take(leader)
        self.stats["generate_calls"] += 1
        self.stats["jobs"] += len(batch)
        log.debug("generate for a batch of %d job(s)", len(batch))
        try:
            outputs = self._generate(batch)
            for job, ids in zip(batch, outputs):
                job.generated = ids
        except BaseException as exc:          # every job of the batch sees the failure
            for job in batch:
                job.error = exc
        finally:
            for job in batch:
                job.done.set()
            with self._lock:
                self._busy = False
                self._wake.notify_all()

    def _generate(self, batch: list[Job]) -> list[list[int]]:
        import torch

        width = max(len(j.prompt) for j in batch)
        ids = [[self.pad_id] * (width - len(j.prompt)) + j.prompt for j in batch]       # left padding
        mask = [[0] * (width - len(j.prompt)) + [1] * len(j.prompt) for j in batch]
        kwargs = dict(batch[0].kwargs)
        # The batch stops when its earliest deadline passes; time spent queued counts too.
        kwargs["max_time"] = max(0.001, min(j.deadline for j in batch) - time.monotonic())
        if batch[0].allowed is not None:
            kwargs["prefix_allowed_tokens_fn"] = \
                lambda row, seq: batch[row].allowed(tuple(seq[width:].tolist()))
        device = self.model.device
        if batch[0].seed is not None:
            torch.manual_seed(batch[0].seed)     # process-wide RNG: set right before this generate
        with torch.inference_mode():
            out = self.model.generate(torch.tensor(ids, device=device),
                                      attention_mask=torch.tensor(mask, device=device), **kwargs)
        return [row[width:].tolist() for row in out]
