"""Serve many rollout threads from one engine in shared batches: asynchronous rollouts.

Each rollout runs in its own thread and calls `generate([its prompt], params)` whenever it
needs the policy's next turn; while some rollouts wait for tools (a search, the code
sandbox, an expert model), the others' requests are queued and run together.  One worker
thread owns the engine: it takes the oldest waiting request, gathers the requests that
arrive within `max_wait_ms` (up to `max_batch` prompts) with the same sampling
parameters, runs them as one `engine.generate` call and hands each caller its own rows.

Semantics (what a caller can rely on):
- a call returns the same generations as a direct `engine.generate` call would (up to
  float rounding from padding): seeded rows keep their seeds `seed + i` when merged,
  through the engine's `seeds=` argument; engines without it never merge seeded calls;
- an exception raised for a merged batch is retried per request, so only the request
  that caused it sees it;
- `generate(..., deadline=t)` passes the request's deadline to the engine per row (HFEngine:
  a row still generating at `t` ends with finish_reason "timeout"); engines that take no
  `deadlines=` refuse a deadline; `generate(..., cancel=event)` likewise hands the request's
  cancel event to engines that take `cancels=` (a row whose event is set stops at its next
  token: orchestrator/cancellation.py); other engines run the request to its end;
- `seeded_alone=True` (the gateway's transformers backend): a request with a seed runs in an
  engine call of its own, so its reply cannot depend, through padding, on its batch-mates;
- `update_weights` is a barrier: requests queued before it run on the old weights,
  requests queued after it on the new ones.

The batch is formed between engine calls (no joining a generation already running).

Lingering (multi-turn rollouts): callers that will come back (an episode between two turns,
away in a tool call) register (`batcher.episodes(n)`, each `.end()`s; `with batcher.episodes():`
for one); training.rollouts.collect_rollouts registers all of a collection's episodes before
the first starts.  While any registered episode is away (no request waiting) and the batch is
not full, the batch keeps gathering until it is full, until every registered episode is
waiting (nobody else can come; an episode that ends wakes it), or until `linger_ms` (and at
most the last engine call's wall time) has passed since it began: a cohort of episodes that
left for their tools together and comes back tens of milliseconds apart (each thread's own
Python work between the tool's reply and its next request, one thread at a time under the GIL)
is served in one engine call instead of a small first batch and a second call for the rest.
Waiting at most one engine call is the break-even: a request that arrives during a call
started without it waits that call out anyway.  No episode registered (the gateway,
evaluation): the old policy, `max_wait_ms` after the first request, no more.
"""
from __future__ import annotations

import dataclasses
import inspect
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from orchestrator.engines.interface import Generation, SamplingParams
from orchestrator.engines.common import row_seeds


@dataclass
class _Request:
    prompts: list[list[int]] | None          # None: a weight update (barrier)
    params: SamplingParams | None
    future: Future = field(default_factory=Future)
    weights: object = None
    deadline: float | None = None            # time.monotonic() by which every row ends
    cancel: threading.Event | None = None    # set: every row ends at its next token


_WAKE = object()                                 # queued to wake a lingering batch; carries no request


class Episodes:
    """Episodes registered with a BatchingEngine (`BatchingEngine.episodes`); thread-safe."""

    def __init__(self, batcher: "BatchingEngine", n: int):
        if n < 0:
            raise ValueError(f"BatchingEngine.episodes(n={n}): expected n >= 0")
        self._batcher, self._left, self._lock = batcher, n, threading.Lock()
        batcher._register(n)

    def end(self) -> None:
        """One of them has finished (or failed); after `close()` (or once all have) nothing."""
        with self._lock:
            if self._left == 0:
                return
            self._left -= 1
        self._batcher._register(-1)

    def close(self) -> None:
        """The ones not ended are no longer coming (finished, abandoned)."""
        with self._lock:
            left, self._left = self._left, 0
        if left:
            self._batcher._register(-left)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@dataclass
class BatcherStats:
    requests: int = 0          # generate calls received
    rows: int = 0              # prompts received
    engine_calls: int = 0      # engine.generate calls made
    max_rows_per_call: int = 0


