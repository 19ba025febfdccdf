"""Offline environment + task synthesis (no LLM): schema -> db -> tools -> policy -> tasks.

    source = resolve_source("school", seed=0)            # shipped schema, Faker records
    source = resolve_source("../shared/.../bank")         # existing db.json, schema inferred
    result = build_domain(source, Path("out/school"), num_tasks=200, seed=0)

The output folder is a domain folder: schema.yaml, db.json, tools.py, policy.md,
tasks.json (see docs/data_synthesis.md).  A folder's own policy.md is the domain's policy:
it is copied, not replaced by the template, and tasks that break its plainly stated rules
(data_synthesis/policy_rules.py) or read implausibly (plausibility.py) are dropped and counted.
"""
from __future__ import annotations

import json
import os
import pickle
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from data_synthesis.fake import generate_db
from data_synthesis.infer import infer_schema
from data_synthesis.plausibility import Plausibility
from data_synthesis.policy import render_policy
from data_synthesis.policy_rules import PolicyCheck, parse_policy
from data_synthesis.schema import Schema, SchemaError, load_schema, shipped_schemas, dump_schema
from data_synthesis.tasks import TaskFilter, synthesize_tasks
from data_synthesis.templates import TaskFactory
from data_synthesis.toolgen import derive_tools, render_tools_py
from orchestrator.domains.folder import load_db, load_tools_module


@dataclass
class DomainSource:
    """Where a domain comes from: its schema, its records, and a note for the summary."""

    schema: Schema
    db: dict
    origin: str
    policy: str | None = None       # the domain folder's own policy.md, when it has one


@dataclass
class DomainResult:
    path: Path
    tasks: list[dict]
    tally: dict
    n_tools: int
    extra: dict = field(default_factory=dict)


def atomic_write(path: Path, text: str) -> None:
    """Write via a temp file in the same folder + os.replace: never a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def dump_json(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def resolve_source(domain_dir: str | Path, seed: int = 0, fake: bool = False,
                   records: int | None = None) -> DomainSource:
    """A shipped schema name, a schema file, or a folder with db.json and/or schema.yaml.

    With a db.json the existing records are used (schema.yaml beside it, else inferred);
    `fake=True` replaces them with Faker records from that schema.  `records` sets how
    many Faker records each collection gets (default: the schema's `count`s).
    """
    path = Path(domain_dir)

    def make_db(schema: Schema) -> dict:
        return generate_db(schema, seed, None if records is None else {c: records for c in schema.collections})

    if not path.exists():
        if str(domain_dir) in shipped_schemas():
            schema = load_schema(str(domain_dir))
            return DomainSource(schema, make_db(schema), f"shipped schema {domain_dir}")
        raise SchemaError(f"{path}: no such folder or schema file, and not a shipped schema "
                          f"(shipped: {shipped_schemas()}); pass a folder with db.json or schema.yaml")
    if path.is_file():
        schema = load_schema(path)
        return DomainSource(schema, make_db(schema), f"schema file {path}")
    has_db, has_schema = (path / "db.json").exists(), (path / "schema.yaml").exists()
    if not has_db and not has_schema:
        raise SchemaError(f"{path}: holds neither db.json nor schema.yaml; a domain needs one of them")
    policy = (path / "policy.md").read_text() if (path / "policy.md").is_file() else None
    if has_db:
        db = load_db(path / "db.json")
        schema = load_schema(path / "schema.yaml") if has_schema else infer_schema(db, path.name, str(path / "db.json"))
        if fake:
            return DomainSource(schema, make_db(schema), f"Faker records, schema of {path}", policy)
        return DomainSource(schema, db, f"existing records of {path / 'db.json'}", policy)
    schema = load_schema(path / "schema.yaml")
    return DomainSource(schema, make_db(schema), f"schema {path / 'schema.yaml'}", policy)


def write_environment(source: DomainSource, out: Path) -> list:
    """Write schema.yaml, db.json, tools.py and policy.md; return the ToolDefs."""
    tools = derive_tools(source.schema)
    atomic_write(out / "schema.yaml", dump_schema(source.schema))
    atomic_write(out / "db.json", dump_json(source.db))
    atomic_write(out / "tools.py", render_tools_py(source.schema, tools))
    atomic_write(out / "policy.md", source.policy if source.policy else render_policy(source.schema, tools))
    return tools


def task_checks(source: DomainSource, tools: list, kinds: dict[str, str]) -> tuple[list, dict]:
    """The checks every task must pass besides replay (the domain's policy.md rules, plausibility),
    and what the summary says of the policy."""
    checks = [Plausibility(source.schema, tools, source.db, kinds).reason]
    if not source.policy:
        return checks, {"policy": "offline template"}
    rules = parse_policy(source.policy, source.schema)
    if rules:
        checks.insert(0, PolicyCheck(rules, source.schema, tools, source.db).reason)
    return checks, {"policy": "the domain's policy.md", "policy_rules": rules.describe()}


def build_domain(source: DomainSource, out: Path, num_tasks: int, seed: int = 0,
                 progress: Callable[[int], None] | None = None) -> DomainResult:
    """Write the environment, synthesise `num_tasks` verified tasks, write tasks.json."""
    out = Path(out)
    tools = write_environment(source, out)
    module = load_tools_module(out / "tools.py")
    frozen = pickle.dumps(source.db)  # pickle round-trips a 1.6 MB db ~4x faster than json
    kinds = dict(module.TOOL_TYPES)

    def call(db: dict, name: str, arguments: dict) -> object:
        if name not in kinds:
            raise ValueError(f"unknown tool {name!r}")
        return getattr(module, name)(db, **arguments)

    checks, policy = task_checks(source, tools, kinds)
    task_filter = TaskFilter(call, source.db, lambda: pickle.loads(frozen), kinds, checks)
    factory = TaskFactory(source.schema, tools, source.db, seed)
    tasks = synthesize_tasks(factory, task_filter, source.schema.domain, num_tasks, progress)
    atomic_write(out / "tasks.json", dump_json(tasks))
    return DomainResult(out, tasks, task_filter.tally.as_dict(), len(tools),
                        {"origin": source.origin, "summary": policy})
