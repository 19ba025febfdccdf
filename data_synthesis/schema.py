"""Domain schemas: the collections of a tau2-style database and the type of every field.

A schema is YAML (or JSON) like the shipped `data_synthesis/schemas/school.yaml`:

    domain: school
    description: A school's records office ...
    collections:
      students:                       # db.json key; db["students"] = {id: record}
        entity: student               # singular, used in tool names
        id_field: student_id          # record field that repeats the key (optional)
        id_prefix: STU                # offline ids: STU0001, STU0002, ...
        count: 30                     # offline records to generate
        lookup_fields: [email]        # unique fields a user can identify with
        fields:
          email: {type: string, faker: email, unique: true}
          status: {type: enum, values: [enrolled, suspended], writable: true}
          advisor_id: {type: ref, collection: teachers}

Field types: string, text, integer, number, boolean, date, datetime, enum (`values`),
id, ref (`collection`, optional `backref`: a list field of the target that lists the
referring ids), list (`items`), object (`fields`), map (id-keyed objects: `key_field`,
`value`), any.  `optional: true` lets a value be null or missing.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from orchestrator.domains.folder import SchemaError  # the one definition: domain folders raise it too

SCHEMA_DIR = Path(__file__).resolve().parent / "schemas"
FieldType = Literal["string", "text", "integer", "number", "boolean", "date", "datetime",
                    "enum", "id", "ref", "list", "object", "map", "any"]
_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"




class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FieldSpec(_Strict):
    type: FieldType
    optional: bool = False
    description: str = ""
    # generation hints
    faker: str | None = None                  # Faker provider, e.g. "email", "city"
    examples: list[Any] = Field(default_factory=list)   # sampled when no provider fits
    min: float | None = None
    max: float | None = None
    decimals: int | None = None
    min_items: int = 0
    max_items: int = 3
    # semantics
    values: list[str] | None = None           # enum
    collection: str | None = None             # ref
    backref: str | None = None                # ref: list field of the target collection
    items: "FieldSpec | None" = None          # list
    fields: "dict[str, FieldSpec] | None" = None   # object
    key_field: str | None = None              # map: value field that repeats the key
    value: "FieldSpec | None" = None          # map
    unique: bool = False
    writable: bool = False                    # gets an update_<entity>_<field> tool

    @model_validator(mode="after")
    def _check_kind(self) -> "FieldSpec":
        need = {"enum": "values", "ref": "collection", "list": "items", "object": "fields", "map": "value"}
        attr = need.get(self.type)
        if attr and not getattr(self, attr):
            raise ValueError(f"a field of type {self.type!r} needs {attr!r}")
        if self.type == "enum" and len(set(self.values or [])) != len(self.values or []):
            raise ValueError("enum 'values' repeat")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} > max {self.max}")
        return self


class CollectionSpec(_Strict):
    entity: str = Field(pattern=_NAME)
    id_field: str | None = None
    id_prefix: str = ""
    id_length: int = 4                        # digits after the prefix (offline ids)
    count: int = Field(20, ge=1)
    description: str = ""
    lookup_fields: list[str] = Field(default_factory=list)   # dotted paths allowed
    fields: dict[str, FieldSpec] = Field(min_length=1)


class Schema(_Strict):
    domain: str = Field(pattern=_NAME)
    description: str = ""
    collections: dict[str, CollectionSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _cross_check(self) -> "Schema":
        entities: dict[str, str] = {}
        for cname, coll in self.collections.items():
            if not re.match(_NAME, cname):
                raise ValueError(f"collections.{cname}: collection names must be identifiers")
            if coll.entity in entities:
                raise ValueError(f"collections.{cname}.entity: {coll.entity!r} also names "
                                 f"collection {entities[coll.entity]!r}")
            entities[coll.entity] = cname
            if coll.id_field and coll.id_field in coll.fields and coll.fields[coll.id_field].type != "id":
                raise ValueError(f"collections.{cname}.fields.{coll.id_field}.type: the id field must have type 'id'")
            for path in coll.lookup_fields:
                if field_at(coll, path) is None:
                    raise ValueError(f"collections.{cname}.lookup_fields: no field {path!r}")
            for fname, spec in coll.fields.items():
                self._check_refs(f"collections.{cname}.fields.{fname}", spec)
        return self

    def _check_refs(self, where: str, spec: FieldSpec) -> None:
        if spec.type == "ref":
            target = self.collections.get(spec.collection or "")
            if target is None:
                raise ValueError(f"{where}.collection: unknown collection {spec.collection!r}; "
                                 f"known: {sorted(self.collections)}")
            if spec.backref:
                back = target.fields.get(spec.backref)
                if back is None or back.type != "list":
                    raise ValueError(f"{where}.backref: {spec.collection}.{spec.backref} must be a list field")
        for sub_name, sub in (spec.fields or {}).items():
            self._check_refs(f"{where}.fields.{sub_name}", sub)
        if spec.items:
            self._check_refs(f"{where}.items", spec.items)
        if spec.value:
            self._check_refs(f"{where}.value", spec.value)


def field_at(coll: CollectionSpec, path: str) -> FieldSpec | None:
    """The spec at a dotted path through object fields ("contact.email"), or None."""
    fields: dict[str, FieldSpec] | None = coll.fields
    spec = None
    for part in path.split("."):
        if not fields or part not in fields:
            return None
        spec = fields[part]
        fields = spec.fields if spec.type == "object" else None
    return spec


def _loc(loc: tuple) -> str:
    return ".".join(str(p) for p in loc if p != "__root__") or "$"


def parse_schema(data: Any, source: str = "<schema>") -> Schema:
    """Validate parsed YAML/JSON; raise SchemaError naming the source and the bad path."""
    try:
        return Schema.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        loc = _loc(tuple(err["loc"]))
        if loc == "$" and ":" in msg:  # cross-field checks name their own path
            loc, msg = msg.split(":", 1)[0], msg.split(":", 1)[1].strip()
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise SchemaError(f"{source}: {loc}: {msg}{more}") from None


def shipped_schemas() -> list[str]:
    """Names of the schemas shipped in data_synthesis/schemas/."""
    return sorted(p.stem for p in SCHEMA_DIR.glob("*.yaml"))


def load_schema(path_or_name: str | Path) -> Schema:
    """Load a schema file, or a shipped schema by name (e.g. "school")."""
    path = Path(path_or_name)
    if not path.exists() and (SCHEMA_DIR / f"{path_or_name}.yaml").exists():
        path = SCHEMA_DIR / f"{path_or_name}.yaml"
    try:
        text = path.read_text()
    except OSError as exc:
        raise SchemaError(f"{path}: cannot read schema: {exc.strerror}; shipped schemas: "
                          f"{shipped_schemas()}") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise SchemaError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                          f"{str(exc).splitlines()[0]}") from None
    return parse_schema(data, str(path))


def dump_schema(schema: Schema) -> str:
    """YAML text of a schema without default-valued keys (what `load_schema` reads back)."""
    data = schema.model_dump(exclude_defaults=True)
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
