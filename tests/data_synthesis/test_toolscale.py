"""`python -m data_synthesis.dataset --toolscale`: NVIDIA's released ToolScale tasks as training data.

The records are fixtures in the released schema, written by the tests (the release itself is not
here): against a domain built in the test (runs anywhere) and against the shared ToolScale
databases (skipped without ../shared).  Good records are kept, a failing gold action, an unknown
tool and an evaluation-set question are rejected and counted, bad input is one error line, and
the output loads in the trainer's loader.
"""
from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data_synthesis.contamination import question_hash, shipped_sets
from data_synthesis.dataset import main
from data_synthesis.records import load_examples
from data_synthesis.toolscale import arrow_row, load_records
from training.tasks import load_tasks

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks" / "toolscale" / "domains"
FRAMES_Q = ("If my future wife has the same first name as the 15th first lady of the United States' mother and "
            "her surname is the same as the second assassinated president's mother's maiden name, what is my "
            "future wife's name? ")

SHOP_TOOLS = '''
TOOL_TYPES = {"find_user_id_by_email": "read", "get_order_details": "read", "cancel_order": "write"}


def find_user_id_by_email(db: dict, email: str) -> str:
    """Find a user's id by email.

    Args:
        email: the user's email
    """
    for uid, user in db["users"].items():
        if user["email"] == email:
            return uid
    raise ValueError("User not found")


def get_order_details(db: dict, order_id: str) -> dict:
    """Get an order.

    Args:
        order_id: the order id
    """
    if order_id not in db["orders"]:
        raise ValueError("Order not found")
    return dict(db["orders"][order_id])


def cancel_order(db: dict, order_id: str, reason: str) -> dict:
    """Cancel a pending order.

    Args:
        order_id: the order id
        reason: why
    """
    order = db["orders"].get(order_id)
    if order is None:
        raise ValueError("Order not found")
    if order["status"] != "pending":
        raise ValueError(f"Order is {order['status']}, only pending orders can be cancelled")
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    return dict(order)
'''


def record(rid, domain, reason, actions, task_instructions="Answer only what the agent asks."):
    """One task in the released ToolScale schema (as the hub's card lists its fields)."""
    return {"id": rid, "description": {"purpose": "", "relevant_policies": None, "notes": None},
            "user_scenario": {"persona": None, "instructions": {
                "task_instructions": task_instructions, "reason_for_call": reason,
                "known_info": "You are the account holder.", "unknown_info": None, "domain": domain}},
            "initial_state": None,
            "evaluation_criteria": {"actions": [{"action_id": f"{rid}_{i}", "name": n, "arguments": a}
                                                for i, (n, a) in enumerate(actions)],
                                    "communicate_info": [], "nl_assertions": None}}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def shop(tmp_path) -> Path:
    """A domain folder of the test's own: db.json, policy.md, tools.py (our tools contract)."""
    root = tmp_path / "domains"
    (root / "shop").mkdir(parents=True)
    db = {"users": {"u1": {"user_id": "u1", "email": "ann@example.com"},
                    "u2": {"user_id": "u2", "email": "bob@example.com"}},
          "orders": {"o1": {"order_id": "o1", "user_id": "u1", "status": "pending"},
                     "o2": {"order_id": "o2", "user_id": "u2", "status": "delivered"}}}
    (root / "shop" / "db.json").write_text(json.dumps(db))
    (root / "shop" / "policy.md").write_text("# Shop policy\nAuthenticate by email; cancel only pending orders.\n")
    (root / "shop" / "tools.py").write_text(SHOP_TOOLS)
    return root


