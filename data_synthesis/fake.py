"""Offline database records from a schema, with Faker (seeded, deterministic).

Ids are planned for every collection first (`<prefix><number>`), so references can
point anywhere, cycles included; lists that a `backref` maintains are filled from the
referring records at the end, so both sides of a link always agree.
"""
from __future__ import annotations

import datetime as dt
import random
import string

from faker import Faker

from data_synthesis.schema import CollectionSpec, FieldSpec, Schema
from data_synthesis import toolkit_runtime as rt

# Field names whose values Faker can make when the schema gives no `faker` hint.
_NAME_HINTS = {
    "email": "email", "phone": "phone_number", "first_name": "first_name", "last_name": "last_name",
    "given": "first_name", "family": "last_name", "city": "city", "country": "country",
    "state": "state", "zip": "postcode", "postal_code": "postcode", "street": "street_address",
    "address1": "street_address", "line1": "street_address", "company": "company",
    "description": "sentence", "name": "name",
}
_EPOCH = dt.date(2000, 1, 1)


class RecordFaker:
    """Makes values for field specs; one instance per database, seeded once."""

    def __init__(self, schema: Schema, seed: int, locale: str = "en_US"):
        self.schema = schema
        self.rng = random.Random(seed)
        self.fake = Faker(locale)
        self.fake.seed_instance(seed)
        self.ids: dict[str, list[str]] = {}
        self._seen: dict[str, set] = {}

    def plan_ids(self, counts: dict[str, int]) -> None:
        for cname, coll in self.schema.collections.items():
            prefix = coll.id_prefix or coll.entity[:3].upper()
            self.ids[cname] = [f"{prefix}{n:0{coll.id_length}d}" for n in range(1, counts[cname] + 1)]

    def value(self, name: str, spec: FieldSpec, where: str, siblings: dict) -> object:
        """A value for field `name` (at `where`, for uniqueness) given already-made siblings."""
        if spec.optional and self.rng.random() < 0.25:
            return None
        for _ in range(50):
            value = self._fresh(name, spec, siblings)
            if not spec.unique or value not in self._seen.setdefault(where, set()):
                break
        else:  # a small provider ran out of distinct values: make it unique by hand
            value = f"{value}-{len(self._seen[where])}"
        if spec.unique:
            self._seen[where].add(value)
        return value

    def _fresh(self, name: str, spec: FieldSpec, siblings: dict) -> object:
        kind, rng = spec.type, self.rng
        if kind == "enum":
            return rng.choice(spec.values)
        if kind == "boolean":
            return rng.random() < 0.5
        if kind in ("integer", "number"):
            lo, hi = spec.min if spec.min is not None else 0, spec.max if spec.max is not None else 1000
            if kind == "integer":
                return rng.randint(int(lo), int(hi))
            return round(rng.uniform(lo, hi), spec.decimals if spec.decimals is not None else 2)
        if kind in ("date", "datetime"):
            lo = dt.date(int(spec.min), 1, 1) if spec.min else dt.date(2015, 1, 1)
            hi = dt.date(int(spec.max), 12, 31) if spec.max else dt.date(2026, 12, 31)
            day = lo + dt.timedelta(days=rng.randint(0, (hi - lo).days))
            if kind == "date":
                return day.isoformat()
            return f"{day.isoformat()}T{rng.randint(0, 23):02d}:{rng.choice([0, 15, 30, 45]):02d}:00Z"
        if kind == "ref":
            return rng.choice(self.ids[spec.collection])
        if kind == "list":
            n = rng.randint(spec.min_items, max(spec.min_items, spec.max_items))
            return [self._fresh(name, spec.items, {}) for _ in range(n)]
        if kind == "object":
            return self.object(spec.fields, f"{name}.", {})
        if kind == "map":
            out = {}
            for _ in range(rng.randint(max(1, spec.min_items), max(1, spec.max_items))):
                key = "".join(rng.choices(string.ascii_uppercase + string.digits, k=8))
                item = self._fresh(name, spec.value, {})
                if spec.key_field and isinstance(item, dict):
                    item[spec.key_field] = key
                out[key] = item
            return out
        if kind == "any":
            return rng.choice(spec.examples) if spec.examples else None
        return self._text(name, spec, siblings)

    def _text(self, name: str, spec: FieldSpec, siblings: dict) -> str:
        provider = spec.faker or _NAME_HINTS.get(name.lower())
        if provider == "email" and siblings.get("first_name") and siblings.get("last_name"):
            user = f"{siblings['first_name']}.{siblings['last_name']}".lower().replace(" ", "")
            return f"{user}{self.rng.randint(1, 99)}@example.com"
        if provider:
            try:
                return str(getattr(self.fake, provider)())
            except AttributeError:
                raise ValueError(f"field {name!r}: Faker has no provider {provider!r}") from None
        if spec.examples:
            return str(self.rng.choice(spec.examples))
        if spec.type == "text":
            return self.fake.sentence()
        return self.fake.word()

    def object(self, fields: dict[str, FieldSpec], where: str, fixed: dict) -> dict:
        out: dict = {}
        for name, spec in fields.items():
            out[name] = fixed[name] if name in fixed else self.value(name, spec, where + name, out)
        return out


def generate_db(schema: Schema, seed: int = 0, counts: dict[str, int] | None = None) -> dict:
    """A database `{collection: {id: record}}` of fake records that pass `check_record`.

    `counts` overrides each collection's `count`. Same schema + seed -> same database.
    """
    counts = {c: (counts or {}).get(c, coll.count) for c, coll in schema.collections.items()}
    maker = RecordFaker(schema, seed)
    maker.plan_ids(counts)
    db: dict[str, dict] = {}
    for cname, coll in schema.collections.items():
        db[cname] = {}
        for rid in maker.ids[cname]:
            fixed = {coll.id_field: rid} if coll.id_field else {}
            db[cname][rid] = maker.object(coll.fields, f"{cname}.", fixed)
    _fill_backrefs(schema, db)
    schema_dict = schema.model_dump()
    for cname in db:
        for rid, record in db[cname].items():
            rt.check_record(schema_dict, cname, record, db)
    return db


def _fill_backrefs(schema: Schema, db: dict) -> None:
    for cname, coll in schema.collections.items():
        for fname, spec in _backref_fields(coll):
            for record in db[spec.collection].values():
                record[spec.backref] = []
            for rid, record in db[cname].items():
                if record.get(fname) is not None:
                    db[spec.collection][record[fname]][spec.backref].append(rid)


def _backref_fields(coll: CollectionSpec) -> list[tuple[str, FieldSpec]]:
    return [(n, s) for n, s in coll.fields.items() if s.type == "ref" and s.backref]
