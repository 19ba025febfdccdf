"""The report's numbers against hand computation on a small results file; plot and summary files."""
import json

import pytest

from evaluation.report import main, summarize

RECORDS = [
    {"id": "q1", "status": "ok", "correct": True, "cost": 0.010, "latency": 30.0, "wall_s": 40.0,
     "tokens": {"prompt": 1000, "completion": 100}, "verdict": {"rule": "exact", "cost": 0.0},
     "tool_calls": {"search-2": 2, "answer-1": 1}, "expert_models": {"gpt-5-mini": 2, "gpt-5": 1}},
    {"id": "q2", "status": "ok", "correct": False, "cost": 0.030, "latency": 90.0, "wall_s": 100.0,
     "tokens": {"prompt": 3000, "completion": 300}, "verdict": {"rule": "llm", "cost": 0.0005},
     "tool_calls": {"search-3": 1, "answer-1": 1}, "expert_models": {"Qwen3-32B": 1, "gpt-5": 1}},
    {"id": "q3", "status": "ok", "correct": True, "cost": 0.020, "latency": 60.0, "wall_s": 70.0,
     "tokens": {"prompt": 2000, "completion": 200}, "verdict": {"rule": "llm", "cost": 0.0005},
     "tool_calls": {"answer-1": 1}, "expert_models": {"gpt-5": 1}},
    {"id": "q4", "status": "error", "error": "RuntimeError: error: policy: LLMCallError: timed out", "wall_s": 5.0},
]


def test_summary_numbers_by_hand():
    s = summarize(RECORDS)
    assert (s["tasks"], s["answered"], s["errors"], s["correct"]) == (4, 3, 1, 2)
    assert s["accuracy"] == pytest.approx(2 / 3)
    assert s["accuracy_errors_as_wrong"] == pytest.approx(2 / 4)
    # cost: (0.01 + 0.03 + 0.02) / 3 = 0.02 $ = 2 cents; latency: (30 + 90 + 60) / 3 = 60 s = 1 min
    assert s["cost_per_query_usd"] == pytest.approx(0.02) and s["cost_per_query_cents"] == pytest.approx(2.0)
    assert s["latency_per_query_s"] == pytest.approx(60.0) and s["latency_per_query_min"] == pytest.approx(1.0)
    assert s["wall_per_query_s"] == pytest.approx(70.0)
    assert s["prompt_tokens_per_query"] == pytest.approx(2000) and s["completion_tokens_per_query"] == pytest.approx(200)
    assert s["judge_cost_usd"] == pytest.approx(0.001)
    # 6 calls: answer-1 3, search-2 2, search-3 1
    assert s["tool_calls"] == {"answer-1": 3, "search-2": 2, "search-3": 1}
    assert s["tool_share"] == pytest.approx({"answer-1": 0.5, "search-2": 1 / 3, "search-3": 1 / 6})
    assert s["model_share"] == pytest.approx({"gpt-5": 0.5, "gpt-5-mini": 1 / 3, "Qwen3-32B": 1 / 6})
    assert s["error_reasons"] == {"RuntimeError: error: policy: LLMCallError: timed out": 1}


def test_later_record_of_an_id_wins_and_tau2_domains_get_pass1():
    recs = [{"id": "a", "status": "error", "error": "x"},
            {"id": "a", "status": "ok", "correct": True, "domain": "airline", "cost": 0.0},
            {"id": "b", "status": "ok", "correct": False, "domain": "airline", "cost": 0.0},
            {"id": "c", "status": "ok", "correct": True, "domain": "retail", "cost": 0.0}]
    s = summarize(recs)
    assert s["errors"] == 0 and s["accuracy"] == pytest.approx(2 / 3)
    assert s["pass1_by_domain"] == {"airline": 0.5, "retail": 1.0}


def test_report_writes_summary_plot_and_viewer(tmp_path, capsys):
    runs = []
    for name, recs in (("run_a", RECORDS), ("run_b", RECORDS[:1])):
        d = tmp_path / name
        d.mkdir()
        (d / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        (d / "run_config.json").write_text(json.dumps({"benchmark": "frames", "model": name, "mode": "all"}))
        runs.append(d)
    plot = tmp_path / "plot.png"
    assert main([str(runs[0]), str(runs[1]), "--plot", str(plot)]) == 0
    summary = json.loads((runs[0] / "summary.json").read_text())
    assert summary["label"] == "frames run_a all" and summary["accuracy"] == pytest.approx(2 / 3)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 5000
    assert (runs[1] / "viewer.html").exists()
    out = capsys.readouterr().out
    assert "frames run_a all" in out and "66.7" in out and "2.000" in out and "Tool mix" in out


def test_report_on_a_folder_without_results_says_so(tmp_path, capsys):
    assert main([str(tmp_path)]) == 1
    assert "no results.jsonl" in capsys.readouterr().err
