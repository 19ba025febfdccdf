"""Training under chaos (issue 28 item 3), at the tiny world's scale on CPU: a real training
subprocess signalled (SIGTERM, SIGKILL) at chosen moments inside a checkpoint write; the run is
then resumed as the babysitter resumes it (the same command, `run.resume: auto`) and its final
weights are compared, bit for bit, with an uninterrupted run's.

The pause points are patched into the subprocess only (`CHAOS_SCRIPT`): a save of step
`CHAOS_STEP` stops at `CHAOS_STAGE`, writes `<dir>/paused`, and waits for `<dir>/release`, so
the test signals the trainer while the write is half done, deterministically.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _train_world import fake_runtime, overrides
from safetensors.torch import load_file

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
        tmp_path, train_world, uninterrupted, stage, caplog):
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
    output = _resume(tmp_path, train_world)
    assert f"removed {root / half[0]}" in output and "(step 1)" in output, output
    _assert_same_weights(uninterrupted[0], _weights(tmp_path / "run"))
    _same_steps_as(uninterrupted, tmp_path / "run")


def test_sigterm_during_rollouts_after_a_save_resumes_bit_exact(tmp_path, train_world, uninterrupted):
    """Pre-empted in step 3's rollouts, right after step 2's periodic save: the step-2 checkpoint
    already holds what a save would write, and the resumed run equals the uninterrupted one."""
    proc, _ = _start(tmp_path, train_world, expert_delay=0.3)
    metrics = tmp_path / "run" / "metrics.jsonl"
    _wait_for(proc, "step 2 to be logged", lambda: metrics.exists() and len(metrics.read_text().splitlines()) == 2)
    os.kill(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == ckpt.PREEMPTED_EXIT_CODE, output
    output = _resume(tmp_path, train_world)
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
