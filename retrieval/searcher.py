"""Answer batches of queries from an index folder: encode once, search once, filter, look up.

`Searcher.search(queries)` is the one retrieval code path: the HTTP server's worker threads
and the in-process client both call it with micro-batches of `Query`. It is thread-safe:
encoder calls may overlap (one per worker, on CPU); a GPU index is used under a lock (FAISS
on GPU is not thread-safe; upstream crashed under concurrent requests), while CPU FAISS and
Lucene searchers take concurrent searches as they are.

A hit is Search-R1's `{"document": {"id", "contents"}, "score": float}`.
"""
from __future__ import annotations

import contextlib
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from retrieval.docstore import DocStore

log = logging.getLogger(__name__)
META_FILE = "meta.json"
# Upstream's servers take the index's top 1,000 and keep, in rank order, the first topk that pass
# their filters (retrieval_hle.py:346-358, retrieval_wiki.py:332-345, training/retrieval_general_thought.py:331-345).
# With a minimum length we ask for FILTER_CANDIDATES first and search UPSTREAM_CANDIDATES deep only
# for a query the filter left short: on an exact index (flat, torch) the same hits as one search of
# 1,000, for the price of 100 candidates almost always. (A minimum score alone needs no depth:
# scores come sorted, so the hits above it are a prefix.)
FILTER_CANDIDATES = 100
UPSTREAM_CANDIDATES = 1000


