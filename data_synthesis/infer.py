"""Infer a domain schema from an existing tau2-style `db.json` (e.g. a ToolScale domain).

The database must be `{collection: {id: record}}`.  Types come from the values seen:
strings that are all keys of another collection become refs, short repeated strings
become enums, id-keyed nested objects become maps, and so on.  Every record of the
database conforms to the inferred schema (`toolkit_runtime.check_record`).
"""
from __future__ import annotations

import re
from collections import Counter
from typing import Any

from data_synthesis.schema import CollectionSpec, FieldSpec, Schema, parse_schema
from orchestrator.domains.folder import check_db_shape

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_DATETIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")
_MAX_ENUM = 12        # more distinct values than this is free text, not a category
_MAX_WRITABLE = 4     # update tools per collection


def singular(name: str) -> str:
    """A rough English singular ("enrollments" -> "enrollment", "classes" -> "class")."""
    if name.endswith(("vies", "kies")):  # movies, cookies
        return name[:-1]
    for plural, single in (("ies", "y"), ("sses", "ss"), ("xes", "x"), ("ches", "ch"), ("shes", "sh")):
        if name.endswith(plural):
            return name[: -len(plural)] + single
    return name[:-1] if name.endswith("s") and not name.endswith("ss") else name


class _Inferrer:
    def __init__(self, db: dict):
        self.db = db
        self.keys = {c: set(recs) for c, recs in db.items()}

    def spec(self, name: str, values: list, total: int) -> FieldSpec:
        """Spec for a field seen with `values` (None = null) in `total` records; missing = optional."""
        present = [v for v in values if v is not None]
        optional = len(present) < total
        if not present:
            return FieldSpec(type="any", optional=True)
        kinds = {_kind(v) for v in present}
        if kinds == {"bool"}:
            return FieldSpec(type="boolean", optional=optional)
        if kinds <= {"int", "float"}:
            return self._number(present, kinds, optional)
        if kinds == {"str"}:
            return self._string(present, optional)
        if kinds == {"list"}:
            items = [i for v in present for i in v]
            item_spec = self.spec(name, items, len(items)) if items else FieldSpec(type="any", optional=True)
            return FieldSpec(type="list", items=item_spec, optional=optional,
                             max_items=max(3, min(5, max(len(v) for v in present))))
        if kinds == {"dict"}:
            return self._dict(name, present, optional)
        return FieldSpec(type="any", optional=True)

    def _number(self, present: list, kinds: set, optional: bool) -> FieldSpec:
        lo, hi = min(present), max(present)
        examples = sorted(set(present))[:8]
        if kinds == {"int"}:
            return FieldSpec(type="integer", min=lo, max=hi, optional=optional, examples=examples)
        return FieldSpec(type="number", min=0 if lo >= 0 else None, optional=optional,
                         examples=examples, max=None, decimals=2)

    def _string(self, present: list, optional: bool) -> FieldSpec:
        counts = Counter(present)
        for cname, keys in self.keys.items():
            if all(v in keys for v in counts):  # dangling ids would fail validation
                return FieldSpec(type="ref", collection=cname, optional=optional)
        if all(_DATE.match(v) for v in counts):
            return FieldSpec(type="date", optional=optional)
        if all(_DATETIME.match(v) for v in counts):
            return FieldSpec(type="datetime", optional=optional)
        distinct = sorted(counts)
        if (len(distinct) <= _MAX_ENUM and len(present) >= 3 * len(distinct) and len(distinct) > 1
                and max(len(v) for v in distinct) <= 40):
            return FieldSpec(type="enum", values=distinct, optional=optional)
        examples = [v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:8]]
        return FieldSpec(type="string", optional=optional, examples=examples,
                         unique=len(counts) == len(present) and len(present) > 1)

    def _dict(self, name: str, present: list[dict], optional: bool) -> FieldSpec:
        key_field = _key_field(present)
        all_keys = Counter(k for d in present for k in d)
        per_record = sum(len(d) for d in present) / len(present)
        id_like = key_field is not None or (len(all_keys) > 20 and per_record < len(all_keys) / 4)
        if id_like and all(isinstance(v, dict) for d in present for v in d.values()):
            values = [v for d in present for v in d.values()]
            value = self._object(name, values) if values else FieldSpec(type="any", optional=True)
            return FieldSpec(type="map", key_field=key_field, value=value, optional=optional)
        spec = self._object(name, present)
        return spec.model_copy(update={"optional": optional})

    def _object(self, name: str, records: list[dict]) -> FieldSpec:
        names = list(dict.fromkeys(k for r in records for k in r))  # first-seen order
        fields = {k: self.spec(k, [r.get(k) for r in records], len(records)) for k in names}
        return FieldSpec(type="object", fields=fields)


