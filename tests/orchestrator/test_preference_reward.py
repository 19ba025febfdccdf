"""orchestrator/preference_reward.py (training/rewards.py re-exports it): the paper's preference
reward, against groups worked by hand."""
import pytest

from orchestrator.preference_reward import preference_rewards, reward_inputs
from orchestrator.records import ExpertCall, Rollout, Turn


def rollout(calls, outcome, cost, latency):
    return {"tool_calls": calls, "outcome": outcome, "cost": cost, "latency": latency}


def test_constant_coordinates_normalise_to_zero_so_reward_is_zero():
    # Every coordinate has max == min (outcome is 1 in both, too), so every normalised
    # coordinate is 0 and R = 0 . P = 0 even though both rollouts are correct.
    group = [rollout({"search-1": 1}, 1, 0.05, 10.0), rollout({"search-1": 1}, 1, 0.05, 10.0)]
    pref = {"search-1": 1.0, "outcome": 1.0, "cost": 1.0, "latency": 1.0}
    assert preference_rewards(group, pref) == [0.0, 0.0]


def test_all_wrong_group_gets_zero_whatever_cost_and_tools():
    # outcome 0 everywhere: R = 0 for every rollout, although cost/latency/tools differ.
    group = [rollout({"answer-1": 1}, 0, 0.01, 1.0), rollout({"search-2": 3}, 0, 0.90, 50.0)]
    pref = {"answer-1": 1.0, "search-2": 1.0, "outcome": 1.0, "cost": 1.0, "latency": 1.0}
    assert preference_rewards(group, pref) == [0.0, 0.0]


def test_preference_on_unused_alias_adds_nothing():
    # answer-1 is in the preference but no rollout calls it: its column is [0, 0],
    # max == min -> normalised [0, 0], so weight 5 adds 0.  outcome column [1, 0]
    # normalises to [1, 0]; R = [1 * 1.0, 0 (wrong)] = [1, 0].
    group = [rollout({"search-2": 1}, 1, 0.1, 5.0), rollout({"search-2": 1}, 0, 0.1, 5.0)]
    assert preference_rewards(group, {"answer-1": 5.0, "outcome": 1.0}) == [1.0, 0.0]


def test_cheaper_rollout_gets_the_cost_weight():
    # -cost column: [-0.02, -0.05]; min -0.05, max -0.02, range 0.03
    # normalised: [(-0.02 + 0.05) / 0.03, 0] = [1, 0] -> the cheaper rollout earns the weight.
    group = [rollout({}, 1, 0.02, 10.0), rollout({}, 1, 0.05, 10.0)]
    assert preference_rewards(group, {"cost": 1.0}) == pytest.approx([1.0, 0.0])


def test_faster_rollout_gets_the_latency_weight():
    # -latency column: [-30, -10] -> normalised [0, 1]; weight 2 -> R = [0, 2].
    group = [rollout({}, 1, 0.02, 30.0), rollout({}, 1, 0.02, 10.0)]
    assert preference_rewards(group, {"latency": 2.0}) == pytest.approx([0.0, 2.0])


def test_mixed_group_of_three_worked_by_hand():
    group = [
        rollout({"search-1": 2, "answer-2": 1}, 1, 0.30, 40.0),
        rollout({"search-3": 1, "answer-2": 1}, 1, 0.10, 20.0),
        rollout({"answer-1": 1}, 0, 0.50, 100.0),
    ]
    pref = {"search-3": 0.5, "search-1": 0.25, "outcome": 1.0, "cost": 1.0, "latency": 0.5}
    # columns (aliases sorted), raw -> normalised over all three rollouts:
    #   answer-1  [0, 0, 1]            -> [0, 0, 1]      weight 0 (missing)
    #   answer-2  [1, 1, 0]            -> [1, 1, 0]      weight 0 (missing)
    #   search-1  [2, 0, 0]            -> [1, 0, 0]      weight 0.25
    #   search-3  [0, 1, 0]            -> [0, 1, 0]      weight 0.5
    #   outcome   [1, 1, 0]            -> [1, 1, 0]      weight 1
    #   -cost     [-0.3, -0.1, -0.5]   -> [0.2/0.4, 1, 0] = [0.5, 1, 0]    weight 1
    #   -latency  [-40, -20, -100]     -> [60/80, 1, 0]   = [0.75, 1, 0]   weight 0.5
    # (the wrong rollout still sets the min of -cost/-latency: normalisation is over the group)
    # R0 = 0.25*1 + 1*1 + 1*0.5 + 0.5*0.75 = 0.25 + 1 + 0.5 + 0.375 = 2.125
    # R1 = 0.5*1 + 1*1 + 1*1 + 0.5*1     = 3.0
    # R2 = 0 (outcome 0)
    assert preference_rewards(group, pref) == pytest.approx([2.125, 3.0, 0.0])


