"""Stopping work whose caller went away: a thread runs under a cancel event (`cancellable`), and
the places that can take long look at it (`cancelled`, `wait`).

The server (orchestrator/serve/) runs each request's episode in a worker thread under the
request's event and sets it when the client disconnects or the deadline passes.  Who looks:
- the episode loop, before each turn (orchestrator/serve/service.py `Job.before_turn`);
- the gateway, before each attempt and in the waits between attempts, and while an HTTP reply
  is awaited (orchestrator/gateway/retry.py: socket reads wait in slices of `SLICE_S`);
- in-process generation: the gateway's transformers backend hands the event to the engine, whose
  step-by-step loop ends the row at its next token (orchestrator/engines/hf.py `cancels`; the
  prompt's prefill, one forward pass, is not cut).
So a cancelled episode stops within about `SLICE_S` or one decoding step, not at its next turn.
The event is per thread (threading.local): a thread the work starts does not inherit it.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

SLICE_S = 0.25      # the longest a cancellable wait goes without looking at the event

_local = threading.local()


def current() -> threading.Event | None:
    """The cancel event of the current thread's work, or None (not cancellable)."""
    return getattr(_local, "event", None)


def cancelled() -> bool:
    event = current()
    return event is not None and event.is_set()


@contextmanager
def cancellable(event: threading.Event) -> Iterator[threading.Event]:
    """Within this block, this thread's work stops once `event` is set."""
    previous = current()
    _local.event = event
    try:
        yield event
    finally:
        _local.event = previous


def wait(seconds: float) -> None:
    """time.sleep(seconds), cut short when the current work is cancelled."""
    event = current()
    if event is None:
        time.sleep(seconds)
    else:
        event.wait(max(0.0, seconds))
