"""Derive a generic, correct toolkit from a schema and write it as a domain's `tools.py`.

Per collection (entity "student", collection "students", id param "student_id"):

    get_student_details(student_id)                read
    find_student_ids_by_email(email)               read, one per lookup field
    list_enrollments_by_student_id(student_id)     read, one per ref field (child -> parent)
    search_students(query, status, ..., limit)     read, filters = top-level enums
    update_student_status(student_id, status)      write, one per writable field
    create_enrollment(student_id, course_id, ...)  write, linked collections only
    delete_enrollment(enrollment_id)               write, linked collections only
    transfer_to_human_agents(summary)              generic (tau2 convention)

The emitted `tools.py` is self-contained: the body of `toolkit_runtime.py`, the schema
as a literal, one small documented function per tool, and `TOOL_TYPES`.  That is the
tools contract every domain folder follows (the LLM pipeline's tools.py included):
module-level functions whose first parameter is `db`, listed in `TOOL_TYPES`.
"""
from __future__ import annotations

import pprint
from dataclasses import dataclass, field
from pathlib import Path

from data_synthesis.schema import CollectionSpec, FieldSpec, Schema

RUNTIME_FILE = Path(__file__).resolve().parent / "toolkit_runtime.py"
_PY_TYPE = {"string": "str", "text": "str", "id": "str", "ref": "str", "enum": "str", "date": "str",
            "datetime": "str", "integer": "int", "number": "float", "boolean": "bool",
            "object": "dict", "map": "dict", "list": "list"}
_MAX_CREATE_PARAMS = 10
_HINT_KEYS = ("faker", "examples", "description", "count", "min_items", "max_items", "unique")


@dataclass
class Param:
    name: str
    annotation: str           # Python annotation text, e.g. "str" or "str | None"
    description: str
    required: bool = True


@dataclass
class ToolDef:
    """One generated tool: what it does (`op`) on which collection/field, and its parameters."""

    name: str
    kind: str                 # "read" | "write" | "generic" (tau2 ToolType values)
    op: str                   # get | find | list_by | search | update | create | delete | transfer
    collection: str | None
    field: str | None         # find: lookup path; list_by: ref field; update: field path
    summary: str
    params: list[Param] = field(default_factory=list)
    call: str = ""            # the runtime call that implements it


def id_param(cname: str, coll: CollectionSpec) -> str:
    return coll.id_field or f"{coll.entity}_id"


def label_paths(coll: CollectionSpec) -> list[str]:
    """Fields that make a short human label for a record (names, titles, else refs + status)."""
    for name in ("title", "name", "display_name", "full_name"):
        spec = coll.fields.get(name)
        if spec is not None and spec.type == "string":
            return [name]
    for prefix, fields in [("", coll.fields)] + [(f"{n}.", s.fields) for n, s in coll.fields.items()
                                                 if s.type == "object"]:
        firsts = [k for k in fields if k in ("first_name", "given")]
        lasts = [k for k in fields if k in ("last_name", "family")]
        if firsts and lasts:
            return [prefix + firsts[0], prefix + lasts[0]]
        if "display_name" in fields or "name" in fields and fields["name"].type == "string":
            return [prefix + ("display_name" if "display_name" in fields else "name")]
    refs = [n for n, s in coll.fields.items() if s.type == "ref"][:2]
    enums = [n for n, s in coll.fields.items() if s.type == "enum"][:1]
    return refs + enums or [n for n, s in coll.fields.items() if s.type == "string"][:1]


def _describe(spec: FieldSpec) -> str:
    if spec.type == "enum":
        return f"One of {spec.values}."
    if spec.type == "ref":
        return f"The id of a {spec.collection} record."
    if spec.type in ("integer", "number"):
        bounds = [f"at least {spec.min:g}" if spec.min is not None else "",
                  f"at most {spec.max:g}" if spec.max is not None else ""]
        return ("A number " + " and ".join(b for b in bounds if b) + ".") if any(bounds) else "A number."
    if spec.type == "date":
        return "A date, YYYY-MM-DD."
    if spec.type == "object":
        return f"An object with fields {list(spec.fields)}."
    return spec.description or f"A {spec.type} value."


