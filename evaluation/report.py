"""Reports over evaluation runs: accuracy, cost and latency per query, tool mix, errors.

    python -m evaluation.report RUN_DIR [RUN_DIR ...] [--plot cost_accuracy.png] [--no-viewer] [--no-task-table]
    python -m evaluation.report GAIA_RUN_DIR --gaia-submission PATH   # also the GAIA leaderboard's file

For each run folder (made by run_hle.py / run_frames.py / run_tau2.py) this reads
`results.jsonl` (+ `run_config.json` for the label), writes `summary.json` and a static
trajectory viewer `viewer.html` into it, prints a table, and plots accuracy against cost
per query for all the runs given (the paper's cost/accuracy figure).

Definitions (PAPER.md §3, §8-9):
- accuracy = correct / answered tasks (tau2: pass^1 = mean success); errors are counted
  apart, and `accuracy_errors_as_wrong` = correct / (answered + errors) is also given;
- cost per query = mean dollars over answered tasks, shown in cents (orchestrator tokens,
  expert tokens, code seconds, search fees; the judge's tokens are not included); what
  failed tasks spent before failing is `error_cost_usd` (with `error_tokens`, `error_turns`),
  and `total_cost_usd` is the whole run's bill;
- accuracy over zero answered tasks is undefined: `null` in summary.json, "n/a" in the table;
- latency per query = mean tool wall-clock seconds over answered tasks, shown in minutes;
- tool mix = share of all tool calls going to each alias, and to each model behind it;
- tau2 (evaluation/tau2_metrics.py): tau2's pass^1..k per domain over each task's trials
  (C(c, k) / C(n, k) averaged over tasks; an error trial counts as a failure, as in tau2's own
  results file), a per-task table (successes / trials, reward per trial), and the run's tau2
  package version, task set and user simulator from run_config.json.
- GAIA runs: accuracy per level (`accuracy_by_level`); tasks without a reference (the test
  split) are answered but not judged (`unscored`) and left out of accuracy;
- judge = who decided correctness (run_config.json: the named judge, or model and style; tau2:
  its evaluator), shown for every run;
- runs judged by `hle` (HLE's official judge) also get HLE's own numbers (evaluation/hle_metrics.py):
  accuracy over all tasks with its 95% half-width and the RMS calibration error (`hle` in summary.json).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from evaluation.hle_metrics import hle_metrics
from evaluation.runner import RESULTS_NAME, read_records
from evaluation.tau2_metrics import trial_table
from evaluation.viewer import write_viewer

SUMMARY_NAME = "summary.json"
CONFIG_NAME = "run_config.json"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _shares(counter: Counter) -> dict[str, float]:
    total = sum(counter.values())
    return {k: v / total for k, v in counter.most_common()} if total else {}


def summarize(records: list[dict], benchmark: str | None = None) -> dict[str, Any]:
    """Numbers of one run from its records (last record per id wins); see module docstring.
    tau2 runs (`benchmark` "tau2", or records with `domain` and `task_id`) also get `tau2`:
    pass^k per domain and the per-task trial table (tau2_metrics.trial_table)."""
    by_id = {r["id"]: r for r in records}
    answered = [r for r in by_id.values() if r.get("status") != "error"]
    errors = [r for r in by_id.values() if r.get("status") == "error"]
    correct = sum(bool(r.get("correct")) for r in answered)
    # answered but not judged: no reference to judge against (GAIA's test split); out of accuracy
    unscored = sum((r.get("verdict") or {}).get("rule") == "no_reference" for r in answered)
    aliases, models = Counter(), Counter()
    for r in answered:
        aliases.update(r.get("tool_calls") or {})
        models.update(r.get("expert_models") or {})
    tokens = [r.get("tokens") or {} for r in answered]
    error_tokens = [r.get("tokens") or {} for r in errors]
    summary = {
        "tasks": len(by_id),
        "answered": len(answered),
        "errors": len(errors),
        "correct": correct,
        "accuracy": correct / (len(answered) - unscored) if len(answered) > unscored else None,   # None: "n/a"
        "accuracy_errors_as_wrong": correct / (len(by_id) - unscored) if len(by_id) > unscored else None,
        "unscored": unscored,
        "cost_per_query_usd": _mean([float(r.get("cost") or 0.0) for r in answered]),
        # what failed tasks spent before failing: part of the run's bill, not of the per-query mean
        "error_cost_usd": sum(float(r.get("cost") or 0.0) for r in errors),
        "error_turns": sum(len(r.get("turns") or []) for r in errors),
        "error_tokens": {"prompt": sum(int(t.get("prompt", 0)) for t in error_tokens),
                         "completion": sum(int(t.get("completion", 0)) for t in error_tokens)},
        "total_cost_usd": sum(float(r.get("cost") or 0.0) for r in by_id.values()),
        "latency_per_query_s": _mean([float(r.get("latency") or 0.0) for r in answered]),
        "wall_per_query_s": _mean([float(r.get("wall_s") or 0.0) for r in answered]),
        "judge_cost_usd": sum(float((r.get("verdict") or {}).get("cost") or 0.0) for r in answered),
        "prompt_tokens_per_query": _mean([float(t.get("prompt", 0)) for t in tokens]),
        "completion_tokens_per_query": _mean([float(t.get("completion", 0)) for t in tokens]),
        "tool_calls": dict(aliases.most_common()),
        "tool_share": _shares(aliases),
        "model_share": _shares(models),
        "error_reasons": dict(Counter(str(r.get("error", ""))[:120] for r in errors).most_common(10)),
    }
    summary["cost_per_query_cents"] = summary["cost_per_query_usd"] * 100
    summary["latency_per_query_min"] = summary["latency_per_query_s"] / 60
    domains = sorted({r["domain"] for r in answered if r.get("domain")})
    if domains:  # tau2: pass^1 per domain over answered trials
        summary["pass1_by_domain"] = {
            d: _mean([1.0 if r.get("correct") else 0.0 for r in answered if r.get("domain") == d])
            for d in domains}
    levels = sorted({(r.get("meta") or {}).get("level") for r in answered if r.get("correct") is not None} - {None})
    if levels:   # GAIA: accuracy per level (the leaderboard's columns), over the judged tasks
        summary["accuracy_by_level"] = {
            str(lv): _mean([1.0 if r["correct"] else 0.0 for r in answered
                            if r.get("correct") is not None and (r.get("meta") or {}).get("level") == lv])
            for lv in levels}
    if by_id and (benchmark == "tau2" or any(r.get("domain") and r.get("task_id") is not None for r in answered)):
        table = trial_table(list(by_id.values()))
        summary["tau2"] = table
        summary["pass_hat_k_by_domain"] = {d: v["pass_hat_k"] for d, v in table["domains"].items()}
    return summary


def load_run(run_dir: str | Path) -> tuple[dict, list[dict]]:
    run_dir = Path(run_dir)
    path = run_dir / RESULTS_NAME
    if not path.exists():
        raise FileNotFoundError(f"{run_dir}: no {RESULTS_NAME}; is this a run folder made by evaluation/run_*.py?")
    config = {}
    if (run_dir / CONFIG_NAME).exists():
        config = json.loads((run_dir / CONFIG_NAME).read_text())
    records, bad = read_records(path)
    for line in bad:
        print(f"warning: {path}:{line}: unreadable record skipped", file=sys.stderr)
    return config, records


def run_label(run_dir: Path, config: dict) -> str:
    parts = [config.get("benchmark"), config.get("model"), config.get("mode"),
             (config.get("preference") or {}).get("name"), "unseen" if config.get("catalog_mode") == "unseen" else None]
    label = " ".join(str(p) for p in parts if p)
    return label or run_dir.name


def judge_label(config: dict) -> str:
    """Who judged the run: "<judge model> (<judge style>)", "exact (lenient)", "tau2 evaluator"."""
    if config.get("benchmark") == "tau2":
        return "tau2 evaluator"
    model, kind = config.get("judge_model"), config.get("judge") or config.get("judge_style")
    if not model:
        return "unknown"
    if model == "gaia":   # a rule judge: no prompt style applies
        return "gaia (GAIA's scorer)"
    return f"{model} ({kind})" if kind else str(model)


def print_hle(label: str, h: dict, console) -> None:
    """HLE's own numbers, as its run_judge_results.py prints them."""
    from rich.table import Table  # lazy: display only, slow to import

    table = Table(title=f"HLE metrics: {label} (HLE's judge; accuracy over all tasks, 95% half-width, "
                        f"RMS calibration error)")
    for col in ("n", "judged", "accuracy %", "± (95%)", "calibration error", "stated confidence"):
        table.add_column(col, justify="right")
    na = "n/a"
    table.add_row(str(h["n"]), str(h["judged"]), na if h["accuracy_pct"] is None else f"{h['accuracy_pct']:g}",
                  na if h["ci95_halfwidth_pct"] is None else f"{h['ci95_halfwidth_pct']:g}",
                  na if h["calibration_error_pct"] is None else f"{h['calibration_error_pct']:g}",
                  str(h["stated_confidence"]))
    console.print(table)
    if h.get("calibration_note"):
        console.print(f"calibration error: {h['calibration_note']}", markup=False)


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _reward(value: float | None) -> str:
    return "err" if value is None else f"{value:g}"


