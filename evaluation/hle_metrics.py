"""HLE's own metrics for a run judged by the `hle` judge: accuracy with its 95% half-width and
the RMS calibration error, computed as HLE's `dump_metrics` computes them (centerforaisafety/hle
hle_eval/run_judge_results.py at 87c92ea, lines 100-158; docs/evaluation.md "HLE's official judge").

- n: every task of the run; a task with no structured verdict (an error, a judge error) counts
  in n and not as correct, as HLE counts a question whose judge response is missing;
- accuracy = round(100 * correct / n, 2) percent; half-width = round(1.96 * sqrt(a * (100 - a) / n), 2)
  with `a` that rounded accuracy (Wald, 95%);
- calibration error = 100 * round(calib_err(confidence / 100, correct, p=2, beta=100), 2) over the
  judged tasks, `confidence` being the judge's extraction of the answer's stated confidence
  (100 where it states none, per HLE's prompt).

`calib_err` keeps HLE's binning exactly, quirks included: the judged tasks sorted by confidence
(numpy's default argsort) are cut into bins of `beta`, the remainder joining the last bin, and the
loop then leaves the last bin out (`range(len(bins) - 1)`).  So with fewer than 2 * beta tasks the
error is 0, and with fewer than `beta` HLE's code raises (IndexError on an empty bin list): we return
None there and say why.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

BETA = 100   # HLE's target bin size


def calib_err(confidence, correct, p: str = "2", beta: int = BETA) -> float | None:
    """HLE's binned calibration error (from hendrycks/outlier-exposure's calibration_tools):
    `confidence` in [0, 1], `correct` booleans; p "2" (RMS), "1" or "infty".  None when there
    are fewer than `beta` values (HLE's code fails there)."""
    confidence, correct = np.asarray(confidence, dtype=float), np.asarray(correct, dtype=float)
    total = len(confidence)
    if total < beta:
        return None
    order = np.argsort(confidence)
    confidence, correct = confidence[order], correct[order]
    edges = [[i * beta, (i + 1) * beta] for i in range(total // beta)]
    edges[-1][1] = total
    err = 0.0
    for start, stop in edges[:-1]:   # HLE's loop: the last bin is never counted
        gap = abs(float(np.nanmean(confidence[start:stop])) - float(np.nanmean(correct[start:stop])))
        weight = (stop - start) / total
        if p == "2":
            err += weight * gap ** 2
        elif p == "1":
            err += weight * gap
        elif p in ("infty", "infinity", "max"):
            err = max(err, gap)
        else:
            raise ValueError(f"p must be '1', '2' or 'infty', got {p!r}")
    return math.sqrt(err) if p == "2" else err


def hle_metrics(records: list[dict[str, Any]]) -> dict[str, Any]:
    """HLE's numbers for a run's records (last record per id wins)."""
    by_id = {r["id"]: r for r in records}
    judged = [r for r in by_id.values()
              if r.get("status") != "error" and (r.get("verdict") or {}).get("confidence") is not None]
    n = len(by_id)
    correct = [bool(r.get("correct")) for r in judged]
    confidence = [float(r["verdict"]["confidence"]) / 100 for r in judged]
    out: dict[str, Any] = {"n": n, "judged": len(judged), "correct": sum(correct),
                           "stated_confidence": sum(1 for r in judged if r["verdict"]["confidence"] != 100)}
    if not n:
        return {**out, "accuracy_pct": None, "ci95_halfwidth_pct": None, "calibration_error_pct": None,
                "calibration_note": "no tasks"}
    accuracy = round(100 * sum(correct) / n, 2)
    err = calib_err(confidence, correct)
    out.update(accuracy_pct=accuracy, ci95_halfwidth_pct=round(1.96 * math.sqrt(accuracy * (100 - accuracy) / n), 2),
               calib_err=err, calibration_error_pct=None if err is None else round(100 * round(err, 2), 6))
    if err is None:
        out["calibration_note"] = f"fewer than {BETA} judged tasks: HLE's calib_err needs one full bin"
    elif len(judged) < 2 * BETA:
        out["calibration_note"] = (f"fewer than {2 * BETA} judged tasks: HLE's calib_err leaves the last bin out, "
                                   f"so one bin gives 0")
    return out
