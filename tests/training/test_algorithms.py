"""training/algorithms.py: group-relative advantage estimators, worked by hand."""
import math

import pytest
import torch

from training.algorithms import (
    ADVANTAGE_ESTIMATORS,
    compute_advantages,
    get_advantage_estimator,
    register_advantage_estimator,
)


def adv(name, rewards):
    return get_advantage_estimator(name)(torch.tensor(rewards, dtype=torch.float64)).tolist()


def test_grpo_uses_the_sample_std():
    # rewards [1, 0, 0, 0]: mean 0.25, deviations [0.75, -0.25, -0.25, -0.25]
    # sum of squares 0.5625 + 3 * 0.0625 = 0.75; sample var 0.75 / 3 = 0.25, std 0.5
    # A = [0.75 / 0.5, -0.25 / 0.5, ...] = [1.5, -0.5, -0.5, -0.5]
    # (the population std sqrt(0.75 / 4) = 0.433 would give A0 = 1.732)
    assert adv("grpo", [1, 0, 0, 0]) == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)


def test_grpo_ddof_one_on_three_rewards():
    # rewards [0, 1, 2]: mean 1, sum of squares 2, sample var 2 / 2 = 1 -> std 1
    # A = [-1, 0, 1] / (1 + 1e-6)
    expected = [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6)]
    assert adv("grpo", [0, 1, 2]) == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_grpo_clip_at_three_is_reached_with_eleven_rollouts():
    # one 1 and ten 0s: mean 1/11; sum of squares (10/11)^2 + 10 (1/11)^2 = 110/121 = 10/11
    # sample var (10/11) / 10 = 1/11, std = 1/sqrt(11) = 0.301511
    # A0 = (10/11) * sqrt(11) = 10 / sqrt(11) = 3.0151 -> clipped to 3
    # others = -(1/11) * sqrt(11) = -1/sqrt(11) = -0.30151
    rewards = [1.0] + [0.0] * 10
    assert adv("grpo_plain", rewards)[0] == pytest.approx(10 / math.sqrt(11), rel=1e-5)
    a = adv("grpo", rewards)
    assert a[0] == 3.0
    assert a[1:] == pytest.approx([-1 / math.sqrt(11)] * 10, rel=1e-5)


def test_grpo_clip_unreachable_with_eight_rollouts():
    # one 1 and seven 0s: A0 = 7 / sqrt(8) = 2.4749 < 3 (the bound (G - 1) / sqrt(G))
    assert adv("grpo", [1.0] + [0.0] * 7)[0] == pytest.approx(7 / math.sqrt(8), rel=1e-5)


def test_grpo_clips_the_negative_side_too():
    # one 0 and ten 1s mirrors the case above: A0 = -3.0151 -> -3
    assert adv("grpo", [0.0] + [1.0] * 10)[0] == -3.0


@pytest.mark.parametrize("name", sorted(ADVANTAGE_ESTIMATORS))
def test_group_of_one_and_equal_rewards_give_zero(name):
    assert adv(name, [0.7]) == [0.0]
    assert adv(name, [2.0, 2.0, 2.0]) == [0.0, 0.0, 0.0]


def test_dr_grpo_and_rloo_by_hand():
    # dr_grpo: R - mean = [1, 0, 0, 0] - 0.25
    assert adv("dr_grpo", [1, 0, 0, 0]) == pytest.approx([0.75, -0.25, -0.25, -0.25])
    # rloo: A0 = 1 - mean(0, 0, 0) = 1;  A1 = 0 - mean(1, 0, 0) = -1/3
    assert adv("rloo", [1, 0, 0, 0]) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_compute_advantages_groups_by_id_not_by_position():
    # group "a" = positions 0, 2, 4, 5 with rewards [1, 0, 0, 0] -> [1.5, -0.5, -0.5, -0.5]
    # group "b" = [5, 5] -> 0 ; group "c" has one rollout -> 0
    rewards = [1.0, 5.0, 0.0, 5.0, 0.0, 0.0, 7.0]
    ids = ["a", "b", "a", "b", "a", "a", "c"]
    out = compute_advantages(rewards, ids)
    assert out.dtype == torch.float32 and out.shape == (7,)
    assert out.tolist() == pytest.approx([1.5, 0.0, -0.5, 0.0, -0.5, -0.5, 0.0], abs=1e-5)


def test_compute_advantages_refuses_bad_input():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'.*grpo"):
        compute_advantages([1.0, 0.0], ["a", "a"], estimator="ppo")
    with pytest.raises(ValueError, match="2 rewards but 1 group ids"):
        compute_advantages([1.0, 0.0], ["a"])
    with pytest.raises(ValueError, match="NaN"):
        compute_advantages([1.0, float("nan")], ["a", "a"])


def test_registering_a_name_twice_is_refused():
    with pytest.raises(ValueError, match="already registered"):
        register_advantage_estimator("grpo")(lambda r: r)
