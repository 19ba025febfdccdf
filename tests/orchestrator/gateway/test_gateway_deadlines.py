"""Deadlines of the gateway against hostile local servers: every call ends within 1.2x its budget.

Budgets: `timeout_s` bounds one attempt (connect + headers + body together), `deadline_s`
a whole call (attempts + waits).  The servers trickle one byte per `trickle_s`, stay silent,
rate-limit with Retry-After, or fail with 5xx for ever.
"""
from __future__ import annotations

import time

import pytest
from _gateway_fakes import FakeServer, elapsed, write_registry

import orchestrator.gateway.backends.openai_compat  # noqa: F401  (imported before timing: SDK import is slow)
from LLM_CALL import LLMCallError, get_llm_response
from orchestrator.gateway.retry import parse_retry_after

MSG = [{"role": "user", "content": "hi"}]
SLACK = 1.2


@pytest.fixture
def registry(tmp_path, monkeypatch):
    def make(url: str, **fields):
        entry = {"backend": "vllm", "base_url": url, "price_model": "Qwen3-32B", "backoff_initial_s": 0.1,
                 "backoff_max_s": 0.5, **fields}
        monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(write_registry(tmp_path / "models.yaml", {"m": entry})))
    return make


@pytest.mark.parametrize("action", ["trickle_body", "trickle_headers"])
def test_trickling_server_cannot_hold_an_attempt_past_its_deadline(registry, action):
    # One byte every 0.3 s: every socket read succeeds, so a per-read timeout never fires.
    with FakeServer([action], trickle_s=0.3) as srv:
        registry(srv.url, timeout_s=1.5, max_retries=0)
        err, seconds = elapsed(lambda: get_llm_response("m", MSG))
    assert isinstance(err, LLMCallError) and "timed out" in str(err), err
    assert srv.hits == 1
    assert seconds <= SLACK * 1.5, seconds


def test_trickling_server_with_retries_is_bounded_by_the_call_deadline(registry):
    with FakeServer(["trickle_body"], trickle_s=0.3) as srv:
        registry(srv.url, timeout_s=1.0, max_retries=10, deadline_s=2.5)
        err, seconds = elapsed(lambda: get_llm_response("m", MSG))
    assert isinstance(err, LLMCallError)
    assert srv.hits >= 2                     # it did retry within the budget
    assert seconds <= SLACK * 2.5, seconds


def test_silent_server_is_bounded_by_the_call_deadline(registry):
    with FakeServer(["stall"], stall_s=30) as srv:
        registry(srv.url, timeout_s=1.0, max_retries=10, deadline_s=2.0)
        err, seconds = elapsed(lambda: get_llm_response("m", MSG))
    assert isinstance(err, LLMCallError) and "timed out" in str(err)
    assert seconds <= SLACK * 2.0, seconds


def test_server_error_forever_is_bounded_by_the_call_deadline(registry):
    with FakeServer(["500"]) as srv:
        registry(srv.url, timeout_s=5.0, max_retries=20, deadline_s=1.5)
        err, seconds = elapsed(lambda: get_llm_response("m", MSG))
    assert isinstance(err, LLMCallError) and "HTTP 500" in str(err)
    assert srv.hits >= 2                     # it retried (how often depends on the box's load)
    assert seconds <= SLACK * 1.5, seconds


def test_rate_limit_waits_at_least_retry_after(registry):
    with FakeServer(["429", "ok"], retry_after="1.5") as srv:
        registry(srv.url, timeout_s=5.0, max_retries=2)
        r = get_llm_response("m", MSG)
    assert r.text == "hello" and srv.hits == 2
    gap = srv.times[1] - srv.times[0]
    assert 1.5 <= gap <= SLACK * (1.5 + 0.1 + 0.1), gap   # Retry-After, not the 0.1 s backoff


def test_retry_after_beyond_the_call_deadline_gives_up_at_once(registry):
    with FakeServer(["429", "ok"], retry_after="30") as srv:
        registry(srv.url, timeout_s=5.0, max_retries=3, deadline_s=3.0)
        err, seconds = elapsed(lambda: get_llm_response("m", MSG))
    assert isinstance(err, LLMCallError) and "HTTP 429" in str(err)
    assert srv.hits == 1 and seconds < 1.0, seconds


