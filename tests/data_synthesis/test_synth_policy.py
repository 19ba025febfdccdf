"""ToolScale synthesis on a domain it never saw: its own policy.md is used and obeyed, and the
tasks read like user requests (data_synthesis/policy_rules.py, data_synthesis/plausibility.py)."""
import json

import pytest

from data_synthesis.infer import infer_schema
from data_synthesis.plausibility import Dependencies, answer_in_request, code_repr
from data_synthesis.policy_rules import parse_policy
from data_synthesis.synthesize import main
from data_synthesis.tasks import task_meta

POLICY = """# Clinic agent policy

## Authentication
- At the beginning of the conversation, you must authenticate the patient by locating their patient id
  via their email. This must be done even if the user already provides a patient id.

## Prescriptions
- New prescriptions must be created with status active.
- A prescription must be active or on-hold before it is changed; completed and cancelled prescriptions
  cannot be changed.
- Only compensate if the user is a gold member (yes, this is prose, not a rule).
"""
CITIES = [("Chicago", "America/Chicago"), ("Denver", "America/Denver"), ("Seattle", "America/Los_Angeles"),
          ("Boston", "America/New_York"), ("Phoenix", "America/Phoenix")]


def clinic_db() -> dict:
    names = ["Ana", "Ben", "Cleo", "Dan", "Eva", "Finn", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lena"]
    locations = {f"LOC{i:03d}": {"location_id": f"LOC{i:03d}", "name": f"{CITIES[i % 5][0]} clinic {i}",
                                 "city": CITIES[i % 5][0], "timezone": CITIES[i % 5][1]} for i in range(20)}
    patients = {f"PAT{i:03d}": {"patient_id": f"PAT{i:03d}", "name": f"{n} Smith", "email": f"{n.lower()}{i}@example.com",
                                "home_location_id": f"LOC{i:03d}"} for i, n in enumerate(names)}
    statuses, meds = ["active", "on-hold", "completed", "cancelled"], ["amoxicillin", "ibuprofen", "metformin", "lisinopril"]
    prescriptions = {f"RX{i:04d}": {"prescription_id": f"RX{i:04d}", "patient_id": f"PAT{i % 12:03d}",
                                    "medication": meds[i % 4], "status": statuses[(i // 3) % 4], "refills": i % 3}
                     for i in range(40)}
    return {"locations": locations, "patients": patients, "prescriptions": prescriptions}


@pytest.fixture(scope="module")
def clinic(tmp_path_factory):
    root = tmp_path_factory.mktemp("clinic")
    src = root / "clinic"
    src.mkdir()
    (src / "db.json").write_text(json.dumps(clinic_db()))
    (src / "policy.md").write_text(POLICY)
    return src, root


def test_policy_rules_parsed_where_stated_plainly():
    db = clinic_db()
    rules = parse_policy(POLICY, infer_schema(db, "clinic", "db.json"))
    assert rules.create == {("prescriptions", "status"): {"active"}}
    assert rules.before_write == {("prescriptions", "status"): {"active", "on-hold"}}
    assert rules.must_authenticate and "email" in rules.identify_by
    assert not any("gold" in str(v) for v in (rules.create, rules.before_write))   # prose is not a rule


def test_synthesize_reads_and_obeys_the_domains_policy(clinic, capsys):
    src, root = clinic
    out = root / "out"
    assert main(["--domain-dir", str(src), "--out", str(out), "--num-tasks", "20", "--seed", "0", "--no-dataset"]) == 0
    printed = capsys.readouterr().out
    assert (out / "policy.md").read_text() == POLICY                  # today: a template policy
    db = clinic_db()
    tasks = json.loads((out / "tasks.json").read_text())
    assert tasks
    for task in tasks:
        actions = task["evaluation_criteria"]["actions"]
        names = [a["name"] for a in actions]
        writes = [a for a in actions if not a["name"].startswith(("get_", "find_", "list_", "search_"))]
        if writes or any("patient" in n or "prescription" in n for n in names):   # personal records
            assert names[0].startswith("find_") and "email" in names[0], names   # authenticated first, by email
        for a in writes:
            args = a["arguments"]
            if a["name"].startswith("create_prescription"):
                assert args.get("status", "active") == "active", args
            rx = db["prescriptions"].get(args.get("prescription_id"))
            if rx is not None:
                assert rx["status"] in ("active", "on-hold"), (a, rx)
            loc = db["locations"].get(args.get("location_id"))
            if loc is not None and "timezone" in a["name"]:
                assert args["timezone"] == dict(CITIES)[loc["city"]], (a, loc)
        instr = task["user_scenario"]["instructions"]
        assert "{'" not in instr["reason_for_call"] and "{'" not in instr["known_info"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["policy"] == "the domain's policy.md" and summary["policy_rules"]
    assert any(r.startswith("policy.md:") for r in summary["dropped"])      # rejections are counted...
    assert "policy.md:" in printed                                          # ...and printed


def test_plausibility_checks_by_hand():
    def task(reason, known="", info=(), actions=()):
        return {"user_scenario": {"instructions": {"reason_for_call": reason, "known_info": known}},
                "evaluation_criteria": {"actions": list(actions), "communicate_info": list(info)}}

    assert code_repr(task("You want the address changed to {'city': 'Oslo', 'zip': '0150'}."))
    assert code_repr(task("You want your address changed to 12 Main St, Oslo.")) is None
    read = [{"name": "get_observation", "arguments": {"observation_id": "59"}}]
    assert answer_in_request(task("You want to know the observation id of observation 59.", info=["59"], actions=read),
                             {"get_observation": "read"})
    assert answer_in_request(task("You want to know the unit of observation 59.", info=["mg/dL"], actions=read),
                             {"get_observation": "read"}) is None
    schema = infer_schema(clinic_db(), "clinic", "db.json")
    deps = Dependencies(clinic_db(), schema)
    chicago = {"city": "Chicago", "timezone": "America/Chicago"}
    assert "contradicts city 'Chicago'" in deps.conflict("locations", chicago, "timezone", "America/Los_Angeles")
    assert deps.conflict("locations", chicago, "timezone", "America/Chicago") is None
    # no dependency between fields that vary independently (medication does not fix status)
    assert not any(k[1:] == ("medication", "status") for k in deps.map)


def test_evolved_tasks_differ_from_their_base(tmp_path):
    """An evolution that only rewords its base, or repeats one of its steps, is dropped and counted."""
    import pickle
    from dataclasses import replace

    from orchestrator.domains.folder import load_tools_module
    from data_synthesis.offline import resolve_source, write_environment
    from data_synthesis.tasks import TaskFilter, synthesize_tasks
    from data_synthesis.templates import TaskFactory

    source = resolve_source("school", seed=0)
    tools = write_environment(source, tmp_path)
    module = load_tools_module(tmp_path / "tools.py")
    frozen = pickle.dumps(source.db)
    task_filter = TaskFilter(lambda db, name, args: getattr(module, name)(db, **args), source.db,
                             lambda: pickle.loads(frozen), dict(module.TOOL_TYPES))
    factory = TaskFactory(source.schema, tools, source.db, seed=0)
    # every evolution repeats the base's last step and rewords the request
    factory.evolve = lambda d: replace(d, actions=d.actions + [d.actions[-1]], evolved=d.evolved + ["copy"],
                                       wants=["Please, as a matter of some urgency: " + w for w in d.wants])
    tasks = synthesize_tasks(factory, task_filter, "school", 15)
    assert len(tasks) == 15 and not any(task_meta(t)["evolved"] for t in tasks)   # today: copies are kept
    assert task_filter.tally.dropped["implausible: evolved task adds no action to its base"] > 0
