"""Tool kinds, one module each, found by name: no `if` chain decides what a tool does.

    from orchestrator.tools.registry import KINDS
    KINDS["python"].spec          # the pydantic model of its tools.json entry
    KINDS["search"].run(...)      # an alias kind carries out one call

A kind is a class registered with `@register`:
- `AliasKind` (search, code, answer, expert): the policy picks a model alias; `run` does the
  step with the alias's expert (orchestrator/runtime.py ToolRuntime calls it);
- `FunctionKind` (python, http, mcp, tau2_domain): `functions(spec, runtime)` opens the entry
  into the functions the policy sees, each with its own JSON-schema arguments; the toolbox
  (orchestrator/tools/toolbox.py) calls them under their deadline and prices them.

Adding a kind: a module in this package defining a `Spec` (subclass of spec.FunctionToolSpec with
`kind: Literal["<name>"]`) and a registered class, listed in BUILTIN_MODULES.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, ClassVar

from orchestrator.tools.spec import AliasToolSpec, FunctionToolSpec, ToolSpecBase


# Types of the modules that import this package, named without importing them (no import cycle):
Catalog = Any          # orchestrator.catalog.Catalog
EpisodeState = Any     # orchestrator.context.EpisodeState
ExpertCall = Any       # orchestrator.records.ExpertCall
ToolRuntime = Any      # orchestrator.runtime.ToolRuntime

BUILTIN_MODULES = ("search", "code", "answer", "expert", "python", "http", "mcp", "tau2_domain")
KINDS: dict[str, "ToolKind"] = {}


class ToolFailure(Exception):
    """A tool call that failed in a way the tool's kind can explain: `fix` says what to change."""

    def __init__(self, message: str, fix: str = ""):
        super().__init__(message)
        self.fix = fix


class ToolKind:
    name: ClassVar[str]
    spec: ClassVar[type[ToolSpecBase]]


class AliasKind(ToolKind):
    spec: ClassVar[type[AliasToolSpec]]
    qa: ClassVar[bool] = False               # offered by the QA episode
    needs_retriever: ClassVar[bool] = False  # offered only where a retriever is configured
    ends_episode: ClassVar[bool] = False     # a call that succeeds gives the final answer

    def run(self, runtime: ToolRuntime, call: ExpertCall, state: EpisodeState,
            catalog: Catalog) -> str | None:
        """Carry out one call of `call.alias`; record output, usage and cost on `call`; return
        the final answer (answer kind) or None.  Raise to record an error."""
        raise NotImplementedError(f"tool kind {self.name!r} is not a QA tool")


@dataclass
class CallContext:
    """What a function call may read: the episode's state (its `tool_state` holds per-episode
    data, e.g. a domain's database), the runtime (sandbox runner, token counter), its deadline."""

    state: EpisodeState | None
    runtime: ToolRuntime | None
    timeout_s: float


@dataclass
class Function:
    """One function the policy can call: its schema and how to call it.  `call` is a plain
    function or a coroutine function of (arguments, context); it returns the output (any JSON
    value) or raises (ToolFailure for a failure the kind explains)."""

    name: str
    description: str
    parameters: dict[str, Any]
    spec: FunctionToolSpec
    call: Callable[[dict, CallContext], Any] | Callable[[dict, CallContext], Awaitable[Any]]
    is_async: bool = False
    # a stand-in for tools that could not be listed (an MCP server that did not start): every
    # call fails with this message, so the run goes on and the record says why
    broken: ToolFailure | None = None
    grace_s: float = 0.0        # waited past timeout_s for a call that ends itself at its deadline (the sandbox's kill)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.spec.kind


class FunctionKind(ToolKind):
    spec: ClassVar[type[FunctionToolSpec]]

    def functions(self, spec: FunctionToolSpec, runtime: ToolRuntime | None) -> list[Function]:
        """The functions tools.json entry `spec` offers (may start a server; a failure is
        a ToolFailure, which the toolbox turns into a stand-in function)."""
        raise NotImplementedError

    def stand_ins(self, spec: FunctionToolSpec) -> list[str]:
        """Names offered in place of the functions when `functions` failed (calls record why)."""
        return [spec.name]

    def close(self) -> None:
        """Release what `functions` opened (servers, clients); the default holds nothing."""


def register(cls: type[ToolKind]) -> type[ToolKind]:
    """Class decorator: add a kind to KINDS under `cls.name`."""
    if cls.name in KINDS and type(KINDS[cls.name]) is not cls:
        raise ValueError(f"tool kind {cls.name!r} is registered twice ({type(KINDS[cls.name]).__name__}, {cls.__name__})")
    KINDS[cls.name] = cls()
    return cls


def load_builtin_kinds() -> dict[str, ToolKind]:
    for module in BUILTIN_MODULES:
        importlib.import_module(f"orchestrator.tools.{module}")
    return KINDS


def alias_kind(name: str) -> AliasKind | None:
    kind = KINDS.get(name)
    return kind if isinstance(kind, AliasKind) else None


def function_kind(name: str) -> FunctionKind | None:
    kind = KINDS.get(name)
    return kind if isinstance(kind, FunctionKind) else None
