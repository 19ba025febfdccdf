"""run_gaia.py end to end: a GAIA-format folder with attached files (tests/_gaia_sample.py), the
orchestrator, experts and judge served by evaluation.mock_backend over real HTTP, GAIA's scorer
as the judge, records, per-level report, the leaderboard's submission file; and the embedded
default (SmolLM2, no key) on two tasks."""
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from _gaia_sample import TEST, VALIDATION, write_gaia
from evaluation.mock_backend import MockBackend, registry_yaml

REPO = Path(__file__).resolve().parents[2]
ANSWERS = {VALIDATION[0]["Question"]: "42", VALIDATION[1]["Question"]: "Paris", VALIDATION[2]["Question"]: "2, 3, 5",
           VALIDATION[3]["Question"]: "sea gull", TEST[0]["Question"]: "3", TEST[1]["Question"]: "Danube"}
IDS = [r["task_id"] for r in VALIDATION]


@pytest.fixture(scope="module")
def backend():
    with MockBackend(answers=ANSWERS, wrong={VALIDATION[2]["Question"]}) as server:
        yield server


@pytest.fixture()
def env(tmp_path, backend, monkeypatch, capsys):
    models = tmp_path / "models.yaml"
    models.write_text(registry_yaml(backend.base_url, ["mock-orch", "mock-expert"]))
    tools = json.loads((REPO / "tools.json").read_text())
    tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv("TAVILY_API_KEY", raising=False)
    monkeypatch.chdir(tmp_path)
    return {"tools": tmp_path / "tools.json", "data": write_gaia(tmp_path / "GAIA"), "tmp": tmp_path, "capsys": capsys}


def run(env, *args):
    """run_gaia.py's main() in this process, every model on the mock server, the profile's judge (gaia)."""
    from evaluation.qa_cli import main

    argv = ["--tools", str(env["tools"]), "--profile", "default", "--serve", "mock", "--model", "mock-orch",
            "--no-progress", *map(str, args)]
    env["capsys"].readouterr()
    code = main("gaia", argv)
    out, err = env["capsys"].readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_validation_run_scores_with_gaias_scorer_per_level_and_writes_the_submission(env):
    out = env["tmp"] / "val"
    proc = run(env, "--data", env["data"], "--output", out)
    assert proc.returncode == 0, proc.stderr
    assert "judge gaia" in proc.stdout and "4 tasks" in proc.stdout
    records = {r["id"]: r for r in lines(out / "results.jsonl")}
    assert sorted(records) == sorted(IDS)
    # the code task: the mock's code prints 42, its answer expert answers 42; GAIA's scorer decides
    assert {i: (r["prediction"], r["correct"], r["verdict"]["rule"]) for i, r in records.items()} == {
        IDS[0]: ("42", True, "gaia"), IDS[1]: ("Paris", True, "gaia"), IDS[2]: ("no idea", False, "not_gaia"),
        IDS[3]: ("sea gull", True, "gaia")}        # "sea gull" == "seagull": whitespace is normalised away
    assert records[IDS[0]]["meta"] == {"level": 2, "file_name": VALIDATION[0]["file_name"]}
    assert "Attached file: " + VALIDATION[0]["file_name"] in records[IDS[0]]["question"]
    config = json.loads((out / "run_config.json").read_text())
    assert (config["judge_model"], config["text_only"], config["level"]) == ("gaia", False, None)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accuracy"] == 0.75 and summary["unscored"] == 0
    assert summary["accuracy_by_level"] == {"1": 0.5, "2": 1.0, "3": 1.0}
    assert "L1 50.0, L2 100.0, L3 100.0" in proc.stdout
    # the leaderboard's file: task_id, model_answer, reasoning_trace, one line per task
    rows = lines(out / "gaia_submission.jsonl")
    assert sorted((r["task_id"], r["model_answer"]) for r in rows) == sorted((i, records[i]["prediction"]) for i in IDS)
    assert all(set(r) == {"task_id", "model_answer", "reasoning_trace"} for r in rows)
    trace = next(r["reasoning_trace"] for r in rows if r["task_id"] == IDS[0])
    assert "enhance_reasoning(reasoner-2" in trace and trace.endswith("final answer: 42")
    assert f"GAIA submission: {out / 'gaia_submission.jsonl'}" in proc.stdout
    assert "the validation split has 165" in proc.stdout      # a partial split is said to be one


