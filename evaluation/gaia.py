"""What run_gaia.py adds to the QA command line (evaluation/qa_cli.py): its flags, its search,
and the GAIA leaderboard's submission file.

- `--level N` (1-3) and `--text-only` (the tasks whose `file_name` is empty: no attached file)
  select tasks; the others are counted as skipped (orchestrator/benchmarks.py).
- Search: `--retriever` / `--index` when given (as for HLE and FRAMES); else Tavily's web search
  when TAVILY_API_KEY is set (retrieval/client.py WebRetriever); else, on the embedded default, the
  toy world's index; else no search tool.
- The submission: one JSON line per task, `{"task_id", "model_answer", "reasoning_trace"}`, the
  format the GAIA leaderboard (huggingface.co/spaces/gaia-benchmark/leaderboard) asks for
  (`reasoning_trace` is optional there; ours lists the orchestrator's turns).  Written into the
  run folder (`gaia_submission.jsonl`) when a run ends, and by
  `python -m evaluation.report RUN --gaia-submission PATH`.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from orchestrator.benchmarks import GAIA_SPLITS
from retrieval.client import web_retriever_from_env

SUBMISSION_NAME = "gaia_submission.jsonl"
TRACE_CHARS = 600           # per turn: the orchestrator's text and the tool's output, each cut to this


def add_gaia_args(group: argparse._ArgumentGroup) -> None:
    group.add_argument("--level", type=int, choices=(1, 2, 3), help="GAIA: only this level's tasks")
    group.add_argument("--text-only", action="store_true",
                       help="GAIA: only the tasks with no attached file (empty file_name); the others are counted "
                            "as skipped")


def web_search():
    """Tavily's web search as the search tool's retriever when TAVILY_API_KEY is set, else None."""
    if not os.environ.get("TAVILY_API_KEY", "").strip():
        return None

    return web_retriever_from_env()


def _cut(text: Any) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= TRACE_CHARS else text[:TRACE_CHARS] + " ..."


def reasoning_trace(record: dict) -> str:
    """The steps of one record, one line per orchestrator turn: what it said, which tool and
    expert it called, what came back; an error record ends with its error."""
    lines = []
    for turn in record.get("turns") or []:
        step = f"{turn.get('index', len(lines)) + 1}."
        if turn.get("reasoning"):
            step += f" orchestrator: {_cut(turn['reasoning'])}"
        if turn.get("tool"):
            step += f" -> {turn['tool']}({turn.get('alias')}" + (f" = {turn['model']}" if turn.get("model") else "") + ")"
        if turn.get("invalid_reason"):
            step += f" [invalid: {_cut(turn['invalid_reason'])}]"
        if turn.get("error"):
            step += f" [error: {_cut(turn['error'])}]"
        elif turn.get("output"):
            step += f": {_cut(turn['output'])}"
        lines.append(step)
    if record.get("status") == "error":
        lines.append(f"error: {_cut(record.get('error'))}")
    lines.append(f"final answer: {record.get('prediction') or ''}")
    return "\n".join(lines)


def submission_rows(records: list[dict]) -> list[dict[str, str]]:
    """One row per task id (the last record wins, as in the report), in first-seen order; a task
    with no answer (an error, or no answer call) gets an empty `model_answer`."""
    by_id: dict[str, dict] = {}
    for record in records:
        by_id[record["id"]] = record
    return [{"task_id": task_id, "model_answer": str(r.get("prediction") or "") if r.get("status") != "error" else "",
             "reasoning_trace": reasoning_trace(r)} for task_id, r in by_id.items()]


def write_submission(run_dir: str | Path, path: str | Path | None = None) -> tuple[Path, list[str]]:
    """Write the run's submission file (default RUN/gaia_submission.jsonl); return its path and
    notes to print (errors without an answer, a split not run whole)."""
    from evaluation.runner import RESULTS_NAME, read_records  # lazy: pulls in tqdm

    run_dir = Path(run_dir)
    if not (run_dir / RESULTS_NAME).exists():
        raise FileNotFoundError(f"{run_dir}: no {RESULTS_NAME}; is this a run folder made by evaluation/run_gaia.py?")
    config_path = run_dir / "run_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    records, _ = read_records(run_dir / RESULTS_NAME)
    if config and config.get("benchmark") != "gaia":
        raise ValueError(f"{run_dir}: a {config.get('benchmark')} run, not a GAIA run (run_config.json benchmark)")
    rows = submission_rows(records)
    path = Path(path) if path else run_dir / SUBMISSION_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    os.replace(tmp, path)
    notes = []
    empty = sum(not r["model_answer"] for r in rows)
    if empty:
        notes.append(f"{empty} of {len(rows)} tasks have no answer (errors or no answer call): empty model_answer")
    split = config.get("split") or "validation"
    expected = GAIA_SPLITS.get(split)
    if expected and len(rows) != expected and not config.get("embedded"):
        notes.append(f"{len(rows)} tasks, the {split} split has {expected}: the leaderboard scores a whole split "
                     f"(run it without --limit/--level/--text-only to submit)")
    return path, notes
