"""Group-relative advantage estimators, registered by name (PAPER.md §4).

Each estimator maps the rewards of ONE group (the G rollouts of one task) to one
advantage per rollout: `fn(rewards: Tensor[G]) -> Tensor[G]`.  `compute_advantages`
applies the chosen estimator group by group over a flat batch.  Every turn of a
rollout later receives that rollout's advantage (see training/samples.py).

A group of size 1 has no peers to compare with, so every estimator returns 0 for it
(the sample std is undefined there; returning 0 keeps NaN out of the batch).

Registered: "grpo" (the paper), "grpo_plain" (no clip), "dr_grpo" (no std division,
Dr. GRPO), "rloo" (leave-one-out baseline).  Add one with `@register_advantage_estimator`.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

AdvantageEstimator = Callable[[torch.Tensor], torch.Tensor]
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}

STD_EPS = 1e-6       # added to the std, as in the paper
ADVANTAGE_CLIP = 3.0  # |A| <= 3 for "grpo"


def register_advantage_estimator(name: str) -> Callable[[AdvantageEstimator], AdvantageEstimator]:
    """Decorator: make `fn(rewards [G]) -> advantages [G]` available as `name`."""
    def register(fn: AdvantageEstimator) -> AdvantageEstimator:
        if name in ADVANTAGE_ESTIMATORS:
            raise ValueError(f"advantage estimator {name!r} is already registered")
        ADVANTAGE_ESTIMATORS[name] = fn
        return fn
    return register


def get_advantage_estimator(name: str) -> AdvantageEstimator:
    """The estimator registered as `name`; the error lists the known names."""
    try:
        return ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown advantage estimator {name!r}; choose one of "
                         f"{sorted(ADVANTAGE_ESTIMATORS)}") from None


def _sample_std(rewards: torch.Tensor) -> torch.Tensor:
    """Sample standard deviation (ddof = 1, divides by G - 1) of rewards [G], G >= 2."""
    return rewards.std(correction=1)


@register_advantage_estimator("grpo")
def grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Paper: A = clip((R - mean) / (std + 1e-6), -3, 3), std = sample std (ddof = 1).

    rewards [G] -> advantages [G] (unitless).  G == 1 gives [0.].  Note that with the
    sample std no z-score can exceed (G - 1) / sqrt(G), so the clip only acts for G >= 11
    (G = 8 bounds |A| by 7 / sqrt(8) = 2.47).
    """
    return grpo_plain_advantages(rewards).clamp(-ADVANTAGE_CLIP, ADVANTAGE_CLIP)


@register_advantage_estimator("grpo_plain")
def grpo_plain_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """A = (R - mean) / (std + 1e-6), sample std, no clip.  rewards [G] -> [G]; G == 1 -> [0.]."""
    rewards = rewards.double()
    if rewards.numel() < 2:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) / (_sample_std(rewards) + STD_EPS)


@register_advantage_estimator("dr_grpo")
def dr_grpo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: A = R - mean (no std division, so easy groups are not up-weighted).

    rewards [G] -> [G], in reward units; G == 1 -> [0.].
    """
    rewards = rewards.double()
    return rewards - rewards.mean()


@register_advantage_estimator("rloo")
def rloo_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: A_t = R_t - mean of the other G - 1 rewards.

    Equals G / (G - 1) * (R_t - mean).  rewards [G] -> [G]; G == 1 -> [0.].
    """
    rewards = rewards.double()
    g = rewards.numel()
    if g < 2:
        return torch.zeros_like(rewards)
    return (rewards - rewards.mean()) * g / (g - 1)


def group_members(group_ids: Sequence[object]) -> dict[object, list[int]]:
    """Positions of each group's rollouts: {group id: [indices into the batch]}."""
    members: dict[object, list[int]] = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    return members


def compute_advantages(rewards: Sequence[float] | torch.Tensor,
                       group_ids: Sequence[object],
                       estimator: str = "grpo") -> torch.Tensor:
    """Advantages of a flat batch of rollouts, estimated within each group.

    Args:
        rewards: [N] scalar reward per rollout.
        group_ids: [N] hashable id per rollout (e.g. the task id plus the batch step);
            rollouts with the same id form one group.  Groups need not be contiguous.
        estimator: a name in `ADVANTAGE_ESTIMATORS`.

    Returns:
        [N] float32 advantages, in the rollouts' order.
    """
    fn = get_advantage_estimator(estimator)
    rewards = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)  # [N]
    if len(group_ids) != rewards.numel():
        raise ValueError(f"got {rewards.numel()} rewards but {len(group_ids)} group ids; "
                         "pass one group id per rollout")
    if not torch.isfinite(rewards).all():
        raise ValueError("rewards contain NaN or inf; check the reward function's inputs")
    advantages = torch.zeros_like(rewards)  # [N]
    for idx in group_members(group_ids).values():
        index = torch.tensor(idx)
        advantages[index] = fn(rewards[index]).double()
    return advantages.float()
