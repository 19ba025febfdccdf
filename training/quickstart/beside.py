"""One function run in a second (spawned) process beside this one's work (the quickstart's initial
evaluation beside GRPO): its return value, its exception as an error carrying the child's
traceback, or an error naming the exit code where the process died without either (an OOM kill,
`os._exit`): never a wait on a process that is gone."""
from __future__ import annotations

import multiprocessing
import queue
import traceback
from collections.abc import Callable
from typing import Any


def _call(results, target: Callable, args: tuple) -> None:
    try:
        results.put(("ok", target(*args)))
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent, which raises it
        results.put(("error", traceback.format_exc()))


class Beside:
    """`Beside(target, *args)` starts `target(*args)` in a spawned process (`target` importable by
    name, arguments picklable); `result()` waits for it, `stop()` ends it early (idempotent)."""

    def __init__(self, target: Callable, *args: Any, what: str = "the second process"):
        ctx = multiprocessing.get_context("spawn")
        self.what = what
        self._results = ctx.Queue()
        self._process = ctx.Process(target=_call, args=(self._results, target, args), name=what)
        self._process.start()

    def result(self, poll_s: float = 5.0) -> Any:
        while True:
            try:
                status, value = self._results.get(timeout=poll_s)
                break
            except queue.Empty:
                if self._process.is_alive():
                    continue
                try:        # it may have put its result just before it ended
                    status, value = self._results.get(timeout=1.0)
                    break
                except queue.Empty:
                    raise RuntimeError(f"{self.what} ended (exit code {self._process.exitcode}) without a "
                                       "result") from None
        self._process.join()
        if status == "error":
            raise RuntimeError(f"{self.what} failed:\n{value}")
        return value

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()
