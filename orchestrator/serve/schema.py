"""The request body of POST /v1/chat/completions (pydantic models FastAPI validates) and
OpenAI's error shape, which every refusal of the server answers with."""
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


class RequestError(ValueError):
    def __init__(self, status: int, field_name: str, message: str, code: str = "invalid_request"):
        super().__init__(f"{field_name}: {message}")
        self.status, self.field, self.code = status, field_name, code


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None, **extra) -> dict:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}, **extra}
