"""schemathesis over the server's OpenAPI schema (every operation it serves), against a live server
of the scripted mock backend: no generated request gets a 5xx, and every refusal is in OpenAI's
error shape.  Half the chat bodies name the served model and end with a user's question, so
episodes run too, not only refusals."""
import json

import pytest

from orchestrator.serve import Background, ServeLimits, create_app

schemathesis = pytest.importorskip("schemathesis")


def test_openapi_fuzzing_finds_no_server_error(served, backend):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    limits = ServeLimits(concurrency=2, queue=4, request_timeout_s=60.0, max_body_bytes=64 << 10)
    with Background(create_app(served[0], limits), limits=limits) as srv:
        schema = schemathesis.openapi.from_url(srv.url + "/openapi.json")
        operations = {(op.method.upper(), op.path): op for op in (r.ok() for r in schema.get_all_operations())}
        assert set(operations) == {("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/health"),
                                   ("GET", "/health/ready")}
        seen: dict[int, int] = {}

        def check(case) -> None:
            response = case.call(base_url=srv.url, timeout=60)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            assert response.status_code < 500, (case.method, case.path, case.body, response.text[:300])
            if response.status_code >= 400:
                body = json.loads(response.text)
                assert list(body) == ["error"] and set(body["error"]) == {"message", "type", "param", "code"}, body

        chat = operations[("POST", "/v1/chat/completions")]

        @given(case=chat.as_strategy(), named=st.booleans(), question=st.text(min_size=1, max_size=300))
        @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def fuzz_chat(case, named, question):
            if named and isinstance(case.body, dict):       # the served model, asked by a user: an episode runs
                case.body["model"] = "mock-orch"
                messages = case.body.get("messages")
                if isinstance(messages, list) and messages and isinstance(messages[-1], dict):
                    messages[-1].update(role="user", content=question)
            check(case)

        fuzz_chat()
        for key in (("GET", "/v1/models"), ("GET", "/health"), ("GET", "/health/ready")):
            @given(case=operations[key].as_strategy())
            @settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck), database=None)
            def fuzz_get(case):
                check(case)

            fuzz_get()
        assert seen.get(200, 0) > 3 and any(400 <= s < 500 for s in seen), seen   # chat answers and refusals