def derive_tools(schema: Schema) -> list[ToolDef]:
    """The generic toolkit for `schema`, in a stable order (schema order)."""
    tools: list[ToolDef] = []
    # create/delete only for leaf records that point at another collection (enrollments,
    # loans, reservations): creating or deleting the records others point at is no agent's job.
    pointed_at = {s.collection for c, coll in schema.collections.items() for s in coll.fields.values()
                  if s.type == "ref" and s.collection != c}
    linked = {c for c, coll in schema.collections.items() if c not in pointed_at
              and any(s.type == "ref" and s.collection != c for s in coll.fields.values())}
    for cname, coll in schema.collections.items():
        tools += _read_tools(schema, cname, coll)
        tools += _update_tools(cname, coll)
        if cname in linked:
            tools += _create_delete_tools(cname, coll)
    tools.append(ToolDef("transfer_to_human_agents", "generic", "transfer", None, None,
                         "Transfer the user to a human agent, with a summary of the issue.",
                         [Param("summary", "str", "A short summary of the user's issue.")],
                         'return "Transfer successful"'))
    names = [t.name for t in tools]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"schema {schema.domain!r}: generated tool names collide: {dupes}; "
                         "give the collections distinct 'entity' names")
    return tools


def _read_tools(schema: Schema, cname: str, coll: CollectionSpec) -> list[ToolDef]:
    ent, pid = coll.entity, id_param(cname, coll)
    id_doc = f"The {ent}'s id."
    labels = repr(label_paths(coll))
    out = [ToolDef(f"get_{ent}_details", "read", "get", cname, None, f"Get the full record of a {ent} by id.",
                   [Param(pid, "str", id_doc)], f'return get_record(SCHEMA, db, "{cname}", {pid})')]
    for path in coll.lookup_fields:
        arg = path.split(".")[-1]
        out.append(ToolDef(f"find_{ent}_ids_by_{arg}", "read", "find", cname, path,
                           f"Find the ids of the {cname} whose {path} matches (case-insensitive).",
                           [Param(arg, "str", f"The {path.replace('.', ' ')} to look up.")],
                           f'return find_record_ids(SCHEMA, db, "{cname}", "{path}", {arg})'))
    for fname, spec in coll.fields.items():
        if spec.type == "ref" and spec.collection != cname:
            out.append(ToolDef(f"list_{cname}_by_{fname}", "read", "list_by", cname, fname,
                               f"List the {cname} whose {fname} is the given id, as {{id: label}}.",
                               [Param(fname, "str", f"The id of the {spec.collection} record.")],
                               f'return list_records_by(SCHEMA, db, "{cname}", "{fname}", {fname}, {labels})'))
    enums = [n for n, s in coll.fields.items() if s.type == "enum"][:3]
    params = [Param("query", "str", "Text to look for in the record (case-insensitive); empty matches all.", False)]
    params += [Param(n, "str | None", f"Only {cname} with this {n}. {_describe(coll.fields[n])}", False) for n in enums]
    params.append(Param("limit", "int", "Most results to return, 1 to 50.", False))
    filters = "{" + ", ".join(f'"{n}": {n}' for n in enums) + "}"
    out.append(ToolDef(f"search_{cname}", "read", "search", cname, None,
                       f"Search {cname} by text and filters; returns [{{{pid}, label}}] sorted by id.", params,
                       f'return search_records(SCHEMA, db, "{cname}", query, {filters}, {labels}, limit)'))
    return out


def _update_tools(cname: str, coll: CollectionSpec) -> list[ToolDef]:
    ent, pid = coll.entity, id_param(cname, coll)
    out = []
    for fname, spec in coll.fields.items():
        if not spec.writable or fname == coll.id_field:
            continue
        ann = _PY_TYPE.get(spec.type, "str") + (" | None" if spec.optional else "")
        out.append(ToolDef(f"update_{ent}_{fname}", "write", "update", cname, fname,
                           f"Set the {fname} of a {ent}.",
                           [Param(pid, "str", f"The {ent}'s id."), Param(fname, ann, "The new value. " + _describe(spec))],
                           f'return update_record(SCHEMA, db, "{cname}", {pid}, "{fname}", {fname})'))
    return out


