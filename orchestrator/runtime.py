"""Carrying out one tool call: the chosen expert does the step, its cost and time recorded.

- search: the expert writes a query, the retriever returns documents;
- enhance_reasoning (kind "code"): the expert writes Python, the sandbox runs it;
- answer: the expert answers and the episode ends;
- call_expert (function-calling episodes, `propose`): the expert proposes the next domain action.

The expert is reached through the one LLM gateway; the alias's model (e.g. gpt-5)
is served by `catalog.served_model(model, profile)` (e.g. the local SmolLM2) but
priced as the alias's model, so a local run reports what the paper's tools would cost.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

from orchestrator.catalog import Catalog
from orchestrator.context import Budgets, CodeBlock, Document, EpisodeState, Prompts, TokenCounter, expert_context
from orchestrator.extract import answer_style, extract_answer, extract_code, extract_query
from orchestrator.gateway.errors import ProviderRejected
from orchestrator.records import ExpertCall, LLMResponse, ToolCall
from orchestrator.toolcall import format_tool_call, parse_tool_calls


class Retriever(Protocol):
    def retrieve(self, queries: list[str], topk: int) -> list[list[dict[str, Any]]]:
        """Search-R1 contract: per query a list of {"document": {"id", "contents"}, "score", ...}."""


class ExpertSettings(BaseModel):
    """How one expert is called (configs/eval_profiles.yaml `experts:`).  Units: tokens, characters."""

    model_config = ConfigDict(extra="forbid")
    max_tokens: int = Field(2048, ge=1, description="completion tokens per call")
    temperature: float = Field(0.0, ge=0)
    context_tokens: int = Field(24000, ge=1, description="documents + code results in the expert's prompt")
    code_tokens: int = Field(24000, ge=1, description="of which code blocks and outputs at most")
    doc_chars: int | None = Field(None, ge=1, description="each document cut to this many characters")
    answer_format: Literal["tags", "tags_brief", "boxed", "auto"] = "auto"
    extra_body: dict[str, Any] = Field(default_factory=dict)


# Search fee per local search (tools.search_fee): "web" charges what a web search with its
# page extractions costs (upstream's training charge: one search + WEB_PAGES_PER_SEARCH pages);
# "tokens" the query's tokens at the orchestrator's input price; "none" nothing (web fallbacks
# the retriever reports are charged in every mode).
SEARCH_FEES = ("web", "tokens", "none")
WEB_PAGES_PER_SEARCH = 30
# Code fee per sandbox run (tools.code_fee): "seconds" charges its wall time at
# fees.code_per_second (the paper's price); "none" nothing.  Wall time differs run to run and
# machine to machine: where every correct rollout of a group made the same calls, the group's
# min-max normalisation turns that microsecond noise into the whole [0, 1] cost coordinate.
CODE_FEES = ("seconds", "none")


def _default_llm(*args, **kwargs):
    from LLM_CALL import get_llm_response  # imported lazily: the gateway pulls in heavy backends
    return get_llm_response(*args, **kwargs)


def _default_sandbox(code: str, timeout: float):
    from orchestrator.sandbox import run_python
    return run_python(code, timeout=timeout)


@dataclass
class ToolRuntime:
    """Everything a tool call needs; one per run, shared by concurrent episodes (thread-safe)."""

    catalog: Catalog
    profile: str | None = None
    retriever: Retriever | None = None
    prompts: Prompts = field(default_factory=Prompts.load)
    budgets: Budgets = field(default_factory=Budgets)
    override_model: str | None = None   # "basic tools" mode: every alias served by this model
    topk: int = 3
    code_timeout: float = 60.0
    expert_max_tokens: int = 512
    expert_temperature: float = 0.0
    experts: dict[str, ExpertSettings] = field(default_factory=dict)   # by model (or "default")
    send_eid: bool = False          # pass the task id as the retriever's `eid` (per-question pools)
    search_fee: str = "none"        # one of SEARCH_FEES
    code_fee: str = "seconds"       # one of CODE_FEES
    llm: Callable[..., Any] = _default_llm
    run_code: Callable[[str, float], Any] = _default_sandbox

    def __post_init__(self) -> None:
        if self.search_fee not in SEARCH_FEES:
            raise ValueError(f"search_fee: {self.search_fee!r} is not one of {SEARCH_FEES}")
        if self.code_fee not in CODE_FEES:
            raise ValueError(f"code_fee: {self.code_fee!r} is not one of {CODE_FEES}")

    def settings(self, model: str) -> ExpertSettings:
        """How expert `model` is called: its `experts` entry, else "default", else the scalar fields."""
        found = self.experts.get(model) or self.experts.get("default")
        if found is not None:
            return found
        return ExpertSettings(max_tokens=self.expert_max_tokens, temperature=self.expert_temperature,
                              context_tokens=self.budgets.context_tokens, code_tokens=self.budgets.context_tokens)

    def tool_schemas(self, catalog: Catalog, tools: list) -> list[dict]:
        """The function schemas the orchestrator sees: upstream's text and order under an
        upstream prompt style, else the catalog's own rendering."""
        if self.prompts.style.startswith("upstream"):
            from orchestrator.upstream_prompts import tool_schemas_upstream
            return tool_schemas_upstream(catalog, tools)
        return catalog.openai_tools(tools=tools)

    def served(self, model: str) -> str:
        return self.override_model or self.catalog.served_model(model, self.profile)

    def call(self, tool_name: str, alias: str, state: EpisodeState, catalog: Catalog | None = None) -> tuple[ExpertCall, str | None]:
        """Run one validated call; return what happened and the final answer (answer tool only).

        Failures (the expert's server, the sandbox, the retriever) are recorded in
        `ExpertCall.error`; they never end the episode by themselves.  Except one: a
        request the provider rejects (ProviderRejected: an unsupported parameter, a wrong
        key) is raised, since no choice of the orchestrator can fix it.
        """
        catalog = catalog or self.catalog
        tool = catalog.tool(tool_name)
        model = tool.aliases[alias].model
        call = ExpertCall(tool=tool_name, alias=alias, model=model)
        started = time.monotonic()
        answer = None
        try:
            if tool.kind == "search":
                self._search(call, state, catalog)
            elif tool.kind == "code":
                self._code(call, state, catalog)
            elif tool.kind == "answer":
                answer = self._answer(call, state, catalog)
            else:
                raise ValueError(f"tool kind {tool.kind!r} is not a QA tool")
        except ProviderRejected:
            raise
        except Exception as exc:  # recorded, not fatal: the orchestrator may try another tool
            call.error = f"{type(exc).__name__}: {exc}"
        call.latency = time.monotonic() - started
        return call, answer

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
            response = self._ask(call, messages, catalog, tools=tools)
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

    # ---- the three tools ---------------------------------------------------------------
    def _ask(self, call: ExpertCall, messages: list[dict], catalog: Catalog, **kwargs) -> LLMResponse:
        settings = self.settings(call.model)
        if settings.extra_body:
            kwargs["extra_body"] = settings.extra_body
        response = self.llm(self.served(call.model), messages, temperature=settings.temperature,
                            max_tokens=settings.max_tokens, price_model=call.model, catalog=catalog, **kwargs)
        call.usage = call.usage + response.usage
        call.cost += catalog.llm_cost(call.model, response.usage)
        return response

    def _ask_expert(self, call: ExpertCall, prompt: str, catalog: Catalog, system: str = "") -> str:
        messages = [{"role": "system", "content": system}] if system else []
        return self._ask(call, messages + [{"role": "user", "content": prompt}], catalog).text

    def _context(self, state: EpisodeState, model: str) -> str:
        if self.prompts.style.startswith("upstream"):
            from orchestrator.upstream_prompts import expert_context_upstream
            return expert_context_upstream(state, self.settings(model), TokenCounter())
        if not self.experts:
            return expert_context(state, self.budgets, TokenCounter())
        return expert_context(state, self.budgets, TokenCounter(), room=self.settings(model).context_tokens)

    def _search_fee(self, query: str, catalog: Catalog) -> float:
        if self.search_fee == "web":
            return catalog.search_cost(web_searches=1, pages=WEB_PAGES_PER_SEARCH)
        if self.search_fee == "tokens" and catalog.orchestrator_price_model:
            price = catalog.price(catalog.orchestrator_price_model)
            return price.input * TokenCounter().count(query) / 1_000_000
        return 0.0

    def _search(self, call: ExpertCall, state: EpisodeState, catalog: Catalog) -> None:
        if self.retriever is None:
            raise RuntimeError("no retriever configured: start the retrieval service or pass --index")
        reply = self._ask_expert(call, self.prompts.render(
            "expert_search", question=state.question, context=self._context(state, call.model)), catalog)
        query = extract_query(reply, fallback=state.question)
        if self.send_eid and state.task_id is not None:
            result = self.retriever.retrieve([query], self.topk, eid=state.task_id)
        else:
            result = self.retriever.retrieve([query], self.topk)
        docs = [Document(id=str(h["document"]["id"]), contents=h["document"]["contents"],
                         source=h["document"].get("source", "local")) for h in result[0]]
        # web fallback fees, as the retriever reports them (RetrievalClient's `Retrieved`)
        call.cost += catalog.search_cost(web_searches=getattr(result, "web_searches", 0),
                                         pages=getattr(result, "pages", 0))
        call.cost += self._search_fee(query, catalog)
        new = state.add_documents(docs)
        listing = "".join(f"\n[{d.id}{' web' if d.source == 'web' else ''}] {d.contents[:200]}" for d in docs)
        call.output = f"query: {query!r}; {len(docs)} documents ({new} new){listing}"

    def _code(self, call: ExpertCall, state: EpisodeState, catalog: Catalog) -> None:
        reply = self._ask_expert(call, self.prompts.render(
            "expert_code", question=state.question, context=self._context(state, call.model)), catalog)
        code = extract_code(reply)
        if code is None:
            call.output = "the expert wrote no ```python block"
            return
        result = self.run_code(code, self.code_timeout)
        if self.code_fee == "seconds":
            call.cost += catalog.code_cost(result.duration_s)
        output = result.stdout if result.exit_code == 0 else f"{result.stdout}\n[exit {result.exit_code}] {result.stderr[-1000:]}"
        if result.timed_out:
            output += f"\n[timed out after {self.code_timeout:g} s]"
        state.code_blocks.append(CodeBlock(code=code, output=output.strip()))
        call.output = output.strip()[:2000]

    def _answer(self, call: ExpertCall, state: EpisodeState, catalog: Catalog) -> str:
        fmt = self.settings(call.model).answer_format
        if fmt == "auto":
            fmt = answer_style(self.served(call.model))
        name = f"expert_answer_{fmt}"
        system = self.prompts.render("expert_answer_system").strip() if fmt == "boxed" else ""
        reply = self._ask_expert(call, self.prompts.render(
            name, question=state.question, context=self._context(state, call.model)), catalog, system=system)
        call.output = reply[:2000]
        if self.prompts.style.startswith("upstream"):
            from orchestrator.upstream_prompts import extract_answer_upstream
            return extract_answer_upstream(reply, "boxed" if fmt == "boxed" else "tags")
        return extract_answer(reply)

