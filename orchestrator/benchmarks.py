"""Benchmark loaders: HLE, FRAMES and GAIA in their official formats, never dropping a record silently.

Sources, by what `--data` names:
- a local `.jsonl` file (one JSON object per line),
- a local `.parquet`, `.tsv` or `.csv` file,
- a Hugging Face dataset id (`cais/hle`, `google/frames-benchmark`), read with `datasets`.

Formats:
- HLE (`cais/hle`): `id, question, image, answer, answer_type, category, ...`. Questions
  with an image are skipped (the paper evaluates text-only HLE) and counted, unless
  `text_only=False` (run_hle.py --no-text-only) keeps them with meta `image: True`.
- FRAMES: the HF `google/frames-benchmark` columns (`Prompt`, `Answer`, `wiki_links`,
  `reasoning_types`, the unnamed index column) or ToolOrchestra's `frames.jsonl`
  (`id, question, answer`). A TSV row gets the id `wiki____<index>`, the id upstream gave
  the same row, so results from either file are comparable and resumable.
- GAIA (`gaia-benchmark/GAIA`): a split folder as the dataset lays it out, `2023/<split>/`
  with `metadata.jsonl` (or, since October 2025, `metadata.parquet`) and the attached files
  beside it; fields `task_id, Question, Level, Final answer, file_name` (+ `file_path`,
  `Annotator Metadata`).  `--data` names that folder, the dataset's root (`2023/<split>/`
  under it; split default `validation`), its metadata file, or the hub id (downloaded with
  `huggingface_hub.snapshot_download`, gated: log in first).  The test split's answers are
  "?": its tasks get no reference (`answer` None).  A task's attachment becomes
  `BenchmarkTask.files` ({file_name: path}); one named but absent stops the load.

A record that cannot be read is reported (`LoadResult.malformed`: where, line, reason) and
skipped; the CLI prints every one of them.
"""
from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator

BENCHMARKS = ("hle", "frames", "gaia")
GAIA_SPLITS = {"validation": 165, "test": 300}     # tasks per split of GAIA 2023 (the leaderboard's)
GAIA_METADATA = ("metadata.jsonl", "metadata.parquet")
_PROMPTS = Path(__file__).resolve().parent / "prompts"


class LoaderError(ValueError):
    """The source as a whole cannot be read (missing file, unknown format, no records)."""


@dataclass
class BenchmarkTask:
    """One question: `id`, `question`, reference `answer` (None: the source has none, GAIA's
    test split), the source's other fields, and attached files ({name: host path})."""

    id: str
    question: str
    answer: str | None
    meta: dict[str, Any] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)


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


def parse_hle(row: dict, index: int, text_only: bool = True) -> BenchmarkTask:
    """One `cais/hle` record; raises _Skip for image questions (`image`: a data URI, "" when none)
    unless `text_only` is False (then kept with meta `image: True`; the image itself is not
    shown), ValueError when malformed."""
    image = row.get("image")
    has_image = image not in (None, "")
    if has_image and text_only:
        raise _Skip("image")
    meta = {k: row[k] for k in ("answer_type", "category", "raw_subject") if row.get(k) is not None}
    if has_image:
        meta["image"] = True
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


def gaia_question(question: str, file_name: str | None) -> str:
    """What the orchestrator reads for a GAIA task: orchestrator/prompts/gaia_question.txt around
    the question, with gaia_attachment.txt naming the attached file when there is one."""
    attachment = ""
    if file_name:
        attachment = (_PROMPTS / "gaia_attachment.txt").read_text().rstrip("\n").format(file_name=file_name)
    return (_PROMPTS / "gaia_question.txt").read_text().rstrip("\n").format(question=question.strip(),
                                                                            attachment=attachment)


def parse_gaia(row: dict, index: int, folder: Path, level: int | None = None,
               text_only: bool = False) -> BenchmarkTask:
    """One GAIA metadata record read in its split folder; raises _Skip for another `level` or,
    with `text_only`, a task with an attached file; ValueError when malformed."""
    raw_level = row.get("Level")
    try:
        task_level = int(raw_level)
    except (TypeError, ValueError):
        raise ValueError(f"field 'Level' is {raw_level!r}, expected 1, 2 or 3") from None
    if task_level not in (1, 2, 3):
        raise ValueError(f"field 'Level' is {raw_level!r}, expected 1, 2 or 3")
    file_name = row.get("file_name") or ""
    if not isinstance(file_name, str):
        raise ValueError(f"field 'file_name' must be a string, got {type(file_name).__name__}")
    if level is not None and task_level != level:
        raise _Skip("other level")
    if text_only and file_name:
        raise _Skip("attached file")
    answer = row.get("Final answer")
    if answer is None or answer == "?":     # the test split: answers are private
        answer = None
    else:
        answer = _text(row, "Final answer")
    files = {}
    if file_name:
        if Path(file_name).name != file_name:
            raise ValueError(f"field 'file_name' {file_name!r} must be a bare file name")
        files[file_name] = str(folder / file_name)
    return BenchmarkTask(id=_text(row, "task_id"), question=gaia_question(_text(row, "Question"), file_name),
                         answer=answer, meta={"level": task_level, "file_name": file_name or None}, files=files)


PARSERS: dict[str, Callable[..., BenchmarkTask]] = {"hle": parse_hle, "frames": parse_frames, "gaia": parse_gaia}


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
    import datasets  # lazy: heavy; only for Hugging Face ids

    return _hf_rows(datasets.load_dataset("parquet", data_files=str(path), split="train"))


