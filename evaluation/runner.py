"""The one evaluation runner: bounded concurrency, one JSONL record per task, resumable.

    results = ResultsFile(out_dir / "results.jsonl", resume=True)   # repairs a torn tail
    stats = run_tasks(tasks, solve, results, concurrency=16)

- `solve(task) -> dict` does one task end to end (episode + judge) and returns its record;
  it runs in a pool of `concurrency` threads, so at most that many tasks (and so LLM
  connections of ours) are in flight at once.
- Each record is appended and flushed (and fsync'ed) the moment its task finishes, by the
  main thread only, through one file handle: no lock, no handle per task.
- A task whose `solve` raises is recorded with `status: "error"` and the reason; it counts
  apart from accuracy. Raising `TaskFailed(msg, partial)` keeps what the task spent (cost,
  tokens, turns) in that record. `--resume` skips every id already in the file (answered or error);
  `--retry-errors` first removes the error records (atomic rewrite) so they run again.
- A run killed mid-write leaves at most one torn last line: it is reported and cut off on
  resume, and that task runs again. Nothing already written is lost or duplicated.
"""
from __future__ import annotations

import json
import os
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

from tqdm import tqdm

from orchestrator.benchmarks import jsonl_rows
from orchestrator.redaction import redact
from orchestrator.fail_closed import FailClosed, Watch, record_calls

RESULTS_NAME = "results.jsonl"


class HasId(Protocol):
    id: str


class RunError(RuntimeError):
    """A run that cannot start (output exists without --resume, unreadable results file...)."""


@dataclass
class RepairReport:
    """What opening an existing results file found."""

    records: int = 0
    torn_tail: str | None = None        # the cut-off text of a half-written last line
    bad_lines: list[int] = field(default_factory=list)   # unreadable lines other than the tail
    errors_dropped: int = 0

    def messages(self, path: Path) -> list[str]:
        out = []
        if self.torn_tail is not None:
            out.append(f"{path}: last line was half-written ({len(self.torn_tail)} bytes: "
                       f"{self.torn_tail[:60]!r}...); cut it off, that task runs again")
        for line in self.bad_lines:
            out.append(f"{path}:{line}: unreadable record kept as is; its task runs again")
        if self.errors_dropped:
            out.append(f"{path}: removed {self.errors_dropped} error records (--retry-errors); they run again")
        return out


def read_records(path: Path) -> tuple[list[dict], list[int]]:
    """Every readable record of a results file and the line numbers of unreadable ones."""
    records, bad = [], []
    for lineno, obj in jsonl_rows(path):
        if isinstance(obj, dict) and isinstance(obj.get("id"), str):
            records.append(obj)
        else:
            bad.append(lineno)
    return records, bad


def _cut_torn_tail(path: Path) -> str | None:
    """Truncate a last line that has no newline (a killed write); return what was cut."""
    size = path.stat().st_size
    if size == 0:
        return None
    with path.open("rb+") as fh:
        fh.seek(-1, os.SEEK_END)
        if fh.read(1) == b"\n":
            return None
        # Walk back to the previous newline; results lines are KBs, so read in blocks.
        pos, block = size, 65536
        while pos > 0:
            start = max(0, pos - block)
            fh.seek(start)
            chunk = fh.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                cut = start + nl + 1
                break
            pos = start
        else:
            cut = 0
        fh.seek(cut)
        torn = fh.read().decode("utf-8", errors="replace")
        fh.truncate(cut)
        fh.flush()
        os.fsync(fh.fileno())
    return torn


