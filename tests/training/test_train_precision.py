"""model.dtype bfloat16 trains float32 master weights under bf16 autocast (training/precision.py).

Hand check of why: a bf16 weight w moves in steps of 2^(floor(log2|w|) - 7), ~6e-5 for
|w| ~ 0.02, while AdamW's first update at lr 1e-6 is lr * g / (|g| + eps) ~ 1e-6 per weight:
rounded to bf16 it vanishes for every weight larger than ~5e-4 (almost all of them).
"""
from __future__ import annotations

import dataclasses
import math
import random

import pytest
import torch
from safetensors.torch import load_file

from _train_world import fake_runtime, overrides
from training.config import load_config
from training.losses import PPOClipLoss
from training.precision import Precision
from training.samples import TurnSample
from training.ppo import ppo_update


def _samples(vocab: int, n: int = 6) -> list[TurnSample]:
    rng = random.Random(0)
    return [TurnSample([rng.randrange(3, vocab) for _ in range(8)], [rng.randrange(3, vocab) for _ in range(6)],
                       [1] * 6, None, advantage=1.0 if i % 2 else -1.0, task_id=f"t{i}", turn_index=0)
            for i in range(n)]


def _one_step(model, reference, optimizer, precision: Precision, vocab: int) -> None:
    with precision.autocast("cpu"):
        ppo_update(model, reference, optimizer, _samples(vocab), PPOClipLoss(), pad_id=0,
                   device=torch.device("cpu"), temperature=1.0, micro_batch_size=3)


def _moved_fraction(before: dict, model) -> float:
    """Fraction of the decoder layers' weights that changed (every one of them gets a gradient)."""
    moved = total = 0
    for name, p in model.named_parameters():
        if ".layers." in name:
            moved += int((p.detach().float() != before[name].float()).sum())
            total += p.numel()
    return moved / total


def test_precision_table():
    assert Precision.of("bfloat16") == Precision(torch.float32, torch.bfloat16)
    assert Precision.of("bfloat16").frozen == torch.bfloat16
    assert Precision.of("float32") == Precision(torch.float32, None)
    assert Precision.of("float16") == Precision(torch.float32, torch.float16)
    assert Precision.of("float16").frozen == torch.float16 and Precision.of("float16").rollout == "float16"
    assert isinstance(Precision.of("float16").scaler("cpu"), torch.amp.GradScaler)
    assert Precision.of("bfloat16").scaler("cpu") is None and Precision.of("float32").scaler("cpu") is None
    with pytest.raises(ValueError, match="model.dtype"):
        Precision.of("int8")


def test_bfloat16_at_lr_1e6_changes_the_weights_where_bf16_adamw_does_not(train_world, tmp_path):
    from training.policy_setup import load_policy, make_optimizer

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **{"model.dtype": "bfloat16", "optim.lr": "1e-6"}))
    model, _ = load_policy(str(policy), cfg.model.dtype, "cpu")
    reference, _ = load_policy(str(policy), cfg.model.dtype, "cpu", frozen=True)
    assert {p.dtype for p in model.parameters()} == {torch.float32}       # master weights
    assert {p.dtype for p in reference.parameters()} == {torch.bfloat16}  # frozen: compute dtype
    vocab = model.get_input_embeddings().weight.shape[0]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    _one_step(model, reference.requires_grad_(False), make_optimizer(model, cfg), Precision.of("bfloat16"), vocab)
    new_path = _moved_fraction(before, model)

    # the old path: bf16 parameters and bf16 AdamW state, same step
    old = model.__class__.from_pretrained(str(policy), dtype=torch.bfloat16).eval()
    before = {n: p.detach().clone() for n, p in old.named_parameters()}
    _one_step(old, reference, make_optimizer(old, cfg), Precision(torch.bfloat16), vocab)
    old_path = _moved_fraction(before, old)

    assert new_path > 0.95, f"float32 master weights: only {new_path:.1%} of the weights moved"
    assert old_path < 0.10, f"bf16 AdamW moved {old_path:.1%} (the rounding argument says ~2%)"


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_half_precision_run_trains_and_checkpoints_float32_master_weights(train_world, tmp_path, dtype):
    from training.session import run

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **{
        "model.dtype": dtype, "optim.lr": "1e-6", "trainer.total_steps": 1}))
    run(cfg, runtime=fake_runtime())
    start = load_file(str(policy / "model.safetensors"))
    saved = load_file(str(tmp_path / "run" / "checkpoints" / "step-00000001" / "model" / "model.safetensors"))
    assert {t.dtype for t in saved.values()} == {torch.float32}
    layers = [k for k in saved if ".layers." in k]
    moved = sum(int((saved[k] != start[k]).sum()) for k in layers) / sum(saved[k].numel() for k in layers)
    assert moved > 0.5, f"one bf16 step at lr 1e-6 moved only {moved:.1%} of the layer weights"


