from orchestrator.redaction import MASK, add_secret, redact


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