def _hub_rows(dataset_id: str, split: str | None, benchmark: str) -> Iterator[tuple[int, dict | Exception]]:
    import datasets  # lazy: heavy; only for Hugging Face ids

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


def _gaia_metadata(folder: Path) -> Path | None:
    return next((folder / name for name in GAIA_METADATA if (folder / name).is_file()), None)


def _gaia_hub(dataset_id: str, split: str) -> Path:
    """The dataset's files of `split` from the hub (cached by huggingface_hub); its root folder."""
    try:
        from huggingface_hub import snapshot_download  # lazy: only for downloads

        return Path(snapshot_download(repo_id=dataset_id, repo_type="dataset", allow_patterns=[f"2023/{split}/*"]))
    except Exception as exc:  # the hub raises many types; all mean "could not get it"
        raise LoaderError(
            f"--data {dataset_id!r}: not a local folder and could not be downloaded from the Hugging Face hub "
            f"(split {split!r}): {type(exc).__name__}: {exc}. GAIA is gated: accept its terms on the dataset page "
            f"and `huggingface-cli login`, or pass a local folder holding 2023/{split}/metadata.jsonl") from None


def gaia_split_folder(data: str | Path, split: str | None = None) -> tuple[Path, Path]:
    """(split folder, metadata file) for `--data` naming a split folder, the dataset root
    (2023/<split>/ under it), a metadata file, or a hub id (downloaded)."""
    split = split or "validation"
    path = Path(data).expanduser()
    if path.is_file():
        if path.suffix not in (".jsonl", ".parquet"):
            raise LoaderError(f"--data {data}: a GAIA metadata file is metadata.jsonl or metadata.parquet")
        return path.parent, path
    if not path.exists() and str(data).count("/") == 1 and not str(data).startswith((".", "/", "~")):
        path = _gaia_hub(str(data), split)
    if not path.is_dir():
        raise LoaderError(f"--data {data}: no such folder (and not a Hugging Face dataset id like "
                          f"'gaia-benchmark/GAIA')")
    for folder in (path, path / "2023" / split, path / split):
        metadata = _gaia_metadata(folder)
        if metadata is not None:
            return folder, metadata
    raise LoaderError(f"--data {data}: no GAIA {' or '.join(GAIA_METADATA)} in {path} or in "
                      f"{path / '2023' / split} (--split {split}); name the split folder of gaia-benchmark/GAIA")


def _gaia_rows(metadata: Path) -> Iterator[tuple[int, dict | Exception]]:
    return jsonl_rows(metadata) if metadata.suffix == ".jsonl" else _parquet_rows(metadata)


def _check_attachments(tasks: list[BenchmarkTask], data: str | Path) -> None:
    """Every attached file a task names is there, or one error naming what is missing."""
    missing = [(t.id, path) for t in tasks for path in t.files.values() if not Path(path).is_file()]
    if missing:
        first_id, first = missing[0]
        raise LoaderError(
            f"--data {data}: {len(missing)} attached file(s) named in 'file_name' are missing (first: task "
            f"{first_id}: {first}); download the split folder with its files (huggingface-cli download "
            f"gaia-benchmark/GAIA --repo-type dataset --include '2023/<split>/*'), or run only the tasks "
            f"without one (--text-only)")


def load_benchmark(benchmark: str, data: str | Path, split: str | None = None,
                   limit: int | None = None, *, level: int | None = None, text_only: bool | None = None) -> LoadResult:
    """Read `data` as `benchmark` ("hle", "frames" or "gaia"); keep the first `limit` usable tasks.
    GAIA only: `level` keeps one level (1-3), `text_only` the tasks with no attached file
    (the others are counted as skipped).  HLE: `text_only` (None: True, the paper's and HLE's
    text-only subset) skips and counts the questions with an image; False keeps them.

    Duplicate ids are malformed too: results are keyed by id, so a duplicate would be lost.
    """
    if benchmark not in PARSERS:
        raise LoaderError(f"unknown benchmark {benchmark!r}; known: {list(PARSERS)}")
    if benchmark != "gaia" and level is not None:
        raise LoaderError(f"level selects GAIA tasks; {benchmark} has no levels")
    if level is not None and level not in (1, 2, 3):
        raise LoaderError(f"--level {level}: GAIA's levels are 1, 2 and 3")
    parse, source, result = PARSERS[benchmark], str(data), LoadResult()
    if benchmark == "gaia":
        folder, metadata = gaia_split_folder(data, split)
        source, rows = str(metadata), _gaia_rows(metadata)
        base = parse

        def parse(row: dict, index: int) -> BenchmarkTask:
            return base(row, index, folder, level=level, text_only=bool(text_only))
    else:
        rows = _rows(str(data), split, benchmark)
        if benchmark == "hle" and text_only is False:
            parse = partial(parse_hle, text_only=False)
    seen: set[str] = set()
    for ordinal, (lineno, row) in enumerate(rows):
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
    if benchmark == "gaia":
        _check_attachments(result.tasks, data)
    if not result.tasks and not result.skipped:
        raise LoaderError(f"--data {data}: no usable {benchmark} records"
                          + (f" ({len(result.malformed)} malformed; first: {result.malformed[0]})"
                             if result.malformed else ""))
    return result
