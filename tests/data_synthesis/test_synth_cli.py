"""The synthesize CLI: deterministic bytes across processes, summary, clear errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from data_synthesis.synthesize import main

REPO = Path(__file__).resolve().parents[2]


def _run(out: Path, hash_seed: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    cmd = [sys.executable, "-m", "data_synthesis.synthesize", "--domain-dir", "school", "--out", str(out),
           "--num-tasks", "30", "--seed", "11", *extra]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_two_runs_write_identical_bytes(tmp_path):
    # different hash seeds: no output may depend on set/dict-of-str iteration order
    a, b = _run(tmp_path / "a", "1"), _run(tmp_path / "b", "2")
    assert a.returncode == 0 and b.returncode == 0, a.stderr[-2000:] + b.stderr[-2000:]
    files = _files(tmp_path / "a")
    assert set(files) == {"schema.yaml", "db.json", "tools.py", "policy.md", "tasks.json", "summary.json",
                          "dataset/train.parquet", "dataset/train.jsonl", "dataset/README.md"}
    assert files == _files(tmp_path / "b")
    summary = json.loads(files["summary.json"])
    assert summary["kept"] == 30 and len(json.loads(files["tasks.json"])) == 30
    assert summary["generated"] == 30 + sum(summary["dropped"].values())
    assert "--out" not in summary["command"] and "kept" in a.stdout and "generated" in a.stdout


def test_errors_name_the_problem(tmp_path, capsys):
    assert main(["--domain-dir", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o"), "--num-tasks", "3"]) == 1
    err = capsys.readouterr().err
    assert "nowhere: no such folder or schema file" in err and "school" in err
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "db.json").write_text('{"users": []}')
    assert main(["--domain-dir", str(tmp_path / "d"), "--out", str(tmp_path / "o"), "--num-tasks", "3"]) == 1
    assert "db.json: $.users: a collection must be an object keyed by record id" in capsys.readouterr().err


def test_existing_db_folder_with_fake_records(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    db = {"users": {f"u{i}": {"user_id": f"u{i}", "email": f"p{i}@x.org", "tier": ["a", "b"][i % 2]}
                    for i in range(9)},
          "orders": {f"o{i}": {"order_id": f"o{i}", "user_id": f"u{i % 9}", "status": ["new", "paid", "sent"][i % 3]}
                     for i in range(18)}}
    (src / "db.json").write_text(json.dumps(db))
    assert main(["--domain-dir", str(src), "--out", str(tmp_path / "kept"), "--num-tasks", "10", "--no-dataset"]) == 0
    assert json.loads((tmp_path / "kept" / "db.json").read_text()) == db
    assert main(["--domain-dir", str(src), "--out", str(tmp_path / "faked"), "--num-tasks", "10", "--fake",
                 "--records", "5", "--no-dataset"]) == 0
    faked = json.loads((tmp_path / "faked" / "db.json").read_text())
    assert {c: len(v) for c, v in faked.items()} == {"users": 5, "orders": 5} and faked != db
    assert len(json.loads((tmp_path / "faked" / "tasks.json").read_text())) == 10
