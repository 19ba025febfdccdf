"""Benchmark loaders: HLE and FRAMES in their official formats, never dropping a record silently.

Sources, by what `--data` names:
- a local `.jsonl` file (one JSON object per line),
- a local `.parquet`, `.tsv` or `.csv` file,
- a Hugging Face dataset id (`cais/hle`, `google/frames-benchmark`), read with `datasets`.

Formats:
- HLE (`cais/hle`): `id, question, image, answer, answer_type, category, ...`. Questions
  with an image are skipped (the paper evaluates text-only HLE) and counted.
- FRAMES: the HF `google/frames-benchmark` columns (`Prompt`, `Answer`, `wiki_links`,
  `reasoning_types`, the unnamed index column) or ToolOrchestra's `frames.jsonl`
  (`id, question, answer`). A TSV row gets the id `wiki____<index>`, the id upstream gave
  the same row, so results from either file are comparable and resumable.

A record that cannot be read is reported (`LoadResult.malformed`: where, line, reason) and
skipped; the CLI prints every one of them.
"""
from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

BENCHMARKS = ("hle", "frames")


class LoaderError(ValueError):
    """The source as a whole cannot be read (missing file, unknown format, no records)."""


@dataclass
class BenchmarkTask:
    """One question: `id`, `question`, reference `answer`, and the source's other fields."""

    id: str
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class Malformed:
    source: str
    line: int          # 1-based line of a text file, or 1-based row of a table / hub split
    reason: str

    def __str__(self) -> str:
        return f"{self.source}:{self.line}: {self.reason}"


@dataclass
class LoadResult:
    tasks: list[BenchmarkTask] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)    # reason -> count (e.g. "image")
    malformed: list[Malformed] = field(default_factory=list)

    def summary(self) -> str:
        parts = [f"{len(self.tasks)} tasks"]
        parts += [f"{n} skipped ({why})" for why, n in sorted(self.skipped.items())]
        if self.malformed:
            parts.append(f"{len(self.malformed)} malformed")
        return ", ".join(parts)


class _Skip(Exception):
    """A well-formed record deliberately left out (e.g. an image question)."""