def test_test_split_is_answered_not_scored(env):
    out = env["tmp"] / "test"
    proc = run(env, "--data", env["data"], "--split", "test", "--output", out)
    assert proc.returncode == 0, proc.stderr
    records = lines(out / "results.jsonl")
    assert [(r["status"], r["reference"], r["correct"], r["verdict"]["rule"]) for r in records] == \
        [("ok", None, None, "no_reference")] * 2
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accuracy"] is None and summary["unscored"] == 2 and summary["errors"] == 0
    assert "[2 unscored: no reference]" in proc.stdout
    assert sorted((r["task_id"], r["model_answer"]) for r in lines(out / "gaia_submission.jsonl")) == \
        sorted([(TEST[0]["task_id"], "3"), (TEST[1]["task_id"], "Danube")])


def test_level_text_only_and_a_missing_attachment(env):
    proc = run(env, "--data", env["data"], "--output", env["tmp"] / "text", "--text-only", "--no-report")
    assert proc.returncode == 0 and "2 tasks, 2 skipped (attached file)" in proc.stdout
    assert {r["id"] for r in lines(env["tmp"] / "text" / "results.jsonl")} == {IDS[1], IDS[2]}
    proc = run(env, "--data", env["data"], "--output", env["tmp"] / "l3", "--level", "3", "--no-report")
    assert proc.returncode == 0 and "1 tasks, 3 skipped (other level)" in proc.stdout
    (env["data"] / "2023" / "validation" / VALIDATION[0]["file_name"]).unlink()
    proc = run(env, "--data", env["data"], "--output", env["tmp"] / "missing")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("error: --data ") and "1 attached file(s) named in 'file_name' are missing" in proc.stderr


def test_report_writes_the_submission_where_asked(env):
    out = env["tmp"] / "rep"
    assert run(env, "--data", env["data"], "--output", out, "--level", "1", "--no-report").returncode == 0
    from evaluation.report import main as report_main

    target = env["tmp"] / "sub" / "mine.jsonl"
    assert report_main([str(out), "--no-viewer", "--gaia-submission", str(target)]) == 0
    assert target.read_text() == (out / "gaia_submission.jsonl").read_text()
    assert sorted(r["task_id"] for r in lines(target)) == sorted([IDS[1], IDS[2]])
    with pytest.raises(SystemExit):
        report_main([str(out), str(out), "--gaia-submission", str(target)])


def test_tavily_is_the_search_when_its_key_is_set(env, monkeypatch):
    pytest.importorskip("tavily", reason="the web search needs tavily-python")
    from tavily_emulator import TavilyEmulator

    proc = run(env, "--data", env["data"], "--output", env["tmp"] / "nokey", "--limit", 1, "--no-report")
    assert "no --retriever/--index and no TAVILY_API_KEY: the search tool is not offered" in proc.stderr
    with TavilyEmulator({"https://example.org/louvre": "The Louvre is in Paris."}) as api:
        monkeypatch.setenv("TAVILY_API_KEY", "tvly-test")
        monkeypatch.setenv("TAVILY_API_BASE_URL", api.base_url)
        proc = run(env, "--data", env["data"], "--output", env["tmp"] / "web", "--limit", 1, "--no-report")
    assert proc.returncode == 0 and "search: Tavily web search (TAVILY_API_KEY set" in proc.stdout
    assert json.loads((env["tmp"] / "web" / "run_config.json").read_text())["retriever"] == "tavily"


@pytest.mark.slow
def test_embedded_default_runs_two_gaia_tasks_without_keys(tmp_path):
    """`python evaluation/run_gaia.py --limit 2` with no key: the toy world as a GAIA split (one task
    with an attached CSV file, one lookup), SmolLM2 in process, the gaia judge, the submission."""
    environ = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "TAVILY_API_KEY",
                                                                "TOOLORCHESTRA_MODELS")}
    out = tmp_path / "gaia-embedded"
    proc = subprocess.run([sys.executable, str(REPO / "evaluation" / "run_gaia.py"), "--limit", "2", "--output", str(out),
                           "--no-progress"], capture_output=True, text=True, timeout=1200, cwd=tmp_path, env=environ)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "setting: embedded default; profile local" in proc.stdout and "judge gaia" in proc.stdout
    records = lines(out / "results.jsonl")
    assert len(records) == 2 and all(r["verdict"]["judge_model"] == "gaia" for r in records if r["status"] == "ok")
    attached = [r for r in records if r["meta"]["file_name"]]
    assert len(attached) == 1 and attached[0]["meta"]["level"] == 2
    folder = out / "world" / "gaia" / "2023" / "validation"
    assert (folder / attached[0]["meta"]["file_name"]).read_text().startswith("a,b,c\n")
    assert [r["task_id"] for r in lines(out / "gaia_submission.jsonl")] == [r["id"] for r in records]
