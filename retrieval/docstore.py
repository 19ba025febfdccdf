"""The corpus on disk, read by row or by id in O(1) with no per-request file opens.

Layout inside an index folder (written once by `write_docstore`, read by `DocStore`):

    docs.bin          contents of every document, UTF-8, concatenated
    docs.offsets.npy  int64 [n + 1]: document i is docs.bin[off[i]:off[i + 1]]
    ids.bin           document ids, UTF-8, concatenated
    ids.offsets.npy   int64 [n + 1]

Both .bin files are memory-mapped once at start-up, so a lookup is a slice of the page cache
(upstream re-read the corpus through `datasets` per request and ran out of file handles in
long runs). Row i is the i-th non-blank line of the corpus; FAISS and BM25 hits are rows.
"""
from __future__ import annotations

import json
import mmap
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

FILES = ("docs.bin", "docs.offsets.npy", "ids.bin", "ids.offsets.npy")
MAX_REPORTED_ERRORS = 20


class CorpusError(ValueError):
    """A malformed corpus: every message names the file and line."""


@dataclass(frozen=True)
class CorpusDoc:
    line: int       # 1-based line number in the corpus file
    id: str
    contents: str


def read_corpus(path: str | Path) -> Iterator[CorpusDoc]:
    """Yield the documents of a JSONL corpus of {"id", "contents"} (or "content") objects.

    Blank lines are skipped. Malformed lines are collected and raised together (up to
    20 shown) after the whole file was read, so one run lists every line to fix.
    """
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: corpus file not found; pass --corpus a JSONL file of {{\"id\", \"contents\"}} lines")
    errors: list[str] = []
    n_errors = 0
    seen: dict[str, int] = {}
    with path.open("r", encoding="utf-8", errors="strict") as f:
        for lineno, line in enumerate(_lines(f, path), start=1):
            if not line.strip():
                continue
            doc, problem = _parse_line(line)
            if problem is None and doc[0] in seen:
                problem = f"duplicate id {doc[0]!r} (first on line {seen[doc[0]]})"
            if problem is not None:
                n_errors += 1
                if len(errors) < MAX_REPORTED_ERRORS:
                    errors.append(f"{path}:{lineno}: {problem}")
                continue
            seen[doc[0]] = lineno
            if not n_errors:
                yield CorpusDoc(lineno, doc[0], doc[1])
    if n_errors:
        more = f"\n... and {n_errors - len(errors)} more" if n_errors > len(errors) else ""
        raise CorpusError(f"{n_errors} malformed corpus line(s):\n" + "\n".join(errors) + more)


def _lines(f, path: Path) -> Iterator[str]:
    try:
        yield from f
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path}: not UTF-8 text ({err}); re-encode the corpus as UTF-8") from None


def _parse_line(line: str) -> tuple[tuple[str, str] | None, str | None]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        return None, f"not valid JSON ({err.msg} at column {err.colno})"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {type(obj).__name__}"
    if "id" not in obj:
        return None, 'missing "id"'
    doc_id = obj["id"]
    if isinstance(doc_id, bool) or not isinstance(doc_id, (str, int)) or str(doc_id) == "":
        return None, f'"id" must be a non-empty string or integer, got {doc_id!r}'
    text = obj.get("contents", obj.get("content"))
    if not isinstance(text, str):
        return None, 'missing "contents" (or "content") string'
    try:
        text.encode("utf-8")
        str(doc_id).encode("utf-8")
    except UnicodeEncodeError:
        return None, "invalid Unicode (a lone surrogate escape such as \\ud800)"
    return (str(doc_id), text), None


