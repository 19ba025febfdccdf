"""What a 2xx reply must look like before the gateway reads it (pydantic), and what it may report.

The SDKs build their reply objects without validating them, so a provider or proxy answering
200 with `choices` a string, a choice without `message`, `usage` a string or with null counts
made a bare AttributeError/KeyError/TypeError far from the call, with no retry and no failover.
Here the JSON body is validated against the shape the API documents; a wrong shape, or usage
that cannot be true (a negative count, more completion tokens than the request allowed, more
tokens than the model's context window), is a retryable AttemptError ("malformed reply"), retried
and failed over to the next replica exactly like a 5xx, then an LLMCallError naming the field.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.gateway.retry import AttemptError

Count = Annotated[int, Field(strict=True, ge=0)]    # a token count: a JSON integer >= 0 (no "12", no 1.5, no null)


class _Shape(BaseModel):
    model_config = ConfigDict(extra="allow")         # providers add fields (refusal, logprobs, ...)


# ---- OpenAI chat completions (OpenAI, Azure, vLLM) ---------------------------------------------
class OpenAIFunction(_Shape):
    name: str
    arguments: str | dict[str, Any] | None = None


class OpenAIToolCall(_Shape):
    id: str | None = None
    function: OpenAIFunction


class OpenAIContentPart(_Shape):
    type: str
    text: str | None = None


class OpenAIMessage(_Shape):
    content: str | list[OpenAIContentPart] | None = None    # a list of parts: some providers' form
    tool_calls: list[OpenAIToolCall] | None = None

    def text(self) -> str:
        """The reply text: the string, or the `text` parts joined (others, e.g. thinking, left out)."""
        if isinstance(self.content, list):
            return "".join(p.text or "" for p in self.content if p.type == "text")
        return self.content or ""


class OpenAIChoice(_Shape):
    message: OpenAIMessage
    finish_reason: str | None = None


class OpenAIUsage(_Shape):
    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count | None = None


class ChatCompletionReply(_Shape):
    choices: list[OpenAIChoice] = Field(min_length=1)
    usage: OpenAIUsage | None = None       # some servers leave it out: counted as 0 tokens, with a warning

    def counts(self) -> tuple[int, int] | None:
        return None if self.usage is None else (self.usage.prompt_tokens, self.usage.completion_tokens)


# ---- Anthropic messages ------------------------------------------------------------------------
class AnthropicBlock(_Shape):
    type: str
    text: str | None = None
    id: str | None = None
    name: str | None = None
    input: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> AnthropicBlock:
        if self.type == "text" and self.text is None:
            raise ValueError("a text block needs `text` (a string)")
        if self.type == "tool_use" and (self.name is None or self.input is None or self.id is None):
            raise ValueError("a tool_use block needs `id`, `name` and `input` (an object)")
        return self


class AnthropicUsage(_Shape):
    input_tokens: Count
    output_tokens: Count


class MessageReply(_Shape):
    type: Literal["message"] = "message"
    content: list[AnthropicBlock]
    usage: AnthropicUsage
    stop_reason: str | None = None

    def counts(self) -> tuple[int, int]:
        return self.usage.input_tokens, self.usage.output_tokens


# ---- reading one reply ---------------------------------------------------------------------------
def _field(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def read_reply(response: Any, schema: type[ChatCompletionReply | MessageReply], *, endpoint: str,
               max_tokens: int | None, context_window: int | None = None):
    """`response` (an httpx2.Response already read, within the size cap) validated as `schema`.

    Raises a retryable AttemptError when the body is not JSON, has the wrong shape, or reports
    impossible usage: more completion tokens than `max_tokens` (the budget the request sent) or
    more prompt + completion tokens than `context_window` (None: unknown)."""
    status = response.status_code
    content_type = response.headers.get("content-type") or "none"
    try:
        data = json.loads(response.content)
    except ValueError as exc:     # json.JSONDecodeError, UnicodeDecodeError
        raise AttemptError(f"HTTP {status} reply is not JSON (Content-Type {content_type}, {type(exc).__name__}): "
                           f"body {response.content[:80].decode('utf-8', 'replace')!r}",
                           endpoint=endpoint, retryable=True) from None
    if not isinstance(data, dict):
        raise AttemptError(f"HTTP {status} malformed reply: expected a JSON object, got {type(data).__name__}",
                           endpoint=endpoint, retryable=True)
    try:
        reply = schema.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_input=False, include_url=False)
        shown = "; ".join(f"{_field(e['loc'])}: {e['msg'].removeprefix('Value error, ')}" for e in errors[:3])
        more = f" (+{len(errors) - 3} more)" if len(errors) > 3 else ""
        raise AttemptError(f"HTTP {status} malformed reply (not the {schema.__name__} shape): {shown}{more}",
                           endpoint=endpoint, retryable=True) from None
    counts = reply.counts()
    if counts is not None:
        prompt, completion = counts
        if max_tokens is not None and completion > max_tokens:
            raise AttemptError(f"HTTP {status} malformed reply: usage reports {completion} completion tokens, "
                               f"more than the {max_tokens} the request allowed", endpoint=endpoint, retryable=True)
        if context_window is not None and prompt + completion > context_window:
            raise AttemptError(f"HTTP {status} malformed reply: usage reports {prompt} + {completion} tokens, more "
                               f"than the model's context window {context_window} (configs/models.yaml "
                               f"rules.context_window or serve.max_model_len; if the server's window is larger, "
                               f"declare it)", endpoint=endpoint, retryable=True)
    return reply
