"""A checkpoint of one backend (`distributed.backend` none / ray) resumed with the other is
refused before anything starts, with a message naming the checkpoint, its backend and the
two ways on.  (A real Ray checkpoint refused by the single-process trainer: see
tests/training/test_distributed_cpu.py; here a checkpoint with a Ray run's trainer state, which is
what the refusal reads.)"""
from __future__ import annotations

import shutil

import pytest

from _train_world import fake_runtime, overrides
from training.checkpoint import CheckpointError, list_checkpoints, save_checkpoint, verify_checkpoint
from training.config import fingerprint, load_config


def _cfg(tmp_path, train_world, **extra):
    policy, tasks = train_world
    return load_config(None, overrides(tmp_path, policy, tasks, **{"trainer.total_steps": 1, **extra}))


def test_single_process_checkpoint_is_refused_by_the_ray_backend_before_any_actor(tmp_path, train_world, monkeypatch):
    from training.distributed.group import RayPolicy
    from training.session import run

    run(_cfg(tmp_path, train_world), runtime=fake_runtime())
    checkpoint = list_checkpoints(tmp_path / "run" / "checkpoints")[-1]

    def no_actors(*a, **k):
        raise AssertionError("Ray actors were started before the checkpoint was checked")
    monkeypatch.setattr(RayPolicy, "start", no_actors)
    cfg = _cfg(tmp_path, train_world, **{"trainer.total_steps": 2, "distributed.backend": "ray"})
    with pytest.raises(CheckpointError) as err:
        run(cfg, runtime=fake_runtime())
    message = str(err.value)
    assert str(checkpoint) in message
    assert "distributed.backend=none" in message and "distributed.backend=ray" in message
    assert f"model.path={checkpoint / 'model'}" in message and f"model.reference={train_world[0]}" in message


@pytest.mark.parametrize("marked", [True, False], ids=["marked", "older-unmarked"])
def test_ray_checkpoint_is_refused_by_the_single_process_trainer(tmp_path, train_world, marked):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.train import main

    policy, _ = train_world
    cfg = _cfg(tmp_path, train_world, **{"trainer.total_steps": 2})
    state = {"rng": {}, "data_position": 2, "step": 1, "wandb_id": None, "scheduler": {},
             "distributed": {"trainer_workers": 2, "zero_stage": 2}}
    if marked:
        state["backend"] = "ray"
    else:   # written before checkpoints recorded their backend: told apart by deepspeed/
        del state["distributed"]
    model = AutoModelForCausalLM.from_pretrained(policy)
    path = save_checkpoint(tmp_path / "run" / "checkpoints", 1, model, AutoTokenizer.from_pretrained(policy), state,
                           fingerprint(cfg))
    if not marked:
        (path / "deepspeed").mkdir()
        shutil.copy(path / "model" / "config.json", path / "deepspeed" / "latest")
    verify_checkpoint(path, fingerprint(cfg))

    from training.session import run
    with pytest.raises(CheckpointError) as err:
        run(cfg, runtime=fake_runtime())
    message = str(err.value)
    assert str(path) in message and "distributed.backend=ray" in message
    assert "cannot be resumed with distributed.backend=none" in message
    if marked:
        assert "distributed.trainer_workers=2 distributed.zero_stage=2" in message
    # the command line says the same and exits 1 (no KeyError traceback)
    (tmp_path / "cfg.yaml").write_text("")
    assert main(["--config", str(tmp_path / "cfg.yaml"),
                 *overrides(tmp_path, policy, train_world[1], **{"trainer.total_steps": 2})]) == 1
