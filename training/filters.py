"""The paper's three training-data filters (PAPER.md §4), as pure functions.

1. `has_final_answer` / `keep_finished`: rollouts that never produced a final answer (the loop
   sets `Rollout.finished` when an `answer` call ended the episode, or the environment ended
   it properly for function-calling tasks) are not trained on.
2. `valid_turns`: drop turns whose tool call did not parse or validate
   (`Turn.valid` is False); such turns are never trained on.
3. `group_std_keep_mask`: drop whole groups whose reward std is below 0.1, since their
   advantages are (near) zero and would only add noise and compute.

Order used by the trainer (training/group_scores.py, as PAPER.md §4 and upstream): rewards,
filter 3 and advantages over the WHOLE group, unfinished rollouts at reward 0; then filter 1
removes the unfinished rollouts from training; then per-turn samples (training/samples.py
applies filter 2).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from orchestrator.records import Rollout, Turn
from training.algorithms import group_members

MIN_GROUP_REWARD_STD = 0.1


def has_final_answer(rollout: Rollout) -> bool:
    """True when the episode ended with a final answer (`Rollout.finished`), or is a tau2
    conversation tau2 cut and scored that the profile trains anyway (`info["train_unfinished"]`,
    orchestrator/episodes/tau2.py: upstream's `correct > -1`, generation_quick3.py:1363)."""
    return bool(rollout.finished or rollout.info.get("train_unfinished"))


def keep_finished(rollouts: Sequence[Rollout]) -> list[Rollout]:
    """The rollouts that produced a final answer, in their order."""
    return [r for r in rollouts if has_final_answer(r)]


def valid_turns(rollout: Rollout) -> list[Turn]:
    """The turns of `rollout` whose tool call parsed and validated, in their order."""
    return [t for t in rollout.turns if t.valid]


def group_std_keep_mask(rewards: Sequence[float] | torch.Tensor,
                        group_ids: Sequence[object],
                        min_std: float = MIN_GROUP_REWARD_STD) -> list[bool]:
    """Per rollout: True when its group's reward std is >= `min_std`.

    Args:
        rewards: [N] reward per rollout.
        group_ids: [N] group id per rollout (same id = same task's group).
        min_std: threshold in reward units (paper: 0.1).

    The std is the sample std (ddof = 1), the same one the "grpo" advantage uses.
    A group of one rollout has no std and is dropped: its advantage is 0 anyway.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)  # [N]
    if len(group_ids) != rewards.numel():
        raise ValueError(f"got {rewards.numel()} rewards but {len(group_ids)} group ids; "
                         "pass one group id per rollout")
    keep = [False] * rewards.numel()
    for idx in group_members(group_ids).values():
        if len(idx) < 2:
            continue
        std = rewards[torch.tensor(idx)].std(correction=1).item()
        for i in idx:
            keep[i] = std >= min_std
    return keep
