"""One task's group, scored as the paper and upstream score it (PAPER.md §4, §8b).

The group is the WHOLE group: rewards, their min-max normalisation, the reward-std filter
and the advantages are computed over all G rollouts of a task; a rollout that never gave
a final answer (no answer, out of turns, out of steps) enters with outcome 0, hence
reward 0, and its tool counts, cost and latency still enter the normalisation.  Only
afterwards are the unfinished rollouts' turns left out of the loss.

Upstream does exactly this (NVlabs/ToolOrchestra `training/lead_agent/llm_agent/
generation_quick3.py`: `example_rewards` collects a reward for every rollout, 0 when not
correct, the mean / `stdev` / `> 0.1` filter run over that list, and a turn is selected for
training only when its rollout is in `valid_answers`: for QA, the rollout called the answer
tool, whatever the reply, an empty one too (2026-2040); for tau2, a non-empty attempt or a
conversation tau2 scored (1345-1364)).

Why it matters: dropping the unfinished rollouts first makes a correct but expensive
answer look bad next to the few cheap finishers (the outcome column is then constant
and contributes nothing), and a group whose only finisher is correct has no std and is
discarded, although it is the most informative group of all.

    score = score_group(inputs, preference, finished)
    score.rewards       # [G] reward per rollout (0 for unfinished or wrong ones)
    score.advantages    # [G] advantage per rollout (0 everywhere when the group is dropped)
    score.kept          # the group passed the std filter
    score.trained       # [G] rollouts whose turns go into the loss: kept and finished

Pure: no I/O, no tensors in the interface.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training.algorithms import compute_advantages
from training.filters import MIN_GROUP_REWARD_STD, group_std_keep_mask
from training.rewards import preference_rewards

BOOST_THRESHOLD = 1.0   # upstream's correct_sample_advantage_boost_threshold (verl ppo_trainer.yaml)


@dataclass
class GroupScore:
    rewards: list[float]        # [G]
    advantages: list[float]     # [G]; zeros when the group is dropped
    kept: bool                  # reward std >= min_std
    trained: list[bool]         # [G]; kept and finished


def score_group(inputs: Sequence[Mapping[str, Any]], preference: Mapping[str, float],
                finished: Sequence[bool], *, estimator: str = "grpo",
                min_std: float = MIN_GROUP_REWARD_STD, boost: float = 0.0,
                boost_threshold: float = BOOST_THRESHOLD) -> GroupScore:
    """Rewards, filter and advantages of one task's G rollouts.

    Args:
        inputs: [G] `training.rewards.reward_inputs` dicts, one per rollout, unfinished
            ones included (their `outcome` must be 0).
        preference: the task's preference vector.
        finished: [G] whether each rollout produced a final answer.
        estimator: advantage estimator name (training/algorithms.py).
        min_std: groups whose reward sample std is below this are dropped (paper: 0.1).
        boost: upstream-only "correct-sample advantage boost" (its `correct_sample_advantage_
            boost_value`, 0.1 in its training script; 0 = off, the paper's form): added to the
            advantage of every rollout whose group-normalised advantage is >= `boost_threshold`
            (upstream: 1.0, compared with a 1e-5 tolerance).  Only rollouts of kept groups are boosted.
    """
    if len(finished) != len(inputs):
        raise ValueError(f"got {len(inputs)} rollouts but {len(finished)} finished flags; pass one per rollout")
    for i, (r, done) in enumerate(zip(inputs, finished)):
        if not done and r.get("outcome") not in (0, None):
            raise ValueError(f"group[{i}]: an unfinished rollout has outcome {r.get('outcome')!r}; it must be 0")
    rewards = preference_rewards(inputs, preference)
    g = len(rewards)
    kept = group_std_keep_mask(rewards, [0] * g, min_std)[0]
    if not kept:
        return GroupScore(rewards, [0.0] * g, False, [False] * g)
    advantages = compute_advantages(rewards, [0] * g, estimator).tolist()
    if boost:
        # upstream compares the *normalised* reward (its token_level_rewards hold the advantage,
        # main_grpo_quick3.py:88, dp_actor.py:341-346), not the raw preference reward
        advantages = [a + boost if a >= boost_threshold - 1e-5 else a for a in advantages]
    return GroupScore(rewards, advantages, True, [bool(f) for f in finished])
