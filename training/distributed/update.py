"""The PPO update across data-parallel DeepSpeed ranks: sharding on the driver, the loop on each rank.

Same algorithm as `training.ppo.ppo_update` (one process), split so that the result
does not depend on the number of ranks:

- the driver splits the step's samples into mini-batches exactly as `ppo_update` does
  (`np.array_split`), deals each mini-batch's samples round-robin to the ranks, and cuts
  each rank's share into length-sorted micro-batches;
- every rank runs the same number of micro-batches per mini-batch (ZeRO-2/3 reduce
  gradients inside each backward, so the ranks must call it equally often): a rank with
  fewer samples runs "filler" micro-batches whose loss mask is all zero (zero loss, zero
  gradient);
- each micro-batch's loss is a token sum divided by the *whole* mini-batch's token count,
  times the number of ranks (DeepSpeed averages gradients over ranks), so the summed
  gradient equals the single-process one; DeepSpeed clips the global gradient norm.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from training.losses import PPOClipLoss
from training.samples import TurnSample
from training.ppo import micro_logprobs, run_ppo_epochs


@dataclass
class RankShard:
    """One rank's work for one step: micro[k][j] = the j-th micro-batch of mini-batch k."""

    micro: list[list[list[TurnSample]]]
    tokens: list[int]               # trainable tokens of each whole mini-batch (all ranks)
    filler: list[list[bool]]        # filler[k][j]: micro-batch j of mini-batch k is padding


def _filler(sample: TurnSample) -> TurnSample:
    return dataclasses.replace(sample, loss_mask=[0] * len(sample.loss_mask))


def shard_samples(samples: Sequence[TurnSample], world: int, mini_batches: int,
                  micro_batch_size: int) -> list[RankShard]:
    """Split a step's samples over `world` ranks (see the module docstring)."""
    if not samples:
        raise ValueError("shard_samples: no samples to train on")
    chunks = np.array_split(np.arange(len(samples)), mini_batches)
    shards = [RankShard([], [], []) for _ in range(world)]
    for idx in chunks:
        tokens = int(sum(sum(samples[i].loss_mask) for i in idx))
        per_rank = [[samples[i] for i in idx[r::world]] for r in range(world)]
        per_rank = [sorted(s, key=lambda t: len(t.prompt_ids) + len(t.response_ids)) for s in per_rank]
        count = max(1, max(-(-len(s) // micro_batch_size) for s in per_rank))
        spare = samples[int(idx[0])] if len(idx) else samples[0]
        for r, share in enumerate(per_rank):
            micro = [share[j:j + micro_batch_size] for j in range(0, len(share), micro_batch_size)]
            filler = [False] * len(micro)
            while len(micro) < count:
                micro.append([_filler(spare)])
                filler.append(True)
            shards[r].micro.append(micro)
            shards[r].tokens.append(tokens)
            shards[r].filler.append(filler)
    return shards


def rank_update(engine, reference, shard: RankShard, loss_fn: PPOClipLoss, *, world: int, pad_id: int,
                device, temperature: float, ppo_epochs: int = 1, old_logprobs: str = "recompute",
                seed: int = 0, reference_offload: bool = False) -> dict[str, float]:
    """Run this rank's part of one PPO step on DeepSpeed `engine` (`training.ppo.run_ppo_epochs`,
    the loop `ppo_update` runs); returns metric *sums* (`sum/<name>`), the real micro-batch
    count and the grad norms, for `combine_metrics`."""
    model = engine.module
    steps = ppo_epochs * len(shard.micro)
    ref_lp = None
    if reference is not None:
        if reference_offload:
            reference.to(device)
        ref_lp = [micro_logprobs(reference, m, pad_id, temperature, device) for m in shard.micro]
        if reference_offload:
            reference.to("cpu")
    old_lp = ([micro_logprobs(model, m, pad_id, temperature, device) for m in shard.micro]
              if old_logprobs in ("recompute", "decoupled") and steps > 1 else None)

    def step() -> float:
        engine.step()
        return float(engine.get_global_grad_norm() or 0.0)

    sums, count, grad_norms = run_ppo_epochs(
        model, shard.micro, shard.tokens, loss_fn, backward=lambda loss: engine.backward(loss * world, scale_wrt_gas=False),
        step=step, pad_id=pad_id, device=device, temperature=temperature, epochs=ppo_epochs, ref_lp=ref_lp,
        old_lp=old_lp, old_logprobs=old_logprobs, seed=seed, filler=shard.filler)
    return {**{f"sum/{k}": v for k, v in sums.items()}, "count": float(count), "steps": float(steps),
            "grad_norm": float(np.mean(grad_norms)) if grad_norms else 0.0}


def combine_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """The ranks' sums -> the metrics `ppo_update` reports (loss terms are split-invariant)."""
    count = sum(r["count"] for r in per_rank)
    steps = per_rank[0]["steps"]
    names = {k.removeprefix("sum/") for r in per_rank for k in r if k.startswith("sum/")}
    out = {f"train/{n}": sum(r.get(f"sum/{n}", 0.0) for r in per_rank) / max(1.0, count) for n in names}
    for n in ("loss", "pg_loss", "kl_loss"):
        out[f"train/{n}"] = sum(r.get(f"sum/{n}", 0.0) for r in per_rank) / max(1.0, steps)
    out["train/grad_norm"] = per_rank[0]["grad_norm"]
    return out


def deepspeed_config(*, zero_stage: int, grad_clip: float, dtype: str, offload_optimizer: bool,
                     optimizer: dict | None = None, overlap_comm: bool = False) -> dict:
    """DeepSpeed settings for `rank_update`: the caller owns accumulation boundaries
    (`managed_gradient_accumulation: false`: every `engine.step()` is one optimizer step).
    overlap_comm: overlap gradient reduction (and ZeRO-3's parameter gathering) with
    compute on side streams (NCCL on GPUs; off for gloo on CPUs)."""
    cfg: dict = {
        "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False, "gradient_clipping": grad_clip,
        "zero_optimization": {"stage": zero_stage, "contiguous_gradients": True, "overlap_comm": overlap_comm},
        "zero_allow_untested_optimizer": True, "steps_per_print": 2**31 - 1, "wall_clock_breakdown": False,
    }
    if dtype == "bfloat16":
        cfg["bf16"] = {"enabled": True}
    elif dtype == "float16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 16}
    if offload_optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        cfg["optimizer"] = {"type": "AdamW", "params": optimizer or {}}
    return cfg
