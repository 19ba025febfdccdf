"""Training tasks: records (JSONL / parquet) -> `orchestrator.loop.Task`, and the order they are taken in.

    tasks   = load_tasks(cfg.data.train_files, default_preference)   # checked, ids unique
    sampler = TaskSampler(len(tasks), seed)                          # epoch-wise shuffle
    batch   = [tasks[i] for i in sampler.take(k)]
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from data_synthesis.records import TrainingExample
from orchestrator.domains.folder import SchemaError
from orchestrator.domains.outcome import tau2_installed
from orchestrator.episodes.tau2 import tau2_task_of
from orchestrator.episodes.tau2_solo import task_domain
from orchestrator.loop import Task
from orchestrator.textfile import utf8_problem
from orchestrator.domains.upstream import folder_domain, upstream_marker

SUPPORTED_KINDS = ("qa", "tau2")


# ---------------------------------------------------------------------------- tasks
def load_tasks(files: Sequence[str], default_preference: dict[str, float] | None = None) -> list[Task]:
    """Tasks from JSONL / parquet files through HF `datasets`, as `orchestrator.loop.Task`s.

    A record holds `id`, `question`, and optionally `answer`, `kind` ("qa" or "tau2"), `tools`
    ({tool: {alias: model}}), `prices` ({model: {"input", "output"}} $/1M tokens),
    `preference` ({alias | "outcome" | "cost" | "latency": weight}) and `metadata`.
    Mapping fields may also be JSON strings.  Arrow pads the mappings of one file to a
    common schema with nulls; those nulls are dropped again here.  A tau2 record's domain
    folder (`domain_dir`, relative paths taken from the file's folder) is loaded and checked here.
    """
    if not files:
        raise ValueError("data.train_files is empty: list JSONL or parquet task files")
    from datasets import load_dataset  # lazy: heavy; only for Hugging Face ids

    tasks: list[Task] = []
    for file in files:
        path = Path(file)
        if not path.exists():
            raise FileNotFoundError(f"data.train_files: {file} does not exist")
        kind = "parquet" if path.suffix == ".parquet" else "json"
        if kind == "json" and check_json_lines(path) == 0 or path.stat().st_size == 0:
            raise ValueError(f"data.train_files: {file} holds no task records (empty); write one JSON object per "
                             f"line ({{\"id\", \"question\", \"answer\"}}) or remove it from data.train_files")
        rows = load_dataset(kind, data_files=str(path), split="train")
        if len(rows) == 0:
            raise ValueError(f"data.train_files: {file} holds no task records; add some or remove it from "
                             f"data.train_files")
        for i, row in enumerate(rows):
            tasks.append(task_from_record(row, f"{file}[{i}]", default_preference, base=path.parent))
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ValueError(f"task id {dup!r} appears more than once in {list(files)}; ids must be unique")
    return tasks


def check_json_lines(path: Path) -> int | None:
    """Every line of a JSON-lines file is one UTF-8 JSON object, else ValueError naming file:line
    and the fix (`datasets` fails on such a line with a long traceback naming neither).  Returns
    how many records it holds (0: `datasets` would fail with a traceback too).  A file that is one
    JSON array (first character `[`) is left to `datasets` (None)."""
    records = 0
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            if raw.lstrip().startswith(b"[") and n == 1:
                return None
            try:
                value = json.loads(raw.decode("utf-8").rstrip())
            except UnicodeDecodeError as exc:
                raise ValueError(utf8_problem(path, exc, line_offset=n - 1)) from None
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{n}: not a JSON object ({exc.msg} at column {exc.colno}); each line of "
                                 f"a JSON-lines file is one task record: fix or delete line {n}") from None
            if not isinstance(value, dict):
                raise ValueError(f"{path}:{n}: a JSON {type(value).__name__}, not an object; each line of a "
                                 f"JSON-lines file is one task record {{\"id\", \"question\", ...}}")
            records += 1
    return records


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_nulls(v) for k, v in value.items() if v is not None}
    return value


def task_from_record(row: dict[str, Any], where: str, default_preference: dict[str, float] | None = None,
                     base: Path | None = None) -> Task:
    """One data record -> Task; errors name the record and field.

    Records written by data_synthesis (`TrainingExample`, recognised by their `instruction`
    field) are adapted through `TrainingExample.loop_task_kwargs`: the policy reads the
    instruction (question + tools, prices and preference in words).  A `kind: tau2` record
    needs `metadata.tau2_task` and `metadata.domain_dir` or `metadata.tau2_domain` (TrainingExample: `tau2_task`,
    `domain_dir`); a relative `domain_dir` is taken from `base` (the data file's folder)."""
    if "instruction" in row and "preference_name" in row:
        try:
            row = TrainingExample.from_row(row).loop_task_kwargs()
        except (ValidationError, ValueError) as exc:
            raise ValueError(f"{where}: not a valid training example: {str(exc).splitlines()[0]}") from None
    for key in ("id", "question"):
        if not isinstance(row.get(key), str) or not row[key]:
            raise ValueError(f"{where}: field {key!r} must be a non-empty string")
    fields: dict[str, Any] = {}
    for key in ("tools", "prices", "preference", "metadata"):
        value = row.get(key)
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: field {key!r} is a string but not JSON ({exc.msg})") from None
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"{where}: field {key!r} must be a mapping, got {type(value).__name__}")
        fields[key] = _drop_nulls(value) if value is not None else None
    kind = row.get("kind") or "qa"
    if kind not in SUPPORTED_KINDS:
        raise ValueError(f"{where}: task kind {kind!r} is unknown; field 'kind' must be one of {SUPPORTED_KINDS}")
    answer = row.get("answer")
    if kind == "qa" and (answer is None or not str(answer).strip()):
        raise ValueError(f"{where}: QA task {row['id']!r} has no 'answer' (the reference the judge scores the "
                         f"outcome reward against); add \"answer\" to the record or drop the record")
    task = Task(id=row["id"], question=row["question"], answer=None if answer is None else str(answer),
                kind=kind, tools=fields["tools"], prices=fields["prices"],
                preference=fields["preference"] or dict(default_preference or {}),
                metadata=fields["metadata"] or {})
    if kind == "tau2":
        _resolve_domain(task, where, base)
    return task


def _resolve_domain(task: Task, where: str, base: Path | None) -> None:
    """Make a tau2 task's `domain_dir` absolute, load its domain once and check its tau2 task
    with tau2's own model when tau2 is installed (errors name the record)."""
    domain_dir = task.metadata.get("domain_dir")
    if isinstance(domain_dir, str) and domain_dir and not Path(domain_dir).is_absolute() and base is not None:
        task.metadata["domain_dir"] = str((base / domain_dir).resolve())
    try:
        if not task.metadata.get("tau2_domain"):
            folder = task.metadata.get("domain_dir")
            if isinstance(folder, str) and folder and upstream_marker(folder):
                folder_domain(folder)      # upstream's ToolScale tools, from the checkout its upstream.json names
            else:
                task_domain(task)
        if tau2_installed():
            tau2_task_of(task)
    except (ValueError, SchemaError) as exc:
        raise ValueError(f"{where}: {exc} (domain_dir is relative to the data file's folder; "
                         "`python -m data_synthesis.synthesize --out OUT` writes OUT/dataset/ beside the domain)") from None


class TaskSampler:
    """Epoch-wise shuffled task order; `position` (tasks consumed) is all its state."""

    def __init__(self, n_tasks: int, seed: int, shuffle: bool = True, position: int = 0):
        self.n, self.seed, self.shuffle, self.position = n_tasks, seed, shuffle, position

    def _order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n))
        return np.random.default_rng([self.seed, epoch]).permutation(self.n).tolist()

    def take(self, k: int) -> list[int]:
        """The next `k` task indices (crossing into the next epoch's order when needed)."""
        out = []
        for _ in range(k):
            epoch, i = divmod(self.position, self.n)
            out.append(self._order(epoch)[i])
            self.position += 1
        return out

    @property
    def epoch(self) -> float:
        return self.position / self.n
