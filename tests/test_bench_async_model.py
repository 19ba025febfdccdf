"""bench/async_schedule_model.py: the producer's rules replayed on durations, checked on
constant durations where the schedule can be worked by hand."""
from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from async_schedule_model import simulate  # noqa: E402


def _args(**kw):
    # every tool call 10 s (p99 = median: no spread), one turn a rollout, a 2 s update, 3 GPU-busy s a step
    base = dict(tasks=2, group=2, turns=8, answer_prob=1.0, median=10.0, p99=10.0, decode=0.0, update=2.0,
                gpu_per_step=3.0, steps=20, warmup=4)
    return Namespace(**{**base, **kw})


@pytest.mark.parametrize("order", ["batch", "completion"])
def test_constant_durations_give_the_hand_worked_periods(order):
    """Synchronous: a step is rollouts + update = 12 s (300 steps/h).  s = 1: update k ends at
    u_k = max(u_(k-1) + 2, u_(k-2) + 12) (its batch started when update k - 2 ended), so the period
    p solves p = 12 - p: 6 s (600 steps/h), busy 3 / 6; nothing over the bound."""
    sync = simulate(_args(), 0, order, seed=0)
    assert sync["steps_per_hour"] == pytest.approx(300) and sync["gpu_busy"] == pytest.approx(3 / 12)
    one = simulate(_args(), 1, order, seed=0)
    assert one["steps_per_hour"] == pytest.approx(600) and one["gpu_busy"] == pytest.approx(3 / 6)
    assert sync["stale_turns"] == one["stale_turns"] == 0


def test_completion_order_overtakes_a_slow_tail_that_batch_order_waits_for():
    """With spread tool times completion order is never slower than batch order at the same bound,
    and only completion order trains turns over it (dropped)."""
    spread = _args(p99=200.0, answer_prob=0.3, steps=40, warmup=5, tasks=8, group=4)
    batch = simulate(spread, 1, "batch", seed=3)
    completion = simulate(spread, 1, "completion", seed=3)
    assert completion["steps_per_hour"] > batch["steps_per_hour"]
    assert batch["stale_turns"] == 0 < completion["stale_turns"]
