"""Bounded retries with exponential backoff (tenacity) around one backend attempt.

Which errors are worth retrying: timeouts, refused/broken connections, HTTP 408/409/429
and 5xx.  Everything else (bad request, wrong key, unknown model, a local model that
ran out of time) fails at once.  The bound on a call's wall clock is therefore about
(max_retries + 1) x timeout_s + the sum of the waits (each <= max_wait_s).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, TypeVar

from tenacity import (RetryCallState, Retrying, retry_if_exception, stop_after_attempt,
                      wait_exponential_jitter)

log = logging.getLogger("toolorchestra.gateway")
T = TypeVar("T")
RETRY_STATUS = {408, 409, 429}


class AttemptError(Exception):
    """One failed attempt, already described without secrets.

    `endpoint` is where it went; `retryable` whether another attempt may succeed.
    """

    def __init__(self, message: str, *, endpoint: str | None, retryable: bool):
        super().__init__(message)
        self.endpoint = endpoint
        self.retryable = retryable


def is_retryable_status(status: int | None) -> bool:
    return status is not None and (status in RETRY_STATUS or status >= 500)


@dataclass
class RetryPolicy:
    max_retries: int = 3          # attempts = max_retries + 1
    initial_s: float = 1.0        # first wait; doubles each retry, plus up to initial_s jitter
    max_wait_s: float = 20.0

    def run(self, attempt: Callable[[int], T], *, model: str) -> T:
        """Call `attempt(i)` (i = 0, 1, ...) until it succeeds or the policy gives up.

        `attempt` raises AttemptError; the last one is re-raised when giving up.
        """
        def _log(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning("%s: attempt %d/%d via %s failed: %s; retrying in %.1f s", model,
                        state.attempt_number, self.max_retries + 1, getattr(exc, "endpoint", "?"),
                        exc, state.next_action.sleep if state.next_action else 0.0)

        retrying = Retrying(
            stop=stop_after_attempt(self.max_retries + 1),
            wait=wait_exponential_jitter(multiplier=self.initial_s, max=self.max_wait_s, jitter=self.initial_s),
            retry=retry_if_exception(lambda e: isinstance(e, AttemptError) and e.retryable),
            before_sleep=_log,
            reraise=True,
        )
        for state in retrying:
            with state:
                return attempt(state.retry_state.attempt_number - 1)
        raise AssertionError("unreachable: tenacity either returns or re-raises")
