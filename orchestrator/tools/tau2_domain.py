"""Kind `tau2_domain`: the tools of a domain folder (db.json, tools.py, policy.md), loaded by
orchestrator/domains/folder.py, which owns how a domain's toolkit is found and called.  Each episode acts
on its own fresh copy of the domain's database (kept in the episode state's `tool_state`).

    {"name": "airline", "kind": "tau2_domain", "domain": "data/domains/airline", "exclude": ["transfer_to_human_agents"]}
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.tools.registry import CallContext, Function, FunctionKind, ToolFailure, register
from orchestrator.tools.spec import FunctionToolSpec


class Spec(FunctionToolSpec):
    kind: Literal["tau2_domain"]
    domain: str = Field(min_length=1, description="the domain folder (db.json, tools.py, policy.md)")
    include: list[str] | None = None
    exclude: list[str] = Field(default_factory=list)


@register
class Tau2Domain(FunctionKind):
    name = "tau2_domain"
    spec = Spec

    def functions(self, spec: Spec, runtime) -> list[Function]:
        from orchestrator.domains.folder import SchemaError, cached_domain

        try:
            domain = cached_domain(spec.domain)
        except SchemaError as exc:
            raise ToolFailure(str(exc), fix="check the entry's `domain` folder") from None
        out = []
        for schema in domain.openai_tools():
            fn = schema["function"]
            if (spec.include is not None and fn["name"] not in spec.include) or fn["name"] in spec.exclude:
                continue
            out.append(Function(fn["name"], fn.get("description", ""), fn.get("parameters") or {"type": "object"},
                                spec, _caller(domain, fn["name"], spec.domain)))
        return out

    def stand_ins(self, spec: Spec) -> list[str]:
        return list(spec.include) if spec.include else [spec.name]


def _caller(domain, name: str, key: str):
    def call(arguments: dict, ctx: CallContext):
        store = ctx.state.tool_state if ctx.state is not None else {}
        db = store.setdefault(("tau2_domain", key), None)
        if db is None:
            db = store[("tau2_domain", key)] = domain.fresh_db()
        return domain.call(db, name, arguments)
    return call
