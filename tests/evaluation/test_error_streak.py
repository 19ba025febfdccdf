"""Stopping a run after N consecutive tasks with the same error (evaluation/error_streak.py, runner hook)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from evaluation.error_streak import ErrorStreak, error_signature
from evaluation.runner import ResultsFile, run_tasks

REJECTED = ("RuntimeError: error: gpt-5: request rejected (HTTP 400 from https://api.openai.com/v1, not retried): "
            "Unsupported value: 'temperature' does not support 0.0 with this model. (after {n} turns)")


def err(text):
    return {"id": "x", "status": "error", "error": text}


def test_signature_of_a_rejection_ignores_the_turn_count_and_other_errors_ignore_numbers():
    assert error_signature(err(REJECTED.format(n=1))) == error_signature(err(REJECTED.format(n=7)))
    assert error_signature(err(REJECTED.format(n=1))).startswith("gpt-5: request rejected (HTTP 400")
    assert error_signature(err("LLMCallError: timed out after 12 s")) == error_signature(err("LLMCallError: timed out after 3 s"))
    assert error_signature({"id": "x", "status": "ok"}) is None


def test_three_in_a_row_stop_an_ok_record_resets_other_errors_restart_the_count():
    streak = ErrorStreak(3)
    a, b = err(REJECTED.format(n=1)), err("JudgeError: judge 'gpt-5' failed")
    assert [streak.observe(r) for r in (a, a, {"status": "ok"}, a, b, a, a)] == [None] * 7
    line = streak.observe(a)
    assert line.startswith("stopped: the last 3 tasks failed with the same error: gpt-5: request rejected")
    assert ErrorStreak(0).observe(a) is None
    with pytest.raises(ValueError, match="--stop-after-errors"):
        ErrorStreak(-1)


@dataclass
class T:
    id: str


def test_run_tasks_stops_starting_tasks_once_stop_when_fires(tmp_path):
    started = []

    def solve(task):
        started.append(task.id)
        raise RuntimeError("error: m: request rejected (HTTP 400 from u, not retried): bad (after 1 turns)")

    with ResultsFile(tmp_path / "r.jsonl") as results:
        stats = run_tasks([T(str(i)) for i in range(10)], solve, results, concurrency=1, progress=False,
                          stop_when=ErrorStreak(3).observe)
    assert len(started) <= 4 and stats.errors == 3          # at most one more had started when it fired
    assert stats.stopped and "m: request rejected (HTTP 400 from u, not retried): bad" in stats.stopped
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 3
