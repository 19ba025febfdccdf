import io
import logging
import pickle

from orchestrator.gateway.errors import LLMCallError, ProviderRejected
from orchestrator.gateway.retry import AttemptError
from orchestrator.redaction import MASK, add_secret, install_log_redaction, redact


def test_registered_value_is_masked_wherever_it_appears():
    add_secret("plainsecretvalue-42")
    assert redact("<html>your key plainsecretvalue-42 is bad</html>") == f"<html>your key {MASK} is bad</html>"


def test_short_values_are_not_registered():
    add_secret("abc")
    assert redact("abc def") == "abc def"


def test_key_patterns_are_masked_without_registration():
    text = "sk-proj-AbCdEf1234567890 Bearer eyJhbGciOi.xyz123 x-api-key: 0123456789abcdef api_key=zzzzzzzzzz"
    out = redact(text)
    for leaked in ("AbCdEf1234567890", "eyJhbGciOi.xyz123", "0123456789abcdef", "zzzzzzzzzz"):
        assert leaked not in out
    assert out.count(MASK) == 4 and out.startswith("sk-proj-" + MASK)


def test_text_without_secrets_is_unchanged():
    assert redact("HTTP 500: upstream overloaded") == "HTTP 500: upstream overloaded"


def test_masked_key_forms_are_masked_and_redaction_is_idempotent():
    out = redact("Incorrect API key provided: sk-abc***wxyz. sk-proj-ab***cd")
    assert "abc" not in out and "wxyz" not in out and "cd" not in out.split("sk-")[-1]
    assert out == f"Incorrect API key provided: sk-{MASK}. sk-{MASK}"
    assert redact(out) == out
    assert redact("key emu-Zq7-***5521 is invalid") == f"key {MASK} is invalid"     # any half-masked token


def test_values_only_leaves_key_like_text_that_is_no_registered_secret():
    add_secret("value-only-secret-77")
    text = "api_key=os.environ['X'] and value-only-secret-77"
    assert redact(text, patterns=False) == f"api_key=os.environ['X'] and {MASK}"


def test_log_records_are_redacted_whatever_handler_writes_them():
    add_secret("logged-secret-value-9")
    install_log_redaction()
    install_log_redaction()                      # idempotent: one wrapper
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log = logging.getLogger("test_redaction.child")
    log.addHandler(handler)
    try:
        log.warning("attempt failed: %s (key %r)", "page echoing logged-secret-value-9", "sk-live-0123456789abc")
        try:
            raise RuntimeError("boom with logged-secret-value-9")
        except RuntimeError:
            log.exception("call failed")
    finally:
        log.removeHandler(handler)
    text = stream.getvalue()
    assert "logged-secret-value-9" not in text and "0123456789abc" not in text
    assert f"attempt failed: page echoing {MASK} (key 'sk-{MASK}')" in text
    assert f"RuntimeError: boom with {MASK}" in text            # the traceback text too


def test_gateway_errors_redact_their_message_when_created():
    add_secret("provider-echoed-secret-1")
    err = ProviderRejected("m: request rejected: key provider-echoed-secret-1 is wrong", model="m", endpoint=None,
                           status=401, provider_message="key provider-echoed-secret-1 is wrong")
    attempt = AttemptError("HTTP 200 body provider-echoed-secret-1", endpoint="http://x/v1", retryable=True,
                           provider_message="provider-echoed-secret-1")
    for text in (str(err), err.provider_message, str(pickle.loads(pickle.dumps(err))), str(attempt),
                 attempt.provider_message, str(LLMCallError("Bearer abcdefghijkl", model="m", endpoint=None))):
        assert "provider-echoed-secret-1" not in text and "abcdefghijkl" not in text and MASK in text
