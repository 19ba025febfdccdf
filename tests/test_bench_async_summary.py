"""bench/async_rollouts.py --summarize: a setting's figures from its run folder alone (a device
call's time limit can end the bench before it prints them)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
pytest.importorskip("torch")
from async_rollouts import summarize_workdir  # noqa: E402


def test_summarize_reads_the_steps_logged_the_config_and_the_busy_samples(tmp_path):
    run = tmp_path / "run-c1"
    run.mkdir()
    (run / "config.yaml").write_text("algorithm:\n  max_staleness: 1\n  async_order: completion\n"
                                     "  old_logprobs: engine\nengine:\n  share_weights: false\n")
    steps = [  # step 1 (compiles) at t=0, then periods of 10 s and 20 s
        {"step": 1, "time": 0.0, "async/wait": 5.0, "async/staleness_0": 3, "async/staleness_1": 0, "train/samples": 3,
         "async/dropped_stale": 0, "async/groups_of_other_batches": 1, "time/rollout": 9.0, "rollout/turns": 2},
        {"step": 2, "time": 10.0, "async/wait": 4.0, "async/staleness_0": 1, "async/staleness_1": 5, "train/samples": 6,
         "async/dropped_stale": 2, "async/groups_of_other_batches": 1, "time/rollout": 9.0, "rollout/turns": 2},
        {"step": 3, "time": 30.0, "async/wait": 2.0, "async/staleness_0": 0, "async/staleness_1": 4, "train/samples": 4,
         "async/dropped_stale": 1, "async/groups_of_other_batches": 2, "time/rollout": 9.0, "rollout/turns": 2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    (run / "gpu_busy.txt").write_text("-1 100\n5 50\n15 100\n25 0\n40 100\n")   # outside [0, 30]: left out
    (r,) = summarize_workdir(tmp_path)
    assert (r["staleness"], r["order"], r["steps_measured"]) == (1, "completion", 2)
    assert r["step_seconds"] == [10.0, 20.0] and r["steps_per_hour"] == pytest.approx(3600 / 15)
    assert r["gpu_busy"] == pytest.approx(0.5)                       # (50 + 100 + 0) / 3
    assert r["trainer_busy"] == pytest.approx(1 - (4 + 2) / 30)      # steps 2-3 waited 6 of 30 s
    assert r["staleness_histogram"] == {0: 1, 1: 9} and r["dropped_stale"] == 3
    assert r["groups_of_other_batches"] == 3
    assert r["steady"] is None          # s = 1 over 3 steps: step 3 (= s + 2) is the drain (> 3 - 1)


def test_the_steady_window_leaves_out_the_start_burst_and_the_end_drain(tmp_path):
    from async_rollouts import steady_window, summarize

    assert steady_window(0, 6) == (2, 6) and steady_window(2, 10) == (4, 8) and steady_window(3, 12) == (5, 9)
    run = tmp_path / "run"
    run.mkdir()
    # s = 2, 10 steps: step 2 ends at 100 s (step 1 compiled), step 3 at 102 s (the burst: its groups
    # were made while step 1 ran), steps 4-8 every 10 s (steady), steps 9-10 every 40 s (the drain).
    times = {1: 0.0, 2: 100.0, 3: 102.0, 4: 112.0, 5: 122.0, 6: 132.0, 7: 142.0, 8: 152.0, 9: 192.0, 10: 232.0}
    waits = {1: 0.0, 2: 0.0, 3: 0.0, 4: 5.0, 5: 5.0, 6: 5.0, 7: 5.0, 8: 5.0, 9: 35.0, 10: 35.0}
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": k, "time": t, "async/wait": waits[k],
                                                            "train/samples": 1, "time/rollout": 1.0,
                                                            "rollout/turns": 1}) + "\n" for k, t in times.items()))
    busy = [(103.0, 0.0), (110.0, 100.0), (150.0, 50.0), (190.0, 0.0)]   # the window is [102, 152]
    r = summarize(run, busy, 2, "completion", total_steps=10)
    w = r["steady"]
    assert w["steps"] == [4, 8]                                  # periods 3->4 .. 7->8: 10 s each
    assert w["steps_per_hour"] == pytest.approx(360.0)
    assert w["trainer_busy"] == pytest.approx(1 - 25 / 50)
    assert w["gpu_busy"] == pytest.approx(0.5)                   # (0 + 100 + 50) / 3
    assert r["steps_per_hour"] == pytest.approx(3600 / (232 / 9))   # every period after step 1