def tau2_provenance(config: dict) -> list[str]:
    """What the run's tau2 was, from its run_config.json: package, task set, user simulator, trials."""
    if config.get("benchmark") != "tau2":
        return []
    head = (f"tau2 {config.get('tau2_version') or '?'}; {config.get('num_trials', 1)} trial(s) per task asked, "
            f"run seed {config.get('seed')}")
    lines = [head]
    for domain, ts in (config.get("task_set") or {}).items():
        files = ts.get("files") or {}
        tasks_file = files.get("tasks.json")
        lines.append(f"task set {domain}: {ts.get('split')} split, {ts.get('tasks')} tasks, tasks_sha256 "
                     f"{str(ts.get('tasks_sha256'))[:12]}" + (f", tasks.json sha256 {tasks_file[:12]}" if tasks_file
                                                              else ""))
    user = config.get("user_simulator")
    if user:
        lines.append(f"user simulator: {user.get('model')} ({user.get('backend')}: {user.get('served_model')}), "
                     f"temperature {user.get('temperature')}, max_tokens {user.get('max_tokens')}")
    elif config.get("user_model"):
        lines.append(f"user simulator: {config['user_model']}, temperature {config.get('user_temperature')}, "
                     f"max_tokens {config.get('user_max_tokens')}")
    return lines


