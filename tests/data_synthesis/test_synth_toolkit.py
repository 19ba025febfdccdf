"""The generic toolkit: semantics and errors of every operation, on a hand-written database."""
from __future__ import annotations

import ast
import copy
import json

import pytest

from orchestrator.domains.folder import load_domain, load_tools_module, openai_schema
from data_synthesis.schema import parse_schema
from data_synthesis.toolgen import derive_tools, render_tools_py

SCHEMA = parse_schema({
    "domain": "vet",
    "collections": {
        "owners": {"entity": "owner", "id_field": "owner_id", "id_prefix": "OWN", "lookup_fields": ["contact.email"],
                   "fields": {"owner_id": {"type": "id"}, "name": {"type": "string"},
                              "contact": {"type": "object", "fields": {"email": {"type": "string"}}},
                              "tier": {"type": "enum", "values": ["basic", "plus"], "writable": True},
                              "pet_ids": {"type": "list", "items": {"type": "ref", "collection": "pets"}}}},
        "pets": {"entity": "pet", "id_field": "pet_id", "id_prefix": "PET",
                 "fields": {"pet_id": {"type": "id"}, "name": {"type": "string"},
                            "owner_id": {"type": "ref", "collection": "owners", "backref": "pet_ids"},
                            "species": {"type": "enum", "values": ["cat", "dog"]},
                            "weight_kg": {"type": "number", "min": 0, "max": 90, "writable": True},
                            "notes": {"type": "string", "optional": True}}},
    },
})
DB = {
    "owners": {"OWN0001": {"owner_id": "OWN0001", "name": "Ada Li", "contact": {"email": "ada@x.org"},
                           "tier": "basic", "pet_ids": ["PET0001", "PET0002"]},
               "OWN0002": {"owner_id": "OWN0002", "name": "Bo Ek", "contact": {"email": "bo@x.org"},
                           "tier": "plus", "pet_ids": []}},
    "pets": {"PET0001": {"pet_id": "PET0001", "name": "Miso", "owner_id": "OWN0001", "species": "cat",
                         "weight_kg": 4.5, "notes": None},
             "PET0002": {"pet_id": "PET0002", "name": "Rex", "owner_id": "OWN0001", "species": "dog",
                         "weight_kg": 30.0, "notes": "bites"}},
}


@pytest.fixture()
def tools(tmp_path):
    path = tmp_path / "tools.py"
    path.write_text(render_tools_py(SCHEMA))
    return load_tools_module(path)


@pytest.fixture()
def db():
    return copy.deepcopy(DB)


def test_toolkit_names_and_kinds():
    kinds = {t.name: t.kind for t in derive_tools(SCHEMA)}
    assert kinds == {
        "get_owner_details": "read", "find_owner_ids_by_email": "read", "search_owners": "read",
        "update_owner_tier": "write",
        "get_pet_details": "read", "list_pets_by_owner_id": "read", "search_pets": "read",
        "update_pet_weight_kg": "write", "create_pet": "write", "delete_pet": "write",
        "transfer_to_human_agents": "generic"}


def test_reads(tools, db):
    assert tools.get_owner_details(db, owner_id="OWN0001")["name"] == "Ada Li"
    assert tools.find_owner_ids_by_email(db, email=" ADA@x.org") == ["OWN0001"]
    assert tools.list_pets_by_owner_id(db, owner_id="OWN0001") == {"PET0001": "Miso", "PET0002": "Rex"}
    assert tools.list_pets_by_owner_id(db, owner_id="OWN0002") == {}
    assert tools.search_pets(db, query="bit") == [{"pet_id": "PET0002", "label": "Rex"}]
    assert tools.search_pets(db, species="cat") == [{"pet_id": "PET0001", "label": "Miso"}]
    assert tools.search_owners(db, query="", limit=1) == [{"owner_id": "OWN0001", "label": "Ada Li"}]
    # reads hand out copies: changing one must not change the database
    tools.get_pet_details(db, pet_id="PET0001")["name"] = "X"
    assert db == DB


