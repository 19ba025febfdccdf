"""The tool catalog (`tools.json`): tools, their model aliases, prices and profiles.

One price table lives here; every dollar figure in the project is computed by
`Catalog.llm_cost` / `Catalog.code_cost` / `Catalog.search_cost` / `Catalog.tool_cost`.
A tool's entry is the pydantic `Spec` of its kind (orchestrator/tools/, one module per kind);
docs/tools.md is the add-a-tool guide.

    python -m orchestrator.catalog tools.json          # validate: every problem at once, or a summary
    python -m orchestrator.catalog tools.json --list   # the tools the orchestrator sees, arguments, prices
"""
from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path
from collections.abc import Iterable
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Discriminator, Field, Tag, ValidationError, model_validator

from orchestrator.records import Usage
from orchestrator.textfile import NotUTF8, read_utf8
from orchestrator.tools.registry import KINDS, alias_kind, function_kind, load_builtin_kinds
from orchestrator.tools.spec import AliasSpec, AliasToolSpec, FunctionToolSpec, Strict

__all__ = ["AliasSpec", "Catalog", "CatalogError", "DEFAULT_CATALOG", "Fees", "Price", "ToolSpec",
           "load_catalog", "parse_catalog"]

DEFAULT_CATALOG = Path(__file__).resolve().parent.parent / "tools.json"


class CatalogError(ValueError):
    """A tools.json problem: each line names the file, the JSON path, what is wrong and the fix.
    `problems` holds every one found (the catalog CLI prints them all)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


_Strict = Strict


# Numbers must be JSON numbers: a price written as "1.25" is a typo, not a value to coerce.
class Price(_Strict):
    """One row of the price table.  A model's row (an alias's `model`) prices its tokens; a
    function tool's row (its `price`, default its name) may charge per call, per second of wall
    clock, and per token of the call's arguments (`input`) and output (`output`)."""

    input: float = Field(0.0, ge=0, strict=True, description="$ per 1M prompt / argument tokens")
    output: float = Field(0.0, ge=0, strict=True, description="$ per 1M completion / output tokens")
    per_call: float = Field(0.0, ge=0, strict=True, description="$ per call")
    per_second: float = Field(0.0, ge=0, strict=True, description="$ per second of the call's wall clock")

    @model_validator(mode="after")
    def _something_priced(self) -> "Price":
        if not self.model_fields_set:
            raise ValueError("an empty price row; set any of input, output (per 1M tokens), per_call, per_second "
                             "(0 for a free tool)")
        return self


class Fees(_Strict):
    code_per_second: float = Field(0.0, ge=0, strict=True)
    web_search: float = Field(0.0, ge=0, strict=True)
    web_extract_page: float = Field(0.0, ge=0, strict=True)


def _kind_of(value: Any) -> str | None:
    return value.get("kind") if isinstance(value, dict) else getattr(value, "kind", None)


ToolSpec = Annotated[Union[tuple(Annotated[k.spec, Tag(name)] for name, k in load_builtin_kinds().items())],
                     Discriminator(_kind_of)]