def _atomic_write_lines(path: Path, records: Iterable[dict]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class ResultsFile:
    """Append-only JSONL of task records, opened once; see the module docstring."""

    def __init__(self, path: str | Path, resume: bool = False, retry_errors: bool = False):
        self.path = Path(path)
        self.repair = RepairReport()
        self.done: set[str] = set()
        if self.path.exists() and self.path.stat().st_size > 0:
            if not resume:
                raise RunError(f"{self.path} already has results; pass --resume to continue that run, "
                               f"or choose another --output folder")
            self._load_existing(retry_errors)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def _load_existing(self, retry_errors: bool) -> None:
        self.repair.torn_tail = _cut_torn_tail(self.path)
        records, self.repair.bad_lines = read_records(self.path)
        if retry_errors:
            kept = [r for r in records if r.get("status") != "error"]
            self.repair.errors_dropped = len(records) - len(kept)
            if self.repair.errors_dropped:
                _atomic_write_lines(self.path, kept)
                self.repair.bad_lines = []   # the rewrite keeps only readable records
            records = kept
        self.repair.records = len(records)
        self.done = {r["id"] for r in records}

    def append(self, record: dict) -> None:
        """Write one record as one line, flushed to disk before returning."""
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        self._fh.write(line)
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.done.add(record["id"])

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "ResultsFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass
class RunStats:
    submitted: int = 0
    skipped_done: int = 0
    ok: int = 0
    errors: int = 0
    correct: int = 0
    wall_s: float = 0.0
    stopped: str | None = None      # why the run stopped early (`stop_when`), else None


class TaskFailed(RuntimeError):
    """A task that failed part-way; `partial` is what it did before (cost, tokens, turns...),
    kept in its error record so the money and time it spent still count in the run's totals."""

    def __init__(self, message: str, partial: dict[str, Any]):
        super().__init__(message)
        self.partial = partial


def error_record(task: HasId, exc: BaseException, wall_s: float) -> dict:
    """The record of a task whose solve raised: the reason, the last frames, what it spent, no verdict.
    Texts are redacted (orchestrator/redaction.py) whatever raised: the gateway's errors already are."""
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    partial = getattr(exc, "partial", None) or {}
    return {**partial, "id": task.id, "status": "error", "error": redact(f"{type(exc).__name__}: {exc}"),
            "traceback": redact("".join(tb[-3:])[-2000:]), "correct": None, "wall_s": round(wall_s, 3)}


def _timed_solve(solve: Callable[[Any], dict], task: HasId) -> dict:
    start = time.perf_counter()
    try:
        record = dict(solve(task))
    except Exception as exc:  # any failure of one task is recorded, never fatal to the run
        return error_record(task, exc, time.perf_counter() - start)
    record.setdefault("status", "ok")
    record["id"] = task.id
    record.setdefault("wall_s", round(time.perf_counter() - start, 3))
    return record


def run_tasks(tasks: list, solve: Callable[[Any], dict], results: ResultsFile,
              concurrency: int = 16, progress: bool = True, desc: str = "tasks",
              stop_when: Callable[[dict], str | None] | None = None) -> RunStats:
    """Run `solve` on every task not yet in `results`, `concurrency` at a time.

    At most `concurrency` tasks are submitted ahead of the writer, so memory and open
    sockets stay bounded however long the task list is. When every call of the last
    `concurrency` tasks failed for one configuration reason (orchestrator/fail_closed.py),
    the run stops with RunError naming it; finished records stay on disk.  `stop_when(record)`
    (e.g. evaluation.error_streak.ErrorStreak.observe) sees each written record; when it
    returns a reason, no further task starts and `stats.stopped` says why.
    """
    if concurrency < 1:
        raise ValueError(f"--concurrency must be >= 1, got {concurrency}")
    todo = [t for t in tasks if t.id not in results.done]
    watch = Watch(window=max(1, min(concurrency, len(todo))))
    stats = RunStats(submitted=len(todo), skipped_done=len(tasks) - len(todo))
    start = time.perf_counter()
    bar = tqdm(total=len(todo), desc=desc, unit="task", disable=not progress, dynamic_ncols=True)
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="eval")
    pending: set[Future] = set()
    queue = iter(todo)
    try:
        while True:
            while len(pending) < concurrency:
                task = next(queue, None)
                if task is None:
                    break
                pending.add(pool.submit(_timed_solve, solve, task))
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                record = fut.result()
                results.append(record)
                try:
                    watch.add(record_calls(record))
                except FailClosed as exc:
                    raise RunError(str(exc)) from None
                if record["status"] == "error":
                    stats.errors += 1
                else:
                    stats.ok += 1
                    stats.correct += bool(record.get("correct"))
                bar.update(1)
                bar.set_postfix(acc=f"{stats.correct / max(stats.ok, 1):.3f}", err=stats.errors)
                if stop_when is not None and stats.stopped is None:
                    stats.stopped = stop_when(record)
            if stats.stopped is not None:
                break
    finally:
        # On Ctrl-C: drop what has not started; finished records are already on disk.
        pool.shutdown(wait=False, cancel_futures=True)
        bar.close()
    stats.wall_s = time.perf_counter() - start
    return stats
