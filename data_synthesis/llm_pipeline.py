"""The LLM pipeline end to end: a domain folder and verified tasks from a domain name.

    pipeline = LLMPipeline(model=MODEL, seed=0)       # MODEL: a configs/models.yaml name
    result = pipeline.build("library", Path("out/library"), num_tasks=50, description="a city library")

When `name_or_dir` is a shipped schema, a schema file or a folder with db.json, its
schema and records are used and the LLM writes only the extra tools, the policy and the
tasks.  Every model call goes through LLM_CALL (any model in configs/models.yaml).
"""
from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Callable

from orchestrator.domains.folder import load_domain
from data_synthesis.llm_env import ask_policy, ask_records, ask_schema, ask_tables, ask_tools
from data_synthesis.llm_steps import StepRunner
from data_synthesis.llm_tasks import LLMTaskWriter, synthesize_llm_tasks, tool_lines
from data_synthesis.offline import DomainResult, DomainSource, atomic_write, dump_json, resolve_source, task_checks
from data_synthesis.policy import render_policy
from data_synthesis.schema import SchemaError, dump_schema
from data_synthesis.tasks import TaskFilter
from data_synthesis.templates import TaskFactory
from data_synthesis.toolgen import derive_tools

DEFAULT_RECORDS = 10   # per collection: LLM records cost tokens, keep the default small


class LLMPipeline:
    def __init__(self, model: str, seed: int = 0, retries: int = 2, max_tokens: int = 4096,
                 temperature: float = 0.7, call: Callable | None = None, timeout_s: float | None = None):
        self.runner = StepRunner(model, retries=retries, temperature=temperature, max_tokens=max_tokens, call=call,
                                 timeout_s=timeout_s)
        self.seed = seed
        self.rng = random.Random(seed)

    def _fail(self, step: str) -> ValueError:
        errors = self.runner.errors.get(step) or ["no reply"]
        return ValueError(f"LLM step {step!r} failed after {1 + self.runner.retries} tries with "
                          f"{self.runner.model}; last problem: {errors[-1]}")

    def environment(self, name: str, description: str, records: int):
        """(schema, db, description) written by the model: tables, schema, records."""
        domain = re.sub(r"\W+", "_", name.strip().lower()).strip("_") or "domain"
        tables = ask_tables(self.runner, domain, description)
        if tables is None:
            raise self._fail("tables")
        schema = ask_schema(self.runner, domain, tables)
        if schema is None:
            raise self._fail("schema")
        db = ask_records(self.runner, schema, tables["subjects"], records, self.rng)
        empty = sorted(c for c, recs in db.items() if not recs)
        if empty:
            raise ValueError(f"LLM step 'records' produced no valid records for {empty}; last problem: "
                             f"{(self.runner.errors.get(f'records/{empty[0]}') or ['none'])[-1]}")
        return schema, db, tables["description"]

    def build(self, name_or_dir: str, out: Path, num_tasks: int, description: str = "",
              records: int | None = None, progress: Callable[[int], None] | None = None) -> DomainResult:
        out = Path(out)
        source = None
        try:
            source = resolve_source(name_or_dir, seed=self.seed, records=records)
            schema, db, origin = source.schema, source.db, source.origin + " (LLM tools, policy, tasks)"
            description = description or schema.description
        except SchemaError:
            if Path(name_or_dir).exists():
                raise  # a real file or folder that is malformed: say so, do not invent a domain
            schema, db, description = self.environment(name_or_dir, description, records or DEFAULT_RECORDS)
            origin = f"LLM {self.runner.model}"
        atomic_write(out / "schema.yaml", dump_schema(schema))
        atomic_write(out / "db.json", dump_json(db))
        generic = derive_tools(schema)
        tools_src, tools_report = ask_tools(self.runner, schema, db, generic)
        atomic_write(out / "tools.py", tools_src)
        given = source.policy if source is not None else None
        atomic_write(out / "policy.md", given or render_policy(schema, generic))  # placeholder until the LLM's passes
        domain = load_domain(out)
        policy = given or ask_policy(self.runner, schema, description, tool_lines(domain), list(domain.tool_types))
        if policy is not None:
            atomic_write(out / "policy.md", policy)
        checks, policy_summary = task_checks(DomainSource(schema, db, origin, given), generic, domain.tool_types)
        task_filter = TaskFilter(domain.call, domain.db, domain.fresh_db, domain.tool_types, checks)
        if given:   # the domain's own policy is the one the tasks must follow
            description = f"{description}\n\nThe domain's policy; every task must follow it:\n{given}".strip()
        writer = LLMTaskWriter(self.runner, domain, TaskFactory(schema, generic, db, self.seed), description, self.seed)
        tasks = synthesize_llm_tasks(writer, task_filter, num_tasks, progress=progress)
        atomic_write(out / "tasks.json", dump_json(tasks))
        extra = {"origin": origin, "domain": schema.domain, "steps": self.runner.summary(),
                 "summary": {"llm_model": self.runner.model, "llm_calls": self.runner.calls,
                             "llm_cost_usd": round(self.runner.cost, 6), "llm_tools": tools_report,
                             "policy": "the domain's policy.md" if given else "llm" if policy is not None
                             else "offline template", **{k: v for k, v in policy_summary.items() if k != "policy"}}}
        return DomainResult(out, tasks, task_filter.tally.as_dict(), len(domain.tool_types), extra)