def _kind(value: Any) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict"}.get(type(value), "other")


def _key_field(dicts: list[dict]) -> str | None:
    """The inner field that repeats the key in >= 90% of id-keyed entries, if any."""
    pairs = [(k, v) for d in dicts for k, v in d.items() if isinstance(v, dict)]
    if not pairs:
        return None
    candidates = Counter(f for k, v in pairs for f, x in v.items() if x == k)
    if candidates:
        field, hits = candidates.most_common(1)[0]
        if hits >= 0.9 * len(pairs):
            return field
    return None


def infer_schema(db: dict, domain: str, source: str = "<db.json>") -> Schema:
    """A Schema that every record of `db` conforms to; raises SchemaError on a bad shape."""
    check_db_shape(db, source)
    inf = _Inferrer(db)
    collections: dict[str, dict] = {}
    for cname, records in db.items():
        recs = list(records.values())
        id_field = _key_field([records])
        obj = inf._object(cname, recs) if recs else FieldSpec(type="object", fields={"id": FieldSpec(type="id")})
        fields = dict(obj.fields)
        if id_field:
            fields[id_field] = FieldSpec(type="id")
        coll = CollectionSpec(entity=singular(cname), id_field=id_field, count=max(1, len(recs)), fields=fields)
        coll.lookup_fields = _lookup_fields(coll)
        _mark_writable(coll)
        collections[cname] = coll.model_dump(exclude_defaults=True)
    _mark_backrefs(db, collections)
    data = {"domain": re.sub(r"\W", "_", domain), "collections": collections,
            "description": f"Inferred from {source}."}
    return parse_schema(data, source)


def _lookup_fields(coll: CollectionSpec) -> list[str]:
    """Unique string fields a user can identify with: emails first (dotted paths allowed)."""
    paths = []

    def walk(fields: dict[str, FieldSpec], prefix: str) -> None:
        for name, spec in fields.items():
            if spec.type == "object" and not prefix:
                walk(spec.fields, f"{name}.")
            elif spec.type == "string" and not spec.optional and "email" in name.lower():
                paths.append(prefix + name)  # real data repeats some emails: find returns every match

    walk(coll.fields, "")
    return paths[:1]


def _mark_writable(coll: CollectionSpec) -> None:
    order = {"enum": 0, "boolean": 1, "integer": 2, "number": 2}
    picks = sorted((order[s.type], n) for n, s in coll.fields.items()
                   if s.type in order and n != coll.id_field and not s.optional)
    for _, name in picks[:_MAX_WRITABLE]:
        coll.fields[name] = coll.fields[name].model_copy(update={"writable": True})


def _mark_backrefs(db: dict, collections: dict[str, dict]) -> None:
    """A ref B.r -> A gets `backref: L` when A's list L holds the ids of the Bs that point at it."""
    for bname, bcoll in collections.items():
        for rname, rspec in bcoll["fields"].items():
            if rspec["type"] != "ref":
                continue
            aname = rspec["collection"]
            for lname, lspec in collections[aname]["fields"].items():
                items = lspec.get("items") or {}
                if lspec["type"] != "list" or items.get("type") != "ref" or items.get("collection") != bname:
                    continue
                pairs = [(bid, rec.get(rname)) for bid, rec in db[bname].items() if rec.get(rname) in db[aname]]
                hits = sum(bid in (db[aname][aid].get(lname) or []) for bid, aid in pairs)
                if pairs and hits >= 0.9 * len(pairs):
                    rspec["backref"] = lname
                    break