def test_negative_weight_penalises_the_heavier_user_of_an_alias():
    # "avoid web search": search-1 column [0, 4] -> [0, 1]; weight -1; outcome column
    # [1, 1] is constant -> 0.  R = [0, -1].
    group = [rollout({}, 1, 0.1, 1.0), rollout({"search-1": 4}, 1, 0.1, 1.0)]
    assert preference_rewards(group, {"search-1": -1.0, "outcome": 1.0}) == [0.0, -1.0]


def test_rewards_follow_the_group_order_and_accept_float_outcomes():
    group = [rollout({}, 0.0, 0.0, 0.0), rollout({}, 1.0, 0.0, 0.0)]
    assert preference_rewards(group, {"outcome": 1.0}) == [0.0, 1.0]


@pytest.mark.parametrize("bad, message", [
    (rollout({}, 0.5, 0.1, 1.0), "outcome"),
    (rollout({}, True, 0.1, 1.0), "outcome"),
    (rollout({}, 1, -0.1, 1.0), "cost"),
    (rollout({}, 1, 0.1, float("nan")), "latency"),
    (rollout({"search-1": -1}, 1, 0.1, 1.0), "search-1"),
    (rollout({"cost": 1}, 1, 0.1, 1.0), "collides"),
    ({"tool_calls": {}, "outcome": 1, "cost": 0.1}, "latency"),
])
def test_bad_rollout_fields_are_named(bad, message):
    with pytest.raises((ValueError, TypeError), match=message):
        preference_rewards([rollout({}, 1, 0.1, 1.0), bad], {"outcome": 1.0})


def test_bad_preference_and_empty_group_are_refused():
    group = [rollout({}, 1, 0.1, 1.0)]
    with pytest.raises(TypeError, match="preference key 3"):
        preference_rewards(group, {3: 1.0})
    with pytest.raises(ValueError, match="preference\\['cost'\\]"):
        preference_rewards(group, {"cost": "high"})
    with pytest.raises(ValueError, match="empty"):
        preference_rewards([], {"outcome": 1.0})
    with pytest.raises(TypeError, match="list of rollout dicts"):
        preference_rewards(group[0], {"outcome": 1.0})


def test_reward_inputs_reads_a_judged_rollout():
    turns = [Turn(index=0, valid=True, policy_cost=0.001,
                  expert=ExpertCall(tool="search", alias="search-2", model="m", cost=0.004, latency=2.0)),
             Turn(index=1, valid=True, policy_cost=0.001,
                  expert=ExpertCall(tool="answer", alias="answer-1", model="m", cost=0.02, latency=5.0))]
    r = Rollout(task_id="t1", turns=turns, finished=True, outcome=1.0)
    entry = reward_inputs(r)
    # cost = 0.001 + 0.004 + 0.001 + 0.02 = 0.026 dollars; latency = 2 + 5 = 7 s
    assert entry["tool_calls"] == {"search-2": 1, "answer-1": 1}
    assert entry["outcome"] == 1.0
    assert entry["cost"] == pytest.approx(0.026)
    assert entry["latency"] == pytest.approx(7.0)
    with pytest.raises(ValueError, match="no outcome"):
        reward_inputs(Rollout(task_id="t2"))