class BatchingEngine:
    """Thread-safe `Engine` wrapper batching concurrent `generate` calls over one engine.

    Args:
        engine: any `Engine` (HFEngine, VLLMEngine, ...).
        max_batch: most prompts per engine call.
        max_wait_ms: after the first request of a batch arrives, how long (milliseconds)
            to wait for more before running it.
        seeded_alone: run every request that carries a seed in an engine call of its own.
        linger_ms: while registered episodes are away (`episodes()`), how long (milliseconds
            after a batch began gathering, and at most the last engine call's time) a batch
            short of `max_batch` may wait for them; 0: no lingering.
    """

    def __init__(self, engine, max_batch: int = 32, max_wait_ms: float = 5.0, seeded_alone: bool = False,
                 linger_ms: float = 0.0):
        if max_batch < 1 or max_wait_ms < 0 or linger_ms < 0:
            raise ValueError(f"BatchingEngine: max_batch={max_batch} must be >= 1, max_wait_ms={max_wait_ms} "
                             f"and linger_ms={linger_ms} >= 0")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.max_batch = max_batch
        self.max_wait = max_wait_ms / 1000.0
        self.linger = linger_ms / 1000.0
        self._lock = threading.Lock()
        self._episodes = 0                        # registered episodes in flight (`episodes()`)
        self._waiting = 0                         # generate requests submitted, not yet answered
        self._call_seconds: float | None = None   # the last engine call's wall time
        self.seeded_alone = seeded_alone
        self.stats = BatcherStats()
        taken = inspect.signature(engine.generate).parameters
        self._takes_seeds, self._takes_deadlines = "seeds" in taken, "deadlines" in taken
        self._takes_cancels = "cancels" in taken
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._pending: list[_Request] = []        # taken from the queue, not yet run (worker only)
        self._closed = False
        self._worker = threading.Thread(target=self._serve, name="batching-engine", daemon=True)
        self._worker.start()

    # ---------------------------------------------------------------- Engine API
    def generate(self, prompts: list[list[int]], params: SamplingParams, *,
                 deadline: float | None = None, cancel: threading.Event | None = None) -> list[Generation]:
        """Blocks until this call's generations are ready (one per prompt, in order).

        `deadline`: a `time.monotonic()` value by which generation ends (time queued counts).
        `cancel`: once set, generation ends at the next token (finish_reason "cancelled")."""
        if not prompts:
            raise ValueError("generate(prompts=...): expected a non-empty list of token-id lists")
        if deadline is not None and not self._takes_deadlines:
            raise ValueError(f"generate(deadline=...): {type(self.engine).__name__} takes no deadlines "
                             "(HFEngine does); leave deadline unset")
        return self._submit(_Request(prompts=[list(p) for p in prompts], params=params,
                                     deadline=deadline, cancel=cancel)).result()

    def episodes(self, n: int = 1) -> "Episodes":
        """Registers `n` episodes in flight (started or about to start) until each `end()`s or
        the returned handle closes: between its requests an episode is away (a tool call) and
        will be back, which lets a short batch linger for it.  Register them all before the
        first starts, so the first requests do not run alone while the others are starting."""
        return Episodes(self, n)

    def _register(self, n: int) -> None:
        with self._lock:
            self._episodes += n
        if n < 0:
            self._queue.put(_WAKE)               # a lingering batch re-checks who can still come

    def update_weights(self, state_dict_or_path) -> None:
        """Applies new weights once every request queued before this call has run."""
        self._submit(_Request(prompts=None, params=None, weights=state_dict_or_path)).result()

    def close(self) -> None:
        """Finish queued requests, then stop the worker thread."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)
            self._worker.join()
            while not self._queue.empty():       # submitted while closing: fail, never hang
                late = self._queue.get()
                if late is not None and late is not _WAKE:
                    late.future.set_exception(RuntimeError("BatchingEngine was closed"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---------------------------------------------------------------- worker
    def _submit(self, request: _Request) -> Future:
        if self._closed:
            raise RuntimeError("BatchingEngine is closed")
        if request.prompts is not None:
            with self._lock:
                self._waiting += 1
            request.future.add_done_callback(self._answered)
        self._queue.put(request)
        return request.future

    def _answered(self, _future) -> None:
        with self._lock:
            self._waiting -= 1

    def _away(self) -> int:
        """Registered episodes with no request waiting (in a tool call, or between two turns)."""
        with self._lock:
            return self._episodes - self._waiting

    def _key(self, params: SamplingParams):
        """Requests with equal keys may share one engine call."""
        if params.seed is not None and (self.seeded_alone or not self._takes_seeds):
            return object()                      # seeded: never merged
        return repr(dataclasses.replace(params, seed=None))

    def _serve(self) -> None:
        while True:
            while not self._pending:
                self._take(self._queue.get())
            self._gather()
            head = self._pending.pop(0)
            if head is None:                     # close(): everything before it has run
                return
            if head.prompts is None:
                self._settle(head, lambda r=head: self.engine.update_weights(r.weights))
            else:
                self._run_batch(head)

    def _take(self, request: _Request | None) -> None:
        if request is _WAKE:
            return
        self._pending.append(request)
        if request is not None and request.prompts is not None:
            self.stats.requests += 1
            self.stats.rows += len(request.prompts)

    def _gather(self) -> None:
        """Move requests from the queue to `_pending` until the batch is full or the wait is over:
        `max_wait` after it began or, while registered episodes are away, `linger` (at most the
        last engine call's time) after it began."""
        began = time.monotonic()
        linger = min(self.linger, self._call_seconds if self._call_seconds is not None else self.linger)
        rows = sum(len(r.prompts) for r in self._pending if r is not None and r.prompts)
        while rows < self.max_batch and not any(r is None or r.prompts is None for r in self._pending):
            deadline = began + self.max_wait
            if linger and self._away() > 0:
                deadline = max(deadline, began + linger)
            try:
                request = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return
            self._take(request)
            if request is not None and request is not _WAKE and request.prompts is not None:
                rows += len(request.prompts)

    def _run_batch(self, head: _Request) -> None:
        """Run `head` with the pending requests before the first barrier that share its key."""
        batch, key, rows = [head], self._key(head.params), len(head.prompts)
        for request in list(self._pending):
            if request is None or request.prompts is None:
                break                            # a barrier: only what came before it
            if self._key(request.params) == key and rows + len(request.prompts) <= self.max_batch:
                batch.append(request)
                rows += len(request.prompts)
                self._pending.remove(request)
        try:
            results = self._call(batch)
        except Exception as e:
            if len(batch) == 1:
                head.future.set_exception(e)
            else:                                # find the culprit: retry each on its own
                for request in batch:
                    self._settle(request, lambda r=request: self._call([r])[0])
            return
        for request, result in zip(batch, results):
            request.future.set_result(result)

    def _call(self, batch: list[_Request]) -> list[list[Generation]]:
        """One engine call for `batch`; returns each request's generations."""
        prompts = [p for r in batch for p in r.prompts]
        params = batch[0].params
        self.stats.engine_calls += 1
        self.stats.max_rows_per_call = max(self.stats.max_rows_per_call, len(prompts))
        kwargs = {}
        if self._takes_seeds:
            kwargs["seeds"] = [s for r in batch for s in row_seeds(r.params, len(r.prompts))]
        if any(r.deadline is not None for r in batch):
            kwargs["deadlines"] = [r.deadline for r in batch for _ in r.prompts]
        if self._takes_cancels and any(r.cancel is not None for r in batch):
            kwargs["cancels"] = [r.cancel for r in batch for _ in r.prompts]
        started = time.monotonic()
        out = self.engine.generate(prompts, params, **kwargs)
        self._call_seconds = time.monotonic() - started
        split, start = [], 0
        for r in batch:
            split.append(out[start:start + len(r.prompts)])
            start += len(r.prompts)
        return split

    @staticmethod
    def _settle(request: _Request, work) -> None:
        try:
            request.future.set_result(work())
        except Exception as e:                   # the caller's thread re-raises it
            request.future.set_exception(e)