class QueryError(ValueError):
    """A request the index cannot answer as asked; `field` names the request field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class Query:
    text: str
    topk: int = 3
    eid: str | None = None               # key into the eid file: search only its documents
    min_score: float | None = None       # drop hits scoring below this
    min_length: int = 0                  # drop documents shorter than this many characters
    # the text's token rows, made by a front end's QueryTokenizer (retrieval/frontends.py); None:
    # the worker tokenises. Not part of the query's identity.
    tokens: dict | None = field(default=None, compare=False, hash=False, repr=False)


class Searcher:
    """An index folder loaded for serving: docstore + dense (FAISS) or BM25 (Lucene).

    `method` is "dense" or "bm25" (default: dense when the folder has a FAISS index).
    `eid_file` is a JSON object {eid: [doc_id, ...]} of per-question whitelists.
    `encoder_runtime`: the query encoder's runtime ("torch", "onnx", "onnx-int8", or "auto":
    onnx on the CPU when onnxruntime is installed; retrieval/encoders.py).
    `cuda_graphs`: on cuda, the query encoder replays CUDA graphs of bucketed shapes
    (retrieval/encoder_graphs.py); no effect on the CPU.
    """

    def __init__(self, folder: str | Path, method: str | None = None, device: str | None = None,
                 eid_file: str | Path | None = None, encoder=None, encoder_runtime: str = "torch",
                 cuda_graphs: bool = True, **index_options):
        self.folder = Path(folder)
        meta_path = self.folder / META_FILE
        if not meta_path.exists():
            raise FileNotFoundError(f"{self.folder}: no {META_FILE}; build the index with "
                                    f"`python -m retrieval.build_index --corpus C --out {self.folder}`")
        self.meta = json.loads(meta_path.read_text())
        self.store = DocStore(self.folder)
        self.method = method or ("dense" if self.meta.get("index") else "bm25")
        self.encoder = None
        self.pretokenized = 0             # queries that arrived with their tokens (front ends)
        self._count_lock = threading.Lock()   # several batch threads (CPU --workers) add to it
        self.device = "cpu"               # where encoder and index run (cuda: one batch worker)
        if self.method == "dense":
            self._load_dense(device, encoder, encoder_runtime, cuda_graphs, index_options)
        elif self.method == "bm25":
            if not self.meta.get("bm25"):
                raise FileNotFoundError(f"{self.folder}: built without --bm25; rebuild with --bm25 to serve BM25")
            from retrieval.bm25 import BM25Index
            self.index = BM25Index(self.folder, self.store)
        else:
            raise ValueError(f"method {method!r} is unknown; use dense or bm25")
        self.whitelists = load_whitelists(eid_file, self.store) if eid_file else None
        self._index_lock = threading.Lock() if self.device.startswith("cuda") else contextlib.nullcontext()

    def _load_dense(self, device, encoder, runtime, cuda_graphs, index_options) -> None:
        if not self.meta.get("index"):
            raise FileNotFoundError(f"{self.folder}: built with --index none; rebuild with a dense index kind")
        from retrieval.dense import DenseIndex
        from retrieval.encoders import Encoder, resolve_runtime

        # The folder the build loaded, when it exists here; else the name (a Hub id or "minilm"),
        # so an index built on another machine still finds its encoder.
        path = self.meta.get("encoder_path")
        name = path if path and Path(path).is_dir() else self.meta["encoder"]
        if device is None:
            import torch
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.encoder = encoder or Encoder(name, profile=self.meta.get("profile"), device=device,
                                          max_length=self.meta.get("max_length"),
                                          runtime=resolve_runtime(runtime, device),
                                          query_graphs=cuda_graphs and device.startswith("cuda"))
        if self.encoder.dim != self.meta["dim"]:
            raise ValueError(f"encoder gives {self.encoder.dim}-d vectors but {self.folder} holds {self.meta['dim']}-d ones")
        self.device = self.encoder.device
        self.index = DenseIndex(self.folder, self.meta, device=self.device, **index_options)

    def check(self, query: Query) -> None:
        """Raise QueryError when `query` asks for something this index cannot do."""
        if query.eid is not None:
            if self.whitelists is None:
                raise QueryError("eid", "this server has no eid whitelists; start it with --eid-file")
            if query.eid not in self.whitelists:
                raise QueryError("eid", f"unknown eid {query.eid[:100]!r}; it is not a key of the eid file")

    def search(self, queries: list[Query]) -> list[list[dict]]:
        """One encoder call and one index search for the whole batch; hits per query, best first."""
        for q in queries:
            self.check(q)
        if not queries:
            return []
        plain = [i for i, q in enumerate(queries) if q.eid is None]
        k = max([_candidates(queries[i], len(self.store)) for i in plain] or [1])
        vectors = None
        if self.method == "dense":
            tokens = [q.tokens for q in queries]
            if any(t is not None for t in tokens):       # tokenised by the HTTP front ends
                with self._count_lock:
                    self.pretokenized += sum(t is not None for t in tokens)
                vectors = self.encoder.encode_queries([q.text for q in queries], tokens)   # [b, dim]
            else:
                vectors = self.encoder.encode_queries([q.text for q in queries])

        scores = rows = None
        if plain:
            batch = vectors[plain] if vectors is not None else [queries[i].text for i in plain]
            with self._index_lock:
                scores, rows = self.index.search(batch, k)
        out: list[list[dict]] = [[] for _ in queries]
        for j, i in enumerate(plain):
            out[i] = self._hits(queries[i], scores[j], rows[j])
        short = [i for i in plain if len(out[i]) < queries[i].topk
                 and _candidates(queries[i], len(self.store), deep=True) > k]
        if short:                         # the length filter left too few: search as deep as upstream
            deep = max(_candidates(queries[i], len(self.store), deep=True) for i in short)
            batch = vectors[short] if vectors is not None else [queries[i].text for i in short]
            with self._index_lock:
                scores, rows = self.index.search(batch, deep)
            for j, i in enumerate(short):
                out[i] = self._hits(queries[i], scores[j], rows[j])
        for i, q in enumerate(queries):
            if q.eid is not None:
                out[i] = self._hits(q, *self._whitelist_search(q, vectors[i] if vectors is not None else None))
        return out

    def _whitelist_search(self, q: Query, vector: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        allowed = self.whitelists[q.eid]
        if vector is not None:            # dense: exact scores over the whitelist only (all scored anyway)
            return self.index.score_rows(vector, allowed, _candidates(q, len(allowed), deep=True))
        # BM25 has no per-query filter: search deep, keep whitelisted rows in rank order.
        with self._index_lock:
            scores, rows = self.index.search([q.text], min(len(self.store), UPSTREAM_CANDIDATES))
        keep = np.isin(rows[0], allowed)
        return scores[0][keep], rows[0][keep]

    def _hits(self, q: Query, scores: np.ndarray, rows: np.ndarray) -> list[dict]:
        hits = []
        for score, row in zip(scores, rows):
            if row < 0 or (q.min_score is not None and float(score) < q.min_score):
                continue      # not `break`: eid/BM25 rows are sorted, but -1 pads may interleave
            doc = self.store.get(int(row))
            if len(doc["contents"]) < q.min_length:
                continue
            hits.append({"document": doc, "score": float(score)})
            if len(hits) == q.topk:
                break
        return hits


def _candidates(q: Query, n: int, deep: bool = False) -> int:
    """Rows to ask the index for: topk, or with a length filter 100 (deep: upstream's 1,000)."""
    if q.min_length <= 0:
        return min(n, q.topk)
    return min(n, max(q.topk, UPSTREAM_CANDIDATES if deep else FILTER_CANDIDATES))


def load_whitelists(path: str | Path, store: DocStore) -> dict[str, np.ndarray]:
    """{eid: [doc_id, ...]} JSON -> {eid: rows int64}; unknown doc ids are dropped (and counted)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"--eid-file {path}: no such file") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--eid-file {path}: line {err.lineno} column {err.colno}: invalid JSON: {err.msg}") from None
    if not isinstance(data, dict):
        raise ValueError(f"--eid-file {path}: expected an object {{eid: [doc_id, ...]}}, got {type(data).__name__}")
    out, unknown = {}, 0
    for eid, ids in data.items():
        if not isinstance(ids, list):
            raise ValueError(f"--eid-file {path}: {eid}: expected a list of document ids, got {type(ids).__name__}")
        rows = [store.row_of(i) for i in ids]
        unknown += sum(r is None for r in rows)
        out[eid] = np.unique(np.asarray([r for r in rows if r is not None], dtype=np.int64))
    if unknown:
        log.warning("%s: %d document id(s) are not in the index and were ignored", path, unknown)
    return out
