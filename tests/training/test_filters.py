"""training/filters.py: the paper's three filters."""
import pytest

from orchestrator.records import Rollout, Turn
from training.filters import group_std_keep_mask, keep_finished, valid_turns


def test_low_std_groups_are_dropped_whole():
    # group a [1, 0, 0, 0]: sample std 0.5 >= 0.1 -> kept
    # group b [0.3, 0.3, 0.42]: mean 0.34, squares 0.0016 + 0.0016 + 0.0064 = 0.0096,
    #   var 0.0096 / 2 = 0.0048, std 0.0693 < 0.1 -> dropped
    # group c [2, 2]: std 0 -> dropped; group d has one rollout -> dropped
    rewards = [1, 0.3, 0, 0.3, 0, 0, 0.42, 2, 2, 9]
    ids = ["a", "b", "a", "b", "a", "a", "b", "c", "c", "d"]
    assert group_std_keep_mask(rewards, ids) == [True, False, True, False, True, True,
                                                 False, False, False, False]


def test_group_std_filter_uses_the_sample_std():
    # [0, 0.15]: sample std 0.15 / sqrt(2) = 0.1061 >= 0.1 -> kept
    # (the population std 0.075 would drop it)
    assert group_std_keep_mask([0.0, 0.15], ["g", "g"]) == [True, True]
    # [0, 0.14]: 0.14 / sqrt(2) = 0.0990 < 0.1 -> dropped
    assert group_std_keep_mask([0.0, 0.14], ["g", "g"]) == [False, False]


def test_group_std_filter_checks_lengths():
    with pytest.raises(ValueError, match="3 rewards but 2 group ids"):
        group_std_keep_mask([1, 2, 3], ["a", "a"])


def test_invalid_call_turns_are_dropped():
    r = Rollout(task_id="t", turns=[Turn(index=0, valid=True),
                                    Turn(index=1, valid=False, invalid_reason="unknown alias"),
                                    Turn(index=2, valid=True)])
    assert [t.index for t in valid_turns(r)] == [0, 2]


def test_rollouts_without_final_answer_are_dropped():
    done = Rollout(task_id="t", finished=True, final_answer="42", stop_reason="answer")
    capped = Rollout(task_id="t", finished=False, stop_reason="max_turns")
    broken = Rollout(task_id="t", finished=False, stop_reason="error: timeout")
    assert keep_finished([capped, done, broken]) == [done]
