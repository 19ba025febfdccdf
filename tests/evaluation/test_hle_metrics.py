"""HLE's metrics (evaluation/hle_metrics.py) with hand-worked numbers, and the report's judge column."""
from __future__ import annotations

import json
import math

import pytest

from evaluation.hle_metrics import calib_err, hle_metrics


def test_calib_err_small_bins_by_hand():
    # sorted by confidence: (0.1, 0) (0.5, 0) | (0.7, 1) (0.9, 1); bins of 2; HLE's loop counts the
    # first bin only: |mean(0.1, 0.5) - mean(0, 0)| = 0.3, weight 2/4 -> sqrt(0.5 * 0.09) = sqrt(0.045)
    conf, corr = [0.9, 0.1, 0.5, 0.7], [True, False, False, True]
    assert calib_err(conf, corr, beta=2) == pytest.approx(math.sqrt(0.045))
    assert calib_err(conf, corr, p="1", beta=2) == pytest.approx(0.5 * 0.3)
    assert calib_err(conf, corr, p="infty", beta=2) == pytest.approx(0.3)
    # 5 values, bins of 2: [0, 2), [2, 5): still only the first bin counts, weight 2/5
    assert calib_err(conf + [1.0], corr + [True], beta=2) == pytest.approx(math.sqrt(0.4 * 0.09))


def test_calib_err_with_hles_bin_size_100_by_hand():
    # 300 judged: confidences 0.2 (100 tasks, 50 right), 0.6 (100, 60 right), 0.95 (100, 0 right).
    # Bins [0,100) [100,200) [200,300); the last is left out by HLE's loop:
    # sqrt(1/3 * 0.3^2 + 1/3 * 0^2) = sqrt(0.03) = 0.17320508...
    conf = [0.2] * 100 + [0.6] * 100 + [0.95] * 100
    corr = [True] * 50 + [False] * 50 + [True] * 60 + [False] * 40 + [False] * 100
    assert calib_err(conf, corr) == pytest.approx(math.sqrt(0.03))
    # fewer than 2 bins' worth: one bin, never counted -> 0; fewer than one bin: HLE's code fails -> None
    assert calib_err(conf[:150], corr[:150]) == 0.0
    assert calib_err(conf[:99], corr[:99]) is None
    with pytest.raises(ValueError, match="p must be"):
        calib_err(conf, corr, p="3")


def _record(i, correct, confidence, status="ok"):
    verdict = None if status == "error" else {"correct": correct, "rule": "llm", "confidence": confidence}
    return {"id": f"t{i}", "status": status, "correct": correct if status == "ok" else None, "verdict": verdict}


def test_hle_metrics_accuracy_half_width_and_calibration_by_hand():
    # the 300 tasks above, plus 10 errors (no judge response): n = 310, 110 correct
    conf = [20] * 100 + [60] * 100 + [95] * 100
    corr = [True] * 50 + [False] * 50 + [True] * 60 + [False] * 40 + [False] * 100
    recs = [_record(i, c, p) for i, (c, p) in enumerate(zip(corr, conf))]
    recs += [_record(300 + i, None, None, status="error") for i in range(10)]
    h = hle_metrics(recs)
    # accuracy = round(100 * 110 / 310, 2) = 35.48; half-width = round(1.96 * sqrt(35.48 * 64.52 / 310), 2)
    #          = round(1.96 * sqrt(7.3843...), 2) = round(1.96 * 2.71741..., 2) = 5.33
    assert (h["n"], h["judged"], h["correct"]) == (310, 300, 110)
    assert h["accuracy_pct"] == 35.48 and h["ci95_halfwidth_pct"] == 5.33
    assert h["calib_err"] == pytest.approx(math.sqrt(0.03)) and h["calibration_error_pct"] == 17.0
    assert h["stated_confidence"] == 300 and "calibration_note" not in h


def test_hle_metrics_small_runs_say_why_calibration_is_missing():
    recs = [_record(i, i < 30, 100) for i in range(100)]
    h = hle_metrics(recs)
    # 30 of 100: 30.0 +/- round(1.96 * sqrt(30 * 70 / 100), 2) = 1.96 * 4.5826 = 8.98
    assert (h["accuracy_pct"], h["ci95_halfwidth_pct"], h["calibration_error_pct"]) == (30.0, 8.98, 0.0)
    assert "leaves the last bin out" in h["calibration_note"] and h["stated_confidence"] == 0
    h = hle_metrics(recs[:10])
    assert h["calibration_error_pct"] is None and "fewer than 100" in h["calibration_note"]
    assert hle_metrics([])["accuracy_pct"] is None


def _write_run(folder, config, records):
    folder.mkdir()
    (folder / "run_config.json").write_text(json.dumps(config))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_report_names_every_runs_judge_and_adds_hles_numbers_to_hle_runs(tmp_path, monkeypatch):
    from rich.console import Console

    from evaluation.report import report

    monkeypatch.setenv("COLUMNS", "250")
    recs = [{**_record(i, i < 3, 80), "cost": 0.01, "latency": 1.0} for i in range(10)]
    _write_run(tmp_path / "hle", {"benchmark": "hle", "model": "m", "mode": "all", "judge": "hle",
                                  "judge_model": "o3-mini", "judge_style": "hle"}, recs)
    _write_run(tmp_path / "paper", {"benchmark": "hle", "model": "m", "mode": "none", "judge": None,
                                    "judge_model": "gpt-5", "judge_style": "upstream"}, recs)
    console = Console(record=True, width=250)
    report([tmp_path / "hle", tmp_path / "paper"], viewer=False, console=console)
    text = console.export_text()
    hle = json.loads((tmp_path / "hle" / "summary.json").read_text())
    paper = json.loads((tmp_path / "paper" / "summary.json").read_text())
    assert hle["judge"] == "o3-mini (hle)" and paper["judge"] == "gpt-5 (upstream)"
    assert hle["hle"]["accuracy_pct"] == 30.0 and hle["hle"]["ci95_halfwidth_pct"] == 28.4   # 1.96*sqrt(30*70/10)
    assert hle["hle"]["calibration_error_pct"] is None and "hle" not in paper
    assert "o3-mini (hle)" in text and "gpt-5 (upstream)" in text and "HLE metrics: hle m all" in text
    assert "28.4" in text and "fewer than 100 judged tasks" in text
