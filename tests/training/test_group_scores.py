"""training/group_scores.py: the group is the whole group (PAPER.md §4, upstream's valid_answers)."""
import math

import pytest

from training.group_scores import score_group


def rollout(outcome, cost, calls=None, latency=0.0):
    return {"tool_calls": calls or {}, "outcome": outcome, "cost": cost, "latency": latency}


def test_issue_case_every_correct_rollout_gets_a_positive_advantage():
    # 8 rollouts: 3 correct at $0.01 / $0.02 / $0.05, 5 unfinished (no answer) at $0.03 each.
    # P = {outcome: 1, cost: 1}.
    # outcome column [1,1,1,0,0,0,0,0] -> normalised the same.
    # -cost column: -0.01, -0.02, -0.05, -0.03 x5; min -0.05, max -0.01, range 0.04
    #   normalised (x + 0.05) / 0.04 = 1, 0.75, 0, 0.5 x5.
    # R = outcome + cost for correct rollouts, 0 otherwise: [2, 1.75, 1, 0, 0, 0, 0, 0].
    # mean = 4.75 / 8 = 0.59375; deviations 1.40625, 1.15625, 0.40625, -0.59375 x5;
    # squares 1.9775391 + 1.3369141 + 0.1650391 + 5 x 0.3525391 = 5.2421875; / 7 = 0.7488839;
    # sample std = 0.8653808.
    # A = dev / (std + 1e-6): 1.6250, 1.3361, 0.4694, -0.6861 (x5).
    # (Over the 3 finishers alone the outcome column would be constant: R = [1, 0.75, 0], and the
    # correct $0.05 answer would get a negative advantage.)
    group = [rollout(1, 0.01), rollout(1, 0.02), rollout(1, 0.05)] + [rollout(0, 0.03) for _ in range(5)]
    finished = [True] * 3 + [False] * 5
    score = score_group(group, {"outcome": 1.0, "cost": 1.0}, finished)
    assert score.rewards == pytest.approx([2.0, 1.75, 1.0, 0, 0, 0, 0, 0])
    std = math.sqrt(5.2421875 / 7)
    expected = [d / (std + 1e-6) for d in (1.40625, 1.15625, 0.40625)] + [-0.59375 / (std + 1e-6)] * 5
    assert score.kept
    assert score.advantages == pytest.approx(expected, abs=1e-5)
    assert all(a > 0 for a in score.advantages[:3])
    # unfinished rollouts count in the statistics but their turns are not trained on
    assert score.trained == [True, True, True, False, False, False, False, False]


def test_a_group_whose_only_finisher_is_correct_is_kept():
    # 1 correct finisher + 7 unfinished: R = [1 (outcome column 1 vs 0; cost constant), 0 x7].
    # mean 1/8, sample std sqrt((7/8)^2 + 7 (1/8)^2) / 7) = sqrt(0.875 / 7) = 0.35355 >= 0.1: kept.
    # A_0 = 0.875 / 0.35355 = 2.4749 (the bound (G - 1) / sqrt(G) of docs/training-algorithms.md).
    group = [rollout(1, 0.02)] + [rollout(0, 0.02) for _ in range(7)]
    score = score_group(group, {"outcome": 1.0, "cost": 1.0}, [True] + [False] * 7)
    assert score.kept and score.trained == [True] + [False] * 7
    assert score.advantages[0] == pytest.approx(0.875 / (math.sqrt(0.875 / 7) + 1e-6), abs=1e-5)


def test_a_flat_group_is_dropped_and_trains_nothing():
    # Every rollout correct at the same cost: every normalised column is constant, R = 0 everywhere.
    group = [rollout(1, 0.02) for _ in range(4)]
    score = score_group(group, {"outcome": 1.0, "cost": 1.0}, [True] * 4)
    assert not score.kept and score.trained == [False] * 4 and score.advantages == [0.0] * 4


def test_correct_sample_boost_adds_where_the_normalised_advantage_reaches_the_threshold():
    # R = [2, 1.75, 1, 0 x5]: mean 0.59375, sample std sqrt(5.2421875 / 7) = 0.86538, so
    # A = [1.6250, 1.3361, 0.4695, -0.6861 x5].  Upstream boosts where the *normalised* reward
    # (the advantage) is >= 1: the first two get +0.1; the third is correct (R = 1) but A < 1.
    group = [rollout(1, 0.01), rollout(1, 0.02), rollout(1, 0.05)] + [rollout(0, 0.03) for _ in range(5)]
    finished = [True] * 3 + [False] * 5
    plain = score_group(group, {"outcome": 1.0, "cost": 1.0}, finished)
    boosted = score_group(group, {"outcome": 1.0, "cost": 1.0}, finished, boost=0.1)
    diff = [b - a for a, b in zip(plain.advantages, boosted.advantages)]
    assert plain.advantages[:3] == pytest.approx([1.40625 / 0.865381, 1.15625 / 0.865381, 0.40625 / 0.865381],
                                                 abs=1e-4)
    assert diff == pytest.approx([0.1, 0.1, 0, 0, 0, 0, 0, 0], abs=1e-6)


def test_an_unfinished_rollout_cannot_carry_a_positive_outcome():
    with pytest.raises(ValueError, match=r"group\[1\].*unfinished"):
        score_group([rollout(1, 0.01), rollout(1, 0.02)], {"outcome": 1.0}, [True, False])
    with pytest.raises(ValueError, match="finished flags"):
        score_group([rollout(1, 0.01)], {"outcome": 1.0}, [True, False])