def _text(row: dict, key: str) -> str:
    value = row.get(key)
    if value is None:
        raise ValueError(f"missing field {key!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)   # e.g. a numeric FRAMES answer read from a table
    if not isinstance(value, str):
        raise ValueError(f"field {key!r} must be a string, got {type(value).__name__}")
    if not value.strip():
        raise ValueError(f"field {key!r} is empty")
    return value


def parse_hle(row: dict, index: int) -> BenchmarkTask:
    """One `cais/hle` record; raises _Skip for image questions, ValueError when malformed."""
    image = row.get("image")
    if image not in (None, ""):
        raise _Skip("image")
    meta = {k: row[k] for k in ("answer_type", "category", "raw_subject") if row.get(k) is not None}
    return BenchmarkTask(id=_text(row, "id"), question=_text(row, "question"),
                         answer=_text(row, "answer"), meta=meta)


def parse_frames(row: dict, index: int) -> BenchmarkTask:
    """One FRAMES record, ToolOrchestra jsonl (`id, question, answer`) or HF (`Prompt, Answer`)."""
    if "Prompt" in row or "Answer" in row:
        raw_index = row.get("Unnamed: 0", row.get("", index))
        try:
            row_index = int(raw_index)
        except (TypeError, ValueError):
            raise ValueError(f"index column is {raw_index!r}, expected an integer") from None
        meta = {k: row[k] for k in ("wiki_links", "reasoning_types") if row.get(k) is not None}
        return BenchmarkTask(id=f"wiki____{row_index}", question=_text(row, "Prompt"),
                             answer=_text(row, "Answer"), meta=meta)
    return BenchmarkTask(id=_text(row, "id"), question=_text(row, "question"), answer=_text(row, "answer"))


PARSERS: dict[str, Callable[[dict, int], BenchmarkTask]] = {"hle": parse_hle, "frames": parse_frames}


# ---- sources: each yields (line or row number, record or the error that stopped parsing it) ----
def jsonl_rows(path: Path) -> Iterator[tuple[int, dict | Exception]]:
    """Non-blank lines of a JSONL file as (line number, object or why it is not one); also
    read by evaluation.runner.read_records."""
    with path.open("r", encoding="utf-8", errors="replace") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                yield lineno, ValueError(f"invalid JSON ({exc.msg} at column {exc.colno})")
                continue
            yield lineno, obj if isinstance(obj, dict) else ValueError(
                f"expected a JSON object, got {type(obj).__name__}")


def _delimited_rows(path: Path, delimiter: str) -> Iterator[tuple[int, dict | Exception]]:
    csv.field_size_limit(sys.maxsize)   # FRAMES wiki_links cells are long
    with path.open("r", encoding="utf-8", errors="replace", newline="") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        width = len(reader.fieldnames or [])
        for row in reader:
            # line_num is the *last* physical line of the row (quoted cells may span lines).
            if None in row:
                yield reader.line_num, ValueError(f"{width + len(row[None])} cells, header has {width}")
            elif any(v is None for v in row.values()):
                yield reader.line_num, ValueError(
                    f"{sum(v is not None for v in row.values())} cells, header has {width}")
            else:
                yield reader.line_num, row


def _hf_rows(rows: Any) -> Iterator[tuple[int, dict | Exception]]:
    for i, row in enumerate(rows, start=1):
        yield i, dict(row)


def _parquet_rows(path: Path) -> Iterator[tuple[int, dict | Exception]]:
    import datasets

    return _hf_rows(datasets.load_dataset("parquet", data_files=str(path), split="train"))


def _hub_rows(dataset_id: str, split: str | None, benchmark: str) -> Iterator[tuple[int, dict | Exception]]:
    import datasets

    split = split or "test"
    try:
        rows = datasets.load_dataset(dataset_id, split=split)
    except Exception as exc:  # the hub raises many types; all mean "could not get it"
        raise LoaderError(
            f"--data {dataset_id!r}: not a local file and could not be loaded from the Hugging Face hub "
            f"(split {split!r}): {type(exc).__name__}: {exc}. Pass a local .jsonl/.parquet/.tsv path, "
            f"or log in with `huggingface-cli login` if the dataset is gated ({benchmark}).") from None
    return _hf_rows(rows)


def _rows(data: str, split: str | None, benchmark: str) -> Iterator[tuple[int, dict | Exception]]:
    path = Path(data).expanduser()
    if path.is_file():
        suffix = path.suffix.lower()
        if suffix in (".jsonl", ".json"):
            return jsonl_rows(path)
        if suffix in (".tsv", ".csv"):
            return _delimited_rows(path, "\t" if suffix == ".tsv" else ",")
        if suffix == ".parquet":
            return _parquet_rows(path)
        raise LoaderError(f"--data {data}: unknown file type {suffix!r}; use .jsonl, .parquet, .tsv or .csv")
    if path.exists():
        raise LoaderError(f"--data {data}: is a directory; name the file inside it")
    if data.count("/") == 1 and not data.startswith((".", "/", "~")):
        return _hub_rows(data, split, benchmark)
    raise LoaderError(f"--data {data}: no such file (and not a Hugging Face dataset id like 'cais/hle')")


def load_benchmark(benchmark: str, data: str | Path, split: str | None = None,
                   limit: int | None = None) -> LoadResult:
    """Read `data` as `benchmark` ("hle" or "frames"); keep the first `limit` usable tasks.

    Duplicate ids are malformed too: results are keyed by id, so a duplicate would be lost.
    """
    if benchmark not in PARSERS:
        raise LoaderError(f"unknown benchmark {benchmark!r}; known: {list(PARSERS)}")
    parse, source, result = PARSERS[benchmark], str(data), LoadResult()
    seen: set[str] = set()
    for ordinal, (lineno, row) in enumerate(_rows(str(data), split, benchmark)):
        if limit is not None and len(result.tasks) >= limit:
            break
        try:
            if isinstance(row, Exception):
                raise row
            task = parse(row, ordinal)
            if task.id in seen:
                raise ValueError(f"duplicate id {task.id!r}")
        except _Skip as skip:
            result.skipped[str(skip)] = result.skipped.get(str(skip), 0) + 1
            continue
        except ValueError as exc:
            result.malformed.append(Malformed(source, lineno, str(exc)))
            continue
        seen.add(task.id)
        result.tasks.append(task)
    if not result.tasks and not result.skipped:
        raise LoaderError(f"--data {data}: no usable {benchmark} records"
                          + (f" ({len(result.malformed)} malformed; first: {result.malformed[0]})"
                             if result.malformed else ""))
    return result
