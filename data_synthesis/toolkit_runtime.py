"""Generic, schema-checked database operations behind every offline domain tool.

This file is copied verbatim to the top of each generated `tools.py`, so a domain
folder runs without this package: standard library only, no imports from the project.
Every function takes the schema (as a plain dict, `Schema.model_dump()`) and the
database (`{collection: {id: record}}`) explicitly; writes mutate `db` in place, the
way tau2 toolkits do, and raise ValueError with a message an agent can act on.
"""
import copy
import re

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _type_error(path, want, value):
    raise ValueError(f"{path}: expected {want}, got {type(value).__name__} {value!r}")


def check_value(schema, spec, value, path, db=None):
    """Raise ValueError (naming `path`) unless `value` fits field `spec` (a dict).

    With `db`, references must name existing records.
    """
    kind = spec["type"]
    if value is None:
        if spec.get("optional") or kind == "any":
            return
        raise ValueError(f"{path}: a value is required")
    if kind in ("string", "text", "id", "datetime"):
        if not isinstance(value, str):
            _type_error(path, "a string", value)
    elif kind == "date":
        if not isinstance(value, str) or not _DATE.match(value):
            raise ValueError(f"{path}: expected a date YYYY-MM-DD, got {value!r}")
    elif kind in ("integer", "number"):
        ok = isinstance(value, int) if kind == "integer" else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok:
            _type_error(path, "an integer" if kind == "integer" else "a number", value)
        if spec.get("min") is not None and value < spec["min"]:
            raise ValueError(f"{path}: {value} is below the minimum {spec['min']}")
        if spec.get("max") is not None and value > spec["max"]:
            raise ValueError(f"{path}: {value} is above the maximum {spec['max']}")
    elif kind == "boolean":
        if not isinstance(value, bool):
            _type_error(path, "true or false", value)
    elif kind == "enum":
        if value not in spec["values"]:
            raise ValueError(f"{path}: {value!r} is not one of {spec['values']}")
    elif kind == "ref":
        if not isinstance(value, str):
            _type_error(path, "an id string", value)
        if db is not None and value not in db.get(spec["collection"], {}):
            raise ValueError(f"{path}: no {spec['collection']} record with id {value!r}")
    elif kind == "list":
        if not isinstance(value, list):
            _type_error(path, "a list", value)
        for i, item in enumerate(value):
            check_value(schema, spec["items"], item, f"{path}[{i}]", db)
    elif kind == "object":
        check_object(schema, spec["fields"], value, path, db)
    elif kind == "map":
        if not isinstance(value, dict):
            _type_error(path, "an object keyed by id", value)
        for key, item in value.items():
            check_value(schema, spec["value"], item, f"{path}.{key}", db)
            key_field = spec.get("key_field")
            if key_field and isinstance(item, dict) and item.get(key_field) != key:
                raise ValueError(f"{path}.{key}.{key_field}: must equal its key {key!r}")


def check_object(schema, fields, value, path, db=None):
    """Check a dict against `fields` (name -> spec): no unknown keys, no missing required ones."""
    if not isinstance(value, dict):
        _type_error(path, "an object", value)
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"{path}: unknown field(s) {unknown}; allowed: {sorted(fields)}")
    for name, spec in fields.items():
        if name not in value and not spec.get("optional"):
            raise ValueError(f"{path}.{name}: missing required field")
        check_value(schema, spec, value.get(name), f"{path}.{name}", db)


def check_record(schema, collection, record, db=None):
    """Raise ValueError unless `record` conforms to its collection's fields."""
    check_object(schema, schema["collections"][collection]["fields"], record, collection, db)


def _records(db, collection):
    if collection not in db:
        raise ValueError(f"the database has no collection {collection!r}")
    return db[collection]


def _entity(schema, collection):
    return schema["collections"][collection]["entity"]


def _require(schema, db, collection, record_id):
    records = _records(db, collection)
    if not isinstance(record_id, str) or record_id not in records:
        sample = ", ".join(sorted(records)[:2])
        raise ValueError(f"{_entity(schema, collection)} {record_id!r} not found "
                         f"(ids look like {sample})")
    return records[record_id]


def _at(record, path):
    value = record
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def label_of(record, label_paths):
    """A short display label: the values at `label_paths`, joined by spaces."""
    parts = [str(_at(record, p)) for p in label_paths if _at(record, p) not in (None, "")]
    return " ".join(parts)


def get_record(schema, db, collection, record_id):
    """A copy of one record, or ValueError naming the missing id."""
    return copy.deepcopy(_require(schema, db, collection, record_id))


def find_record_ids(schema, db, collection, path, value):
    """Sorted ids of the records whose field `path` equals `value` (case-insensitive)."""
    want = str(value).strip().lower()
    hits = [rid for rid, rec in sorted(_records(db, collection).items())
            if _at(rec, path) is not None and str(_at(rec, path)).strip().lower() == want]
    if not hits:
        raise ValueError(f"no {_entity(schema, collection)} with {path} {value!r}")
    return hits


def list_records_by(schema, db, collection, field, value, label_paths):
    """{id: label} of the records whose `field` references `value` (must exist)."""
    spec = schema["collections"][collection]["fields"][field]
    _require(schema, db, spec["collection"], value)
    return {rid: label_of(rec, label_paths) for rid, rec in sorted(_records(db, collection).items())
            if rec.get(field) == value}