def print_tau2(label: str, s: dict, config: dict, console, tasks: bool = True) -> None:
    """tau2 as tau2 reports it: provenance, pass^1..k per domain, and the per-task trial table."""
    from rich.markup import escape  # lazy: display only, slow to import
    from rich.table import Table

    for line in tau2_provenance(config):
        console.print(line, markup=False, highlight=False)
    t2 = s["tau2"]
    max_k = max((len(d["pass_hat_k"]) for d in t2["domains"].values()), default=0)
    table = Table(title=f"tau2 pass^k: {label} (tau2's formula; error trials count as failures)")
    for col in ("domain", "tasks", "trials / task", "error trials", "avg reward",
                *(f"pass^{k}" for k in range(1, max_k + 1))):
        table.add_column(col, justify="left" if col == "domain" else "right")
    for domain, d in t2["domains"].items():
        lo, hi = d["trials_per_task"]
        table.add_row(domain, str(d["tasks"]), str(lo) if lo == hi else f"{lo}-{hi}", str(d["errors"]),
                      f"{d['avg_reward']:.4f}",
                      *(f"{d['pass_hat_k'][k]:.4f}" if k in d["pass_hat_k"] else "" for k in range(1, max_k + 1)))
    console.print(table)
    for domain, d in t2["domains"].items():
        lo, hi = d["trials_per_task"]
        if lo != hi:
            console.print(f"warning: {domain}: tasks have {lo} to {hi} trials; pass^k stops at k = {lo}, as tau2's "
                          f"compute_metrics does (finish the run with --resume)", markup=False)
    if not tasks:
        return
    per_task = Table(title=f"tau2 per task: {label}")
    for col in ("domain", "task", "successes / trials", "reward per trial"):
        per_task.add_column(col, justify="right" if col == "successes / trials" else "left")
    for t in t2["tasks"]:
        per_task.add_row(escape(t["domain"]), escape(t["task_id"]), f"{t['successes']}/{t['trials']}",
                         " ".join(f"{k}:{_reward(v)}" for k, v in t["rewards"].items()))
    console.print(per_task)


