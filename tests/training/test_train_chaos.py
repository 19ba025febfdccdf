"""Training under chaos (issue 28 item 3), at the tiny world's scale on CPU: a real training
subprocess signalled (SIGTERM, SIGKILL) at chosen moments inside a checkpoint write; the run is
then resumed as the babysitter resumes it (the same command, `run.resume: auto`) and its final
weights are compared, bit for bit, with an uninterrupted run's.

The pause points are patched into the subprocess only (`CHAOS_SCRIPT`): a save of step
`CHAOS_STEP` stops at `CHAOS_STAGE`, writes `<dir>/paused`, and waits for `<dir>/release`, so
the test signals the trainer while the write is half done, deterministically.
"""
from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from _train_world import TOOLS, build_policy, fake_runtime, overrides
from safetensors.torch import load_file

from orchestrator.records import LLMResponse, Usage
from training import checkpoint as ckpt
from training.config import load_config
from training.metrics_log import read_metrics

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
SETTINGS = {"trainer.total_steps": STEPS, "trainer.save_every": 1, "run.threads": 1}

CHAOS_SCRIPT = """
import os, sys, time
sys.path[:0] = [{root!r}, {tests!r}]
from pathlib import Path
from _train_world import fake_runtime, overrides
from training import checkpoint as ckpt
from training.config import load_config
from training.session import run

root, policy, tasks, chaos = Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4])
stage, at_step = os.environ.get("CHAOS_STAGE", ""), int(os.environ.get("CHAOS_STEP", "0"))
saving = []

def pause(where):
    if saving and saving[-1] == at_step and where == stage and not (chaos / "paused").exists():
        (chaos / "paused").write_text(str(os.getpid()))
        deadline = time.monotonic() + 120
        while not (chaos / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.05)

def hooked(name, fn):
    def call(*a, **kw):
        pause(name)           # the files before this call are written, what it writes is not
        return fn(*a, **kw)
    return call

save = ckpt.save_checkpoint
def save_checkpoint(root_, step, *a, **kw):
    saving.append(step)
    try:
        return save(root_, step, *a, **kw)
    finally:
        saving.pop()
ckpt.save_checkpoint = save_checkpoint
ckpt._sha256 = hooked("files", ckpt._sha256)              # weights + state written, no manifest yet
ckpt._fsync_tree = hooked("manifest", ckpt._fsync_tree)    # manifest written, folder not renamed
rename = Path.rename
def rename_then_pause(self, target):
    out = rename(self, target)
    if ".old-" in Path(target).name:                        # re-save: the old one moved aside
        pause("swap")
    return out
Path.rename = rename_then_pause

extra = dict(a.split("=", 1) for a in sys.argv[5:])
cfg = load_config(None, overrides(root, policy, tasks, **extra))
run(cfg, runtime=fake_runtime(expert_delay=float(os.environ.get("CHAOS_EXPERT_DELAY", "0"))))
"""


def _start(tmp_path, train_world, *, stage="", step=0, expert_delay=0.0, **extra) -> tuple[subprocess.Popen, Path]:
    policy, tasks = train_world
    chaos = tmp_path / "chaos"
    chaos.mkdir(exist_ok=True)
    for name in ("paused", "release"):
        (chaos / name).unlink(missing_ok=True)
    script = tmp_path / "job.py"
    script.write_text(CHAOS_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests")))
    settings = {**SETTINGS, **extra}
    env = {**os.environ, "CHAOS_STAGE": stage, "CHAOS_STEP": str(step), "CHAOS_EXPERT_DELAY": str(expert_delay)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path), str(policy), str(tasks), str(chaos),
                             *(f"{k}={v}" for k, v in settings.items())],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    return proc, chaos


