"""LLM environment synthesis (PAPER.md §7): tables -> schema -> records -> tools -> policy.

Every step's reply is checked; a failed check is retried with the error (llm_steps.py):
- tables: JSON with 2-6 distinct identifier names;
- schema: validates as a `Schema` (our typed data model of the domain), and its
  generic toolkit derives without name clashes;
- records: written in small batches, each with a sampled subject; we assign the ids so
  they stay consistent across collections; each record must pass `check_record`
  (types, enums, refs to records that exist) or it is dropped;
- tools: extra LLM-written tools run in the sandbox on the database; crashing tools are
  dropped, the rest are appended to the generic toolkit;
- policy: markdown that names the tools; else the offline policy is used.
"""
from __future__ import annotations

import ast
import json
import random
import re

from data_synthesis import toolkit_runtime as rt
from data_synthesis.fake import _fill_backrefs
from data_synthesis.llm_steps import CheckFailed, StepRunner, extract_code, extract_json, prompt
from data_synthesis.schema import SCHEMA_DIR, Schema, SchemaError, load_schema, parse_schema
from data_synthesis.tool_check import check_tools
from data_synthesis.toolgen import ToolDef, derive_tools, id_param, render_tools_py, runtime_schema

BATCH = 5
_IDENT = re.compile(r"^[a-z][a-z0-9_]*$")


def ask_tables(runner: StepRunner, domain: str, description: str) -> dict | None:
    def check(text: str) -> dict:
        data = extract_json(text)
        colls = data.get("collections") if isinstance(data, dict) else None
        if not isinstance(colls, list) or not 2 <= len(colls) <= 6:
            raise CheckFailed("'collections' must be a list of 2 to 6 tables")
        names = [c.get("name") for c in colls if isinstance(c, dict)]
        if len(names) != len(colls) or not all(isinstance(n, str) and _IDENT.match(n) for n in names):
            raise CheckFailed("every table needs a snake_case 'name'")
        if len(set(names)) != len(names):
            raise CheckFailed(f"table names repeat: {names}")
        subjects = [s for s in data.get("subjects") or [] if isinstance(s, str) and s.strip()]
        return {"description": str(data.get("description") or description), "collections": colls,
                "subjects": subjects or ["everyday customers"]}

    return runner.ask("tables", prompt("tables", domain=domain, description=description or "(none given)"), check)


def ask_schema(runner: StepRunner, domain: str, tables: dict) -> Schema | None:
    example = json.dumps(load_schema(SCHEMA_DIR / "school.yaml").model_dump(exclude_defaults=True), indent=1)

    def check(text: str) -> Schema:
        data = extract_json(text)
        if isinstance(data, dict):
            data["domain"] = domain  # the name is ours, not the model's
        try:
            schema = parse_schema(data, "schema reply")
            derive_tools(schema)
        except (SchemaError, ValueError) as exc:
            raise CheckFailed(str(exc)) from None
        return schema

    text = prompt("schema", domain=domain, description=tables["description"],
                  tables=json.dumps(tables["collections"]), example=example)
    return runner.ask("schema", text, check, max_tokens=4096)


def _order(schema: Schema) -> list[str]:
    """Collections with referenced ones first (ref cycles broken in schema order)."""
    deps = {c: {s.collection for s in coll.fields.values() if s.type == "ref" and s.collection != c}
            for c, coll in schema.collections.items()}
    done: list[str] = []
    while len(done) < len(deps):
        ready = [c for c in deps if c not in done and deps[c] <= set(done)]
        done.append(ready[0] if ready else next(c for c in deps if c not in done))
    return done


def ask_records(runner: StepRunner, schema: Schema, subjects: list[str], per_collection: int,
                rng: random.Random) -> dict:
    """The database, built batch by batch; records failing `check_record` are dropped."""
    sdict = schema.model_dump()
    db: dict[str, dict] = {c: {} for c in schema.collections}
    for cname in _order(schema):
        coll = schema.collections[cname]
        prefix = coll.id_prefix or coll.entity[:3].upper()
        ids = [f"{prefix}{n:0{coll.id_length}d}" for n in range(1, per_collection + 1)]
        for start in range(0, len(ids), BATCH):
            batch = ids[start:start + BATCH]
            refs = {s.collection: sorted(db[s.collection])[:40] for s in coll.fields.values()
                    if s.type == "ref" and s.collection in db}
            fields = {n: s.model_dump(exclude_defaults=True) for n, s in coll.fields.items()}
            text = prompt("records", domain=schema.domain, collection=cname, n=len(batch),
                          subject=rng.choice(subjects), fields=json.dumps(fields), id_field=coll.id_field or "id",
                          ids=json.dumps(batch), refs=json.dumps(refs))
            runner.ask(f"records/{cname}", text, lambda t: _take_records(t, sdict, cname, coll, batch, db, runner))
    _fill_backrefs(schema, db)
    return db


