"""Load a domain folder (`db.json`, `policy.md`, `tools.py`, `tasks.json`) and call its tools.

Shared by data synthesis (which writes these folders) and the tau2 episodes (which run them).
The tools contract (see data_synthesis/toolgen.py): `tools.py` defines module-level functions whose
first parameter is the database dict, and `TOOL_TYPES = {name: "read"|"write"|"generic"}`.
`Domain.openai_tools()` gives OpenAI function schemas built from the signatures and the
Google-style docstrings; `replay` runs gold actions on a fresh copy of the database.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import json
import pickle
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from orchestrator.domains.upstream import UPSTREAM_FILE


class SchemaError(ValueError):
    """A schema, database or domain-folder problem, as one line: file, path inside it, what is wrong."""


_JSON_TYPE = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}


def db_hash(db: dict) -> str:
    """sha256 of the database as tau2 hashes it (json.dumps, sorted keys, default=str)."""
    return hashlib.sha256(json.dumps(db, sort_keys=True, default=str).encode()).hexdigest()


def load_tools_module(path: str | Path, source: str | None = None) -> types.ModuleType:
    """Import a tools.py from a file path (or from `source` text, named after `path`)."""
    path = Path(path)
    name = "domain_tools_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
    module = types.ModuleType(name)
    module.__file__ = str(path)
    try:
        # dont_inherit: this file's `from __future__ import annotations` must not turn the
        # tools' annotations into strings (tau2 and our schemas read the real types).
        code = compile(source if source is not None else path.read_text(), str(path), "exec",
                       dont_inherit=True)
        exec(code, module.__dict__)  # noqa: S102 - the domain's own tool code, by design
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read tools: {exc.strerror}") from None
    except Exception as exc:
        raise SchemaError(f"{path}: tools do not import: {type(exc).__name__}: {exc}") from None
    _check_contract(module, path)
    return module


def _check_contract(module: types.ModuleType, path: Path) -> None:
    tool_types = getattr(module, "TOOL_TYPES", None)
    if not isinstance(tool_types, dict) or not tool_types:
        raise SchemaError(f"{path}: TOOL_TYPES: missing or empty; define {{tool_name: 'read'|'write'|'generic'}}")
    for name, kind in tool_types.items():
        fn = getattr(module, name, None)
        if not callable(fn):
            raise SchemaError(f"{path}: TOOL_TYPES.{name}: no function {name!r} in the module")
        if kind not in ("read", "write", "generic", "think"):
            raise SchemaError(f"{path}: TOOL_TYPES.{name}: {kind!r} is not read/write/generic")
        params = list(inspect.signature(fn).parameters)
        if not params or params[0] != "db":
            raise SchemaError(f"{path}: {name}: the first parameter must be `db`, got {params[:1]}")


def parse_args_doc(doc: str | None) -> tuple[str, dict[str, str]]:
    """(summary, {param: description}) from a Google-style docstring."""
    lines = inspect.cleandoc(doc or "").splitlines()
    summary = lines[0] if lines else ""
    params: dict[str, str] = {}
    in_args = False
    for line in lines[1:]:
        if re.match(r"^(Args|Arguments|Parameters):\s*$", line.strip()):
            in_args = True
            continue
        if in_args and re.match(r"^[A-Z][a-z]+:\s*$", line.strip()):
            break
        m = re.match(r"^\s+(\w+)(?:\s*\([^)]*\))?:\s*(.*)$", line) if in_args else None
        if m:
            params[m.group(1)] = m.group(2)
    return summary, params


def _json_type(annotation: Any) -> tuple[str, bool]:
    """(JSON type, nullable) of a parameter annotation."""
    args = typing.get_args(annotation)
    if args and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        return _JSON_TYPE.get(inner[0], "string") if inner else "string", True
    return _JSON_TYPE.get(typing.get_origin(annotation) or annotation, "string"), False


def openai_schema(name: str, fn: Callable) -> dict:
    """An OpenAI function schema for tool `fn` (its `db` parameter left out)."""
    summary, docs = parse_args_doc(fn.__doc__)
    props, required = {}, []
    for pname, param in list(inspect.signature(fn).parameters.items())[1:]:
        jtype, nullable = _json_type(param.annotation)
        props[pname] = {"type": [jtype, "null"] if nullable else jtype, "description": docs.get(pname, "")}
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    return {"type": "function", "function": {
        "name": name, "description": summary,
        "parameters": {"type": "object", "properties": props, "required": required}}}


@dataclass
class Domain:
    """A loaded domain folder. `db` is the pristine database; use `fresh_db()` to act on one."""

    name: str
    path: Path
    db: dict
    policy: str
    module: types.ModuleType
    tasks: list[dict] = field(default_factory=list)

    @property
    def tool_types(self) -> dict[str, str]:
        return dict(self.module.TOOL_TYPES)

    def tool(self, name: str) -> Callable:
        if name not in self.module.TOOL_TYPES:
            raise KeyError(f"unknown tool {name!r}; {self.name} has {sorted(self.module.TOOL_TYPES)}")
        return getattr(self.module, name)

    def fresh_db(self) -> dict:
        """A deep copy of the pristine database (pickle: ~4x faster than json at 1 MB)."""
        return pickle.loads(self._db_bytes)

    def call(self, db: dict, name: str, arguments: dict) -> Any:
        """Run tool `name` on `db` with keyword `arguments` (raises what the tool raises)."""
        return self.tool(name)(db, **arguments)

    def openai_tools(self) -> list[dict]:
        return [openai_schema(n, self.tool(n)) for n in self.module.TOOL_TYPES]

    def __post_init__(self) -> None:
        self._db_bytes = pickle.dumps(self.db)


def load_db(path: str | Path) -> dict:
    """Read a db.json and check its shape; SchemaError names the file and the bad path."""
    path = Path(path)
    try:
        db = json.loads(path.read_text())
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read database: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}") from None
    check_db_shape(db, str(path))
    return db


def check_db_shape(db: Any, source: str) -> None:
    if not isinstance(db, dict) or not db:
        raise SchemaError(f"{source}: $: the database must be a non-empty JSON object of collections")
    for cname, coll in db.items():
        if not isinstance(coll, dict):
            raise SchemaError(f"{source}: $.{cname}: a collection must be an object keyed by record id, "
                              f"got {type(coll).__name__}")
        for rid, rec in coll.items():
            if not isinstance(rec, dict):
                raise SchemaError(f"{source}: $.{cname}.{rid}: a record must be an object, got {type(rec).__name__}")


def load_domain(path: str | Path) -> Domain:
    """Read a domain folder; SchemaError names the file that is missing or malformed."""
    path = Path(path)
    if not (path / "tools.py").exists() and (path / UPSTREAM_FILE).exists():
        raise SchemaError(f"{path}: runs on upstream's ToolScale tools ({UPSTREAM_FILE}, no tools.py): such a folder "
                          "runs in tau2 episodes with the user simulator (orchestrator/domains/tau2_env.py; tau2_user: "
                          "simulator), not in solo episodes; load it with orchestrator.domains.upstream.folder_domain")
    for required in ("db.json", "tools.py"):
        if not (path / required).exists():
            raise SchemaError(f"{path / required}: missing; a domain folder needs db.json, tools.py, "
                              "policy.md (and tasks.json for tasks)")
    db = load_db(path / "db.json")
    policy = (path / "policy.md").read_text() if (path / "policy.md").exists() else ""
    tasks = []
    if (path / "tasks.json").exists():
        try:
            tasks = json.loads((path / "tasks.json").read_text())
        except json.JSONDecodeError as exc:
            raise SchemaError(f"{path / 'tasks.json'}: line {exc.lineno}: invalid JSON: {exc.msg}") from None
    name = path.name
    if (path / "schema.yaml").exists():  # the domain name tasks carry in instructions.domain
        name = (yaml.safe_load((path / "schema.yaml").read_text()) or {}).get("domain", name)
    return Domain(name, path, db, policy, load_tools_module(path / "tools.py"), tasks)


DOMAIN_FILES = ("db.json", "tools.py", "tasks.json", "policy.md", "schema.yaml")


def domain_version(path: str | Path) -> tuple[Path, tuple]:
    """(resolved folder, modification times of its files): what a loaded folder is cached by."""
    path = Path(path).resolve()
    return path, tuple((f, (path / f).stat().st_mtime_ns) for f in DOMAIN_FILES if (path / f).exists())


@functools.lru_cache(maxsize=16)
def _cached(path: Path, stamp: tuple) -> Domain:
    return load_domain(path)


def cached_domain(path: str | Path) -> Domain:
    """`load_domain`, once per folder content version (episodes and evaluators load a folder
    many times).  The Domain is shared: act on `fresh_db()`, never on `Domain.db`."""
    return _cached(*domain_version(path))
