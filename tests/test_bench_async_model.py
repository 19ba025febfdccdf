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


def test_completion_order_takes_the_oldest_groups_done_and_batch_order_its_own_batch():
    """Hand-worked: 2 groups a batch, one 1-turn rollout each, every group 10 s but (0, 1) 30 s; 2 s
    updates; s = 1, so batches 0 and 1 start at 0 s.  Completion order: step 0 at 10 s takes (0, 0),
    (1, 0) (done at 10 s, oldest first); update 0 ends at 12 s and batch 2 starts (done at 22 s);
    step 1 at 22 s takes (1, 1), (2, 0); update 1 ends at 24 s, batch 3 starts (done at 34 s); step 2
    at 30 s takes (0, 1) (its turn was made by version 0: staleness 2 > 1, over the bound), (2, 1);
    step 3 at 34 s takes batch 3.  Batch order waits for (0, 1) at step 0."""
    def durations(j, i):
        return [[30.0 if (j, i) == (0, 1) else 10.0]]
    args = _args(steps=4, warmup=1, group=1)
    completion = simulate(args, 1, "completion", seed=0, durations=durations)
    assert completion["taken"] == [[(0, 0), (1, 0)], [(1, 1), (2, 0)], [(0, 1), (2, 1)], [(3, 0), (3, 1)]]
    assert completion["stale_turns"] == pytest.approx(1 / 8)
    batch = simulate(args, 1, "batch", seed=0, durations=durations)
    assert batch["taken"] == [[(0, 0), (0, 1)], [(1, 0), (1, 1)], [(2, 0), (2, 1)], [(3, 0), (3, 1)]]
    assert batch["stale_turns"] == 0
