"""Carrying out one tool call: the chosen expert does the step, its cost and time recorded.

What a call does is its kind's (orchestrator/tools/, one module per kind, found in the registry):
- search: the expert writes a query, the retriever returns documents;
- enhance_reasoning (kind "code"): the expert writes Python, the sandbox runs it;
- answer: the expert answers and the episode ends;
- call_expert (function-calling episodes, `propose`): the expert proposes the next domain action;
- function tools (python, http, mcp, tau2_domain): `call_function` runs one under its deadline
  through the toolbox (orchestrator/tools/toolbox.py), priced at its row of the price table.

The expert is reached through the one LLM gateway; the alias's model (e.g. GPT-5)
is served by `catalog.served_model(model, serve)` (e.g. the local SmolLM2) and charged as
the profile's `pricing` says (orchestrator/settings.py PRICING): `as_alias` at the alias
model's price, so a local run reports what the paper's tools would cost; `as_served` at the
served model's own (the open profile's gpt-oss for GPT-5).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

from orchestrator.catalog import Catalog
from orchestrator.context import Budgets, EpisodeState, Prompts, TokenCounter, expert_context
from orchestrator.settings import PRICING, ExpertSettings, QASettings, Tau2Settings
from orchestrator.gateway.errors import ProviderRejected
from orchestrator.records import ExpertCall, LLMResponse, ToolCall
from orchestrator.toolcall import format_tool_call, parse_tool_calls
from orchestrator.tools.code import CODE_FEES  # noqa: F401 - settings' choices, kept importable here
from orchestrator.tools.registry import Function, alias_kind
from orchestrator.tools.search import SEARCH_FEES, WEB_PAGES_PER_SEARCH  # noqa: F401
from orchestrator.tools.toolbox import TOOLBOX, Toolbox


class Retriever(Protocol):
    def retrieve(self, queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
        """Search-R1 contract: per query a list of {"document": {"id", "contents"}, "score", ...}."""


def _rejected_errors() -> tuple[type[Exception], ...]:
    try:
        from retrieval.client import RetrievalRejected
    except ImportError:   # retrieval's dependencies not installed: no retriever can raise it
        return (ProviderRejected,)
    return (ProviderRejected, RetrievalRejected)


# Requests refused as such (not the weather): they end the episode, naming the refusal.
REJECTED = _rejected_errors()


def check_pricing(catalog: Catalog, serve: str | None, pricing: str) -> None:
    """Raise ValueError, naming `pricing`, unless it is one of PRICING and, for `as_served`,
    every model the serving map `serve` answers with has a tools.json price row."""
    if pricing not in PRICING:
        raise ValueError(f"pricing: {pricing!r} is not one of {list(PRICING)}")
    if pricing == "as_served" and serve in catalog.profiles:
        unpriced = sorted(set(catalog.profiles[serve].values()) - set(catalog.prices))
        if unpriced:
            raise ValueError(f"pricing: as_served charges each expert call at its served model's price, but "
                             f"tools.json has no price for {unpriced} (served under profiles.{serve}); add them "
                             f"to 'prices' or set `pricing: as_alias` in the settings profile")


def _default_llm(*args, **kwargs):
    from orchestrator.gateway import get_llm_response  # imported lazily: the gateway pulls in heavy backends
    return get_llm_response(*args, **kwargs)


def _default_sandbox(code: str, timeout: float, files: dict[str, Path] | None = None):
    from orchestrator.sandbox import run_python
    return run_python(code, timeout=timeout, files=files)


@dataclass
class ToolRuntime:
    """Everything a tool call needs; one per run, shared by concurrent episodes (thread-safe).

    Built by orchestrator/setup.py `build_runtime` from a profile's settings section
    (orchestrator/settings.py), never by hand in a script: `sections` holds the profile's
    section of each episode kind the run plays (QA tools read `qa`, `call_expert` reads `tau2`).
    """

    catalog: Catalog
    # episode kind -> its settings section (orchestrator/settings.py EPISODE_SETTINGS)
    sections: dict[str, Any] = field(default_factory=lambda: {"qa": QASettings(), "tau2": Tau2Settings()})
    serve: str | None = None        # tools.json `profiles` entry: which model answers for each alias model
    pricing: str = "as_alias"       # whose price a served call pays (orchestrator/settings.py PRICING)
    retriever: Retriever | None = None
    prompts: Prompts = field(default_factory=Prompts.load)
    budgets: Budgets = field(default_factory=Budgets)
    override_model: str | None = None   # "basic tools" mode: every alias served by this model
    counter: TokenCounter = field(default_factory=TokenCounter)   # expert contexts' token cuts, query fees
    llm: Callable[..., Any] = _default_llm
    run_code: Callable[[str, float], Any] = _default_sandbox
    toolbox: Toolbox = field(default_factory=lambda: TOOLBOX)   # function tools, opened once per process

    def __post_init__(self):
        check_pricing(self.catalog, self.serve, self.pricing)

    def section(self, kind: str):
        if kind not in self.sections:
            raise ValueError(f"this runtime has no {kind!r} settings (it has {sorted(self.sections)}); "
                             f"build it with orchestrator.setup.build_runtime for that episode kind")
        return self.sections[kind]

    @property
    def qa(self) -> QASettings:
        return self.section("qa")

    def expert(self, model: str, kind: str = "qa", tool: str | None = None) -> ExpertSettings:
        """How expert `model` is called by `tool` in `kind` episodes (orchestrator/settings.py find_expert)."""
        return self.section(kind).expert(model, tool)

    def tool_schemas(self, catalog: Catalog, tools: list) -> list[dict]:
        """The function schemas the orchestrator sees: upstream's text and order under an
        upstream prompt style, else the catalog's own rendering."""
        if self.prompts.style.startswith("upstream"):
            from orchestrator.upstream_prompts import tool_schemas_upstream
            return tool_schemas_upstream(catalog, tools)
        return catalog.openai_tools(tools=tools)

    def served(self, model: str) -> str:
        return self.override_model or self.catalog.served_model(model, self.serve)

    def priced(self, model: str, catalog: Catalog) -> str:
        """The price row an expert call of alias model `model` is charged at: the alias model's
        (`pricing: as_alias`) or the served model's (`as_served`).  "Basic tools" mode (the
        orchestrator answering for every alias) charges the orchestrator's model where it has a
        price row, else the alias model's, whatever the pricing."""
        served = self.served(model)
        if self.override_model:
            return served if served in catalog.prices else model
        return served if self.pricing == "as_served" else model

    def call(self, tool_name: str, alias: str, state: EpisodeState, catalog: Catalog | None = None) -> tuple[ExpertCall, str | None]:
        """Run one validated call; return what happened and the final answer (answer tool only).

        Failures (the expert's server, the sandbox, the retriever) are recorded in
        `ExpertCall.error`; they never end the episode by themselves.  Except a request the
        provider or the retrieval service rejects (ProviderRejected: an unsupported parameter,
        a wrong key; RetrievalRejected: an unknown eid, a bad filter): it is raised, since no
        choice of the orchestrator can fix it.
        """
        catalog = catalog or self.catalog
        tool = catalog.tool(tool_name)
        model = tool.aliases[alias].model
        call = ExpertCall(tool=tool_name, alias=alias, model=model)
        started = time.monotonic()
        answer = None
        try:
            kind = alias_kind(tool.kind)
            if kind is None:
                raise ValueError(f"tool {tool_name!r} (kind {tool.kind!r}) takes arguments, not an alias: "
                                 f"call it with call_function")
            answer = kind.run(self, call, state, catalog)
        except REJECTED:
            raise
        except Exception as exc:  # recorded, not fatal: the orchestrator may try another tool
            call.error = f"{type(exc).__name__}: {exc}"
        call.latency = time.monotonic() - started
        return call, answer

    def functions(self, catalog: Catalog, task: str = "qa", taken: set[str] = frozenset()) -> list[Function]:
        """The function tools `task` episodes offer under `catalog` (names in `taken` left out)."""
        return self.toolbox.offered(catalog, task, runtime=self, taken=taken)

    def call_function(self, fn: Function, arguments: dict, state: EpisodeState | None,
                      catalog: Catalog | None = None) -> tuple[ExpertCall, str]:
        """Call function tool `fn`; (its record, the output text the episode's context gets).
        Never raises for the tool's failure: it is the record's `error`, with cost and latency."""
        return self.toolbox.invoke(fn, arguments, catalog or self.catalog, state, runtime=self)

    def propose(self, tool_name: str, alias: str, messages: list[dict], tools: list[dict],
                catalog: Catalog | None = None) -> tuple[ExpertCall, ToolCall | None]:
        """`call_expert` (function-calling episodes): the alias's expert reads the conversation
        `messages` and proposes the next action, one call to one of `tools`.  Returns what the
        expert cost and its proposal (None when it proposed none; the reason is in `error`)."""
        catalog = catalog or self.catalog
        call = ExpertCall(tool=tool_name, alias=alias, model=catalog.tool(tool_name).aliases[alias].model)
        started = time.monotonic()
        proposal = None
        try:
            response = self.ask(call, messages, catalog, kind="tau2", tools=tools)
            calls = response.tool_calls or parse_tool_calls(response.text)[1]
            if not calls:
                raise ValueError(f"the expert proposed no tool call: {response.text[:200]!r}")
            proposal = calls[0]
            call.output = format_tool_call(proposal.name, proposal.arguments)
        except ProviderRejected:
            raise
        except Exception as exc:  # recorded, not fatal
            call.error = f"{type(exc).__name__}: {exc}"
        call.latency = time.monotonic() - started
        return call, proposal

    # ---- expert calls (orchestrator/tools/ search, code, answer use these) -------------------
    def ask(self, call: ExpertCall, messages: list[dict], catalog: Catalog, kind: str = "qa",
            **kwargs) -> LLMResponse:
        """One expert call for `call.model`, with that expert's settings in `kind` episodes; its
        usage and dollars added to `call`, charged at `priced`'s row (the profile's `pricing`)."""
        settings = self.expert(call.model, kind, call.tool)
        if settings.extra_body:
            kwargs["extra_body"] = settings.extra_body
        served, priced = self.served(call.model), self.priced(call.model, catalog)
        response = self.llm(served, messages, temperature=settings.temperature,
                            max_tokens=settings.max_tokens, price_model=priced, catalog=catalog, **kwargs)
        call.usage = call.usage + response.usage
        call.cost += catalog.llm_cost(priced, response.usage)
        return response

    def _ask_expert(self, call: ExpertCall, prompt: str, catalog: Catalog, system: str = "") -> str:
        messages = [{"role": "system", "content": system}] if system else []
        return self.ask(call, messages + [{"role": "user", "content": prompt}], catalog).text

    def _context(self, state: EpisodeState, call: ExpertCall) -> str:
        settings = self.expert(call.model, tool=call.tool)
        if self.prompts.style.startswith("upstream"):
            from orchestrator.upstream_prompts import expert_context_upstream
            return expert_context_upstream(state, settings, self.counter)
        return expert_context(state, self.budgets, self.counter, room=settings.context_tokens)