def print_table(rows: list[tuple[str, dict]], console=None) -> None:
    """One rich table of the headline numbers, and one of the tool mix per run."""
    from rich.console import Console  # lazy: display only, slow to import
    from rich.table import Table

    console = console or Console()
    table = Table(title="Evaluation runs")
    for col in ("run", "judge", "tasks", "accuracy %", "errors", "cost / query (¢)", "errors' cost ($)",
                "latency / query (min)", "wall / query (s)"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for label, s in rows:
        acc = "n/a" if s["accuracy"] is None else f"{100 * s['accuracy']:.1f}"
        if "pass1_by_domain" in s:
            acc += " (" + ", ".join(f"{d} {100 * v:.1f}" for d, v in s["pass1_by_domain"].items()) + ")"
        if "accuracy_by_level" in s:
            acc += " (" + ", ".join(f"L{lv} {100 * v:.1f}" for lv, v in s["accuracy_by_level"].items()) + ")"
        if s.get("unscored"):
            acc += f" [{s['unscored']} unscored: no reference]"
        table.add_row(label, s.get("judge", "unknown"), str(s["tasks"]), acc, str(s["errors"]),
                      f"{s['cost_per_query_cents']:.3f}",
                      f"{s['error_cost_usd']:.4f}",
                      f"{s['latency_per_query_min']:.2f}", f"{s['wall_per_query_s']:.1f}")
    console.print(table)
    for label, s in rows:
        if not s["tool_share"]:
            continue
        mix = Table(title=f"Tool mix: {label}")
        mix.add_column("alias / tool")
        mix.add_column("calls", justify="right")
        mix.add_column("share %", justify="right")
        for alias, share in s["tool_share"].items():
            mix.add_row(alias, str(s["tool_calls"][alias]), f"{100 * share:.1f}")
        console.print(mix)


def plot_cost_accuracy(rows: list[tuple[str, dict]], path: Path) -> Path:
    """Accuracy (%) against cost per query (cents), one labelled point per run."""
    import matplotlib  # lazy: heavy; only for plots

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: heavy; only for plots

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for label, s in rows:
        if s["accuracy"] is None:   # nothing answered: no point to place
            continue
        x, y = s["cost_per_query_cents"], 100 * s["accuracy"]
        ax.scatter([x], [y], s=40)
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 5), fontsize=8)
    ax.set_xlabel("cost per query (cents)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title("Accuracy vs cost")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def report(run_dirs: list[str | Path], plot: str | Path | None = None, viewer: bool = True,
           console=None, task_table: bool = True) -> list[tuple[str, dict]]:
    """Summarize each run (writing summary.json, viewer.html), print tables, plot; return rows."""
    from rich.console import Console  # lazy: display only, slow to import

    console_out = console or Console()
    rows, configs = [], []
    runs = []   # (label, config, records, summary): the per-preference table (evaluation/preference.py)
    for run_dir in map(Path, run_dirs):
        config, records = load_run(run_dir)
        summary = summarize(records, config.get("benchmark"))
        summary["judge"] = judge_label(config)
        if config.get("judge_style") == "hle":
            summary["hle"] = hle_metrics(records)
        label = run_label(run_dir, config)
        write_json_atomic(run_dir / SUMMARY_NAME, {"label": label, "config": config, **summary})
        if viewer:
            write_viewer(run_dir / "viewer.html", label, records)
        rows.append((label, summary))
        configs.append(config)
        runs.append((label, config, records, summary))
    print_table(rows, console_out)
    for (label, summary), config in zip(rows, configs):
        if "tau2" in summary:
            print_tau2(label, summary, config, console_out, tasks=task_table)
        if "hle" in summary:
            print_hle(label, summary["hle"], console_out)
    from evaluation.preference import preference_table  # lazy: pulls in faker (slow): keeps --help fast

    for row in preference_table(runs, console_out):   # the row joins its run's summary.json
        label, config, _, summary = runs[row["index"]]
        write_json_atomic(Path(run_dirs[row["index"]]) / SUMMARY_NAME,
                          {"label": label, "config": config, **summary, "preference": row})
    plot_path = Path(plot) if plot else Path(run_dirs[0]) / "cost_accuracy.png"
    plot_cost_accuracy(rows, plot_path)
    (console.print if console else print)(f"plot: {plot_path}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evaluation.report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", help="run folders (each with results.jsonl)")
    parser.add_argument("--plot", help="PNG path for the accuracy-vs-cost plot (default: FIRST_RUN/cost_accuracy.png)")
    parser.add_argument("--no-viewer", action="store_true", help="do not write viewer.html")
    parser.add_argument("--no-task-table", action="store_true",
                        help="tau2: leave the per-task trial table out of the terminal (summary.json keeps it)")
    parser.add_argument("--gaia-submission", metavar="PATH",
                        help="GAIA: also write the run's leaderboard submission (task_id, model_answer, "
                             "reasoning_trace) to PATH; one run folder only")
    args = parser.parse_args(argv)
    if args.gaia_submission and len(args.run_dirs) != 1:
        parser.error("--gaia-submission writes one run's file: give exactly one run folder")
    try:
        report(args.run_dirs, args.plot, viewer=not args.no_viewer, task_table=not args.no_task_table)
        if args.gaia_submission:
            from evaluation.gaia import write_submission  # lazy: pulls in httpx (slow): keeps --help fast

            path, notes = write_submission(args.run_dirs[0], args.gaia_submission)
            print(f"GAIA submission: {path}" + "".join(f"\n  note: {n}" for n in notes))
    except (FileNotFoundError, json.JSONDecodeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