def _wait_for(proc: subprocess.Popen, what: str, predicate, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the job ended before {what}:\n{proc.stdout.read()}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _resume(tmp_path, train_world, **extra) -> str:
    """The babysitter's resubmission: the same job again; it resumes from the newest checkpoint."""
    proc, _ = _start(tmp_path, train_world, **{"logging.console": "true", **extra})
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output
    return output


def _resume_here(tmp_path, train_world, capsys) -> str:
    """`_resume`'s run (the job's `run` on the same settings, `run.resume: auto`) in this process,
    as `uninterrupted` runs: its output.  The kill left the checkpoints on disk, and a run reads
    them from there either way; the first test resumes with the job itself (a new process)."""
    from training.session import run

    policy, tasks = train_world
    capsys.readouterr()
    run(load_config(None, overrides(tmp_path, policy, tasks, **{**SETTINGS, "logging.console": "true"})),
        runtime=fake_runtime())
    out = capsys.readouterr()
    return out.out + out.err


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    last = ckpt.list_checkpoints(run_dir / "checkpoints")[-1]
    assert last.name == f"step-{STEPS:08d}"
    return load_file(str(ckpt.verify_checkpoint(last).model_dir / "model.safetensors"))


def _assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} tensors differ from the uninterrupted run's, e.g. {differ[:3]}"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, train_world):
    """Final weights and per-step losses of the run nobody interrupts (in this process)."""
    from training.session import run

    root = tmp_path_factory.mktemp("uninterrupted")
    policy, tasks = train_world
    run(load_config(None, overrides(root, policy, tasks, **SETTINGS)), runtime=fake_runtime())
    return _weights(root / "run"), read_metrics(root / "run" / "metrics.jsonl")


def _same_steps_as(uninterrupted, run_dir: Path) -> None:
    """Steps 1..STEPS logged once each (a step the kill interrupted is redone, not logged twice),
    with the uninterrupted run's losses."""
    _, full = uninterrupted
    logged = read_metrics(run_dir / "metrics.jsonl")
    assert [m["step"] for m in logged] == list(range(1, STEPS + 1))
    for a, b in zip(full, logged):
        assert a["train/loss"] == b["train/loss"] and a["reward/mean"] == b["reward/mean"], a["step"]


def test_sigterm_during_a_checkpoint_write_completes_it_exits_143_and_resumes_bit_exact(
        tmp_path, train_world, uninterrupted):
    proc, chaos = _start(tmp_path, train_world, stage="files", step=2)
    _wait_for(proc, "the step-2 save to pause half written", (chaos / "paused").exists)
    os.kill(proc.pid, signal.SIGTERM)     # Slurm's pre-emption signal, mid-write
    time.sleep(0.5)
    (chaos / "release").touch()
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == ckpt.PREEMPTED_EXIT_CODE, output
    root = tmp_path / "run" / "checkpoints"
    assert [p.name for p in ckpt.list_checkpoints(root)] == ["step-00000001", "step-00000002"]
    assert ckpt.verify_checkpoint(root / "step-00000002").load_state()["data_position"] == 4
    assert not [p for p in root.iterdir() if p.name.startswith(".")], "a temporary folder was left behind"
    output = _resume(tmp_path, train_world)
    assert "resuming from" in output and "(step 2)" in output, output
    _assert_same_weights(uninterrupted[0], _weights(tmp_path / "run"))
    _same_steps_as(uninterrupted, tmp_path / "run")


class _EndedJob:
    """Slurm as the babysitter sees it after the kill: job 100 FAILED (signal 9); sbatch gives 101."""

    def __init__(self):
        self.submitted = []

    def job(self, job_id):
        from training.distributed.slurm import JobInfo
        return JobInfo(job_id, "FAILED", "0:9")

    def submit(self, script, sbatch_args=(), env=None, cwd=None):
        self.submitted.append(script)
        return "101"


def _babysitter_resubmits(tmp_path, checkpoints: Path, caplog) -> str:
    """One babysitter pass over the killed training job: what it logs when it resubmits."""
    from training.babysitter import Babysitter, BabysitterConfig

    cfg = BabysitterConfig.model_validate({"state_dir": str(tmp_path / "sitter"), "jobs": [
        {"name": "train", "kind": "batch", "script": "slurm/train.sbatch", "checkpoints": str(checkpoints)}]})
    slurm = _EndedJob()
    sitter = Babysitter(cfg, slurm=slurm)
    sitter.job_state("train").update(job_id="100", submits=1)
    with caplog.at_level("INFO", logger="toolorchestra.resume"):
        sitter.tick()
    assert slurm.submitted == ["slurm/train.sbatch"], caplog.text
    return caplog.text


