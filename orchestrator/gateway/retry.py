"""Retries and deadlines: the one place that decides how long a gateway call may take.

Two budgets bound every call (units: seconds):
- per attempt (`timeout_s`): connecting, sending, waiting for headers and reading the whole
  body together.  The HTTP clients of the openai/anthropic SDKs only bound each socket
  read, so a server trickling one byte per second could hold a call for ever; here every
  socket operation of an attempt is given only what is left of the attempt's deadline
  (`DeadlineBackend`, installed by `http_client()`), and a read past it raises a timeout.
- per call (`deadline_s`): all attempts and the waits between them.  A wait that would end
  past the call's deadline is not started, however long the server's `Retry-After` asks for
  (86400 s included): the call gives up at once with the last error, and the error says which
  wait did not fit (`AttemptError.gave_up`).  Every registry entry has a deadline
  (registry.DEFAULT_DEADLINE_S unless it sets its own).

Every reply body is capped too (`CappedTransport`, the registry's `max_reply_bytes`): a body
past the cap is cut while it streams in, never held whole (ReplyTooLarge, retried like a 5xx).

Which errors are worth retrying: timeouts, refused/broken connections, HTTP 408/409/429
and 5xx, and 2xx replies that are malformed (replies.py) or too big.  Everything else (bad request, wrong key, unknown model) fails at once.  Waits
grow exponentially with jitter (tenacity's `wait_exponential_jitter`) and are never
shorter than the server's `Retry-After` (or `retry-after-ms`) header.

Work run under a cancel event (orchestrator/cancellation.py: a served request whose client went
away) stops early: an attempt does not start once the event is set, waits between attempts end
when it is set, and a socket read waits in slices of `cancellation.SLICE_S`, ending with a timeout.
"""
from __future__ import annotations

import email.utils
import logging
import math
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpcore2
import httpx2
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from orchestrator import cancellation
from orchestrator.gateway.registry import DEFAULT_MAX_REPLY_BYTES
from orchestrator.redaction import redact

log = logging.getLogger("toolorchestra.gateway")
T = TypeVar("T")
RETRY_STATUS = {408, 409, 429}


class AttemptError(Exception):
    """One failed attempt, described without secrets (the message and `provider_message` are
    redacted here, when it is created).

    `endpoint` is where it went; `retryable` whether another attempt may succeed;
    `status` the HTTP status when the server answered; `retry_after` the seconds the
    server asked us to wait (Retry-After), when it said; `provider_message` the
    provider's own error text (for a rejected request).
    """

    def __init__(self, message: str, *, endpoint: str | None, retryable: bool, status: int | None = None,
                 retry_after: float | None = None, provider_message: str | None = None, timed_out: bool = False):
        super().__init__(redact(message))
        self.endpoint = endpoint
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after
        self.provider_message = redact(provider_message) if provider_message else provider_message
        self.timed_out = timed_out        # the attempt ran out of time (no answer from the server)
        self.gave_up: str | None = None   # set by RetryPolicy when the next wait would pass the deadline
        self.before: AttemptError | None = None   # set by RetryPolicy: the previous attempt's error, when the
                                                  # call's deadline cut this one short


def is_retryable_status(status: int | None) -> bool:
    return status is not None and (status in RETRY_STATUS or status >= 500)


def parse_retry_after(headers: Any) -> float | None:
    """Seconds from `retry-after-ms` or `Retry-After` (seconds or an HTTP date); None if absent."""
    if headers is None:
        return None
    try:
        ms = headers.get("retry-after-ms")
        if ms is not None:
            return max(0.0, float(ms) / 1000)
        value = headers.get("retry-after")
    except (AttributeError, ValueError):
        return None
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# ---- per-attempt deadline over every socket operation -----------------------------------
_local = threading.local()


def remaining() -> float | None:
    """Seconds left of the current thread's attempt deadline (None: no deadline set)."""
    deadline = getattr(_local, "deadline", None)
    return None if deadline is None else deadline - time.monotonic()


@contextmanager
def attempt_deadline(seconds: float | None) -> Iterator[None]:
    """Within this block, every socket operation of this thread ends by `seconds` from now."""
    previous = getattr(_local, "deadline", None)
    _local.deadline = None if seconds is None else time.monotonic() + seconds
    try:
        yield
    finally:
        _local.deadline = previous


