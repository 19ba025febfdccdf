"""The tool catalog (`tools.json`): tools, their model aliases, prices and profiles.

One price table lives here; every dollar figure in the project is computed by
`Catalog.llm_cost` / `Catalog.code_cost` / `Catalog.search_cost`.

    python -m orchestrator.catalog tools.json     # validate and print a one-line summary
"""
from __future__ import annotations

import difflib
import json
import sys
from pathlib import Path
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.records import Usage
from orchestrator.textfile import NotUTF8, read_utf8

DEFAULT_CATALOG = Path(__file__).resolve().parent.parent / "tools.json"
ToolKind = Literal["search", "code", "answer", "expert"]


class CatalogError(ValueError):
    """A tools.json problem, as one line: file, JSON path, what is wrong."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# Numbers must be JSON numbers: a price written as "1.25" is a typo, not a value to coerce.
class Price(_Strict):
    input: float = Field(ge=0, strict=True, description="$ per 1M prompt tokens")
    output: float = Field(ge=0, strict=True, description="$ per 1M completion tokens")


class Fees(_Strict):
    code_per_second: float = Field(0.0, ge=0, strict=True)
    web_search: float = Field(0.0, ge=0, strict=True)
    web_extract_page: float = Field(0.0, ge=0, strict=True)


class AliasSpec(_Strict):
    model: str = Field(min_length=1)
    latency_s: float = Field(ge=0, strict=True, description="listed mean latency shown to the policy")
    description: str | None = None


class ToolSpec(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    kind: ToolKind
    description: str
    argument: str = Field("model", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                          description="name of the alias argument (upstream: `model`; tau2's call_expert: `expert`)")
    argument_description: str = ""
    tasks: list[str] = Field(default_factory=lambda: ["qa"])
    aliases: dict[str, AliasSpec] = Field(min_length=1)


class Catalog(_Strict):
    version: Literal[1] = 1
    tools: list[ToolSpec] = Field(min_length=1)
    prices: dict[str, Price]
    fees: Fees = Field(default_factory=Fees)
    orchestrator_price_model: str | None = None
    profiles: dict[str, dict[str, str]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _cross_check(self) -> "Catalog":
        seen_tools: set[str] = set()
        seen_aliases: dict[str, str] = {}
        for i, tool in enumerate(self.tools):
            if tool.name in seen_tools:
                raise ValueError(f"tools[{i}].name: duplicate tool name {tool.name!r}")
            seen_tools.add(tool.name)
            for alias, spec in tool.aliases.items():
                where = f"tools[{i}].aliases.{alias}"
                if alias in seen_aliases:
                    raise ValueError(f"{where}: alias also used by tool {seen_aliases[alias]!r}; aliases must be unique")
                seen_aliases[alias] = tool.name
                if spec.model not in self.prices:
                    raise ValueError(f"{where}.model: {spec.model!r} has no entry in 'prices'"
                                     f"{_closest(spec.model, self.prices)}; add it there")
        if self.orchestrator_price_model and self.orchestrator_price_model not in self.prices:
            raise ValueError(f"orchestrator_price_model: {self.orchestrator_price_model!r} has no entry in 'prices'")
        for name, mapping in self.profiles.items():
            for model in mapping:
                if model not in self.prices:
                    raise ValueError(f"profiles.{name}.{model}: unknown model{_closest(model, self.prices)}; "
                                     f"profile keys must be models listed in 'prices'")
        return self

    def check_served(self, known_models: Iterable[str], profile: str | None = None,
                     source: str = "tools.json") -> None:
        """Raise CatalogError unless every model `profile` serves is a name in the model registry.

        With profile=None every profile is checked (the catalog CLI); a run checks the one it uses,
        including an empty profile such as `paper`, which serves each alias model as itself.
        A profile that maps some models must map every alias model: one left out would be served
        as itself (e.g. a paid API under `local`), which fails only at run time.  (Not checked when
        parsing: per-task catalogs of training examples offer other models under the same profiles.)
        """
        known = set(known_models)
        names = sorted(self.profiles) if profile is None else [profile]
        alias_models = {spec.model for tool in self.tools for spec in tool.aliases.values()}
        for name in names:
            if name not in self.profiles:
                raise CatalogError(f"{source}: profile {name!r} is not defined; "
                                   f"defined: {sorted(self.profiles)}")
            missing = sorted(alias_models - set(self.profiles[name])) if self.profiles[name] else []
            if missing:
                raise CatalogError(f"{source}: $.profiles.{name}: no mapping for {missing}, used by tool aliases; "
                                   f"add each to the profile (e.g. \"{missing[0]}\": \"smollm2-135m\")")
            for served_by, target in sorted(self.profiles[name].items()):
                if target not in known:
                    raise CatalogError(f"{source}: $.profiles.{name}.{served_by}: {target!r} is not a model "
                                       f"in the model registry (configs/models.yaml){_closest(target, known)}")
            if profile is None:
                continue   # serving alias models as themselves is checked only for a profile in use
            for tool in self.tools:
                for alias, spec in tool.aliases.items():
                    served = self.served_model(spec.model, name)
                    if served not in known:
                        raise CatalogError(
                            f"{source}: profile {name!r} cannot serve alias {alias} (model {spec.model!r}): "
                            f"{served!r} is not in the model registry (configs/models.yaml); map it in "
                            f"$.profiles.{name} or add it to the registry")

    # ---- lookups -------------------------------------------------------------------
    def tool(self, name: str) -> ToolSpec:
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(f"unknown tool {name!r}; known: {[t.name for t in self.tools]}")

    def tools_for(self, task: str = "qa") -> list[ToolSpec]:
        return [t for t in self.tools if task in t.tasks]

    @property
    def aliases(self) -> dict[str, str]:
        """alias -> tool name, over every tool."""
        return {a: t.name for t in self.tools for a in t.aliases}

    def served_model(self, model: str, profile: str | None) -> str:
        """The model that actually serves `model` under `profile` (itself when unmapped)."""
        if not profile:
            return model
        if profile not in self.profiles:
            raise KeyError(f"unknown profile {profile!r}; tools.json defines {sorted(self.profiles)}")
        return self.profiles[profile].get(model, model)

    # ---- money ---------------------------------------------------------------------
    def price(self, model: str) -> Price:
        try:
            return self.prices[model]
        except KeyError:
            raise KeyError(f"no price for model {model!r}; add it to 'prices' in tools.json") from None

    def llm_cost(self, model: str, usage: Usage) -> float:
        """Dollars for one call: in_price x prompt_tokens + out_price x completion_tokens (per 1M)."""
        p = self.price(model)
        return (p.input * usage.prompt_tokens + p.output * usage.completion_tokens) / 1_000_000

    def code_cost(self, seconds: float) -> float:
        return self.fees.code_per_second * seconds

    def search_cost(self, web_searches: int = 0, pages: int = 0) -> float:
        return self.fees.web_search * web_searches + self.fees.web_extract_page * pages

    # ---- what the policy sees ---------------------------------------------------------
    def openai_tools(self, task: str = "qa", tools: list[ToolSpec] | None = None) -> list[dict]:
        """OpenAI function schemas; each tool takes one argument, `tool.argument`, naming an alias.

        The price/latency table is written into the argument description, as upstream
        does, so per-example prices change what the policy reads.
        """
        out = []
        for tool in tools if tools is not None else self.tools_for(task):
            rows = ["Model | price per million input tokens | price per million output tokens | average latency"]
            for alias, spec in tool.aliases.items():
                p = self.price(spec.model)
                rows.append(f"{alias} | ${p.input:g} | ${p.output:g} | {spec.latency_s:g}s")
            desc = f"{tool.argument_description} Choices: {list(tool.aliases)}.\n" + "\n".join(rows)
            out.append({
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": {
                        "type": "object",
                        "properties": {tool.argument: {"type": "string", "enum": list(tool.aliases),
                                                       "description": desc}},
                        "required": [tool.argument],
                    },
                },
            })
        return out


def _json_path(loc: tuple) -> str:
    path = "$"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _closest(name: str, known: Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _known_fields(root: type[BaseModel], loc: tuple) -> list[str]:
    """The field names allowed where `loc` (the path of an unknown key) points."""
    model: type[BaseModel] | None = root
    for part in loc[:-1]:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:   # a dict key (alias / model name): its value type is the next model
            continue
        ann = field.annotation
        model = None
        for arg in (ann, *getattr(ann, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                model = arg
            for inner in getattr(arg, "__args__", ()):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    model = inner
    return list(model.model_fields) if model else []


def parse_catalog(data: object, source: str = "<tools.json>") -> Catalog:
    """Validate already-parsed JSON; raise CatalogError with one line naming the problem.

    An unknown key is reported first (with the closest known one): a misspelled key also
    makes the right one "missing", and the misspelling is the thing to fix.
    """
    try:
        return Catalog.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        loc = _json_path(tuple(p for p in err["loc"] if p != "__root__"))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "float_type" and isinstance(err.get("input"), str):
            msg = f"{err['input']!r} is a string; write the number without quotes"
        if err["type"] == "extra_forbidden":
            key = str(err["loc"][-1])
            msg = f"unknown key {key!r}{_closest(key, _known_fields(Catalog, err['loc']))}"
        if loc == "$" and ":" in msg:  # cross-field checks name their own path
            loc, msg = "$." + msg.split(":", 1)[0], msg.split(":", 1)[1].strip()
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise CatalogError(f"{source}: {loc}: {msg}{more}") from None


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load and validate a tools.json (default: the repository's).  A catalog with
    `"extends": "<path>"` (relative to its own file) takes that catalog's prices, fees and
    orchestrator_price_model; its own `prices` may only add models the base does not price (one
    price per model), and its own fees / orchestrator_price_model replace the base's."""
    path = Path(path) if path else DEFAULT_CATALOG
    return parse_catalog(_with_base(_read_json(path), path), str(path))