@pytest.mark.parametrize("stage", ["files", "manifest"])
def test_kill_9_during_a_checkpoint_write_leaves_the_previous_one_and_resumes_bit_exact(
        tmp_path, train_world, uninterrupted, stage, caplog, capsys):
    proc, chaos = _start(tmp_path, train_world, stage=stage, step=2)
    _wait_for(proc, "the step-2 save to pause half written", (chaos / "paused").exists)
    proc.kill()                           # SIGKILL: Slurm's KillWait ran out mid-save
    proc.communicate(timeout=60)
    root = tmp_path / "run" / "checkpoints"
    half = [p.name for p in root.iterdir() if p.name.startswith(".step-00000002.tmp-")]
    assert half, "the kill came after the write: nothing half written to test"
    assert [p.name for p in ckpt.list_checkpoints(root)] == ["step-00000001"]   # the half one is no checkpoint
    ckpt.verify_checkpoint(root / "step-00000001")
    assert "resuming from checkpoint step 1" in _babysitter_resubmits(tmp_path, root, caplog)
    output = _resume_here(tmp_path, train_world, capsys)
    assert f"removed {root / half[0]}" in output and "(step 1)" in output, output
    _assert_same_weights(uninterrupted[0], _weights(tmp_path / "run"))
    _same_steps_as(uninterrupted, tmp_path / "run")


def test_sigterm_during_rollouts_after_a_save_resumes_bit_exact(tmp_path, train_world, uninterrupted, capsys):
    """Pre-empted in step 3's rollouts, right after step 2's periodic save: the step-2 checkpoint
    already holds what a save would write, and the resumed run equals the uninterrupted one."""
    proc, _ = _start(tmp_path, train_world, expert_delay=0.3)
    metrics = tmp_path / "run" / "metrics.jsonl"
    _wait_for(proc, "step 2 to be logged", lambda: metrics.exists() and len(metrics.read_text().splitlines()) == 2)
    os.kill(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == ckpt.PREEMPTED_EXIT_CODE, output
    output = _resume_here(tmp_path, train_world, capsys)
    assert "(step 2)" in output, output
    _assert_same_weights(uninterrupted[0], _weights(tmp_path / "run"))
    _same_steps_as(uninterrupted, tmp_path / "run")


RESAVE_SCRIPT = """
import sys, time
sys.path[:0] = [{root!r}, {tests!r}]
from pathlib import Path
import torch
from training import checkpoint as ckpt
from test_checkpoint import TinyModel

root, chaos = Path(sys.argv[1]), Path(sys.argv[2])
rename = Path.rename
def rename_then_pause(self, target):
    out = rename(self, target)
    if ".old-" in Path(target).name:          # the checkpoint moved aside, the new one not yet in place
        (chaos / "paused").touch()
        time.sleep(120)
    return out
torch.manual_seed(0)
ckpt.save_checkpoint(root, 2, TinyModel(), None, {{"data_position": 4}}, {{"model.path": "m"}}, keep=1)
Path.rename = rename_then_pause
ckpt.save_checkpoint(root, 2, TinyModel(), None, {{"data_position": 4}}, {{"model.path": "m"}}, keep=1)
"""


def test_kill_9_between_a_resaves_two_renames_loses_no_checkpoint(tmp_path):
    """Re-saving a step (SIGTERM right after its periodic save) moves the old folder aside and the
    new one into place: two renames.  Killed between them, no folder has the step's name; the
    next start-up puts the moved one back (with keep_checkpoints=1 it is the only checkpoint)."""
    script, root, chaos = tmp_path / "job.py", tmp_path / "checkpoints", tmp_path / "chaos"
    chaos.mkdir()
    script.write_text(RESAVE_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests" / "training")))
    proc = subprocess.Popen([sys.executable, str(script), str(root), str(chaos)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(proc, "the re-save to move the old checkpoint aside", (chaos / "paused").exists, timeout=120)
    proc.kill()
    proc.communicate(timeout=60)
    assert ckpt.list_checkpoints(root) == []                      # the window the kill hit
    moved = sorted(p.name for p in root.iterdir())
    assert [n.split("-")[1].split(".")[1] for n in moved] == ["old", "tmp"], moved
    restored = ckpt.recover_interrupted_saves(root)
    assert [p.name for p in restored] == ["step-00000002"]
    assert ckpt.verify_checkpoint(root / "step-00000002", {"model.path": "m"}).load_state()["data_position"] == 4
    assert ckpt.remove_stale_temps(root) and sorted(p.name for p in root.iterdir()) == ["step-00000002"]


# ---------------------------------------------------------------------------- the retrieval service restarted
SEARCH_TOOLS = {"search": {"search-3": "Qwen3-32B"}, **TOOLS}
SEARCH_PROMPT = "Write one short search query"      # orchestrator/prompts/expert_search.txt


@pytest.fixture(scope="module")
def search_world(tmp_path_factory):
    """A policy whose tokenizer knows the search tool, tasks offering it, and a retrieval index of
    a few documents (the shipped MiniLM encoder)."""
    from orchestrator.catalog import load_catalog
    from orchestrator.loop import Task, task_catalog
    from orchestrator.toolcall import allowed_call_strings
    from retrieval.build_index import build

    root = tmp_path_factory.mktemp("search-world")
    catalog = task_catalog(load_catalog(), Task("x", "q", tools=SEARCH_TOOLS))
    texts = [json.dumps(catalog.openai_tools(tools=catalog.tools))] * 5
    texts += allowed_call_strings({t: list(a) for t, a in SEARCH_TOOLS.items()}) * 50
    policy = build_policy(root / "policy", extra_texts=texts)
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"What is {i} + {i}?", "answer": str(2 * i),
                                         "tools": SEARCH_TOOLS}) + "\n" for i in range(1, 5)))
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "contents": f"{i} + {i} is {2 * i}."}) + "\n"
                              for i in range(1, 9)))
    build(corpus=corpus, out=root / "index", progress=False)
    return policy, tasks, root / "index"


