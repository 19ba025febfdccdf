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
