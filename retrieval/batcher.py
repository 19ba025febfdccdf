"""Micro-batching: many concurrent callers, a few worker threads, one call per batch.

Callers `submit` a list of items (one request's queries) and get a Future; a worker
thread takes everything queued (up to `max_batch` items), runs `fn` once over the
concatenation and hands each caller its slice. Batches form by themselves under load:
while a worker searches, new requests queue up and go together next time. `max_wait_s`
optionally holds a batch open a little longer for stragglers.

`workers` > 1 lets several batches encode at once (one per CPU core, with one torch
thread each); `fn` must then be thread-safe: `Searcher.search` serialises index access.
"""
from __future__ import annotations

import logging
import math
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

log = logging.getLogger(__name__)


class Overloaded(RuntimeError):
    """More requests are waiting than `max_pending`: the caller should retry later."""


class MicroBatcher:
    """Run `fn(items) -> results` (same length, same order) over micro-batches on one thread."""

    def __init__(self, fn: Callable[[list], list], max_batch: int = 256, max_wait_s: float = 0.0,
                 max_pending: int = 4096, workers: int = 1, name: str = "retrieval-batcher"):
        self.fn, self.max_batch, self.max_wait_s = fn, max_batch, max_wait_s
        self._queue: queue.Queue = queue.Queue(maxsize=max_pending)
        self.batches = 0          # calls of fn so far (tests and benchmarks read it)
        self._count_lock = threading.Lock()
        self._closed = False
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(max(1, workers))]
        for thread in self._threads:
            thread.start()

    def submit(self, items: Sequence) -> Future:
        """Queue one request's items; the Future resolves to their results (a list)."""
        if self._closed:
            raise RuntimeError("the batcher is closed")
        fut: Future = Future()
        try:
            self._queue.put_nowait((list(items), fut))
        except queue.Full:
            raise Overloaded(f"{self._queue.maxsize} requests already waiting") from None
        return fut

    def close(self, timeout: float = 5.0) -> None:
        """Stop the workers after the batches already queued."""
        if not self._closed:
            self._closed = True
            for _ in self._threads:
                self._queue.put((None, None))
            for thread in self._threads:
                thread.join(timeout)

    def _take_batch(self) -> list[tuple[list, Future]] | None:
        first = self._queue.get()
        if first[0] is None:
            return None
        batch, size = [first], len(first[0])
        # Leave a fair share of what is queued to the other workers, so that on CPU every
        # core encodes instead of one worker taking everything while the others idle.
        share = math.ceil((1 + self._queue.qsize()) / len(self._threads))
        limit = max(1, min(self.max_batch, share)) if len(self._threads) > 1 else self.max_batch
        deadline = time.monotonic() + self.max_wait_s
        while size < limit:
            try:
                wait = deadline - time.monotonic()
                item = self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait()
            except queue.Empty:
                break
            if item[0] is None:                 # close() while collecting: finish this batch first
                self._queue.put(item)
                break
            batch.append(item)
            size += len(item[0])
        return batch

    def _run(self) -> None:
        while True:
            batch = self._take_batch()
            if batch is None:
                return
            # A caller that timed out cancelled its Future: skip its work entirely.
            batch = [(items, fut) for items, fut in batch if fut.set_running_or_notify_cancel()]
            if not batch:
                continue
            flat = [x for items, _ in batch for x in items]
            try:
                results = self.fn(flat)
                self._count()
            except Exception:                   # noqa: BLE001 -- isolate the request that broke it
                log.exception("retrieval batch of %d queries failed; retrying its requests one by one", len(flat))
                for items, fut in batch:
                    self._run_alone(items, fut)
                continue
            start = 0
            for items, fut in batch:
                fut.set_result(results[start:start + len(items)])
                start += len(items)

    def _run_alone(self, items: list, fut: Future) -> None:
        # One bad request must not fail the others it happened to be batched with.
        try:
            fut.set_result(self.fn(items))
            self._count()
        except Exception as err:                # noqa: BLE001 -- reported to its caller only
            fut.set_exception(err)

    def _count(self) -> None:
        with self._count_lock:
            self.batches += 1
