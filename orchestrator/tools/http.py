"""Kind `http`: a web service is the tool.

    {"name": "weather", "kind": "http", "url": "http://localhost:8808/weather", "method": "GET",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
     "headers": {"Authorization": "Bearer ${WEATHER_TOKEN}"}}

GET and DELETE send the arguments as query parameters, the other methods as a JSON body; an
argument named in the URL (`.../cities/{city}`) fills it instead.  Header values come from
environment variables: either a variable's NAME (`"X-Api-Key": "WEATHER_KEY"`) or text with
`${NAME}` in it; a secret is never written in tools.json, and every value read is registered with
orchestrator.redaction so that no record, log or error shows it.  A call is retried (HTTP 408,
409, 429, 5xx, refused or broken connections) through the gateway's RetryPolicy, all attempts
within the tool's `timeout_s`.  The answer must be JSON unless `"response": "text"`.
"""
from __future__ import annotations

import json
import os
import re
import string
import time
from typing import Any, Literal

from pydantic import Field, field_validator

from orchestrator.redaction import add_secret, redact
from orchestrator.tools.registry import CallContext, Function, FunctionKind, ToolFailure, register
from orchestrator.tools.spec import FunctionToolSpec

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")
ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
QUERY_METHODS = ("GET", "DELETE")


class Spec(FunctionToolSpec):
    kind: Literal["http"]
    url: str = Field(pattern=r"^https?://\S+$")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}},
                                       description="JSON schema of the arguments")
    headers: dict[str, str] = Field(default_factory=dict,
                                    description="header -> environment variable NAME, or text with ${NAME}")
    retries: int = Field(2, ge=0, le=10, strict=True)
    response: Literal["json", "text"] = "json"

    @field_validator("headers")
    @classmethod
    def _values_name_variables(cls, headers: dict[str, str]) -> dict[str, str]:
        for header, value in headers.items():
            if not (ENV_NAME.match(value) or ENV_REF.search(value)):
                raise ValueError(f"header {header!r}: write the NAME of an environment variable that holds the "
                                 f"value (e.g. \"MY_TOOL_KEY\"), or text with ${{NAME}} in it (e.g. "
                                 f"\"Bearer ${{MY_TOOL_TOKEN}}\"); never the secret itself")
        return headers


def header_values(spec: Spec) -> dict[str, str]:
    """The headers with their environment variables read (each value registered as a secret)."""
    out = {}
    for header, value in spec.headers.items():
        names = [value] if ENV_NAME.match(value) else ENV_REF.findall(value)
        missing = [n for n in names if not os.environ.get(n)]
        if missing:
            raise ToolFailure(f"environment variable {missing[0]} (header {header!r}) is not set",
                              fix=f"export {missing[0]}=... before the run starts")
        for n in names:
            add_secret(os.environ[n])
        out[header] = os.environ[value] if ENV_NAME.match(value) else ENV_REF.sub(lambda m: os.environ[m.group(1)], value)
        add_secret(out[header])
    return out


@register
class Http(FunctionKind):
    name = "http"
    spec = Spec

    def functions(self, spec: Spec, runtime) -> list[Function]:
        headers = header_values(spec)
        description = spec.description or f"{spec.method} {spec.url}"
        # the call bounds itself by timeout_s (every attempt and wait); the grace lets its own message win
        return [Function(spec.name, description, spec.parameters, spec, _caller(spec, headers), grace_s=1.0)]


def _caller(spec: Spec, headers: dict[str, str]):
    in_url = {f for _, f, _, _ in string.Formatter().parse(spec.url) if f}

    def call(arguments: dict, ctx: CallContext):
        import httpx

        from orchestrator.gateway.retry import AttemptError, RetryPolicy, is_retryable_status

        url = spec.url.format(**{k: arguments[k] for k in in_url if k in arguments}) if in_url else spec.url
        rest = {k: v for k, v in arguments.items() if k not in in_url}
        limit = spec.max_output_chars * 4          # bytes read before the answer is refused as too long
        deadline = time.monotonic() + ctx.timeout_s

        def attempt(_: int):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AttemptError("no time left for another attempt", endpoint=spec.url, retryable=False, timed_out=True)
            try:
                with httpx.Client(timeout=left, trust_env=False) as client, client.stream(
                        spec.method, url, headers=headers,
                        params=rest if spec.method in QUERY_METHODS else None,
                        json=None if spec.method in QUERY_METHODS else rest) as reply:
                    body = bytearray()
                    for chunk in reply.iter_bytes():
                        body += chunk
                        if len(body) > limit:
                            raise ToolFailure(f"{spec.url} answered more than {limit} bytes",
                                              fix="make the service answer less, or raise the tool's max_output_chars")
                        if time.monotonic() > deadline:
                            raise httpx.ReadTimeout("deadline")
                    if reply.status_code >= 400:
                        # redacted here: the retry policy logs this text (a service may echo our key)
                        raise AttemptError(redact(f"{spec.url} answered HTTP {reply.status_code}: "
                                                  f"{bytes(body[:200]).decode('utf-8', 'replace')!r}"),
                                           endpoint=spec.url, retryable=is_retryable_status(reply.status_code),
                                           status=reply.status_code)
                    return reply.headers.get("content-type", ""), bytes(body)
            except httpx.TimeoutException:
                raise AttemptError(f"{spec.url} did not answer within {ctx.timeout_s:g} s", endpoint=spec.url,
                                   retryable=True, timed_out=True) from None
            except httpx.TransportError as exc:
                raise AttemptError(redact(f"{spec.url}: {type(exc).__name__}: {exc}"), endpoint=spec.url,
                                   retryable=True) from None

        policy = RetryPolicy(max_retries=spec.retries, initial_s=0.2, max_wait_s=2.0, deadline_s=ctx.timeout_s)
        try:
            ctype, body = policy.run(attempt, model=spec.name)
        except AttemptError as exc:
            fix = ("check the service (its logs) at the tool's `url`" if exc.status
                   else "check that the service runs at the tool's `url` and answers within `timeout_s`")
            # the policy's own wording names configs/models.yaml (the gateway's): say it for a tool
            what = f"{spec.url} did not answer within {ctx.timeout_s:g} s" if exc.timed_out else str(exc)
            raise ToolFailure(f"{what} (attempts within timeout_s: at most {spec.retries + 1})", fix=fix) from None
        return _decoded(spec, ctype, body)
    return call


def _decoded(spec: Spec, ctype: str, body: bytes):
    """The tool's output from the service's body: the text, or its JSON (`response`)."""
    text = body.decode("utf-8", "replace")
    if not text.strip():
        raise ToolFailure(f"{spec.url} answered an empty body", fix="make the service answer JSON")
    if spec.response == "text":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        raise ToolFailure(f"{spec.url} answered {ctype or 'no content type'}, not JSON: {text[:120]!r}",
                          fix="point `url` at the JSON API, or set \"response\": \"text\" in tools.json") from None
