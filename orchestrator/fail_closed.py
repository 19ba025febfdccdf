"""Stop a run whose every call fails for the same configuration reason.

A model registry with an invalid backend makes every expert call record
`GatewayConfigError: ...` in its turn; the episode goes on, the step learns from nothing
(`train/samples 0.0`), and a training run used to reach its end and exit 0. A configuration
error does not heal by retrying, so when every call of a unit of work (a training step; a
window of evaluation tasks) failed with a configuration error of one reason, the run stops
with that reason and a non-zero exit.

A "call" is what the orchestrator asked a tool or the policy to do: one entry per expert
call (None when it succeeded, else its error text "Type: message"), plus one for a policy
failure that ended an episode. Transient failures (timeouts, 5xx) are not configuration
errors and never stop a run here.
"""
from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Any, Iterable

from orchestrator.records import Rollout

# Error types whose cause is the run's configuration (a wrong file, name, backend or key),
# not the weather: retrying the same call cannot succeed.
CONFIG_ERRORS = ("GatewayConfigError", "UnknownModelError", "ConfigError", "CatalogError",
                 "SandboxUnavailable", "PromptError")


# Call failures no retry can fix, as the gateway words them (orchestrator/gateway/call.py; tests
# produce them from real servers): the provider refused the key or does not know the model, the
# key variable is unset.  One such call stops a training step: the run's premise is broken.
PERMANENT = re.compile(r"request rejected \(HTTP (?:401|403|404) from |environment variable \w+ is not set")
# Every attempt refused by the endpoint (nothing listens): stops a step only when every call of it
# failed so (a replica that restarts heals; the pool fails over meanwhile).
UNREACHABLE = re.compile(r"gave up after \d+ attempt\(s\); last endpoint \S+: connection failed: .*"
                         r"(?:Connection refused|Name or service not known)")


class FailClosed(RuntimeError):
    """Every call of a unit of work failed for one configuration reason (the message)."""


def config_reason(error: str | None) -> str | None:
    """The configuration error inside `error` ("...GatewayConfigError: models.yaml: ..."), else None."""
    if not error:
        return None
    found = [(error.find(f"{name}: "), name) for name in CONFIG_ERRORS if f"{name}: " in error]
    if not found:
        return None
    start = min(found)[0]
    reason = error[start:].strip()
    if reason.endswith(" turns)") and " (after " in reason:   # evaluation's "(after N turns)" suffix
        reason = reason[:reason.rfind(" (after ")]
    return reason


def shared_config_reason(calls: Iterable[str | None]) -> str | None:
    """The reason when there was at least one call and every call failed with a configuration
    error of that one reason; else None (a success, a transient error, or two reasons)."""
    reasons = Counter()
    for error in calls:
        reason = config_reason(error)
        if reason is None:
            return None
        reasons[reason] += 1
    return next(iter(reasons)) if len(reasons) == 1 else None


def rollout_calls(rollouts: Iterable[Rollout]) -> list[str | None]:
    """One entry per expert call of the rollouts, plus one per episode the policy's failure ended."""
    calls: list[str | None] = []
    for rollout in rollouts:
        calls += [turn.expert.error for turn in rollout.turns if turn.expert is not None]
        if rollout.stop_reason.startswith("error"):
            calls.append(rollout.stop_reason)
    return calls


def _shown(error: str) -> str:
    return error.removeprefix("error: ").strip()[:400]


def check_step(groups: list[list[Rollout]], step: int) -> None:
    """Training: raise FailClosed when every call of this step failed for one configuration reason,
    when any call failed with an error no retry can fix (PERMANENT: a refused key, an unknown
    model), or when every call failed because no endpoint could be reached (UNREACHABLE)."""
    calls = rollout_calls(r for group in groups for r in group)
    reason = shared_config_reason(calls)
    if reason is not None:
        raise FailClosed(f"step {step}: every call failed with the same configuration error, stopping: {reason}")
    permanent = [c for c in calls if c and PERMANENT.search(c)]
    if permanent:
        raise FailClosed(f"step {step}: {len(permanent)} of {len(calls)} calls failed with an error no retry can "
                         f"fix, stopping (fix it, then resume): {_shown(permanent[0])}")
    if calls and all(c and (UNREACHABLE.search(c) or config_reason(c)) for c in calls):
        reasons = list(dict.fromkeys(_shown(c).split("\n")[0] for c in calls))
        raise FailClosed(f"step {step}: every call failed, no endpoint could be reached, stopping (start the "
                         f"servers, then resume): {' | '.join(reasons[:3])}" + (f" (+{len(reasons) - 3} more)"
                                                                                if len(reasons) > 3 else ""))


