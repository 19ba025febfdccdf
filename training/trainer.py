"""Moved: training/trainer.py was split by concern.  This stub only names the new homes.

    training.tasks     load_tasks, task_from_record, TaskSampler, SUPPORTED_KINDS
    training.rollouts  collect_rollouts, SeededEngine, MemoizedLLM, Preempted, rollout_seed,
                       decision_mask, choice_token_ids, mask_forced_tokens
    training.scoring   score_groups, ScoredBatch, judged, make_judge, rollout_metrics
    training.ppo       response_logprobs, check_logprob_path, micro_logprobs, run_ppo_epochs, ppo_update
"""
from __future__ import annotations

_MOVED = {name: module for module, names in {
    "training.tasks": "load_tasks task_from_record TaskSampler SUPPORTED_KINDS",
    "training.rollouts": "collect_rollouts SeededEngine MemoizedLLM Preempted rollout_seed decision_mask "
                         "choice_token_ids mask_forced_tokens",
    "training.scoring": "score_groups ScoredBatch judged make_judge rollout_metrics",
    "training.ppo": "response_logprobs check_logprob_path micro_logprobs run_ppo_epochs ppo_update",
}.items() for name in names.split()}


def __getattr__(name: str):
    if name in _MOVED:
        raise ImportError(f"training.trainer.{name} moved: import it from {_MOVED[name]} "
                          f"(`from {_MOVED[name]} import {name}`)")
    raise AttributeError(f"module 'training.trainer' has no attribute {name!r} (it was split into "
                         "training.tasks, training.rollouts, training.scoring and training.ppo)")
