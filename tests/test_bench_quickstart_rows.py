"""bench/quickstart_rows.py: one docs row per quickstart run folder, on hand-made summaries."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from quickstart_rows import main  # noqa: E402  (bench/ is scripts, not a package)


def ci(estimate: float, low: float, high: float) -> dict:
    return {"estimate": estimate, "low": low, "high": high, "width": high - low}


def run_dir(root: Path, *, forced: str | None, favour_low: float) -> Path:
    root.mkdir(parents=True)
    rise = ci(0.2, favour_low, 0.3)
    summary = {
        "seed": 3, "wall_seconds": 600.0,
        "initial": {"cost": {"accuracy": 0.5}}, "final": {"cost": {"accuracy": 0.75}},
        "intervals": {"accuracy_gain": ci(0.25, 0.1, 0.4), "cost_ratio": ci(0.5, 0.45, 0.55),
                      "share_rise_favour": rise, "share_rise_favour_paraphrase": ci(0.1, 0.02, 0.2),
                      "share_rise_accuracy": ci(-0.01, -0.05, 0.03), "share_rise_cost": ci(0.0, 0.0, 0.0),
                      "share_rise_accuracy_paraphrase": ci(0.02, -0.04, 0.08), "share_rise_cost_paraphrase": ci(-0.1, -0.2, 0.0)},
        "checks": {"accuracy_up_5_points": True, "cost_at_least_40pct_lower": True,
                   "favoured_share_rises_when_favoured": favour_low > 0, "favoured_share_not_rising_otherwise": True},
        "reading": {"warm": {"favour": 0.5, "cost": 0.07}, "final": {"favour": 0.9, "cost": 0.01}},
        "machine": {"cpu_model": "Some CPU", "cpu_capability": "AVX512", "cpu_seconds": 812.4,
                    "load_average_1min": 1.5, "kernel_env": {"ATEN_CPU_CAPABILITY": forced}},
    }
    (root / "summary.json").write_text(json.dumps(summary))
    return root


def test_a_row_per_run_with_intervals_kernels_reading_and_the_count(tmp_path, capsys):
    a = run_dir(tmp_path / "seed-3-native", forced=None, favour_low=0.1)
    b = run_dir(tmp_path / "seed-3-avx2", forced="avx2", favour_low=-0.02)
    assert main([str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == ("| seed-3-native | 3 | Some CPU, AVX512 | 0.50 -> 0.75 | +0.25 [+0.10, +0.40] | 0.50 [0.45, 0.55] "
                        "| +0.20 [+0.10, +0.30] | +0.10 [+0.02, +0.20] | -0.01 (+0.02) / +0.00 (-0.10) | 0.50/0.07 -> 0.90/0.01 "
                        "| **4 of 4** | 812 | 10.0 min (1.5) |")
    assert "| Some CPU, AVX2 forced |" in lines[3] and "| 3 of 4 |" in lines[3]
    assert lines[-1] == "7 of 8 checks hold over 2 runs."
    c = run_dir(tmp_path / "seed-3-default", forced="default", favour_low=0.1)   # ATen's scalar kernels
    assert main([str(c)]) == 0 and "| Some CPU, DEFAULT forced |" in capsys.readouterr().out


def test_a_run_whose_warm_up_was_tried_again_says_which_try_it_kept(tmp_path, capsys):
    run = run_dir(tmp_path / "seed-3-native", forced=None, favour_low=0.1)
    summary = json.loads((run / "summary.json").read_text())
    summary["warmup_tries"] = [{"seed": 3, "separation": 0.01}, {"seed": 10010, "separation": 0.4}]
    (run / "summary.json").write_text(json.dumps(summary))
    assert main([str(run)]) == 0
    assert "| 0.50/0.07 -> 0.90/0.01 (warm-up try 2) |" in capsys.readouterr().out.splitlines()[2]
    summary["warmup_tries"] = [{"separation": 0.01, "kept": False}, {"separation": 0.2, "kept": True},
                               {"separation": 0.1, "kept": False}]          # none passed: the best kept
    (run / "summary.json").write_text(json.dumps(summary))
    assert main([str(run)]) == 0
    assert "| 0.50/0.07 -> 0.90/0.01 (warm-up try 2) |" in capsys.readouterr().out.splitlines()[2]


def test_a_folder_without_summary_is_named(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2
    assert f"no summary.json in {tmp_path}" in capsys.readouterr().err