class Catalog(_Strict):
    version: Literal[1] = 1
    tools: list[ToolSpec] = Field(min_length=1)
    prices: dict[str, Price]
    fees: Fees = Field(default_factory=Fees)
    orchestrator_price_model: str | None = None
    profiles: dict[str, dict[str, str]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _cross_check(self) -> "Catalog":
        problems = cross_check(self.model_dump(exclude_unset=False))
        if problems:
            raise ValueError("\n".join(problems))
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

    def tool_cost(self, row: str, seconds: float = 0.0, input_tokens: int = 0, output_tokens: int = 0) -> float:
        """Dollars for one function-tool call at price row `row`: per call + per second of wall
        clock + per 1M tokens of its arguments (`input`) and output (`output`)."""
        p = self.price(row)
        return p.per_call + p.per_second * seconds + (p.input * input_tokens + p.output * output_tokens) / 1_000_000

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
            if not tool.alias_tool:
                continue        # function tools: their schemas come from the toolbox (orchestrator/tools/)
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


def price_note(catalog: "Catalog", spec: FunctionToolSpec) -> str:
    """What a function tool costs, as the policy reads it after the tool's description."""
    p = catalog.prices.get(spec.price_row)
    if p is None:
        return ""
    parts = [f"${v:g} {what}" for v, what in ((p.per_call, "per call"), (p.per_second, "per second"),
                                              (p.input, "per million argument tokens"),
                                              (p.output, "per million output tokens")) if v]
    cost = "; ".join(parts) or "free"
    return f" (Price: {cost}" + (f"; average latency {spec.latency_s:g}s)" if spec.latency_s is not None else ")")


def cross_check(data: Any) -> list[str]:
    """Every problem between parts of a catalog (tools vs prices vs profiles), as "$.path: what
    and the fix" lines.  Works on the raw JSON: parts of the wrong shape are skipped (the field
    validation names those)."""
    if not isinstance(data, dict):
        return []
    problems: list[str] = []
    prices = data.get("prices") if isinstance(data.get("prices"), dict) else {}
    tools = data.get("tools") if isinstance(data.get("tools"), list) else []
    seen_tools: dict[str, int] = {}
    seen_aliases: dict[str, str] = {}
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            continue
        name = tool.get("name")
        if isinstance(name, str):
            if name in seen_tools:
                problems.append(f"$.tools[{i}].name: duplicate tool name {name!r} (also tools[{seen_tools[name]}]); "
                                f"rename one")
            seen_tools.setdefault(name, i)
        if alias_kind(tool.get("kind")) is not None and isinstance(tool.get("aliases"), dict):
            for alias, spec in tool["aliases"].items():
                where = f"$.tools[{i}].aliases.{alias}"
                if alias in seen_aliases:
                    problems.append(f"{where}: alias also used by tool {seen_aliases[alias]!r}; aliases must be unique")
                seen_aliases.setdefault(alias, name)
                model = spec.get("model") if isinstance(spec, dict) else None
                if isinstance(model, str) and model and model not in prices:
                    problems.append(f"{where}.model: {model!r} has no entry in 'prices'{_closest(model, prices)}; "
                                    f"add it there")
        elif function_kind(tool.get("kind")) is not None and isinstance(name, str):
            row = tool.get("price") or name
            if isinstance(row, str) and row not in prices:
                where = f"$.tools[{i}].price" if tool.get("price") else f"$.tools[{i}]"
                problems.append(f"{where}: tool {name!r} has no row {row!r} in 'prices'{_closest(row, prices)}; "
                                f"add \"{row}\": {{\"per_call\": 0.001}} there (0 for a free tool; per_second, "
                                f"input, output also apply)")
    opm = data.get("orchestrator_price_model")
    if isinstance(opm, str) and opm not in prices:
        problems.append(f"$.orchestrator_price_model: {opm!r} has no entry in 'prices'{_closest(opm, prices)}")
    profiles = data.get("profiles") if isinstance(data.get("profiles"), dict) else {}
    for name, mapping in profiles.items():
        for model in mapping if isinstance(mapping, dict) else ():
            if model not in prices:
                problems.append(f"$.profiles.{name}.{model}: unknown model{_closest(model, prices)}; "
                                f"profile keys must be models listed in 'prices'")
    return problems


def _json_path(loc: tuple) -> str:
    path = "$"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def _closest(name: str, known: Iterable[str]) -> str:
    match = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def _model_at(data: Any, loc: tuple) -> type[BaseModel] | None:
    """The pydantic model that validates the object at `loc` (a path into the raw JSON)."""
    model: type[BaseModel] | None = Catalog
    node = data
    in_tools = False
    for part in loc:
        node = _node(node, (part,))
        if in_tools:             # a tools item: its kind picks its model
            in_tools = False
            kind = KINDS.get(_kind_of(node))
            model = kind.spec if kind else None
            continue
        if model is None:
            return None
        if model is Catalog and part == "tools":
            in_tools = True
            continue
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            continue            # a dict key (alias / model name): the next model is the value type's
        model = None
        ann = field.annotation
        for arg in (ann, *getattr(ann, "__args__", ())):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                model = arg
            for inner in getattr(arg, "__args__", ()):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    model = inner
        if model is None and part in ("prices",):
            model = Price
    return model


def _problem(err: dict, data: Any) -> str:
    """One pydantic error as "$.path: what is wrong; the fix"."""
    loc = tuple(p for p in err["loc"] if p != "__root__")
    if len(loc) >= 3 and loc[0] == "tools" and isinstance(loc[1], int) and isinstance(loc[2], str) and loc[2] in KINDS:
        loc = loc[:2] + loc[3:]          # the discriminator's tag is not part of the JSON path
    path = _json_path(loc)
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "float_type" and isinstance(err.get("input"), str):
        msg = f"{err['input']!r} is a string; write the number without quotes"
    elif err["type"] == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(data, loc[:-1])
        msg = f"unknown key {key!r}{_closest(key, list(model.model_fields) if model else [])}"
        if model is not None and issubclass(model, AliasToolSpec) and key in ("url", "handler", "command", "per_call"):
            msg += (f"; a {_kind_of(_node(data, loc[:-1]))} tool picks a model alias: for a web service, a Python "
                    f"function or an MCP server use kind http, python or mcp (docs/tools.md)")
    elif err["type"] == "union_tag_not_found" and not isinstance(err.get("input"), dict):
        msg = (f"expected a tool entry (an object with `name` and `kind`), got {type(err.get('input')).__name__} "
               f"{json.dumps(err.get('input'))[:60]}")
    elif not loc and err["type"] in ("model_type", "dict_type"):
        msg = "expected a JSON object with `tools` and `prices` (see the repository's tools.json)"
    elif err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        kind = _kind_of(err.get("input"))
        path = f"{path}.kind"
        msg = (f"{kind!r} is not a tool kind{_closest(str(kind), KINDS)}; choose one of {sorted(KINDS)}"
               if kind is not None else f"missing; choose one of {sorted(KINDS)}")
    elif err["type"] == "missing":
        msg = "Field required"
        model = _model_at(data, loc[:-1])
        field = model.model_fields.get(str(loc[-1])) if model else None
        if field is not None and field.description:
            msg += f" ({field.description})"
    return f"{path}: {msg}"


def _node(data: Any, loc: tuple) -> Any:
    for part in loc:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def catalog_problems(data: object) -> tuple[Catalog | None, list[str]]:
    """(the catalog, []) or (None, every problem found: field by field, then across fields)."""
    try:
        return Catalog.model_validate(data), []
    except ValidationError as exc:
        errors = exc.errors()
    # the cross-field check raised as one error at the root: cross_check below gives its lines
    errors = [e for e in errors if not (e["loc"] == () and e["type"] == "value_error")]
    # a misspelled key also makes the key meant "missing": name only the misspelling
    unknown = {(tuple(e["loc"][:-1]), str(e["loc"][-1])) for e in errors if e["type"] == "extra_forbidden"}
    errors = [e for e in errors if not (e["type"] == "missing" and any(
        where == tuple(e["loc"][:-1]) and difflib.get_close_matches(str(e["loc"][-1]), [key], cutoff=0.6)
        for where, key in unknown))]
    problems = [_problem(e, data) for e in errors]
    if isinstance(data, dict):
        problems += [p for p in cross_check(data) if p not in problems]
    else:
        problems = problems or ["$: expected a JSON object with `tools` and `prices`"]
    return None, list(dict.fromkeys(problems))


def parse_catalog(data: object, source: str = "<tools.json>") -> Catalog:
    """Validate already-parsed JSON; raise CatalogError listing every problem, one a line
    ("{source}: $.path: what is wrong; the fix").  An unknown key is named with the closest
    known one: a misspelled key also makes the right one "missing", and the misspelling is the
    thing to fix."""
    catalog, problems = catalog_problems(data)
    if catalog is None:
        lines = [f"{source}: {p}" for p in problems]
        raise CatalogError("\n".join(lines), lines)
    return catalog


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
    import argparse

    parser = argparse.ArgumentParser(prog="python -m orchestrator.catalog",
                                     description="Validate a tools.json (every problem at once), or --list the "
                                                 "tools the orchestrator sees with their arguments and prices.")
    parser.add_argument("path", help="a tools.json")
    parser.add_argument("--list", action="store_true", help="open every tool (imports handlers, starts MCP "
                                                            "servers) and print what the orchestrator sees")
    parser.add_argument("--task", default="qa", help="episode kind whose tools --list shows (default qa)")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        cat = load_catalog(args.path)
    except CatalogError as exc:
        for line in exc.problems:
            print(f"error: {line}", file=sys.stderr)
        if len(exc.problems) > 1:
            print(f"{len(exc.problems)} problems in {args.path}", file=sys.stderr)
        return 1
    try:
        from orchestrator.gateway.registry import load_registry

        cat.check_served(load_registry().models, source=args.path)
    except CatalogError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.list:
        return _print_list(cat, args.task)
    print(f"{args.path}: OK: {len(cat.tools)} tools ({', '.join(t.name for t in cat.tools)}), "
          f"{len(cat.aliases)} aliases, {len(cat.prices)} priced models, profiles {sorted(cat.profiles)}")
    return 0


def _print_list(cat: Catalog, task: str) -> int:
    """The tools of `task` episodes as the orchestrator sees them: name, kind, arguments, price."""
    from rich.console import Console
    from rich.table import Table

    from orchestrator.tools.toolbox import TOOLBOX

    table = Table(title=f"tools offered to {task} episodes", show_lines=True)
    for column in ("tool", "kind", "arguments", "price", "description"):
        table.add_column(column, overflow="fold")
    broken = 0
    for spec in cat.tools_for(task):
        if spec.alias_tool:
            args = f"{spec.argument}: one of " + ", ".join(spec.aliases)
            prices = "\n".join(f"{a}: {m.model} ${cat.price(m.model).input:g}/${cat.price(m.model).output:g} "
                               f"per 1M in/out, {m.latency_s:g}s" for a, m in spec.aliases.items())
            table.add_row(spec.name, spec.kind, args, prices, spec.description)
            continue
        for fn in TOOLBOX.functions(spec, None):
            props = fn.parameters.get("properties") or {}
            required = set(fn.parameters.get("required") or [])
            args = "\n".join(f"{k}{'' if k in required else '?'}: {_type_text(v)}" for k, v in props.items()) or "(none)"
            desc = fn.description if fn.broken is None else f"UNAVAILABLE: {fn.broken}; fix: {fn.broken.fix}"
            broken += fn.broken is not None
            table.add_row(fn.name, spec.kind, args, price_note(cat, spec).strip(" ()") or "-", desc)
    Console(width=int(os.environ.get("COLUMNS") or 160)).print(table)
    return 1 if broken else 0


def _type_text(schema: dict) -> str:
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    if "anyOf" in schema:
        return " | ".join(_type_text(s) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    return "/".join(kind) if isinstance(kind, list) else str(kind)


if __name__ == "__main__":
    raise SystemExit(main())
