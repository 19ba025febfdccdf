"""algorithm.ppo_mini_batch_size: several optimizer steps per training step, so the PPO
clip and the ratio metrics act (upstream: 16 per-turn samples per mini-batch)."""
from __future__ import annotations

import random

import pytest
import torch

from training.losses import PPOClipLoss
from training.ppo import ppo_update
from training.samples import TurnSample, mini_batch_count


def test_mini_batch_count_is_ceil_of_samples_over_size():
    assert mini_batch_count(64, 16) == 4      # 64 / 16
    assert mini_batch_count(65, 16) == 5      # ceil(65 / 16)
    assert mini_batch_count(10, 16) == 1      # fewer samples than one mini-batch
    assert mini_batch_count(0, 16) == 1
    assert mini_batch_count(100, 0) == 1      # 0: the whole step is one mini-batch
    with pytest.raises(ValueError, match="ppo_mini_batch_size"):
        mini_batch_count(10, -1)


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg)


def _samples(n: int) -> list[TurnSample]:
    rng = random.Random(0)
    return [TurnSample([rng.randrange(3, 64) for _ in range(6)], [rng.randrange(3, 64) for _ in range(4)],
                       [1] * 4, None, advantage=2.0 if i % 2 else -2.0, task_id=f"t{i}", turn_index=0)
            for i in range(n)]


def _update(mini_batches: int) -> dict[str, float]:
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)   # large steps: the ratio leaves [0.8, 1.28]
    return ppo_update(model, None, optimizer, _samples(32), PPOClipLoss(kl_coef=0.0), pad_id=0,
                      device=torch.device("cpu"), temperature=1.0, micro_batch_size=8,
                      mini_batches=mini_batch_count(32, 32 // mini_batches))


def test_one_mini_batch_never_clips_but_later_mini_batches_do():
    # One mini-batch: the old log-probs are the current ones, the ratio is exactly 1 on every
    # token, so nothing is clipped and the ratio has no spread (the paper's 1 x 1 setting).
    one = _update(1)
    assert one["train/clip_frac"] == 0.0 and one["train/ratio_std"] == pytest.approx(0.0, abs=1e-6)
    # Four mini-batches of 8: mini-batches 2-4 are scored against the weights before the first
    # optimizer step, so their ratios move and the clip acts.
    four = _update(4)
    assert four["train/clip_frac"] > 0.0
    assert four["train/ratio_std"] > 0.0 and four["train/approx_kl"] > 0.0
