"""The orchestration loop (PAPER.md §1), shared by training and evaluation: one entry point,
`run_episode`, which runs the episode of the task's kind (orchestrator/episodes/: `qa`, `tau2`).
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable

from orchestrator.context import TokenCounter
from orchestrator.episodes.base import LoopConfig, Task, take_turn, task_catalog
from orchestrator.episodes.qa import run_qa_episode
from orchestrator.episodes.tau2 import run_tau2_episode
from orchestrator.records import Rollout
from orchestrator.runtime import ToolRuntime

__all__ = ["KINDS", "LoopConfig", "Task", "run_episode", "run_episodes", "take_turn", "task_catalog"]
KINDS = ("qa", "tau2")


def run_episode(task: Task, policy, runtime: ToolRuntime, config: LoopConfig,
                counter: TokenCounter | None = None) -> Rollout:
    """Run the episode of `task.kind` and return the recorded rollout."""
    if task.kind == "qa":
        return run_qa_episode(task, policy, runtime, config, counter)
    if task.kind == "tau2":
        return run_tau2_episode(task, policy, runtime, config, counter)
    raise ValueError(f"task {task.id}: unknown kind {task.kind!r}; expected one of {KINDS}")


def run_episodes(jobs: Iterable[Task], policy, runtime: ToolRuntime, config: LoopConfig,
                 concurrency: int = 8, on_done: Callable[[Task, Rollout], None] | None = None) -> list[Rollout]:
    """Run many episodes concurrently (threads): while some wait on tools, others generate.

    Results come back in input order; `on_done` is called as each finishes (e.g. to
    append it to a results file).
    """
    jobs = list(jobs)

    def one(task: Task) -> Rollout:
        rollout = run_episode(task, policy, runtime, config)
        if on_done is not None:
            on_done(task, rollout)
        return rollout

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return list(pool.map(one, jobs))
