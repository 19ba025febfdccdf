"""Evaluation runner throughput: N tasks against a local backend that answers after 1 s.

Each task is one orchestrator call in "no tools" mode (through LLM_CALL, the model registry
and real HTTP to evaluation.mock_backend), judged by exact match and appended to a results
file, i.e. the full per-task path of run_frames.py minus the tools. The ideal wall time at
concurrency c is ceil(N / c) x delay (the issue states it as N / c x delay + overhead).

    python bench/eval_concurrency.py [--tasks 200] [--delay 1.0] [--concurrency 32 2] [--repeats 3]
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evaluation.scoring.judge import Judge  # noqa: E402
from orchestrator.benchmarks import BenchmarkTask  # noqa: E402
from evaluation.mock_backend import MockBackend, registry_yaml  # noqa: E402
from evaluation.qa import QASetup, solve  # noqa: E402
from evaluation.runner import ResultsFile, run_tasks  # noqa: E402
from orchestrator.catalog import load_catalog  # noqa: E402
from orchestrator.context import Prompts  # noqa: E402
from orchestrator.loop import LoopConfig  # noqa: E402


def one_run(tasks: list[BenchmarkTask], concurrency: int, workdir: Path, server: MockBackend) -> float:
    setup = QASetup(mode="none", model="bench-orch", price_model="Qwen3-8B", catalog=load_catalog(), runtime=None,
                    policy=None, loop=LoopConfig(temperature=0.0), judge=Judge("bench-orch"),
                    prompts=Prompts.load(), direct_max_tokens=16)
    server.max_inflight = 0
    path = workdir / f"results-c{concurrency}-{len(list(workdir.iterdir()))}.jsonl"
    with ResultsFile(path) as results:
        stats = run_tasks(tasks, lambda t: solve(setup, t), results, concurrency=concurrency, progress=False)
    assert stats.ok == len(tasks) and stats.correct == len(tasks), (stats, path)
    assert server.max_inflight <= concurrency
    return stats.wall_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--delay", type=float, default=1.0, help="seconds the backend waits before each answer")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[32, 2])
    parser.add_argument("--repeats", type=int, default=3, help="runs per concurrency above 8 (median reported)")
    args = parser.parse_args()
    tasks = [BenchmarkTask(id=f"t{i}", question=f"Question number {i}?", answer=f"answer {i}")
             for i in range(args.tasks)]
    with tempfile.TemporaryDirectory() as tmp, \
            MockBackend(answers={t.question: t.answer for t in tasks}, delay_s=args.delay) as server:
        models = Path(tmp) / "models.yaml"
        models.write_text(registry_yaml(server.base_url, ["bench-orch"]))
        os.environ["TOOLORCHESTRA_MODELS"] = str(models)
        print(f"{args.tasks} tasks, backend delay {args.delay:g} s")
        print("| concurrency | wall s (median) | runs | ideal ceil(N/c)*d | N/c*d | ratio to ceil ideal | peak in flight |")
        print("|---|---|---|---|---|---|---|")
        for c in args.concurrency:
            repeats = args.repeats if c > 8 else 1
            walls = [one_run(tasks, c, Path(tmp), server) for _ in range(repeats)]
            ideal = math.ceil(args.tasks / c) * args.delay
            median = statistics.median(walls)
            print(f"| {c} | {median:.2f} | {', '.join(f'{w:.2f}' for w in walls)} | {ideal:.2f} | "
                  f"{args.tasks / c * args.delay:.2f} | {median / ideal:.3f} | {server.max_inflight} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