def write_docstore(corpus: str | Path, out: str | Path, progress: bool = True) -> int:
    """Write the four docstore files into `out` (atomically: temp names, then rename).

    Returns the number of documents. Raises CorpusError naming bad lines.
    """
    from tqdm import tqdm  # lazy: display only

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = {name: out / f".{name}.tmp" for name in FILES}
    doc_off, id_off = [0], [0]
    try:
        with open(tmp["docs.bin"], "wb") as docs, open(tmp["ids.bin"], "wb") as ids:
            total = Path(corpus).stat().st_size if Path(corpus).is_file() else None
            with tqdm(total=total, unit="B", unit_scale=True, desc="corpus", disable=not progress) as bar:
                for doc in read_corpus(corpus):
                    body, key = doc.contents.encode(), doc.id.encode()
                    docs.write(body)
                    ids.write(key)
                    doc_off.append(doc_off[-1] + len(body))
                    id_off.append(id_off[-1] + len(key))
                    bar.update(len(body) + len(key) + 30)   # ~ the JSON line's size
    except BaseException:
        for path in tmp.values():
            path.unlink(missing_ok=True)
        raise
    if len(doc_off) == 1:
        raise CorpusError(f"{corpus}: no documents (the file is empty or blank)")
    np.save(tmp["docs.offsets.npy"], np.asarray(doc_off, dtype=np.int64))
    np.save(tmp["ids.offsets.npy"], np.asarray(id_off, dtype=np.int64))
    # np.save appends ".npy" when missing; our temp names end in ".tmp".
    for name in ("docs.offsets.npy", "ids.offsets.npy"):
        os.replace(f"{tmp[name]}.npy", tmp[name])
    for name in FILES:
        os.replace(tmp[name], out / name)
    return len(doc_off) - 1


class DocStore:
    """Read-only view of a docstore; safe to share between threads."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        missing = [n for n in FILES if not (folder / n).exists()]
        if missing:
            raise FileNotFoundError(f"{folder}: not a retrieval index (missing {missing}); "
                                    f"build one with `python -m retrieval.build_index --corpus C --out {folder}`")
        # Plain ndarray views of the memory maps: np.memmap's Python-level __getitem__ is paid
        # on every look-up otherwise (a GPU batch worker does 5 per query).
        self._doc_off = np.asarray(np.load(folder / "docs.offsets.npy", mmap_mode="r"))
        self._id_off = np.asarray(np.load(folder / "ids.offsets.npy", mmap_mode="r"))
        self._docs = _map(folder / "docs.bin")
        self._ids = _map(folder / "ids.bin")
        self._row_of: dict[str, int] | None = None
        self._lock = threading.Lock()
        # Most corpora (FlashRAG's Wikipedia, ours) number documents 0..n-1: then id == row
        # and no id -> row dictionary (~100 B per document) is needed.
        n = len(self)
        self.ids_are_rows = n > 0 and self.id(0) == "0" and self.id(n - 1) == str(n - 1)

    def __len__(self) -> int:
        return len(self._doc_off) - 1

    def id(self, row: int) -> str:
        return bytes(self._ids[self._id_off[row]:self._id_off[row + 1]]).decode()

    def contents(self, row: int) -> str:
        return bytes(self._docs[self._doc_off[row]:self._doc_off[row + 1]]).decode()

    def get(self, row: int) -> dict:
        """{"id", "contents"} of document `row` (0 <= row < len(self))."""
        return {"id": self.id(row), "contents": self.contents(row)}

    def row_of(self, doc_id: str | int) -> int | None:
        """Row of the document with this id, or None when no such document exists."""
        key = str(doc_id)
        if self.ids_are_rows and key.isdigit() and int(key) < len(self) and self.id(int(key)) == key:
            return int(key)
        if self._row_of is None:
            with self._lock:
                if self._row_of is None:
                    self._row_of = {self.id(i): i for i in range(len(self))}
        return self._row_of.get(key)


def _map(path: Path):
    """Memory-map a file read-only (an empty file cannot be mapped: use empty bytes)."""
    if path.stat().st_size == 0:
        return b""
    with open(path, "rb") as f:   # the mapping outlives the descriptor: no open files kept
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