def record_calls(record: dict[str, Any]) -> list[str | None]:
    """Evaluation: the calls of one results.jsonl record (an error record is one failed call)."""
    if record.get("status") == "error":
        return [record.get("error") or "error"]
    return [turn.get("error") for turn in record.get("turns") or [] if turn.get("model") is not None]


class Watch:
    """Evaluation: the last `window` tasks' calls; `add` raises FailClosed when all of them failed
    for one configuration reason (tasks that made no call do not count)."""

    def __init__(self, window: int):
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._recent: list[list[str | None]] = []

    def add(self, calls: list[str | None]) -> None:
        if not calls:
            return
        self._recent = (self._recent + [calls])[-self.window:]
        if len(self._recent) == self.window:
            reason = shared_config_reason(c for task in self._recent for c in task)
            if reason is not None:
                raise FailClosed(f"the last {self.window} tasks: every call failed with the same "
                                 f"configuration error, stopping: {reason}")


def call_failure(model: str, exc: BaseException) -> str:
    """One line for a failed expert call: model, endpoint (when the gateway names one), the error."""
    endpoint = getattr(exc, "endpoint", None)
    return f"{model} at {endpoint}: {call_error(model, exc)}" if endpoint else f"{model}: {call_error(model, exc)}"


def call_error(model: str, exc: BaseException) -> str:
    """`exc` as "Type: message" on one line, redacted, at most 300 characters, without the gateway's
    repetition of the model and endpoint."""
    from orchestrator.redaction import redact

    text = " ".join(str(exc).split()).removeprefix(f"{model}: ")
    text = redact(_GATEWAY_PREFIX.sub(r"after \1 attempt(s): ", text))
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}"


_GATEWAY_PREFIX = re.compile(r"^(?:gave up|failed \(not retryable\)) after (\d+) attempt\(s\); last endpoint \S+: ")


def refused_request(exc: BaseException) -> bool:
    """A provider's refusal of one request (HTTP 400/413/422: too long, a bad parameter; or the
    gateway's rules refusing it before sending): the server works, this request does not."""
    from orchestrator.gateway.errors import ProviderRejected

    return isinstance(exc, ProviderRejected) and exc.status in (None, 400, 413, 422)


class ExpertWatch:
    """Training: the runtime's expert call (`ToolRuntime.llm`) with its outcomes counted.

    `limit` failed calls in a row (0: no limit) trip it (a request the provider refuses as such,
    `refused_request`, is an answer, not a failure): every later call fails at once, so the
    running episodes end quickly, and `check(step)` raises FailClosed naming the endpoint and the
    error of the last failure.  `check` also raises when every call since the previous check
    failed (a step with no usable sample: each of its rollouts was scored on failed tools), then
    starts counting the next step.  Thread-safe (episodes call experts concurrently)."""

    def __init__(self, llm, limit: int):
        if limit < 0:
            raise ValueError(f"limit must be >= 0 (0: no limit), got {limit}")
        self.llm, self.limit = llm, limit
        self._lock = threading.Lock()
        self.in_a_row = 0
        self.calls = self.failed = 0          # since the last check
        self.last_failure: str | None = None
        self.tripped: str | None = None

    def __call__(self, model, messages, **kwargs):
        if self.tripped:
            raise FailClosed(self.tripped)
        try:
            response = self.llm(model, messages, **kwargs)
        except Exception as exc:
            if refused_request(exc):   # the server answered: this request was wrong, not the expert
                with self._lock:
                    self.calls, self.in_a_row = self.calls + 1, 0
                raise
            with self._lock:
                self.calls, self.failed, self.in_a_row = self.calls + 1, self.failed + 1, self.in_a_row + 1
                self.last_failure = call_failure(model, exc)
                if self.limit and self.in_a_row >= self.limit and self.tripped is None:
                    self.tripped = (f"{self.in_a_row} expert calls in a row failed, stopping (fix the expert, then "
                                    f"resume; tools.max_consecutive_failures sets the limit); the last: "
                                    f"{self.last_failure}")
            raise
        with self._lock:
            self.calls, self.in_a_row = self.calls + 1, 0
        return response

    def check(self, step: int) -> None:
        """Raise FailClosed when tripped, or when there were calls since the last check and all failed."""
        with self._lock:
            calls, failed, self.calls, self.failed = self.calls, self.failed, 0, 0
        if self.tripped:
            raise FailClosed(f"step {step}: {self.tripped}")
        if calls and failed == calls:
            raise FailClosed(f"step {step}: no usable sample, all {calls} expert calls failed, stopping (fix the "
                             f"expert, then resume); the last: {self.last_failure}")