def test_backoff_is_jittered():
    from tenacity import RetryCallState

    from orchestrator.gateway.retry import RetryPolicy

    wait = RetryPolicy(initial_s=1.0, max_wait_s=60)._wait()
    state = RetryCallState(None, None, (), {})
    state.attempt_number = 3
    samples = {round(wait(state), 6) for _ in range(20)}
    assert len(samples) > 1 and all(4.0 <= s <= 5.0 for s in samples)   # 1 x 2^2 + U(0, 1)


def test_parse_retry_after_forms():
    assert parse_retry_after({"retry-after": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "250"}) == 0.25
    date = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 10))
    assert 8.0 <= parse_retry_after({"retry-after": date}) <= 10.5
    assert parse_retry_after({"retry-after": "soon"}) is None and parse_retry_after({}) is None


def test_retry_after_of_a_day_fails_at_once_under_the_shipped_default_deadline(registry):
    """An entry that sets no deadline_s gets the registry's default (ModelEntry.deadline_s); a
    `Retry-After: 86400` longer than what is left of it is not waited for: the call fails at once
    with the gateway's error saying why.  (Run in a thread: without the cap it would sleep a day.)"""
    import threading

    outcome = {}
    with FakeServer(["429", "ok"], retry_after="86400") as srv:
        registry(srv.url, timeout_s=5.0, max_retries=3)          # no deadline_s: the default applies
        worker = threading.Thread(target=lambda: outcome.update(r=elapsed(lambda: get_llm_response("m", MSG))),
                                  daemon=True)
        worker.start()
        worker.join(20)
    assert not worker.is_alive(), "the call is still waiting out Retry-After: 86400"
    err, _ = outcome["r"]
    assert isinstance(err, LLMCallError) and "HTTP 429" in str(err), err
    assert "Retry-After 86400 s" in str(err) and "deadline_s" in str(err), err
    assert srv.hits == 1


def test_every_shipped_model_has_a_finite_call_deadline():
    from orchestrator.gateway.registry import DEFAULT_MODELS, ModelEntry, load_registry

    default = ModelEntry.model_fields["deadline_s"].default
    assert default is not None and 0 < default < 86400
    for name, entry in load_registry(DEFAULT_MODELS).models.items():
        assert entry.deadline_s is not None and entry.deadline_s >= entry.timeout_s, name


def test_an_attempt_cut_short_by_the_call_deadline_says_so_and_keeps_the_error_before():
    # A loaded box can leave the last retry only a sliver of the call's deadline: that attempt
    # times out, and the error must still name the server's failure, not only the timeout.
    from orchestrator.gateway.retry import AttemptError, RetryPolicy, remaining

    def attempt(i: int):
        if i == 0:
            raise AttemptError("HTTP 500: boom", endpoint="e", retryable=True, status=500)
        time.sleep(max(remaining(), 0.0))         # the server says nothing until the attempt's time is up
        raise AttemptError("timed out after 5 s (attempt deadline)", endpoint="e", retryable=True, timed_out=True)

    policy = RetryPolicy(max_retries=5, initial_s=0.01, max_wait_s=0.01, attempt_s=5.0, deadline_s=0.5)
    with pytest.raises(AttemptError) as caught:
        policy.run(attempt, model="m")
    exc = caught.value
    assert "the call's deadline (deadline_s 0.5 s) cut this attempt short of its timeout_s 5 s" in str(exc)
    assert exc.before is not None and "HTTP 500" in str(exc.before)


def test_a_timeout_within_the_attempts_own_budget_keeps_its_message():
    from orchestrator.gateway.retry import AttemptError, RetryPolicy

    def attempt(i: int):
        raise AttemptError("timed out after 0.1 s (attempt deadline)", endpoint="e", retryable=True, timed_out=True)

    policy = RetryPolicy(max_retries=0, attempt_s=0.1, deadline_s=30.0)
    with pytest.raises(AttemptError) as caught:
        policy.run(attempt, model="m")
    assert str(caught.value) == "timed out after 0.1 s (attempt deadline)" and caught.value.before is None
