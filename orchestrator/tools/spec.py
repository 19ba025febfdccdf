"""The tools.json entry of a tool, common to every kind (orchestrator/tools/registry.py).

Two families:
- alias tools (kinds search, code, answer, expert: the paper's tools): the policy picks a model
  alias (`aliases`), the alias's model does the step and is charged at its row of `prices`;
- function tools (kinds python, http, mcp, tau2_domain): the policy calls the tool with its own
  JSON arguments; the call is charged at the tool's row of `prices` (`price`, default: the tool's
  name): per call, per second of wall clock and per token of arguments and output.
"""
from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
FUNCTION_NAME = r"^[A-Za-z_][A-Za-z0-9_.\-]*$"   # an MCP server's tool names may hold '.' or '-'


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AliasSpec(Strict):
    model: str = Field(min_length=1)
    latency_s: float = Field(ge=0, strict=True, description="listed mean latency shown to the policy")
    description: str | None = None


class ToolSpecBase(Strict):
    name: str = Field(pattern=NAME)
    kind: str
    description: str = ""
    tasks: list[str] = Field(default_factory=lambda: ["qa"], description="episode kinds that offer the tool")

    alias_tool: ClassVar[bool] = False


class AliasToolSpec(ToolSpecBase):
    """A tool whose one argument picks a model alias (the paper's tools)."""

    description: str
    argument: str = Field("model", pattern=NAME,
                          description="name of the alias argument (upstream: `model`; tau2's call_expert: `expert`)")
    argument_description: str = ""
    aliases: dict[str, AliasSpec] = Field(min_length=1)

    alias_tool: ClassVar[bool] = True


class FunctionToolSpec(ToolSpecBase):
    """A tool the policy calls with its own JSON arguments."""

    price: str | None = Field(None, description="its row in `prices` (default: the tool's name)")
    latency_s: float | None = Field(None, ge=0, strict=True, description="listed latency shown to the policy")
    timeout_s: float = Field(30.0, gt=0, strict=True, description="deadline of one call, seconds")
    max_output_chars: int = Field(100_000, gt=0, strict=True,
                                  description="longer outputs are an error (the tool should return less)")

    @property
    def aliases(self) -> dict[str, AliasSpec]:
        """No model aliases: code that walks every tool's aliases sees none here."""
        return {}

    @property
    def price_row(self) -> str:
        return self.price or self.name

    def explicit_parameters(self) -> dict[str, Any] | None:
        return getattr(self, "parameters", None)
