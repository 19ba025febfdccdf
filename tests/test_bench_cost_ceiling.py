"""bench/quickstart_cost_ceiling.py: perfect-routing cost from a run's trajectories, hand-worked."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from quickstart_cost_ceiling import ceiling, right_aliases  # noqa: E402


def episode(task: str, kind: str, *calls: tuple[str, str, float]) -> dict:
    """Each call one turn: the orchestrator's turn costs 0.1, the expert's `cost`."""
    return {"task_id": task, "question_kind": kind,
            "turns": [{"policy_cost": 0.1, "expert": {"tool": tool, "alias": alias, "cost": cost}}
                      for tool, alias, cost in calls]}


ROWS = [episode("a", "arithmetic", ("enhance_reasoning", "reasoner-1", 0.3), ("answer", "answer-1", 0.2)),
        episode("a", "arithmetic", ("enhance_reasoning", "reasoner-2", 0.05), ("answer", "answer-math-2", 0.01)),
        episode("b", "year", ("search", "search-1", 0.02), ("answer", "answer-1", 0.2)),
        episode("b", "year", ("search", "search-3", 0.4), ("answer", "answer-math-2", 0.03)),
        episode("b", "year", ("search", "search-3", 0.4))]          # one turn: not in the policy's mean
RIGHT = {"arithmetic": ["reasoner-1", "reasoner-2"], "city": ["search-1", "search-3"], "year": ["search-3"]}


def test_perfect_routing_and_every_lookup_deep_by_hand():
    got = ceiling(ROWS, ["arithmetic", "year", "city"], RIGHT, ["answer-1", "answer-math-2"])
    # policy 2 x 0.1; cheapest answer: answer-math-2 (0.01 + 0.03) / 2 = 0.02
    # sum: reasoner-2 0.05 -> 0.27; year: search-3 0.4 -> 0.62; city (never asked: pooled) search-1 0.02 -> 0.24
    assert got["policy"] == pytest.approx(0.2)
    assert got["prices"]["answer-math-2"] == pytest.approx(0.02) and got["prices"]["search-1"] == pytest.approx(0.02)
    assert got["perfect"] == pytest.approx((0.27 + 0.62 + 0.24) / 3)
    assert got["all_deep"] == pytest.approx((0.27 + 0.62 + 0.62) / 3)        # the city question on search-3


def test_an_alias_never_called_is_priced_from_another_run_or_named():
    right = {**RIGHT, "city": ["search-2", "search-3"]}
    with pytest.raises(ValueError, match="search-2: never called"):
        ceiling(ROWS, ["city"], right, ["answer-math-2"])
    other = [episode("c", "city", ("search", "search-2", 0.001))]
    got = ceiling(ROWS, ["city"], right, ["answer-math-2"], other)
    assert got["perfect"] == pytest.approx(0.2 + 0.02 + 0.001)


def test_the_right_aliases_follow_the_quickstart_world():
    from training.quickstart.env import SEARCH_DEPTH

    right = right_aliases()
    assert right["year"] == ["search-3"] and all(SEARCH_DEPTH[a] == "deep" for a in right["year"])
    assert set(right["city"]) == {"search-1", "search-2", "search-3"}
    assert right["arithmetic"] == ["reasoner-1", "reasoner-2"]
