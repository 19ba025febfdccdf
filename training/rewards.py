"""The reward training optimises: the paper's preference-weighted reward (PAPER.md §4), defined in
orchestrator/preference_reward.py (the core, because evaluation's preference report scores with it
too) and re-exported here under training's name."""
from orchestrator.preference_reward import COST, LATENCY, OUTCOME, preference_rewards, reward_inputs

__all__ = ["preference_rewards", "reward_inputs", "OUTCOME", "COST", "LATENCY"]