class Outages:
    """The experts of `fake_runtime`, plus: the `at`-th search query the search expert writes (1-based)
    kills the retrieval server (SIGKILL) and starts it again `down_s` later, on the same port, so the
    search that query feeds meets a dead server.  Records each retrieval's (start, end, ok)."""

    def __init__(self, server, at: tuple[int, ...], down_s: float):
        self.llm, self.server, self.at, self.down_s = fake_runtime().llm, server, at, down_s
        self.searches_written, self.restarts, self.retrievals = 0, [], []
        self.lock = threading.Lock()

    def __call__(self, model, messages, **kw):
        prompt = messages[0]["content"]
        if SEARCH_PROMPT not in prompt:
            return self.llm(model, messages, **kw)
        with self.lock:
            self.searches_written += 1
            if self.searches_written in self.at:
                self.server.kill()
                restart = threading.Thread(target=lambda: (time.sleep(self.down_s), self.server.start()))
                restart.start()
                self.restarts.append(restart)
        n = re.search(r"What is (\d+) \+", prompt).group(1)
        return LLMResponse(model=model, text=f"<query>{n} + {n}</query>", usage=Usage(len(prompt) // 4, 5))

    def watch(self, client):
        retrieve = client.retrieve

        def watched(*a, **kw):
            started = time.time()
            try:
                out = retrieve(*a, **kw)
            except Exception:
                self.retrievals.append((started, time.time(), False))
                raise
            self.retrievals.append((started, time.time(), True))
            return out
        client.retrieve = watched
        return client


@contextlib.contextmanager
def retrieval_server(index: Path, log: Path):
    from faults import ServerProcess
    from orchestrator.vllm_servers.launch import free_port

    port = free_port()   # fixed for the run: a restart comes back on the same one
    with ServerProcess([sys.executable, "-m", "retrieval.server", "--index", str(index), "--port", str(port),
                        "--threads", "1", "--workers", "1"], health_url=f"http://127.0.0.1:{port}/health",
                       log=log, cwd=ROOT) as server:
        yield server, f"http://127.0.0.1:{port}"


def _train_with_outages(tmp_path, search_world, client_kwargs: dict, at: tuple[int, ...], down_s: float):
    from orchestrator.catalog import load_catalog
    from orchestrator.runtime import ToolRuntime
    from retrieval.client import RetrievalClient
    from training.session import run

    policy, tasks, index = search_world
    with retrieval_server(index, tmp_path / "retrieval.log") as (server, url):
        outages = Outages(server, at, down_s)
        client = outages.watch(RetrievalClient([url], **client_kwargs))
        runtime = ToolRuntime(catalog=load_catalog(), llm=outages, run_code=fake_runtime().run_code, retriever=client)
        try:
            run(load_config(None, overrides(tmp_path, policy, tasks, **SETTINGS)), runtime=runtime)
        finally:
            for thread in outages.restarts:
                thread.join(120)
            client.close()
    return outages, list(server.events), read_metrics(tmp_path / "run" / "metrics.jsonl")


@pytest.mark.slow
def test_retrieval_server_restarted_mid_step_the_client_rides_it_out(tmp_path, search_world):
    """Killed at the 3rd search query and back 2 s later (plus its start-up): the searches that meet
    the dead server are retried by the client (20 attempts within 120 s) until it answers; the run
    trains every step and no tool call fails."""
    outages, server_events, metrics = _train_with_outages(tmp_path, search_world, {}, at=(3,), down_s=2.0)
    events = [e for _, e in server_events]
    assert events == ["ready", "killed (SIGKILL)", "ready", "killed (SIGTERM)"]   # (the last: the test's stop)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    (killed, back), = [(t, u) for (t, e), (u, f) in itertools.pairwise(server_events)
                          if e == "killed (SIGKILL)"]
    met_the_outage = [r for r in outages.retrievals if killed <= r[0] < back]
    assert met_the_outage and all(ok for _, _, ok in outages.retrievals), outages.retrievals
    assert all(m["tools/errors"] == 0 for m in metrics), [m["tools/errors"] for m in metrics]
    assert sum(m["calls/search-3"] * m["rollout/count"] for m in metrics) == pytest.approx(len(outages.retrievals))


@pytest.mark.slow
def test_retrieval_down_past_the_clients_budget_counts_tool_errors_and_training_goes_on(tmp_path, search_world):
    """A client allowed 2 attempts within 0.5 s against a server down for seconds: those searches
    fail, the step's `tools/errors` counts each, the episodes go on without them, and every step
    trains (a failed search is the weather, not a configuration error: no fail-closed stop)."""
    outages, server_events, metrics = _train_with_outages(tmp_path, search_world, {"attempts": 2, "retry_s": 0.5},
                                                          at=(3,), down_s=3.0)
    events = [e for _, e in server_events]
    assert events == ["ready", "killed (SIGKILL)", "ready", "killed (SIGTERM)"]   # (the last: the test's stop)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    failed = [r for r in outages.retrievals if not r[2]]
    assert failed, outages.retrievals
    assert sum(m["tools/errors"] for m in metrics) == len(failed)
    assert all(m["train/samples"] > 0 for m in metrics)


def test_a_trainer_death_restart_resumes_only_from_this_runs_checkpoints(tmp_path, train_world):
    """`run.resume: never` in a run.dir holding an older run's steps 1-3: the rank dies in step 2's
    update, and the in-job restart must resume from the step 1 this run saved, not from the older
    run's step 3 (which would end the job with steps 2-3 never trained)."""
    from training.distributed.group import TrainerWorkerDead
    from training.learner import LocalLearner
    from training.session import run

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **SETTINGS, **{"run.resume": "never"}))
    run(cfg, runtime=fake_runtime())                                   # the older run: steps 1-3 saved
    older = _weights(tmp_path / "run")
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")][-1] == "step-00000003"
    deaths = []

    def make_learner(*args):
        learner = LocalLearner(*args)
        update = learner.update

        def dying(samples, step):
            if step == 1 and not deaths:                                 # step index 1 = the second step
                deaths.append(step)
                exc = TrainerWorkerDead("trainer rank 0 died (test)", rank=0)
                exc.restartable, exc.restarts_allowed = True, 1
                raise exc
            return update(samples, step)
        learner.update = dying
        return learner

    run(cfg, runtime=fake_runtime(), make_learner=make_learner)
    assert deaths == [1]
    assert [m["step"] for m in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]
    _assert_same_weights(older, _weights(tmp_path / "run"))


def test_saved_since_names_the_newest_checkpoint_written_during_the_call(tmp_path):
    from training.session import saved_since

    a, b, c = (tmp_path / f"step-0000000{k}" for k in (1, 2, 3))
    before = {a: 10, b: 20, c: 30}
    assert saved_since(before, dict(before)) is None                   # nothing new: keep run.resume
    assert saved_since(before, {a: 11, b: 20, c: 30}) == a             # step 1 written again
    assert saved_since({}, {a: 1, b: 2}) == b                          # the newest by step
    assert saved_since(before, {a: 11, b: 21, c: 30}) == b             # c is the older run's
