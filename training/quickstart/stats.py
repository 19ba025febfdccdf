"""The quickstart's checks as statistics: paired bootstrap intervals over held-out tasks.

Every held-out task is evaluated before and after training (the same task, preference and
sampling seed), so a task is the unit that is resampled: one bootstrap draw picks `n` task
indices with replacement and computes the statistic on the *same* draw for both sides (a paired
bootstrap), which removes the between-task spread from the before/after difference.  The interval
is the 2.5th and 97.5th percentile of `draws` such statistics (numpy's default generator with a
fixed seed, so an interval is a pure function of the per-task numbers).

Per-task numbers (`TaskOutcome`): summed over the task's episodes (one unless --eval-samples is
larger): episodes, correct episodes, dollars, answer calls and the favoured alias's answer calls.
Ratios (accuracy, cost per task, the favoured share) are ratios of sums over the drawn tasks.

Pure: no files, no torch; `recompute` in run.py feeds it the saved trajectories.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

DRAWS = 10_000
BOOTSTRAP_SEED = 20_251_121
LEVEL = 0.95


@dataclass(frozen=True)
class TaskOutcome:
    """One held-out task's episodes under one preference, summed."""

    episodes: int
    correct: int
    cost: float
    answer_calls: int
    favoured_calls: int


def _columns(outcomes: list[TaskOutcome]) -> dict[str, np.ndarray]:
    return {f: np.array([getattr(o, f) for o in outcomes], dtype=float)
            for f in ("episodes", "correct", "cost", "answer_calls", "favoured_calls")}


def accuracy(c: dict[str, np.ndarray]) -> np.ndarray:
    """Correct episodes / episodes along the last axis."""
    return c["correct"].sum(-1) / c["episodes"].sum(-1)


def cost_per_task(c: dict[str, np.ndarray]) -> np.ndarray:
    """Dollars / episodes along the last axis."""
    return c["cost"].sum(-1) / c["episodes"].sum(-1)


def favoured_share(c: dict[str, np.ndarray]) -> np.ndarray:
    """The favoured alias's answer calls / all answer calls (0 where no answer call was made)."""
    calls = c["answer_calls"].sum(-1)
    return np.where(calls > 0, c["favoured_calls"].sum(-1) / np.maximum(calls, 1), 0.0)


def paired_bootstrap(before: list[TaskOutcome], after: list[TaskOutcome],
                     statistic: Callable[[dict, dict], np.ndarray], *, draws: int = DRAWS,
                     seed: int = BOOTSTRAP_SEED, level: float = LEVEL) -> dict[str, float]:
    """{"estimate", "low", "high", "width"}: `statistic(before, after)` on all tasks, and the
    percentile interval of the same statistic over `draws` paired resamples of the tasks.

    `statistic` maps column dicts (arrays whose last axis is the task) to one number per row.
    `before[i]` and `after[i]` must be the same task."""
    if len(before) != len(after):
        raise ValueError(f"paired bootstrap: {len(before)} tasks before, {len(after)} after; "
                         "the same held-out tasks must be on both sides")
    if not before:
        raise ValueError("paired bootstrap: no held-out tasks")
    b, a = _columns(before), _columns(after)
    estimate = float(statistic(b, a))
    index = np.random.default_rng(seed).integers(0, len(before), size=(draws, len(before)))   # [D, N]
    values = statistic({k: v[index] for k, v in b.items()}, {k: v[index] for k, v in a.items()})   # [D]
    tail = 100 * (1 - level) / 2
    low, high = (float(x) for x in np.percentile(values, [tail, 100 - tail]))
    return {"estimate": round(estimate, 6), "low": round(low, 6), "high": round(high, 6),
            "width": round(high - low, 6)}


def accuracy_gain(before: list[TaskOutcome], after: list[TaskOutcome], **kw) -> dict[str, float]:
    """After minus before accuracy (a fraction: 0.05 = 5 points)."""
    return paired_bootstrap(before, after, lambda b, a: accuracy(a) - accuracy(b), **kw)


def cost_ratio(before: list[TaskOutcome], after: list[TaskOutcome], **kw) -> dict[str, float]:
    """After / before cost per task (0.6 = a 40% cut)."""
    return paired_bootstrap(before, after, lambda b, a: cost_per_task(a) / np.maximum(cost_per_task(b), 1e-300), **kw)


def share_rise(before: list[TaskOutcome], after: list[TaskOutcome], **kw) -> dict[str, float]:
    """After minus before favoured share of the answer calls."""
    return paired_bootstrap(before, after, lambda b, a: favoured_share(a) - favoured_share(b), **kw)


# The thresholds (issue 43): never moved to make a run pass.
MIN_ACCURACY_GAIN = 0.05
MIN_COST_CUT = 0.40


def accuracy_check(gain: dict) -> bool:
    """Gain >= 5 points and its interval's lower bound > 0."""
    return gain["estimate"] >= MIN_ACCURACY_GAIN - 1e-9 and gain["low"] > 0


def cost_check(ratio: dict) -> bool:
    """Cut (1 - ratio) >= 40% and the ratio's upper bound < 1."""
    return 1 - ratio["estimate"] >= MIN_COST_CUT - 1e-9 and ratio["high"] < 1


def rises(rise: dict) -> bool:
    """The share rises: the rise's interval lies above 0."""
    return rise["low"] > 0


def does_not_rise(rise: dict) -> bool:
    """The share does not rise: the rise's upper bound is at most the interval's width (issue 43's
    wording; equivalently low <= 0: the interval does not exclude "no rise")."""
    return rise["high"] <= rise["width"] + 1e-12