def _strings(value, depth=2):
    """Every string in a record, down to `depth` levels of nesting (searchable text)."""
    if isinstance(value, str):
        yield value
    elif depth >= 0 and isinstance(value, dict):
        for item in value.values():
            yield from _strings(item, depth - 1)
    elif depth >= 0 and isinstance(value, list):
        for item in value:
            yield from _strings(item, depth - 1)


def search_records(schema, db, collection, query, filters, label_paths, limit=10):
    """[{id, label}] of records whose text contains `query` and whose fields equal `filters`.

    `filters` maps field paths to wanted values; None values are ignored. Sorted by id,
    at most `limit` (1..50).
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= 50:
        raise ValueError(f"limit: expected an integer from 1 to 50, got {limit!r}")
    id_key = schema["collections"][collection].get("id_field") or "id"
    needle = (query or "").strip().lower()
    out = []
    for rid, rec in sorted(_records(db, collection).items()):
        if any(want is not None and _at(rec, path) != want for path, want in filters.items()):
            continue
        if needle and not any(needle in s.lower() for s in _strings(rec)):
            continue
        out.append({id_key: rid, "label": label_of(rec, label_paths)})
        if len(out) == limit:
            break
    return out


def _spec_at(schema, collection, path):
    fields = schema["collections"][collection]["fields"]
    spec = None
    for part in path.split("."):
        spec = (fields or {}).get(part)
        if spec is None:
            raise ValueError(f"{collection} has no field {path!r}")
        fields = spec.get("fields")
    return spec


def update_record(schema, db, collection, record_id, path, value):
    """Set field `path` of a record to `value` after checking it; returns the record."""
    record = _require(schema, db, collection, record_id)
    check_value(schema, _spec_at(schema, collection, path), value, path, db)
    parts = path.split(".")
    target = record
    for part in parts[:-1]:
        if not isinstance(target.get(part), dict):
            raise ValueError(f"{_entity(schema, collection)} {record_id!r} has no {part!r} object")
        target = target[part]
    target[parts[-1]] = value
    return copy.deepcopy(record)


def _empty(spec):
    return {"list": [], "map": {}}.get(spec["type"])


def _new_id(schema, db, collection):
    coll = schema["collections"][collection]
    prefix = coll.get("id_prefix") or coll["entity"][:3].upper()
    width = coll.get("id_length", 4)
    n = len(db[collection]) + 1
    while f"{prefix}{n:0{width}d}" in db[collection]:
        n += 1
    return f"{prefix}{n:0{width}d}"


def create_record(schema, db, collection, values):
    """Add a record built from `values` (lists/maps default to empty); returns it.

    The id is the next free `<prefix><number>`; refs must exist; ref fields with a
    `backref` also append the new id to the referenced record's list.
    """
    coll = schema["collections"][collection]
    _records(db, collection)
    record_id = _new_id(schema, db, collection)
    record = {}
    for name, spec in coll["fields"].items():
        if name == coll.get("id_field"):
            record[name] = record_id
        elif name in values:
            record[name] = values[name]
        elif spec["type"] in ("list", "map"):
            record[name] = _empty(spec)
        elif spec.get("optional"):
            record[name] = None
    unknown = sorted(set(values) - set(coll["fields"]))
    if unknown:
        raise ValueError(f"unknown field(s) {unknown} for a new {coll['entity']}")
    check_record(schema, collection, record, db)
    db[collection][record_id] = record
    for name, spec in coll["fields"].items():
        if spec["type"] == "ref" and spec.get("backref") and record.get(name) is not None:
            db[spec["collection"]][record[name]][spec["backref"]].append(record_id)
    return copy.deepcopy(record)


def referencing(schema, db, collection, record_id):
    """Sorted "collection id" strings of records whose top-level refs point at a record."""
    hits = []
    for cname, coll in schema["collections"].items():
        for fname, spec in coll["fields"].items():
            is_ref = spec["type"] == "ref" and spec["collection"] == collection
            is_list = (spec["type"] == "list" and spec["items"]["type"] == "ref"
                       and spec["items"]["collection"] == collection)
            if not (is_ref or is_list) or _is_backref(schema, cname, fname):
                continue
            for rid, rec in db.get(cname, {}).items():
                got = rec.get(fname)
                if got == record_id or (is_list and isinstance(got, list) and record_id in got):
                    hits.append(f"{cname} {rid}")
    return sorted(hits)


def _is_backref(schema, collection, field):
    for coll in schema["collections"].values():
        for spec in coll["fields"].values():
            if spec.get("backref") == field and spec.get("collection") == collection:
                return True
    return False


def delete_record(schema, db, collection, record_id):
    """Remove a record nothing else references; drop it from backref lists; returns it."""
    record = _require(schema, db, collection, record_id)
    users = referencing(schema, db, collection, record_id)
    if users:
        raise ValueError(f"cannot delete {_entity(schema, collection)} {record_id!r}: still "
                         f"referenced by {', '.join(users[:5])}; change or delete those first")
    for name, spec in schema["collections"][collection]["fields"].items():
        if spec["type"] == "ref" and spec.get("backref") and record.get(name) in db[spec["collection"]]:
            back = db[spec["collection"]][record[name]][spec["backref"]]
            if record_id in back:
                back.remove(record_id)
    del db[collection][record_id]
    return copy.deepcopy(record)
