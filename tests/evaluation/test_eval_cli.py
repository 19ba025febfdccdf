"""run_frames.py / run_hle.py end to end against a local OpenAI-compatible server (real HTTP).

The orchestrator, the experts (through a tools.json profile) and the judge are all served
by evaluation.mock_backend; the gateway, loop, sandbox, judge, runner and report are real.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from evaluation.mock_backend import MockBackend, registry_yaml
from orchestrator.catalog import load_catalog
from orchestrator.records import Usage

REPO = Path(__file__).resolve().parents[2]
SHARED_FRAMES = REPO.parent / "shared" / "benchmarks" / "frames" / "frames.jsonl"
RECORDS = [{"id": "f1", "question": "Which city hosts the Louvre?", "answer": "Paris"},
           {"id": "f2", "question": "What is the capital of Japan?", "answer": "Tokyo"},
           {"id": "f3", "question": "Who wrote Hamlet?", "answer": "William Shakespeare"},
           {"id": "f4", "question": "How many legs has a spider?", "answer": "8"}]
ANSWERS = {r["question"]: r["answer"] for r in RECORDS}


@pytest.fixture(scope="module")
def backend():
    with MockBackend(answers=ANSWERS, fail={"How many legs has a spider?"},
                     wrong={"Who wrote Hamlet?"}) as server:
        yield server


@pytest.fixture()
def env(tmp_path, backend, monkeypatch, capsys):
    """A registry and a tools.json profile sending every model to the mock server."""
    models = tmp_path / "models.yaml"
    models.write_text(registry_yaml(backend.base_url, ["mock-orch", "mock-expert", "mock-judge"]))
    tools = json.loads((REPO / "tools.json").read_text())
    tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    data = tmp_path / "frames.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS) + "{broken\n")
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(models))   # restored after the test (--endpoint changes it)
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.chdir(tmp_path)
    return {"models": models, "tools": tmp_path / "tools.json", "data": data, "tmp": tmp_path, "capsys": capsys}


def run(script, env, *args, subprocess_run=False):
    """The script as a user runs it (subprocess), or its main() in this process (faster)."""
    argv = ["--tools", str(env["tools"]), "--profile", "default", "--serve", "mock", "--model", "mock-orch", "--judge-model", "mock-judge",
            "--no-progress", *map(str, args)]
    if subprocess_run:
        return subprocess.run([sys.executable, str(REPO / "evaluation" / script), *argv], capture_output=True,
                              text=True, timeout=120, cwd=env["tmp"], env=dict(os.environ))
    from evaluation.qa_cli import main

    env["capsys"].readouterr()
    code = main(script.removeprefix("run_").removesuffix(".py"), argv)
    out, err = env["capsys"].readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def records(out):
    return {r["id"]: r for r in map(json.loads, (out / "results.jsonl").read_text().splitlines())}


def test_frames_all_tools_records_costs_errors_and_report(env):
    out = env["tmp"] / "run"
    proc = run("run_frames.py", env, "--data", env["data"], "--output", out, "--concurrency", 3, subprocess_run=True)
    assert proc.returncode == 0, proc.stderr
    assert "4 tasks, 1 malformed" in proc.stdout and "frames.jsonl:5: invalid JSON" in proc.stderr
    recs = records(out)
    assert set(recs) == {"f1", "f2", "f3", "f4"}
    assert recs["f1"]["correct"] and recs["f1"]["verdict"]["rule"] == "exact"
    assert recs["f3"]["correct"] is False and recs["f3"]["verdict"]["rule"] == "llm"
    assert recs["f3"]["verdict"]["raw"] == "False" and recs["f3"]["prediction"] == "no idea"
    assert recs["f4"]["status"] == "error" and "LLMCallError" in recs["f4"]["error"]

    # f1: code then answer; costs priced as the alias's model although mock-expert served them
    catalog, r = load_catalog(env["tools"]), recs["f1"]
    assert [t["tool"] for t in r["turns"]] == ["enhance_reasoning", "answer"]
    assert r["tool_calls"] == {"reasoner-2": 1, "answer-1": 1}
    assert r["expert_models"] == {"gpt-5-mini": 1, "gpt-5": 1}
    assert "42" in r["turns"][0]["output"]            # the real sandbox ran the expert's code
    for turn, model in zip(r["turns"], ["gpt-5-mini", "gpt-5"]):
        pol = Usage(turn["policy_tokens"]["prompt"], turn["policy_tokens"]["completion"])
        exp = Usage(turn["tokens"]["prompt"] - pol.prompt_tokens, turn["tokens"]["completion"] - pol.completion_tokens)
        expected = catalog.llm_cost("Qwen3-8B", pol) + catalog.llm_cost(model, exp)
        code_fee = turn["cost"] - expected
        assert 0 <= code_fee < 1e-3 and (turn["tool"] == "enhance_reasoning" or code_fee == pytest.approx(0, abs=1e-15))
    assert r["cost"] == pytest.approx(sum(t["cost"] for t in r["turns"]), rel=1e-12)

    summary = json.loads((out / "summary.json").read_text())
    assert (summary["answered"], summary["errors"], summary["correct"]) == (3, 1, 2)
    assert summary["accuracy"] == pytest.approx(2 / 3)
    assert (out / "viewer.html").exists() and (out / "cost_accuracy.png").exists()
    config = json.loads((out / "run_config.json").read_text())
    assert (config["price_model"], config["serve"], config["pricing"]) == ("Qwen3-8B", "mock", "as_alias")
    assert "66.7" in proc.stdout and "Tool mix" in proc.stdout


def test_resume_skips_done_and_refuses_changed_settings(env):
    out = env["tmp"] / "run"
    assert run("run_frames.py", env, "--data", env["data"], "--output", out, "--limit", 2, "--no-report").returncode == 0
    proc = run("run_frames.py", env, "--data", env["data"], "--output", out, "--limit", 2)
    assert proc.returncode == 2 and "--resume" in proc.stderr
    proc = run("run_frames.py", env, "--data", env["data"], "--output", out, "--resume", "--no-report")
    assert proc.returncode == 0 and "(2 already done)" in proc.stdout
    assert len((out / "results.jsonl").read_text().splitlines()) == 4
    proc = run("run_frames.py", env, "--data", env["data"], "--output", out, "--resume", "--mode", "none")
    assert proc.returncode == 2 and "mode: 'all' -> 'none'" in proc.stderr


def test_no_tools_and_basic_tools_modes(env):
    out = env["tmp"] / "none"
    assert run("run_frames.py", env, "--data", env["data"], "--output", out, "--mode", "none", "--limit", 2,
               "--no-report").returncode == 0
    r = records(out)["f2"]
    assert r["correct"] and r["tool_calls"] == {} and r["stop_reason"] == "direct" and len(r["turns"]) == 1
    catalog = load_catalog(env["tools"])
    usage = Usage(r["tokens"]["prompt"], r["tokens"]["completion"])
    assert r["cost"] == pytest.approx(catalog.llm_cost("Qwen3-8B", usage), rel=1e-12)

    out = env["tmp"] / "basic"
    assert run("run_frames.py", env, "--data", env["data"], "--output", out, "--mode", "basic", "--limit", 2,
               "--no-report").returncode == 0
    r = records(out)["f2"]
    assert r["correct"] and r["expert_models"] == {"Qwen3-8B": 2}    # every alias is the orchestrator itself
    for turn in r["turns"]:
        tokens_cost = catalog.llm_cost("Qwen3-8B", Usage(turn["tokens"]["prompt"], turn["tokens"]["completion"]))
        if turn["tool"] == "answer":
            assert turn["cost"] == pytest.approx(tokens_cost, rel=1e-12)
        else:   # plus the sandbox's seconds at $8.3e-6/s (under a minute)
            assert 0 < turn["cost"] - tokens_cost < 60 * catalog.fees.code_per_second


def test_hle_script_skips_image_questions(env):
    data = env["tmp"] / "hle.jsonl"
    rows = [{"id": "h1", "question": "What is the capital of Japan?", "answer": "Tokyo", "image": "",
             "answer_type": "exactMatch", "category": "Other"},
            {"id": "h2", "question": "What is in the picture?", "answer": "cat", "image": "data:image/png;base64,AA"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = env["tmp"] / "hle"
    proc = run("run_hle.py", env, "--data", data, "--output", out, "--no-report", subprocess_run=True)
    assert proc.returncode == 0, proc.stderr
    assert "1 tasks, 1 skipped (image)" in proc.stdout
    assert records(out)["h1"]["correct"] and records(out)["h1"]["meta"]["category"] == "Other"


@pytest.mark.skipif(not SHARED_FRAMES.exists(), reason=f"{SHARED_FRAMES} absent (the ../shared folder is not here)")
def test_frames_script_on_real_frames_records(env):
    out = env["tmp"] / "real"
    proc = run("run_frames.py", env, "--data", SHARED_FRAMES, "--limit", 3, "--output", out, "--no-report")
    assert proc.returncode == 0, proc.stderr
    recs = records(out)
    assert set(recs) == {"wiki____0", "wiki____1", "wiki____2"}
    # the mock does not know these questions: the answer expert says "I do not know", judged False
    assert all(r["status"] == "ok" and r["correct"] is False for r in recs.values())


def test_bad_flags_are_one_line_errors(env):
    proc = run("run_frames.py", env, "--data", env["data"], "--concurrency", 0)
    assert proc.returncode == 2 and proc.stderr.strip() == "error: --concurrency must be >= 1, got 0"
    proc = run("run_frames.py", env, "--data", env["tmp"] / "nope.jsonl")
    assert proc.returncode == 2 and "no such file" in proc.stderr and "Traceback" not in proc.stderr
    proc = run("run_hle.py", env, "--data", env["data"], "--price-model", "gpt-7")
    assert proc.returncode == 2 and "'gpt-7' has no row in the tools.json price table" in proc.stderr
    served = env["tmp"] / "served.yaml"   # the mock map's mock-expert has no price row to charge at
    served.write_text("extends: default\npricing: as_served\n")
    proc = run("run_frames.py", env, "--data", env["data"], "--profile", served)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "the profile's pricing: as_served charges each expert call at its served model's price, but tools.json " \
           "has no price for ['mock-expert'] (served under profiles.mock)" in proc.stderr


def test_endpoint_flag_serves_the_orchestrator_from_a_url(env, backend):
    """--model names a price-table model; --endpoint says where it is served (no registry edit)."""
    before = backend.requests
    # run() passes --model mock-orch first; the later --model wins
    proc = run("run_frames.py", env, "--data", env["data"], "--limit", 1, "--output", env["tmp"] / "endpoint2",
               "--no-report", "--endpoint", backend.base_url, "--model", "Qwen3-8B")
    assert proc.returncode == 0, proc.stderr
    config = json.loads((env["tmp"] / "endpoint2" / "run_config.json").read_text())
    assert config["model"] == "Qwen3-8B" and config["price_model"] == "Qwen3-8B"
    registry = (env["tmp"] / "endpoint2" / "models.yaml").read_text()
    assert f"base_url: {backend.base_url}" in registry and "mock-expert" in registry
    assert records(env["tmp"] / "endpoint2")["f1"]["correct"] and backend.requests > before


def _changed_tools(env):
    tools = json.loads(env["tools"].read_text())
    tools["prices"]["gpt-5"]["output"] = 11.0
    path = env["tmp"] / "tools2.json"
    path.write_text(json.dumps(tools))
    return path


def _changed_prompts(env):
    folder = env["tmp"] / "prompts"
    folder.mkdir(exist_ok=True)
    (folder / "system.txt").write_text((REPO / "orchestrator" / "prompts" / "system.txt").read_text() + "\nBe brief.")
    return folder


def _changed_judge_prompt(env):
    path = env["tmp"] / "judge.txt"
    path.write_text((REPO / "orchestrator" / "prompts" / "judge.txt").read_text() + "\nBe strict.")
    return path


@pytest.mark.parametrize("flags, key", [
    (lambda env: ["--judge-model", "mock-orch"], "judge_model"),
    (lambda env: ["--judge-prompt", _changed_judge_prompt(env)], "judge_prompt_sha256"),
    (lambda env: ["--tools", _changed_tools(env)], "catalog_sha256"),
    (lambda env: ["--prompts", _changed_prompts(env)], "prompts_sha256"),
    (lambda env: ["--max-turns", 7], "max_turns"),
    (lambda env: ["--max-tokens", 99], "max_tokens"),
    (lambda env: ["--expert-max-tokens", 99], "expert_max_tokens"),
    (lambda env: ["--constrained"], "constrained"),
    (lambda env: ["--topk", 5], "topk"),
    (lambda env: ["--temperature", 0.0], "temperature"),
])
def test_resume_refuses_any_setting_that_changes_records(env, flags, key):
    out = env["tmp"] / "run"
    base = ["--data", env["data"], "--output", out, "--limit", 1, "--no-report"]
    assert run("run_frames.py", env, *base).returncode == 0
    first = json.loads((out / "run_config.json").read_text())
    proc = run("run_frames.py", env, *base, "--limit", 2, "--resume", *flags(env))
    assert proc.returncode == 2 and f"{key}: " in proc.stderr and "--force" in proc.stderr
    assert json.loads((out / "run_config.json").read_text()) == first     # untouched by the refused resume
    # --force continues and writes what changed to the run's log
    proc = run("run_frames.py", env, *base, "--limit", 2, "--resume", "--force", *flags(env))
    assert proc.returncode == 0 and "(1 already done)" in proc.stdout
    log = (out / "run.log").read_text().splitlines()
    assert len(log) == 2 and " start" in log[0] and "forced over changed settings" in log[1] and f"{key}: " in log[1]
    history = json.loads((out / "run_config.json").read_text())["history"]   # the first record's settings stay
    assert len(history) == 1 and history[0]["config"] == first and history[0]["records"] == 1
    assert key in history[0]["changed"] and history[0]["forced"] is True


def test_resume_of_the_same_command_always_works(env):
    out = env["tmp"] / "run"
    base = ["--data", env["data"], "--output", out, "--limit", 1, "--no-report"]
    assert run("run_frames.py", env, *base).returncode == 0
    for _ in range(2):
        proc = run("run_frames.py", env, *base, "--resume")
        assert proc.returncode == 0, proc.stderr
    assert (out / "run.log").read_text().count(" resume\n") == 2
    proc = run("run_frames.py", env, *base, "--force")
    assert proc.returncode == 2 and "--force needs --resume" in proc.stderr


def test_embedded_world_resumes_without_rebuilding(tmp_path):
    """Each start of the embedded default writes its world again; the index is kept (by content)."""
    import os

    from evaluation.qa_cli import embedded_world

    tasks, index = embedded_world(tmp_path, 4)
    corpus = tmp_path / "world" / "corpus.jsonl"
    state = (index / "build_state.json").read_text()
    built = {p.name: p.stat().st_mtime_ns for p in index.iterdir() if p.is_file() and p.name != "build_state.json"}
    os.utime(corpus, ns=(1, 1))                      # same bytes, other mtime (a copy, a checkout)
    embedded_world(tmp_path, 4)                       # today: BuildError "different corpus"
    embedded_world(tmp_path, 4)
    assert {n: (index / n).stat().st_mtime_ns for n in built} == built      # nothing rebuilt
    assert json.loads((index / "build_state.json").read_text())["corpus"]["sha256"] == \
        json.loads(state)["corpus"]["sha256"]
    corpus.write_text(corpus.read_text().replace("a", "b", 1))   # a real change is still refused
    from retrieval.build_index import BuildError, build
    with pytest.raises(BuildError, match="different corpus"):
        build(corpus=corpus, out=index, progress=False)


def test_a_forced_resume_keeps_the_settings_earlier_records_were_written_under(tmp_path):
    """run_config.json keeps, under `history`, each config a resume replaced: when, how many
    records it had written, what changed; so the file still describes every record."""
    from evaluation.cli import prepare_output

    first = {"model": "m", "max_turns": 1, "concurrency": 4}
    prepare_output(tmp_path, first, resume=False)
    (tmp_path / "results.jsonl").write_text('{"id": "a"}\n{"id": "b"}\n')
    second = {"model": "m", "max_turns": 7, "concurrency": 4}
    prepare_output(tmp_path, second, resume=True, force=True)
    saved = json.loads((tmp_path / "run_config.json").read_text())
    assert {k: saved[k] for k in second} == second
    (entry,) = saved["history"]
    assert {k: entry["config"][k] for k in first} == first and "history" not in entry["config"]
    assert entry["records"] == 2 and entry["forced"] is True and entry["until"].endswith("Z")
    assert entry["changed"] == {"max_turns": {"from": 1, "to": 7}}
    # a resume with the same settings (or only uncompared ones changed) keeps the history as it is
    prepare_output(tmp_path, {**second, "concurrency": 8}, resume=True)
    again = json.loads((tmp_path / "run_config.json").read_text())
    assert again["history"][0] == entry and len(again["history"]) == 2
    assert again["history"][1]["changed"] == {"concurrency": {"from": 4, "to": 8}}
    assert again["history"][1]["forced"] is False
    prepare_output(tmp_path, {**second, "concurrency": 8}, resume=True)
    assert json.loads((tmp_path / "run_config.json").read_text())["history"] == again["history"]


def _argv(env, *args) -> list[str]:
    return ["--tools", str(env["tools"]), "--profile", "default", "--serve", "mock", "--model", "mock-orch",
            "--judge-model", "mock-judge", "--no-progress", *map(str, args)]


def test_a_second_run_on_a_folder_in_use_is_refused_naming_the_owner(env, backend):
    """Two run_frames.py on one --output used to both write (each task id twice).  The first owns the
    folder (a lock on its .lock file) until it ends; the second is refused in one line naming the
    first's pid and writes nothing there; the first's records are each there once."""
    out = env["tmp"] / "run"
    backend.delay_s = 0.5          # the first run is still going when the second starts
    try:
        first = subprocess.Popen([sys.executable, str(REPO / "evaluation" / "run_frames.py"),
                                  *_argv(env, "--data", env["data"], "--output", out, "--concurrency", 1, "--no-report")],
                                 cwd=env["tmp"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lock = out / ".lock"
        deadline = time.monotonic() + 120
        while not (lock.exists() and lock.read_text().strip() == str(first.pid)):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = run("run_frames.py", env, "--data", env["data"], "--output", out, "--resume", "--force")
        still_running = first.poll() is None
        _, first_err = first.communicate(timeout=120)
    finally:
        backend.delay_s = 0.0
    assert still_running
    assert second.returncode == 2 and second.stdout.count("\n") <= 1, (second.stdout, second.stderr)
    line = second.stderr.strip()
    assert "\n" not in line and len(line) <= 200, line
    assert line.startswith("error: --output ") and f"is in use by process {first.pid}" in line, line
    assert "choose another --output" in line
    assert first.returncode == 0, first_err
    ids = [json.loads(x)["id"] for x in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(ids) == ["f1", "f2", "f3", "f4"]                      # once each
    assert (out / "run.log").read_text().count("\n") == 1               # only the first run started there
    # once the first has ended the folder is free again: the same command resumes it
    assert run("run_frames.py", env, "--data", env["data"], "--output", out, "--resume", "--no-report").returncode == 0


def test_a_folder_of_another_benchmark_is_refused_even_with_resume_force(env):
    """`--resume --force` on a HLE run folder as GAIA mixed HLE ids into the GAIA submission; now it is
    refused before anything is written (GAIA's embedded world would be the first thing)."""
    data = env["tmp"] / "hle.jsonl"
    data.write_text(json.dumps({"id": "h1", "question": "What is the capital of Japan?", "answer": "Tokyo",
                                "image": "", "answer_type": "exactMatch", "category": "Other"}) + "\n")
    out = env["tmp"] / "hle"
    assert run("run_hle.py", env, "--data", data, "--output", out, "--no-report").returncode == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    proc = run("run_gaia.py", env, "--output", out, "--resume", "--force", "--no-report")
    line = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in line and len(line) <= 200, proc.stderr
    assert "holds a hle run; a gaia run cannot use it, even with --resume --force: choose another --output" in line
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert not (out / "world").exists()