def shop_records() -> list[dict]:
    return [
        record("1", "shop", "You want to know the status of your order o1.",
               [("find_user_id_by_email", {"email": "ann@example.com"}), ("get_order_details", {"order_id": "o1"})]),
        record("2", "shop", "You want to cancel your order o1, you no longer need it.",
               [("find_user_id_by_email", {"email": "ann@example.com"}),
                ("cancel_order", {"order_id": "o1", "reason": "no longer needed"})]),
        record("3", "shop", "You want to cancel order o2 that already arrived.",      # gold action fails
               [("find_user_id_by_email", {"email": "bob@example.com"}),
                ("cancel_order", {"order_id": "o2", "reason": "changed my mind"})]),
        record("4", "shop", "Which river runs through the capital of the country that hosted Expo 2015?",
               [("get_order_details", {"order_id": "o1"})]),                          # an eval question
        record("5", "shop", "You want a refund.", [("refund_order", {"order_id": "o1"})]),   # no such tool
    ]


def run(argv: list[str], capsys) -> tuple[int, str]:
    # rich lays the summary table out to COLUMNS (80 without a terminal), wrapping the title's
    # long tmp path; the tests read the table's words, so give it room for one line each
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COLUMNS", "300")
        code = main(argv)
    return code, capsys.readouterr().err


def test_own_domain_keeps_good_records_rejects_the_rest_and_trains(shop, tmp_path, capsys):
    staged = record("6", "shop", "You want order o1 again.", [("get_order_details", {"order_id": "o1"})])
    staged["initial_state"] = {"initialization_actions": [{"env_type": "assistant", "func_name": "cancel_order",
                                                           "arguments": {"order_id": "o1", "reason": "x"}}]}
    src = write_jsonl(tmp_path / "toolscale.jsonl", shop_records() + [staged])
    bench = write_jsonl(tmp_path / "bench.jsonl", [{"id": "b1", "answer": "Po", "question": shop_records()[3]["user_scenario"]
                                                    ["instructions"]["reason_for_call"].upper()}])
    out = tmp_path / "out"
    code, err = run(["--toolscale", str(src), "--toolscale-domains", str(shop), "--out", str(out),
                     "--eval-set", f"mybench={bench}"], capsys)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())["toolscale"]
    shop_sum = summary["domains"]["shop"]
    assert (summary["records"], summary["kept"], summary["rejected"]) == (6, 2, 4)
    assert shop_sum["toolkit"].endswith("shop/tools.py")
    assert shop_sum["runs"] == {"tools.py": 2}      # of the 4 replayed (records 4 and 6 stop before)
    assert shop_sum["dropped"] == {
        "gold action … cancel_order failed: ValueError: Order is delivered, only pending orders can be cancelled": 1,
        "in evaluation set mybench": 1,
        "gold actions call unknown tools […]": 1,
        "initial_state is set (replay starts from db.json as is; the release has none)": 1}
    assert shop_sum["rejected_ids"]["in evaluation set mybench"] == ["4"]
    assert "mybench" in summary["eval_sets"] and "frames" in summary["eval_sets"]
    # the tau2 domain folder: the source's files and the kept tasks, valid for tau2 itself
    dom = out / "domains" / "shop"
    assert (dom / "tools.py").read_text() == SHOP_TOOLS
    assert json.loads((dom / "db.json").read_text()) == json.loads((shop / "shop" / "db.json").read_text())
    tasks = json.loads((dom / "tasks.json").read_text())
    assert [t["id"] for t in tasks] == ["1", "2"]
    assert json.loads(tasks[1]["description"]["notes"]) == {"source": "toolscale", "difficulty": "easy",
                                                             "notes": None}
    from orchestrator.domains.tau2_env import get_tasks
    assert [t.id for t in get_tasks(dom)] == ["1", "2"]
    # the training records load in the trainer's loader, domain folder resolved from the file's folder
    examples = load_examples(str(out / "train.parquet"))
    assert [(e.id, e.kind, e.domain, e.domain_dir) for e in examples] == [
        ("shop/1", "tau2", "shop", "domains/shop"), ("shop/2", "tau2", "shop", "domains/shop")]
    loaded = load_tasks([str(out / "train.jsonl")])
    assert [t.kind for t in loaded] == ["tau2", "tau2"]
    assert loaded[1].metadata["domain_dir"] == str(dom.resolve())
    assert loaded[1].metadata["tau2_task"]["evaluation_criteria"]["actions"][1]["name"] == "cancel_order"
    assert "cancel_order" in err and "2 of 6" in err   # the printed table


