"""The quickstart's checks as statistics (training/quickstart/stats.py), on hand-worked cases."""
from __future__ import annotations

import json

import pytest

from training.quickstart.stats import (
    TaskOutcome,
    accuracy_gain,
    cost_ratio,
    does_not_rise,
    paired_bootstrap,
    rises,
    share_rise,
)


def task(correct=0, cost=1.0, answers=1, favoured=0, episodes=1):
    return TaskOutcome(episodes=episodes, correct=correct, cost=cost, answer_calls=answers, favoured_calls=favoured)


def test_two_tasks_the_interval_spans_the_resampled_extremes():
    """Two tasks, gains 0 and 1. A paired resample of 2 tasks is (0,0), (0,1), (1,0) or (1,1) with
    chances 1/4, 1/4, 1/4, 1/4: the mean gain is 0, 1/2 or 1 with chances 1/4, 1/2, 1/4, so the
    2.5th percentile is 0, the 97.5th is 1, and the estimate (both tasks) is 1/2."""
    before = [task(correct=0), task(correct=0)]
    after = [task(correct=0), task(correct=1)]
    assert accuracy_gain(before, after) == {"estimate": 0.5, "low": 0.0, "high": 1.0, "width": 1.0}


def test_cost_ratio_is_a_ratio_of_sums_over_the_drawn_tasks():
    """Costs before (1, 1), after (0.5, 1): the ratio over both tasks is 1.5 / 2 = 0.75; a resample
    of task 1 twice gives 0.5, of task 2 twice 1.0, so the interval is [0.5, 1.0]."""
    got = cost_ratio([task(cost=1.0), task(cost=1.0)], [task(cost=0.5), task(cost=1.0)])
    assert got == {"estimate": 0.75, "low": 0.5, "high": 1.0, "width": 0.5}


def test_a_rise_that_every_task_shows_has_a_point_interval():
    """Every task's favoured share goes 0 -> 1 (one answer call each): every resample gives +1."""
    before = [task(answers=1, favoured=0)] * 5
    after = [task(answers=1, favoured=1)] * 5
    assert share_rise(before, after) == {"estimate": 1.0, "low": 1.0, "high": 1.0, "width": 0.0}
    assert rises(share_rise(before, after)) and not does_not_rise(share_rise(before, after))


def test_shares_pool_the_drawn_tasks_answer_calls_and_skip_tasks_without_one():
    """Share = favoured answer calls / answer calls over the tasks (tasks without an answer call add
    nothing); before 1/4 (task 1: 1 of 2, task 2: 0 of 2), after 3/4 (2 of 2, 1 of 2): +0.5."""
    before = [task(answers=2, favoured=1), task(answers=2, favoured=0), task(answers=0)]
    after = [task(answers=2, favoured=2), task(answers=2, favoured=1), task(answers=0)]
    assert share_rise(before, after)["estimate"] == 0.5


def test_does_not_rise_is_the_upper_bound_within_the_width():
    """Issue 43's "upper bound of the rise <= its width" (equivalently: the lower bound <= 0)."""
    assert does_not_rise({"estimate": 0.05, "low": -0.05, "high": 0.15, "width": 0.2})
    assert does_not_rise({"estimate": 0.0, "low": 0.0, "high": 0.0, "width": 0.0})
    assert not does_not_rise({"estimate": 0.1, "low": 0.02, "high": 0.18, "width": 0.16})
    assert not rises({"estimate": 0.05, "low": 0.0, "high": 0.1, "width": 0.1})


def test_the_interval_is_a_pure_function_of_the_tasks_and_pairs_them():
    before = [task(correct=i % 2, cost=1 + i) for i in range(20)]
    after = [task(correct=1, cost=0.5 + i) for i in range(20)]
    first = accuracy_gain(before, after)
    assert accuracy_gain(before, after) == first               # fixed bootstrap seed
    assert 0 < first["low"] < first["estimate"] == 0.5 < first["high"] <= 1
    with pytest.raises(ValueError, match="3 tasks before, 2 after"):
        paired_bootstrap(before[:3], after[:2], lambda b, a: a["correct"].sum(-1))


def test_recompute_reads_the_saved_trajectories_and_flags_a_changed_one(tmp_path, capsys):
    """`--recompute RUN_DIR`: the intervals and checks from eval_<initial|final>_<run>.jsonl alone,
    equal to summary.json's; a trajectory edited afterwards makes it say so (exit 1)."""
    from training.quickstart.run import EVAL_RUNS, checks, intervals, main

    def write(tag, name, rows):
        (tmp_path / f"eval_{tag}_{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    for name in EVAL_RUNS:
        for tag, correct, cost, alias in (("initial", 0, 2e-4, "answer-1"), ("final", 1, 1e-4, "answer-4")):
            write(tag, name, [{"task_id": f"t{i}", "correct": bool(correct or i % 3 == 0), "cost": cost * (1 + i % 4),
                               "favoured": "answer-4",
                               "tool_calls": {"search-1": 1, (alias if "favour" in name or i % 2 else "answer-math-2"): 1}}
                              for i in range(12)])
    ci = intervals(tmp_path)
    assert ci["accuracy_gain"]["estimate"] == pytest.approx(8 / 12, abs=1e-6)     # 4 of 12 right before, 12 after
    assert ci["cost_ratio"]["estimate"] == pytest.approx(0.5, abs=1e-6)
    assert ci["share_rise_favour"] == {"estimate": 1.0, "low": 1.0, "high": 1.0, "width": 0.0}
    (tmp_path / "summary.json").write_text(json.dumps({"intervals": ci, "checks": checks(ci)}))
    assert main(["--recompute", str(tmp_path)]) == 0
    assert "identical to summary.json" in capsys.readouterr().out
    write("final", "cost", [{"task_id": f"t{i}", "correct": False, "cost": 1e-4, "favoured": "answer-4",
                             "tool_calls": {"answer-1": 1}} for i in range(12)])
    assert main(["--recompute", str(tmp_path)]) == 1


def test_the_terminal_tables_fit_80_columns(capsys):
    from training.quickstart import report, run

    row = {"accuracy": 0.41, "cost_per_task": 7.38e-4, "favoured_share": 0.33}
    ci = {key: {"estimate": -0.123, "low": -0.456, "high": 0.789, "width": 1.245} for key, _, _ in report.CHECK_ROWS}
    result = {k: True for k in ("accuracy_up_5_points", "cost_at_least_40pct_lower",
                                "favoured_share_rises_when_favoured", "favoured_share_not_rising_otherwise")}
    report.print_table({n: row for n in run.EVAL_RUNS}, {n: row for n in run.EVAL_RUNS}, ci, result)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 20 and max(len(line) for line in lines) <= 80


def test_the_per_seed_table_fits_80_columns_on_one_line_per_seed(capsys):
    from training.quickstart import report

    ci = {"estimate": -0.123, "low": -0.456, "high": 0.789, "width": 1.245}
    summary = {"seeds": [{"seed": k, "accuracy": [0.41, 0.88], "accuracy_gain": ci, "cost_ratio": ci,
                          "favour_share": [0.16, 0.94], "checks_holding": 4} for k in range(5)],
               "all_seeds_pass": {"accuracy_up_5_points": True}}
    report.print_seeds(summary)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if "->" in line]
    assert len(rows) == 5 and all(line.count("[") == 2 for line in rows)      # no row wraps
