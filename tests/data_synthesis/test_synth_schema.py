"""Schemas: shipped one loads, bad schemas/databases name the path, inference on ToolScale."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from data_synthesis import toolkit_runtime as rt
from data_synthesis.fake import generate_db
from data_synthesis.infer import infer_schema, singular
from orchestrator.domains.folder import load_db
from data_synthesis.schema import SchemaError, dump_schema, load_schema, parse_schema, shipped_schemas

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
TOOLSCALE = SHARED / "benchmarks" / "toolscale" / "domains"
needs_toolscale = pytest.mark.skipif(not TOOLSCALE.is_dir(), reason=f"{TOOLSCALE} absent (shared ToolScale domains)")


def test_shipped_school_schema_loads_and_fakes_conforming_records():
    assert "school" in shipped_schemas()
    schema = load_schema("school")
    db = generate_db(schema, seed=3)
    assert {c: len(v) for c, v in db.items()} == {"teachers": 12, "students": 40, "courses": 16, "enrollments": 90}
    # backref lists agree with the refs that point at them, both ways
    for eid, enr in db["enrollments"].items():
        assert eid in db["students"][enr["student_id"]]["enrollment_ids"]
    assert sum(len(s["enrollment_ids"]) for s in db["students"].values()) == 90


def test_fake_db_is_deterministic_per_seed():
    schema = load_schema("school")
    a, b, c = (json.dumps(generate_db(schema, seed=s), sort_keys=True) for s in (5, 5, 6))
    assert a == b and a != c


def test_schema_round_trips_through_yaml(tmp_path):
    schema = load_schema("school")
    (tmp_path / "s.yaml").write_text(dump_schema(schema))
    assert load_schema(tmp_path / "s.yaml") == schema


@pytest.mark.parametrize("mutate, where", [
    (lambda d: d["collections"]["students"]["fields"]["advisor_id"].update(collection="staff"),
     "collections.students.fields.advisor_id.collection"),
    (lambda d: d["collections"]["students"]["fields"]["status"].pop("values"),
     "collections.students.fields.status"),
    (lambda d: d["collections"]["students"].update(lookup_fields=["mail"]), "collections.students.lookup_fields"),
    (lambda d: d["collections"]["students"]["fields"]["grade_level"].update(type="float"),
     "collections.students.fields.grade_level.type"),
])
def test_malformed_schema_error_names_the_path(mutate, where):
    import yaml
    data = yaml.safe_load((Path(__file__).resolve().parents[2] / "data_synthesis/schemas/school.yaml").read_text())
    mutate(data)
    with pytest.raises(SchemaError) as err:
        parse_schema(data, "my.yaml")
    assert str(err.value).startswith("my.yaml: " + where), str(err.value)


def test_unreadable_and_invalid_files_name_the_file(tmp_path):
    with pytest.raises(SchemaError, match="nope.yaml: cannot read schema"):
        load_schema(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("domain: [unclosed\n")
    with pytest.raises(SchemaError, match="bad.yaml: not valid YAML"):
        load_schema(bad)


def test_malformed_database_names_file_and_json_path(tmp_path):
    path = tmp_path / "db.json"
    path.write_text(json.dumps({"users": {"u1": {"id": "u1"}}, "orders": [{"id": "o1"}]}))
    with pytest.raises(SchemaError, match=r"db.json: \$\.orders: a collection must be an object keyed by record id"):
        load_db(path)
    path.write_text(json.dumps({"users": {"u1": "not a record"}}))
    with pytest.raises(SchemaError, match=r"\$\.users\.u1: a record must be an object"):
        load_db(path)
    path.write_text("{")
    with pytest.raises(SchemaError, match="db.json: line 1 column 2: invalid JSON"):
        load_db(path)


def test_singular():
    assert [singular(w) for w in ["students", "movies", "classes", "beneficiaries", "sales", "catalogue"]] == \
        ["student", "movie", "class", "beneficiary", "sale", "catalogue"]


def test_inference_on_a_small_handmade_db():
    db = {"users": {f"u{i}": {"user_id": f"u{i}", "email": f"p{i}@x.org", "tier": ["gold", "silver"][i % 2],
                              "orders": [f"o{i}"]} for i in range(6)},
          "orders": {f"o{i}": {"order_id": f"o{i}", "user_id": f"u{i}", "total": 10.5 * i, "qty": i + 1}
                     for i in range(6)}}
    schema = infer_schema(db, "shop")
    users, orders = schema.collections["users"], schema.collections["orders"]
    assert users.id_field == "user_id" and users.lookup_fields == ["email"]
    assert users.fields["tier"].type == "enum" and users.fields["tier"].values == ["gold", "silver"]
    assert orders.fields["user_id"].type == "ref" and orders.fields["user_id"].backref == "orders"
    assert orders.fields["total"].type == "number" and orders.fields["qty"].type == "integer"
    assert (orders.fields["qty"].min, orders.fields["qty"].max) == (1, 6)


@needs_toolscale
@pytest.mark.parametrize("domain", sorted(p.name for p in TOOLSCALE.iterdir()) if TOOLSCALE.is_dir() else [])
def test_inferred_schema_fits_every_toolscale_record(domain):
    db = load_db(TOOLSCALE / domain / "db.json")
    schema = infer_schema(db, domain)
    sdict = schema.model_dump()
    for cname, records in db.items():
        for record in records.values():
            rt.check_record(sdict, cname, record, db)
    assert set(schema.collections) == set(db)


@needs_toolscale
def test_bank_inference_finds_ids_refs_backrefs_and_email_lookup():
    schema = infer_schema(load_db(TOOLSCALE / "bank" / "db.json"), "bank")
    clients, loans = schema.collections["clients"], schema.collections["loans"]
    assert clients.id_field == "client_id" and clients.lookup_fields == ["contact.email"]
    assert loans.fields["client_id"].type == "ref" and loans.fields["client_id"].collection == "clients"
    assert loans.fields["client_id"].backref == "loan_ids"
    assert clients.fields["accounts"].type == "map" and clients.fields["accounts"].key_field == "account_id"
