"""Where tool calls run so that no caller waits past a tool's deadline.

- `run_sync(fn, timeout)`: `fn()` in a daemon worker thread; the caller waits at most `timeout`
  seconds.  A handler that never returns keeps its worker (Python cannot kill a thread; use
  `"sandbox": true` for code that may hang) but never the episode, nor interpreter exit.
- `run_async(coro_fn, timeout)`: a coroutine on the one background event loop, cancelled at
  its deadline (async python handlers, MCP sessions).
"""
from __future__ import annotations

import asyncio
import queue
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Awaitable, Callable


class Deadline(TimeoutError):
    """A tool call ran past its deadline."""


class _Pool:
    """Daemon threads, one more whenever every idle one is taken (a hung handler costs one)."""

    def __init__(self):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        with self._lock:
            spawn = self._idle == 0
            if not spawn:
                self._idle -= 1
        self._jobs.put((fn, future))
        if spawn:
            threading.Thread(target=self._work, name="tool-worker", daemon=True).start()
        return future

    def _work(self) -> None:
        while True:
            fn, future = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:   # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)
            with self._lock:
                self._idle += 1


_pool = _Pool()
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def loop() -> asyncio.AbstractEventLoop:
    """The background event loop (started on first use, a daemon thread)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            new = asyncio.new_event_loop()
            threading.Thread(target=new.run_forever, name="tool-loop", daemon=True).start()
            _loop = new
        return _loop


def run_sync(fn: Callable[[], Any], timeout: float) -> Any:
    """`fn()` in a worker; raises Deadline after `timeout` seconds (the worker may go on)."""
    future = _pool.submit(fn)
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        future.cancel()
        raise Deadline(f"no result within {timeout:g} s") from None


def run_async(make: Callable[[], Awaitable[Any]], timeout: float) -> Any:
    """Await `make()` on the background loop; cancelled and Deadline raised after `timeout` s."""
    async def bounded():
        return await asyncio.wait_for(make(), timeout)

    future = asyncio.run_coroutine_threadsafe(bounded(), loop())
    try:
        return future.result(timeout=timeout + 1.0)   # wait_for cancels first; this is the backstop
    except (asyncio.TimeoutError, FutureTimeout):
        future.cancel()
        raise Deadline(f"no result within {timeout:g} s") from None