def _clamp(timeout: float | None, exc: type[Exception]) -> float | None:
    left = remaining()
    if left is None:
        return timeout
    if left <= 0:
        raise exc("the attempt's deadline passed")
    return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore2.NetworkStream):
    def __init__(self, inner: httpcore2.NetworkStream):
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        timeout = _clamp(timeout, httpcore2.ReadTimeout)
        if cancellation.current() is None:
            return self._inner.read(max_bytes, timeout)
        # cancellable work (orchestrator/cancellation.py): wait in slices, looking at the event between
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            if cancellation.cancelled():
                raise httpcore2.ReadTimeout("cancelled: the caller went away")
            left = None if end is None else end - time.monotonic()
            piece = cancellation.SLICE_S if left is None else max(0.0, min(cancellation.SLICE_S, left))
            try:
                return self._inner.read(max_bytes, piece)
            except httpcore2.ReadTimeout:
                if left is not None and left <= cancellation.SLICE_S:
                    raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, _clamp(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None):
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname,
                                                     _clamp(timeout, httpcore2.ConnectTimeout)))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class DeadlineBackend(httpcore2.NetworkBackend):
    """httpcore's socket backend with every timeout cut to the thread's attempt deadline."""

    def __init__(self, inner: httpcore2.NetworkBackend | None = None):
        self._inner = inner or httpcore2.SyncBackend()

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        return _DeadlineStream(self._inner.connect_tcp(host, port, _clamp(timeout, httpcore2.ConnectTimeout),
                                                       local_address, socket_options))

    def connect_unix_socket(self, path, timeout=None, socket_options=None):
        return _DeadlineStream(self._inner.connect_unix_socket(path, _clamp(timeout, httpcore2.ConnectTimeout),
                                                               socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


# ---- a size cap on every reply body -------------------------------------------------------
_ENCODINGS = {"gzip": 47, "x-gzip": 47, "deflate": 15}     # zlib wbits (47: gzip or zlib header)


def _mib(n: int) -> str:
    return f"{n / 2**20:.3g} MiB"


class ReplyTooLarge(AttemptError):
    """A reply body over the cap: reading stopped at the cap.  Retryable (another replica may answer
    normally); the backend fills in `endpoint`."""

    def __init__(self, cap: int, declared: int | None = None):
        what = (f"reply declares Content-Length {declared} ({_mib(declared)}), over max_reply_bytes {cap} "
                f"({_mib(cap)}): not read" if declared is not None else
                f"reply body over max_reply_bytes {cap} ({_mib(cap)}): stopped reading at the cap")
        super().__init__(f"{what}; raise max_reply_bytes in the model's configs/models.yaml entry if its replies "
                         f"really are this large", endpoint=None, retryable=True)


class _CappedStream(httpx2.SyncByteStream):
    """One response body, read chunk by chunk and stopped with ReplyTooLarge past `cap` bytes.  A
    gzip/deflate body is inflated here, at most cap + 1 bytes per step, so the cap counts the bytes
    the SDK would hold and a small compressed bomb cannot grow either."""

    def __init__(self, inner: httpx2.SyncByteStream, cap: int, encoding: str | None):
        self._inner, self._cap = inner, cap
        self._inflater = zlib.decompressobj(_ENCODINGS[encoding]) if encoding else None

    def _decoded(self, chunk: bytes) -> Iterator[bytes]:
        if self._inflater is None:
            yield chunk
            return
        try:
            while chunk:
                yield self._inflater.decompress(chunk, self._cap + 1)
                chunk = self._inflater.unconsumed_tail
        except zlib.error as exc:
            raise AttemptError(f"reply body is not valid gzip/deflate: {exc}", endpoint=None, retryable=True) from None

    def __iter__(self) -> Iterator[bytes]:
        total = 0
        for chunk in self._inner:
            for piece in self._decoded(chunk):
                total += len(piece)
                if total > self._cap:
                    raise ReplyTooLarge(self._cap)
                if piece:
                    yield piece

    def close(self) -> None:
        self._inner.close()


class CappedTransport(httpx2.HTTPTransport):
    """httpx2's transport with every response body capped at `max_reply_bytes` while it streams in:
    a Content-Length over the cap is refused before reading, a body without one (or lying about it)
    is cut at the cap.  Nothing past the cap is ever held in memory."""

    def __init__(self, max_reply_bytes: int, **kwargs: Any):
        super().__init__(**kwargs)
        self.max_reply_bytes = max_reply_bytes

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = super().handle_request(request)
        cap = self.max_reply_bytes
        headers = httpx2.Headers(response.headers)
        declared = headers.get("content-length", "").strip()
        encodings = [e.strip().lower() for e in headers.get("content-encoding", "").split(",")]
        encodings = [e for e in encodings if e and e != "identity"]
        problem: AttemptError | None = None
        if declared.isdigit() and int(declared) > cap:
            problem = ReplyTooLarge(cap, int(declared))
        elif len(encodings) > 1 or (encodings and encodings[0] not in _ENCODINGS):
            problem = AttemptError(f"reply has Content-Encoding {headers['content-encoding']!r}; the gateway reads "
                                   f"only gzip or deflate", endpoint=None, retryable=True)
        if problem is not None:
            response.stream.close()
            raise problem
        if encodings:       # inflated by _CappedStream: httpx must not decode it again
            del headers["content-encoding"]
            headers.pop("content-length", None)
        return httpx2.Response(status_code=response.status_code, headers=headers, extensions=response.extensions,
                               stream=_CappedStream(response.stream, cap, encodings[0] if encodings else None))


def http_client(max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES):
    """An HTTP client for the openai/anthropic SDKs whose sockets obey `attempt_deadline` and whose
    reply bodies stop at `max_reply_bytes` (ReplyTooLarge).

    Both SDKs (openai 3.x, anthropic 2.x) run on httpx2; its transport's connection pool
    takes a network backend, which is where the deadline is enforced, and the transport hands
    back each response's body stream, which is where the cap is.  Proxies from the
    environment are not used by this client.
    """
    transport = CappedTransport(max_reply_bytes, trust_env=False)
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore2.ConnectionPool) or not hasattr(pool, "_network_backend"):
        raise RuntimeError("httpx2's transport no longer exposes its connection pool; "
                           "orchestrator/gateway/retry.py needs updating for this httpx2 version")
    pool._network_backend = DeadlineBackend(pool._network_backend)
    return httpx2.Client(transport=transport, trust_env=False)


# ---- retries -------------------------------------------------------------------------------
@dataclass
class RetryPolicy:
    max_retries: int = 3          # attempts = max_retries + 1
    initial_s: float = 1.0        # first wait; doubles each retry, plus up to initial_s jitter
    max_wait_s: float = 20.0      # longest backoff (a longer Retry-After is still honoured)
    attempt_s: float | None = None   # deadline of one attempt
    deadline_s: float | None = None  # deadline of the whole call (attempts + waits)

    def _wait(self) -> Callable[[RetryCallState], float]:
        backoff = wait_exponential_jitter(initial=self.initial_s, max=self.max_wait_s, jitter=self.initial_s)

        def wait(state: RetryCallState) -> float:
            exc = state.outcome.exception() if state.outcome else None
            after = getattr(exc, "retry_after", None)
            return max(backoff(state), after) if after is not None else backoff(state)
        return wait

    def run(self, attempt: Callable[[int], T], *, model: str) -> T:
        """Call `attempt(i)` (i = 0, 1, ...) until it succeeds or the policy gives up.

        `attempt` raises AttemptError; the last one is re-raised when giving up.  Each
        attempt runs under `attempt_deadline(min(attempt_s, what is left of deadline_s))`.
        """
        started = time.monotonic()
        call_end = math.inf if self.deadline_s is None else started + self.deadline_s

        def out_of_time(state: RetryCallState) -> bool:
            left = call_end - time.monotonic()
            if state.upcoming_sleep < left:
                return False
            exc = state.outcome.exception() if state.outcome else None
            if isinstance(exc, AttemptError):
                asked = exc.retry_after is not None and exc.retry_after >= state.upcoming_sleep
                wait = (f"the server's Retry-After {exc.retry_after:g} s" if asked
                        else f"the next backoff ({state.upcoming_sleep:.1f} s)")
                exc.gave_up = (f"not retried: {wait} would end past the call's deadline "
                               f"(deadline_s {self.deadline_s:g} s, {max(left, 0.0):.1f} s left); raise deadline_s "
                               f"in the model's configs/models.yaml entry, or retry later")
            return True

        def _log(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome else None
            log.warning("%s: attempt %d/%d via %s failed: %s; retrying in %.1f s", model,
                        state.attempt_number, self.max_retries + 1, getattr(exc, "endpoint", "?"),
                        exc, state.next_action.sleep if state.next_action else 0.0)

        retrying = Retrying(
            sleep=cancellation.wait,      # a cancelled call's next attempt refuses at once (below)
            stop=stop_after_attempt(self.max_retries + 1) | out_of_time,
            wait=self._wait(),
            retry=retry_if_exception(lambda e: isinstance(e, AttemptError) and e.retryable),
            before_sleep=_log,
            reraise=True,
        )
        previous: AttemptError | None = None
        for state in retrying:
            with state:
                if cancellation.cancelled():
                    raise AttemptError("cancelled: the caller went away", endpoint=None, retryable=False)
                left = call_end - time.monotonic()
                own = self.attempt_s if self.attempt_s is not None else math.inf
                budget = min(own, left)
                try:
                    with attempt_deadline(None if math.isinf(budget) else max(budget, 0.0)):
                        return attempt(state.retry_state.attempt_number - 1)
                except AttemptError as exc:
                    if exc.timed_out and budget < own:     # the call's deadline, not attempt_s, ended it
                        exc.args = (f"timed out after {max(budget, 0.0):.1f} s: the call's deadline (deadline_s "
                                    f"{self.deadline_s:g} s) cut this attempt short of its timeout_s {own:g} s",)
                        exc.before = previous
                    previous = exc
                    raise
        raise AssertionError("unreachable: tenacity either returns or re-raises")