def _take_records(text, sdict, cname, coll, batch, db, runner) -> int:
    """Add the valid records of a reply to `db`; CheckFailed when none is valid."""
    records = extract_json(text)
    if isinstance(records, dict):
        records = [records]
    if not isinstance(records, list):
        raise CheckFailed("answer with a JSON array of records")
    backrefs = {s["backref"] for c in sdict["collections"].values() for s in c["fields"].values()
                if s.get("backref") and s.get("collection") == cname}
    kept, errors = 0, []
    for rid, rec in zip(batch, records):
        if not isinstance(rec, dict):
            errors.append(f"{rid}: not an object")
            continue
        rec = dict(rec)
        if coll.id_field:
            rec[coll.id_field] = rid
        for name in backrefs:
            rec[name] = []  # filled from the referring records at the end
        try:
            rt.check_record(sdict, cname, rec, db)
        except ValueError as exc:
            errors.append(f"{rid}: {exc}")
            continue
        db[cname][rid] = rec
        kept += 1
    runner.counts[f"records/{cname}"]["records_kept"] += kept
    runner.counts[f"records/{cname}"]["records_dropped"] += len(batch) - kept
    if not kept:
        raise CheckFailed("no record passed the schema check: " + "; ".join(errors[:3]))
    return kept


# ---- tools ------------------------------------------------------------------------------
def ask_tools(runner: StepRunner, schema: Schema, db: dict, generic: list[ToolDef]) -> tuple[str, dict]:
    """tools.py source: the generic toolkit plus the LLM tools that passed the sandbox check.

    Returns (source, report) with report = {"kept": [...], "dropped": {name: reason}}.
    """
    base = render_tools_py(schema, generic)
    taken = _top_level_names(base)
    samples = {c: next(iter(recs.values())) for c, recs in db.items() if recs}
    id_names = {id_param(c, coll): c for c, coll in schema.collections.items()}
    report: dict = {"kept": [], "dropped": {}}

    def check(text: str) -> str:
        code = extract_code(text)
        try:
            names = _top_level_names(code)
        except SyntaxError as exc:
            raise CheckFailed(f"SyntaxError: {exc.msg} (line {exc.lineno})") from None
        clash = sorted((names & taken) - {"TOOL_TYPES"})
        if clash:
            raise CheckFailed(f"redefines existing names {clash}; choose new names")
        result = check_tools(code, db, id_names)
        if result["import_error"]:
            raise CheckFailed(f"the code does not run: {result['import_error']}")
        crashed = {n: r["detail"] for n, r in result["tools"].items() if r["status"] == "crash"}
        good = [n for n, r in result["tools"].items() if r["status"] in ("ok", "value_error")]
        if crashed and not good:
            raise CheckFailed("every tool crashed on the database: " + "; ".join(
                f"{n}: {d}" for n, d in list(crashed.items())[:3]))
        report["dropped"] = {n: f"crashed in the sandbox: {d}" for n, d in crashed.items()}
        report["kept"] = good
        return code

    text = prompt("tools", domain=schema.domain, schema=json.dumps(runtime_schema(schema)),
                  samples=json.dumps(samples, default=str)[:6000], existing=", ".join(t.name for t in generic))
    code = runner.ask("tools", text, check, max_tokens=4096)
    if code is None or not report["kept"]:
        return base, {"kept": [], "dropped": report["dropped"], "note": "generic toolkit only"}
    kinds = _tool_types(code)
    listed = {n: kinds.get(n, "read") for n in report["kept"]}
    merged = (base + "\n\n# ---- LLM-written tools (checked in the sandbox on db.json) ----\n"
              + code.replace("TOOL_TYPES", "LLM_TOOL_TYPES")
              + f"\n# tools that crashed in the sandbox are left out of TOOL_TYPES\nTOOL_TYPES.update({listed!r})\n")
    return merged, report


def _top_level_names(code: str) -> set[str]:
    names = set()
    for node in ast.parse(code).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _tool_types(code: str) -> dict[str, str]:
    for node in ast.parse(code).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "TOOL_TYPES" for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return {}
            return {k: v if v in ("read", "write") else "read" for k, v in value.items() if isinstance(k, str)}
    return {}


def ask_policy(runner: StepRunner, schema: Schema, description: str, tool_lines: list[str],
               tool_names: list[str]) -> str | None:
    def check(text: str) -> str:
        body = re.sub(r"^```(?:markdown|md)?\s*\n|```\s*$", "", text.strip())
        if len(body) < 200:
            raise CheckFailed("the policy is too short; cover authentication, scope, write rules and transfers")
        missing = [n for n in tool_names if n not in body]
        if len(missing) > len(tool_names) // 2:
            raise CheckFailed(f"the policy does not mention these tools: {missing[:10]}")
        return body.rstrip() + "\n"

    return runner.ask("policy", prompt("policy", domain=schema.domain, description=description,
                                       tools="\n".join(tool_lines)), check)