@pytest.mark.parametrize("call, message", [
    (lambda t, d: t.get_pet_details(d, pet_id="PET9"), "pet 'PET9' not found (ids look like PET0001, PET0002)"),
    (lambda t, d: t.find_owner_ids_by_email(d, email="zed@x.org"), "no owner with contact.email 'zed@x.org'"),
    (lambda t, d: t.list_pets_by_owner_id(d, owner_id="OWN9"), "owner 'OWN9' not found"),
    (lambda t, d: t.search_pets(d, limit=0), "limit: expected an integer from 1 to 50, got 0"),
    (lambda t, d: t.update_owner_tier(d, owner_id="OWN0001", tier="gold"), "tier: 'gold' is not one of ['basic', 'plus']"),
    (lambda t, d: t.update_pet_weight_kg(d, pet_id="PET0001", weight_kg=91), "weight_kg: 91 is above the maximum 90"),
    (lambda t, d: t.update_pet_weight_kg(d, pet_id="PET0001", weight_kg="4"), "weight_kg: expected a number, got str '4'"),
    (lambda t, d: t.create_pet(d, name="Tom", owner_id="OWN7", species="cat", weight_kg=3.0),
     "pets.owner_id: no owners record with id 'OWN7'"),
    (lambda t, d: t.create_pet(d, name="Tom", owner_id="OWN0001", species="cow", weight_kg=3.0),
     "pets.species: 'cow' is not one of ['cat', 'dog']"),
    (lambda t, d: t.delete_pet(d, pet_id="PET5"), "pet 'PET5' not found"),
])
def test_errors_are_clear_and_leave_the_database_unchanged(tools, db, call, message):
    with pytest.raises(ValueError) as err:
        call(tools, db)
    assert message in str(err.value)
    assert db == DB


def test_update(tools, db):
    out = tools.update_pet_weight_kg(db, pet_id="PET0001", weight_kg=5)
    assert out["weight_kg"] == 5 and db["pets"]["PET0001"]["weight_kg"] == 5


def test_create_assigns_next_id_and_maintains_backref(tools, db):
    rec = tools.create_pet(db, name="Tom", owner_id="OWN0002", species="cat", weight_kg=3.25)
    assert rec == {"pet_id": "PET0003", "name": "Tom", "owner_id": "OWN0002", "species": "cat",
                   "weight_kg": 3.25, "notes": None}
    assert db["pets"]["PET0003"] == rec and db["owners"]["OWN0002"]["pet_ids"] == ["PET0003"]
    assert tools.create_pet(db, name="Kit", owner_id="OWN0002", species="cat", weight_kg=1.0)["pet_id"] == "PET0004"


def test_delete_drops_backref(tools, db):
    assert tools.delete_pet(db, pet_id="PET0001")["name"] == "Miso"
    assert "PET0001" not in db["pets"] and db["owners"]["OWN0001"]["pet_ids"] == ["PET0002"]


def test_delete_refuses_a_referenced_record():
    from data_synthesis import toolkit_runtime as rt
    db = copy.deepcopy(DB)
    with pytest.raises(ValueError, match=r"cannot delete owner 'OWN0001': still referenced by pets PET0001, pets PET0002"):
        rt.delete_record(SCHEMA.model_dump(), db, "owners", "OWN0001")
    assert db == DB


def test_openai_schema_from_signature_and_docstring(tools):
    fn = openai_schema("search_pets", tools.search_pets)["function"]
    assert fn["parameters"]["required"] == []
    assert fn["parameters"]["properties"]["limit"]["type"] == "integer"
    assert fn["parameters"]["properties"]["species"]["type"] == ["string", "null"]
    assert "One of ['cat', 'dog']" in fn["parameters"]["properties"]["species"]["description"]
    create = openai_schema("create_pet", tools.create_pet)["function"]["parameters"]
    assert create["required"] == ["name", "owner_id", "species", "weight_kg"]


def test_tools_py_is_self_contained(tmp_path):
    src = render_tools_py(SCHEMA)
    imported = {n.names[0].name if isinstance(n, ast.Import) else n.module
                for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.Import, ast.ImportFrom))}
    assert imported == {"copy", "re"}


def test_tools_py_runs_in_the_sandbox_on_the_database():
    sandbox = pytest.importorskip("orchestrator.sandbox")
    code = ("import json, tools\ndb = json.load(open('db.json'))\n"
            "print(json.dumps([tools.find_owner_ids_by_email(db, 'bo@x.org'), sorted(tools.TOOL_TYPES)[:2]]))\n")
    result = sandbox.run_python(code, timeout=30, files={"tools.py": render_tools_py(SCHEMA), "db.json": json.dumps(DB)})
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout) == [["OWN0002"], ["create_pet", "delete_pet"]]


def test_load_domain_requires_files_and_checks_contract(tmp_path):
    from data_synthesis.schema import SchemaError
    with pytest.raises(SchemaError, match="db.json: missing"):
        load_domain(tmp_path)
    (tmp_path / "db.json").write_text(json.dumps(DB))
    (tmp_path / "tools.py").write_text("def get(x):\n    return 1\nTOOL_TYPES = {'get': 'read'}\n")
    with pytest.raises(SchemaError, match="get: the first parameter must be `db`"):
        load_domain(tmp_path)
    (tmp_path / "tools.py").write_text("TOOL_TYPES = {'nothing': 'read'}\n")
    with pytest.raises(SchemaError, match="TOOL_TYPES.nothing: no function"):
        load_domain(tmp_path)
    (tmp_path / "tools.py").write_text("import not_a_module_at_all\n")
    with pytest.raises(SchemaError, match="tools do not import: ModuleNotFoundError"):
        load_domain(tmp_path)