def test_without_the_eval_set_the_overlapping_record_is_kept_and_allow_overlap_keeps_a_frames_copy(
        shop, tmp_path, capsys):
    rows = shop_records()[:2] + [record("9", "shop", FRAMES_Q.lower(), [("get_order_details", {"order_id": "o1"})])]
    src = write_jsonl(tmp_path / "t.jsonl", rows)
    assert question_hash(FRAMES_Q) in shipped_sets()["frames"]
    code, _ = run(["--toolscale", str(src), "--toolscale-domains", str(shop), "--out", str(tmp_path / "a")], capsys)
    assert code == 0
    dropped = json.loads((tmp_path / "a" / "summary.json").read_text())["toolscale"]["domains"]["shop"]["dropped"]
    assert dropped == {"in evaluation set frames": 1}          # the shipped FRAMES hashes always count
    code, _ = run(["--toolscale", str(src), "--toolscale-domains", str(shop), "--out", str(tmp_path / "b"),
                   "--allow-eval-overlap"], capsys)
    assert code == 0
    assert [e.id for e in load_examples(str(tmp_path / "b" / "train.jsonl"))] == ["shop/1", "shop/2", "shop/9"]


def test_a_tau2_bench_task_is_an_evaluation_set(shop, tmp_path, capsys):
    from data_synthesis.contamination import tau2_bench_sets
    try:
        from tau2.utils import DATA_DIR
    except ImportError:
        pytest.skip("the tau2 package (its tasks are the tau2-Bench evaluation set) is not installed")
    airline = json.loads((Path(DATA_DIR) / "tau2" / "domains" / "airline" / "tasks.json").read_text())
    copied = airline[0]["user_scenario"]["instructions"]["reason_for_call"]
    assert question_hash(copied) in tau2_bench_sets()["tau2-airline"]
    src = write_jsonl(tmp_path / "t.jsonl", shop_records()[:1] + [
        record("7", "shop", copied, [("get_order_details", {"order_id": "o1"})])])
    code, err = run(["--toolscale", str(src), "--toolscale-domains", str(shop), "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    dropped = json.loads((tmp_path / "o" / "summary.json").read_text())["toolscale"]["domains"]["shop"]["dropped"]
    assert dropped == {"in evaluation set tau2-airline": 1}


@pytest.mark.parametrize("path, field", [
    (("user_scenario", "instructions", "domain"), "user_scenario.instructions.domain"),
    (("user_scenario", "instructions", "unknown_info"), "user_scenario.instructions.unknown_info"),
    (("evaluation_criteria", "actions", 0, "name"), "evaluation_criteria.actions[0].name"),
    (("id",), "id"),
])
def test_a_missing_field_is_one_line_naming_record_and_field(shop, tmp_path, capsys, path, field):
    rows = shop_records()
    target = rows[1]
    for key in path[:-1]:
        target = target[key]
    del target[path[-1]]
    src = write_jsonl(tmp_path / "t.jsonl", rows)
    code, err = run(["--toolscale", str(src), "--toolscale-domains", str(shop), "--out", str(tmp_path / "o")], capsys)
    assert code == 1
    line = err.strip()
    assert "\n" not in line and line.startswith(f"error: --toolscale {src}: record ")
    assert ("record #1 (no id)" if field == "id" else "record 2:") in line
    assert f"missing field '{field}'" in line
    assert not (tmp_path / "o").exists()                     # nothing written before the check


def test_unknown_domain_stops_or_is_counted(shop, tmp_path, capsys):
    rows = shop_records()[:2] + [record("8", "weather", "Will it rain in Oslo tomorrow?", [])]
    src = write_jsonl(tmp_path / "t.jsonl", rows)
    code, err = run(["--toolscale", str(src), "--toolscale-domains", str(shop), "--out", str(tmp_path / "o")], capsys)
    assert code == 1
    assert err.count("\n") == 1 and "record 8: unknown domain 'weather'" in err and "['shop']" in err
    assert "--skip-unknown-domains" in err
    code, err = run(["--toolscale", str(src), "--toolscale-domains", str(shop), "--out", str(tmp_path / "o"),
                     "--skip-unknown-domains"], capsys)
    assert code == 0, err
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())["toolscale"]
    assert summary["domains"]["weather"] == {"toolkit": None, "generated": 1, "kept": 0, "runs": {}, "dropped": {
        "unknown domain (no folder in --toolscale-domains)": 1}, "rejected_ids": {
        "unknown domain (no folder in --toolscale-domains)": ["8"]}}
    assert summary["kept"] == 2


def test_unreadable_inputs_are_one_line(shop, tmp_path, capsys):
    cases = {}
    bad_json = tmp_path / "bad.jsonl"
    bad_json.write_text(json.dumps(shop_records()[0]) + "\n{not json\n")
    cases[str(bad_json)] = f"--toolscale {bad_json}:2: invalid JSON"
    fake_parquet = tmp_path / "fake.parquet"
    fake_parquet.write_text("this is not parquet")
    cases[str(fake_parquet)] = f"--toolscale {fake_parquet}: not a readable parquet file"
    cases[str(tmp_path / "absent.jsonl")] = "no such file or folder, and not a Hugging Face dataset id"
    (tmp_path / "empty").mkdir()
    cases[str(tmp_path / "empty")] = "the folder holds no .parquet, .jsonl or .json file"
    for source, message in cases.items():
        code, err = run(["--toolscale", source, "--toolscale-domains", str(shop), "--out", str(tmp_path / "o")],
                        capsys)
        assert code == 1 and err.count("\n") == 1 and message in err, (source, err)
    good = write_jsonl(tmp_path / "good.jsonl", shop_records()[:1])
    code, err = run(["--toolscale", str(good), "--toolscale-domains", str(tmp_path / "nope"),
                     "--out", str(tmp_path / "o")], capsys)
    assert code == 1 and "--toolscale-domains" in err and "not a folder" in err
    with pytest.raises(SystemExit):                                      # argparse: the flag is needed
        main(["--toolscale", str(good), "--out", str(tmp_path / "o")])
    assert "--toolscale needs --toolscale-domains" in capsys.readouterr().err


def test_parquet_padding_and_timestamps_are_undone_and_the_hub_path_reads_the_same(shop, tmp_path, monkeypatch):
    rows = shop_records()
    table = pa.Table.from_pylist(rows)          # as the hub stores it: arguments padded to one struct
    folder = tmp_path / "snapshot" / "data"
    folder.mkdir(parents=True)
    pq.write_table(table, folder / "train-00000-of-00001.parquet")
    (tmp_path / "snapshot" / "README.md").write_text("card")
    raw = pq.read_table(folder / "train-00000-of-00001.parquet").to_pylist()
    assert raw[0]["evaluation_criteria"]["actions"][0]["arguments"]["order_id"] is None   # the padding
    from_folder = load_records(str(tmp_path / "snapshot"))
    assert [a["arguments"] for r in from_folder for a in r["evaluation_criteria"]["actions"]] == \
        [a["arguments"] for r in rows for a in r["evaluation_criteria"]["actions"]]
    (tmp_path / "tasks.json").write_text(json.dumps(rows))            # tau2's tasks.json: a list, as written
    assert load_records(str(tmp_path / "tasks.json")) == rows
    assert arrow_row({"evaluation_criteria": {"actions": [{"arguments": {
        "start_date": dt.datetime(2025, 8, 1), "at": dt.datetime(2025, 8, 1, 9, 30), "x": None}}]}}) == \
        {"evaluation_criteria": {"actions": [{"arguments": {"start_date": "2025-08-01", "at": "2025-08-01T09:30:00"}}]}}

    import datasets
    calls = []

    def fake_hub(dataset_id, split):   # the hub, served from the local snapshot
        calls.append((dataset_id, split))
        return datasets.Dataset.from_parquet(str(folder / "train-00000-of-00001.parquet"))

    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    assert load_records("nvidia/ToolScale") == from_folder and calls == [("nvidia/ToolScale", "train")]

    def offline(dataset_id, split):
        raise ConnectionError("Couldn't reach 'nvidia/ToolScale' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"^--toolscale nvidia/ToolScale: cannot load it from the Hugging Face hub "
                                         r"\(ConnectionError: .*huggingface-cli download nvidia/ToolScale"):
        load_records("nvidia/ToolScale")


# ------------------------------------------------------------------ the shared ToolScale databases
@pytest.fixture(scope="module")
def bank_rows():
    if not (SHARED / "bank" / "db.json").is_file():
        pytest.skip(f"{SHARED} absent (the shared ToolScale databases, ../shared/benchmarks/toolscale)")
    db = json.loads((SHARED / "bank" / "db.json").read_text())
    emails = Counter(c["contact"]["email"] for c in db["clients"].values())
    client = next(c for c in db["clients"].values() if emails[c["contact"]["email"]] == 1)
    loan = next(ln for ln in db["loans"].values() if ln["client_id"] == client["client_id"])
    other = next(s for s in ("active", "delinquent") if s != loan["status"])
    movie = json.loads((SHARED / "movie" / "db.json").read_text())
    booking = next(iter(movie["bookings"].values()))
    email = client["contact"]["email"]
    return [
        record("101", "bank", "You want to see your client profile.",
               [("find_client_ids_by_email", {"email": email}), ("get_client_details", {"client_id": client["client_id"]})]),
        record("102", "bank", f"Your loan {loan['loan_id']} should be marked {other}.",
               [("get_loan_details", {"loan_id": loan["loan_id"]}),
                ("update_loan_status", {"loan_id": loan["loan_id"], "status": other})]),
        record("103", "bank", "You want your profile, but give a wrong id.",
               [("get_client_details", {"client_id": "NOSUCHID"})]),
        # upstream's tool names: the release ships no tool code, the generic toolkit lacks this one
        record("104", "bank", "You want your client id.", [("find_client_id_by_email", {"email": email})]),
        record("105", "bank", FRAMES_Q, [("get_client_details", {"client_id": client["client_id"]})]),
        record("201", "movie", "You want to check your booking.",
               [("get_booking_details", {"booking_id": booking["booking_id"]})]),
    ]


def test_shared_domains_replay_gold_actions_on_the_real_databases(bank_rows, tmp_path, capsys):
    src = tmp_path / "toolscale.parquet"
    pq.write_table(pa.Table.from_pylist(bank_rows), src)
    out = tmp_path / "out"
    code, err = run(["--toolscale", str(src), "--toolscale-domains", str(SHARED), "--out", str(out)], capsys)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())["toolscale"]
    bank, movie = summary["domains"]["bank"], summary["domains"]["movie"]
    assert (bank["generated"], bank["kept"], movie["generated"], movie["kept"]) == (5, 2, 1, 1)
    assert bank["toolkit"].startswith("generic toolkit derived from db.json")
    assert (bank["runs"], movie["runs"]) == ({"generic": 2}, {"generic": 1})
    assert bank["dropped"] == {"gold action … get_client_details failed: ValueError: client … not found (ids look like …, …)": 1,
                               "gold actions call unknown tools […]": 1, "in evaluation set frames": 1}
    assert bank["rejected_ids"]["gold actions call unknown tools […]"] == ["104"]
    # the write task changes the real database copy in the output folder only when replayed
    assert json.loads((out / "domains" / "bank" / "db.json").read_text()) == \
        json.loads((SHARED / "bank" / "db.json").read_text())
    assert (out / "domains" / "bank" / "policy.md").read_text() == (SHARED / "bank" / "policy.md").read_text()
    loaded = load_tasks([str(out / "train.parquet")])
    assert sorted(t.id for t in loaded) == ["bank/101", "bank/102", "movie/201"]
    assert {t.metadata["difficulty"] for t in loaded} == {"easy"}
