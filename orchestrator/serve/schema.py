"""The request body of POST /v1/chat/completions (pydantic models FastAPI validates), OpenAI's
error shape, which every refusal of the server answers with, and the two rules its messages keep:
at most `ECHO_CHARS` characters of what the client sent (`clip`), and text that is valid Unicode
(a lone surrogate such as "\\ud800" is refused up front: `surrogate_at`)."""
# No `from __future__ import annotations`: FastAPI must see the real request model classes.
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(min_length=1)
    content: str | list[dict[str, Any]] | None = None


class Budget(BaseModel):
    model_config = ConfigDict(extra="forbid")
    dollars: float | None = Field(None, gt=0, allow_inf_nan=False, description="stop once this much is spent")
    turns: int | None = Field(None, ge=1, le=10_000, description="stop after this many orchestrator turns")


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")     # OpenAI clients send sampling keys the profile decides here
    model: str = Field(min_length=1)
    messages: list[Message] = Field(min_length=1)
    stream: bool = False
    preference: str | dict[str, float] | None = None
    budget: Budget | None = None


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """Every refusal's body (documented in the OpenAPI schema for 4XX and 5XX)."""
    error: ErrorDetail


class RequestError(ValueError):
    def __init__(self, status: int, field_name: str, message: str, code: str = "invalid_request"):
        super().__init__(f"{field_name}: {message}")
        self.status, self.field, self.code = status, field_name, code


ECHO_CHARS = 200          # the most characters of a client's input an error repeats
PATH_CHARS = ECHO_CHARS // 2   # a field's path (its keys are input too), in the message and again in `param`
MESSAGE_CHARS = 1000      # the longest error message (a bound on what any path can echo)


def clip(text: str, limit: int = ECHO_CHARS) -> str:
    """`text` as an error message may repeat it: at most `limit` characters (then how many there
    were), a lone surrogate written as its escape so the reply can be encoded."""
    text = str(text)
    if len(text) > limit:
        text = f"{text[:limit]}... ({len(text)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def surrogate_at(value, path: tuple = ()) -> tuple[tuple, str] | None:
    """(where, the offending text) of the first string or key in decoded JSON `value` holding a
    lone surrogate (text no UTF-8 can carry), or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            found = surrogate_at(key, (*path, key)) or surrogate_at(item, (*path, key))
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = surrogate_at(item, (*path, i))
            if found:
                return found
    return None


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None, **extra) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}; the message and
    param are clipped (`clip`) whatever produced them."""
    return {"error": {"message": clip(message, MESSAGE_CHARS), "type": kind,
                      "param": None if param is None else clip(param, PATH_CHARS), "code": code}, **extra}