def _read_json(path: Path) -> Any:
    try:
        text = read_utf8(path)
    except OSError as exc:
        raise CatalogError(f"{path}: cannot read: {exc.strerror}") from None
    except NotUTF8 as exc:
        raise CatalogError(str(exc)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogError(f"{path}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}") from None


def _with_base(data: Any, path: Path, seen: tuple[Path, ...] = ()) -> Any:
    """`data` with its `extends` catalog's prices, fees and orchestrator_price_model merged in."""
    if not isinstance(data, dict) or "extends" not in data:
        return data
    data = dict(data)
    ref = data.pop("extends")
    if not isinstance(ref, str) or not ref:
        raise CatalogError(f"{path}: $.extends: expected the path of a catalog (relative to this file), got {ref!r}")
    base_path = (path.parent / ref).resolve()
    if base_path in seen or base_path == path.resolve():
        raise CatalogError(f"{path}: $.extends: {ref!r} extends this catalog again (a cycle)")
    if not base_path.is_file():
        raise CatalogError(f"{path}: $.extends: {ref!r} is not a file (resolved to {base_path})")
    base = _with_base(_read_json(base_path), base_path, (*seen, path.resolve()))
    if not isinstance(base, dict):
        raise CatalogError(f"{base_path}: expected a JSON object (extended by {path})")
    own = data.get("prices", {})
    if not isinstance(own, dict):
        return data                                     # parse_catalog names the wrong type
    repeated = sorted(set(own) & set(base.get("prices", {})))
    if repeated:
        raise CatalogError(f"{path}: $.prices: {repeated} priced in {ref} already (one price per model); "
                           "remove them here, or edit them there")
    data["prices"] = {**base.get("prices", {}), **own}
    for key in ("fees", "orchestrator_price_model"):
        if key not in data and key in base:
            data[key] = base[key]
    return data


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        print("usage: python -m orchestrator.catalog PATH/TO/tools.json", file=sys.stderr)
        return 2
    try:
        cat = load_catalog(argv[0])
    except CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        from orchestrator.gateway.registry import load_registry

        cat.check_served(load_registry().models, source=argv[0])
    except CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{argv[0]}: OK: {len(cat.tools)} tools ({', '.join(t.name for t in cat.tools)}), "
          f"{len(cat.aliases)} aliases, {len(cat.prices)} priced models, profiles {sorted(cat.profiles)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