def test_float16_scales_the_loss_skips_an_overflowing_step_and_checkpoints_the_scale(train_world, tmp_path):
    """float16: float32 master weights + fp16 autocast + GradScaler.  A step whose scaled
    gradients overflow fp16 (advantages of 1e4 x the initial scale 2^16) leaves the weights
    as they were and halves the scale; the next, ordinary step moves them."""
    from training.learner import LocalLearner
    from training.policy_setup import load_policy, make_optimizer

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **{"model.dtype": "float16", "trainer.total_steps": 1}))
    model, _ = load_policy(str(policy), cfg.model.dtype, "cpu")
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    vocab = model.get_input_embeddings().weight.shape[0]
    precision, optimizer = Precision.of("float16"), make_optimizer(model, cfg)
    scaler = precision.scaler("cpu")
    huge = [dataclasses.replace(s, advantage=s.advantage * 1e4) for s in _samples(vocab)]

    def step(samples):
        with precision.autocast("cpu"):
            return ppo_update(model, None, optimizer, samples, PPOClipLoss(kl_coef=0.0), pad_id=0,
                              device=torch.device("cpu"), temperature=1.0, micro_batch_size=3, scaler=scaler)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = step(huge)
    assert not math.isfinite(metrics["train/grad_norm"])
    assert _moved_fraction(before, model) == 0.0 and scaler.get_scale() == 2.0**15
    step(_samples(vocab))
    assert _moved_fraction(before, model) > 0.95

    learner = LocalLearner(cfg, None, {}, total_steps=1)
    learner.scaler.scale(torch.ones(()))         # as a step does before update
    learner.scaler.update(1024.0)
    saved = learner.save(1, {"step": 1})
    from training.checkpoint import verify_checkpoint
    assert verify_checkpoint(saved).load_state()["grad_scaler"]["scale"] == 1024.0
    resumed = LocalLearner(cfg, verify_checkpoint(saved), verify_checkpoint(saved).load_state(), total_steps=1)
    assert resumed.scaler.get_scale() == 1024.0


def test_float16_step_with_more_mini_batches_than_samples_trains_the_non_empty_ones(train_world, tmp_path):
    """np.array_split leaves empty mini-batches when a step has fewer samples than
    algorithm.mini_batches (after filtering): they are skipped; with a GradScaler an empty
    one would reach unscale_/step without gradients and raise."""
    from training.policy_setup import load_policy, make_optimizer

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **{"model.dtype": "float16"}))
    model, _ = load_policy(str(policy), cfg.model.dtype, "cpu")
    vocab = model.get_input_embeddings().weight.shape[0]
    precision = Precision.of("float16")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with precision.autocast("cpu"):
        metrics = ppo_update(model, None, make_optimizer(model, cfg), _samples(vocab, n=2), PPOClipLoss(kl_coef=0.0),
                             pad_id=0, device=torch.device("cpu"), temperature=1.0, micro_batch_size=3,
                             mini_batches=5, scaler=precision.scaler("cpu"))
    assert math.isfinite(metrics["train/grad_norm"]) and _moved_fraction(before, model) > 0.95
