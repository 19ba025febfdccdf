"""Checkpoints: atomic layout, verification, refusal of corrupt/mismatched ones, SIGTERM."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from torch import nn

from training import checkpoint as ckpt
from training.checkpoint import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


class TinyModel(nn.Module):
    """Enough of the HF interface for save_checkpoint: save_pretrained."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)

    def save_pretrained(self, folder, safe_serialization=True):
        from safetensors.torch import save_file
        Path(folder).mkdir(parents=True, exist_ok=True)
        save_file(self.state_dict(), str(Path(folder) / "model.safetensors"))


def _save(root, step, fp=None, keep=5):
    state = {"optimizer": {"lr": 0.1}, "rng": ckpt.rng_state(), "data_position": step * 2, "wandb_id": "abc"}
    return ckpt.save_checkpoint(root, step, TinyModel(), None, state, fp or {"model.path": "m"}, keep=keep)


def test_save_writes_manifest_last_and_verifies(tmp_path):
    path = _save(tmp_path, 3)
    assert path.name == "step-00000003"
    manifest = json.loads((path / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model/model.safetensors", "trainer_state.pt"}
    c = ckpt.verify_checkpoint(path, {"model.path": "m"})
    assert c.step == 3 and c.load_state()["data_position"] == 6 and c.load_state()["wandb_id"] == "abc"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no temporary left behind


def test_auto_resume_picks_the_latest_complete_and_prunes_old(tmp_path):
    for step in (1, 2, 10, 3):
        _save(tmp_path, step, keep=3)
    (tmp_path / ".step-00000011.tmp-99").mkdir()           # a save that died half-way
    (tmp_path / "step-00000012").mkdir()                    # no manifest: not a checkpoint
    assert [p.name for p in ckpt.list_checkpoints(tmp_path)] == ["step-00000002", "step-00000003", "step-00000010"]
    assert ckpt.resolve_resume("auto", tmp_path).name == "step-00000010"
    assert ckpt.resolve_resume("never", tmp_path) is None
    assert ckpt.resolve_resume("auto", tmp_path / "none") is None
    with pytest.raises(CheckpointError, match="run.resume='/nope': no checkpoint there"):
        ckpt.resolve_resume("/nope", tmp_path)


def test_corrupt_file_is_refused_with_its_name(tmp_path):
    path = _save(tmp_path, 1)
    weights = path / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"is corrupt: model/model.safetensors does not match .* delete"):
        ckpt.verify_checkpoint(path)


def test_truncated_state_and_missing_file_are_refused(tmp_path):
    path = _save(tmp_path, 1)
    (path / "trainer_state.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match="trainer_state.pt does not match"):
        ckpt.verify_checkpoint(path)
    (path / "trainer_state.pt").unlink()
    with pytest.raises(CheckpointError, match="trainer_state.pt is missing"):
        ckpt.verify_checkpoint(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="unreadable manifest.json"):
        ckpt.verify_checkpoint(path)


def test_mismatched_config_is_refused_naming_the_key(tmp_path):
    path = _save(tmp_path, 1, fp={"model.path": "a", "rollout.tasks_per_step": 16})
    with pytest.raises(CheckpointError, match=r"model.path: checkpoint 'a' vs config 'b'.*run.resume=never"):
        ckpt.verify_checkpoint(path, {"model.path": "b", "rollout.tasks_per_step": 16})


def test_rng_state_round_trips():
    import numpy as np

    state = ckpt.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    ckpt.set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_trainer_refuses_a_mismatched_or_corrupt_latest_checkpoint(tmp_path, train_world):
    from _train_world import fake_runtime, overrides
    from training.config import load_config
    from training.session import run

    policy, tasks = train_world
    config = lambda **kw: load_config(None, overrides(tmp_path, policy, tasks, **kw))  # noqa: E731
    run(config(**{"trainer.total_steps": 1}), runtime=fake_runtime())
    with pytest.raises(CheckpointError, match=r"rollout.tasks_per_step: checkpoint 2 vs config 1"):
        run(config(**{"trainer.total_steps": 2, "rollout.tasks_per_step": 1}), runtime=fake_runtime())
    state = tmp_path / "run" / "checkpoints" / "step-00000001" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match="step-00000001 is corrupt: trainer_state.pt"):
        run(config(**{"trainer.total_steps": 2}), runtime=fake_runtime())


SIGTERM_SCRIPT = """
import sys
sys.path[:0] = [{root!r}, {tests!r}]
from pathlib import Path
from _train_world import fake_runtime, overrides
from training.config import load_config
from training.session import run
root, policy, tasks = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
cfg = load_config(None, overrides(root, policy, tasks, **{{"trainer.total_steps": 50, "trainer.save_every": 100}}))
run(cfg, runtime=fake_runtime(expert_delay=0.5))
"""


def test_sigterm_during_rollouts_saves_a_checkpoint_and_exits_143(tmp_path, train_world):
    policy, tasks = train_world
    script = tmp_path / "job.py"
    script.write_text(SIGTERM_SCRIPT.format(root=str(ROOT), tests=str(ROOT / "tests")))
    from _train_world import sigterm_after_step_1

    code, output = sigterm_after_step_1(script, tmp_path, policy, tasks)   # in step 2's rollouts
    assert code == ckpt.PREEMPTED_EXIT_CODE, output
    saved = ckpt.list_checkpoints(tmp_path / "run" / "checkpoints")
    assert [p.name for p in saved] == ["step-00000001"], output      # no periodic save was due
    c = ckpt.verify_checkpoint(saved[0])
    assert c.load_state()["data_position"] == 2                       # step 2's tasks not consumed