def create_params(coll: CollectionSpec) -> list[tuple[str, FieldSpec]]:
    """Fields a `create_<entity>` call takes: everything but the id and list/map fields."""
    return [(n, s) for n, s in coll.fields.items() if n != coll.id_field and s.type not in ("list", "map")]


def _create_delete_tools(cname: str, coll: CollectionSpec) -> list[ToolDef]:
    ent, pid = coll.entity, id_param(cname, coll)
    fields = create_params(coll)
    out = []
    if len(fields) <= _MAX_CREATE_PARAMS:
        required = [(n, s) for n, s in fields if not s.optional]
        optional = [(n, s) for n, s in fields if s.optional]
        params = [Param(n, _PY_TYPE.get(s.type, "str"), _describe(s)) for n, s in required]
        params += [Param(n, _PY_TYPE.get(s.type, "str") + " | None", _describe(s), False) for n, s in optional]
        values = "{" + ", ".join(f'"{n}": {n}' for n, _ in fields) + "}"
        out.append(ToolDef(f"create_{ent}", "write", "create", cname, None,
                           f"Create a new {ent}; its id is assigned and returned.", params,
                           f'values = {{k: v for k, v in {values}.items() if v is not None}}\n'
                           f'    return create_record(SCHEMA, db, "{cname}", values)'))
    out.append(ToolDef(f"delete_{ent}", "write", "delete", cname, None,
                       f"Delete a {ent} that no other record references.",
                       [Param(pid, "str", f"The {ent}'s id.")], f'return delete_record(SCHEMA, db, "{cname}", {pid})'))
    return out


# ---- rendering ------------------------------------------------------------------------
def _strip_hints(value: object) -> object:
    if isinstance(value, dict):
        return {k: _strip_hints(v) for k, v in value.items() if k not in _HINT_KEYS}
    if isinstance(value, list):
        return [_strip_hints(v) for v in value]
    return value


def runtime_schema(schema: Schema) -> dict:
    """The schema as the runtime reads it: plain dicts, generation hints dropped."""
    return _strip_hints(schema.model_dump(exclude_defaults=True))


def _render_tool(tool: ToolDef) -> str:
    sig = ["db: dict"]
    for p in tool.params:
        default = "" if p.required else (' = ""' if p.name == "query" else " = 10" if p.name == "limit" else " = None")
        sig.append(f"{p.name}: {p.annotation}{default}")
    args = "\n".join(f"        {p.name}: {p.description}" for p in tool.params)
    return (f"def {tool.name}({', '.join(sig)}):\n"
            f'    """{tool.summary}\n\n    Args:\n{args}\n    """\n'
            f"    {tool.call}\n")


def render_tools_py(schema: Schema, tools: list[ToolDef] | None = None) -> str:
    """Source of a self-contained tools.py for `schema` (deterministic text)."""
    tools = tools if tools is not None else derive_tools(schema)
    runtime = RUNTIME_FILE.read_text()
    body = runtime.split('"""', 2)[2].lstrip("\n")  # drop the runtime's module docstring
    types = "\n".join(f'    "{t.name}": "{t.kind}",' for t in tools)
    parts = [
        f'"""Tools of the {schema.domain} domain, generated offline by data_synthesis.toolgen.\n\n'
        "Contract: every tool is a module-level function whose first parameter is the database\n"
        "`db` ({collection: {id: record}}); writes change `db` in place; errors are ValueError.\n"
        'TOOL_TYPES lists the tools and whether each reads or writes.\n"""',
        "# ---- generic runtime (data_synthesis/toolkit_runtime.py) ----\n" + body.rstrip("\n"),
        "# ---- schema ----\nSCHEMA = " + pprint.pformat(runtime_schema(schema), sort_dicts=False, width=100),
        "# ---- tools ----",
        *[_render_tool(t) for t in tools],
        "TOOL_TYPES = {\n" + types + "\n}\n",
    ]
    return "\n\n".join(p.rstrip("\n") for p in parts) + "\n"

