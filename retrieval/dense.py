"""FAISS indexes over passage embeddings: build from shards, load, search.

Embeddings live in `emb/shard-NNNNN.npy` (float16 [<= shard_size, dim], rows in corpus
order). The FAISS index is built from them shard by shard, so memory holds one shard plus
the index itself. Index kinds (inner product on L2-normalised vectors = cosine):

- flat:  exact (IndexFlatIP); 4 x dim bytes per passage in RAM.
- hnsw:  graph search (IndexHNSWFlat, M=32, efConstruction=200, efSearch=128); ~1.1 x flat RAM.
- ivfpq: inverted lists + product quantisation (nlist ~ 4 sqrt(n), dim/4 one-byte codes
  per passage, nprobe=32), then an exact re-score of refine x topk candidates read from
  the on-disk shards: RAM is ~dim/4 bytes per passage (16x less than flat).

The shards stay in the index folder: eid whitelists and the ivfpq re-score read them
(memory-mapped once, never re-opened per request).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from retrieval.torch_flat import TorchFlatIndex

INDEX_FILE = "dense.faiss"
SHARD_DIR = "emb"
HNSW_M, HNSW_EF_CONSTRUCTION, HNSW_EF_SEARCH = 32, 200, 128
IVF_NPROBE, IVF_REFINE = 32, 8
KINDS = ("flat", "hnsw", "ivfpq")


def shard_path(folder: Path, i: int) -> Path:
    return Path(folder) / SHARD_DIR / f"shard-{i:05d}.npy"


def write_shard(folder: Path, i: int, vectors: np.ndarray) -> None:
    """Save one shard atomically: an interrupted build never leaves a half shard behind."""
    path = shard_path(folder, i)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, vectors.astype(np.float16))
    os.replace(tmp, path)


class ShardVectors:
    """Exact passage vectors by row, from the memory-mapped shards ([m] rows -> [m, dim] f32)."""

    def __init__(self, folder: Path, n: int, shard_size: int):
        count = math.ceil(n / shard_size)
        self.shards = [np.load(shard_path(folder, i), mmap_mode="r") for i in range(count)]
        self.shard_size = shard_size

    def get(self, rows: np.ndarray) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        out = np.empty((len(rows), self.shards[0].shape[1]), dtype=np.float32)
        shard_of, offset = np.divmod(rows, self.shard_size)
        for s in np.unique(shard_of):
            sel = shard_of == s
            out[sel] = self.shards[s][offset[sel]]
        return out


def build_faiss(folder: Path, n: int, dim: int, shard_size: int, kind: str, progress: bool = True,
                nlist: int | None = None):
    """Build the `kind` index from the shards in `folder` and write it atomically.
    `nlist`: ivfpq's list count (default `ivf_lists(n)`)."""
    import faiss  # lazy: heavy
    from tqdm import tqdm  # lazy: display only

    if kind not in KINDS:
        raise ValueError(f"--index {kind!r} is unknown; choose one of {KINDS}")
    vectors = ShardVectors(folder, n, shard_size)
    index = _empty_index(kind, n, dim, nlist)
    if not index.is_trained:
        index.train(_training_sample(vectors, n, index.nlist))
    with tqdm(total=n, unit="doc", desc=f"faiss {kind}", disable=not progress) as bar:
        for shard in vectors.shards:
            index.add(np.ascontiguousarray(shard, dtype=np.float32))
            bar.update(len(shard))
    tmp = Path(folder) / f".{INDEX_FILE}.tmp"
    faiss.write_index(index, str(tmp))
    os.replace(tmp, Path(folder) / INDEX_FILE)
    return index


def ivf_lists(n: int) -> int:
    """IVF cluster count: ~4 sqrt(n), but >= 39 training points per cluster (faiss' floor)."""
    return max(1, min(int(4 * math.sqrt(n)), n // 39))


def pq_subquantizers(dim: int) -> int:
    """Number of one-byte PQ codes: dim/4 (4 dims per code), rounded to a divisor of dim."""
    m = max(1, dim // 4)
    while dim % m:
        m -= 1
    return m


def _empty_index(kind: str, n: int, dim: int, nlist: int | None = None):
    import faiss  # lazy: heavy

    if kind == "flat":
        return faiss.IndexFlatIP(dim)
    if kind == "hnsw":
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        return index
    if n < 256:
        raise ValueError(f"--index ivfpq needs at least 256 passages to train its codebooks (got {n}); use flat")
    quantizer = faiss.IndexFlatIP(dim)
    return faiss.IndexIVFPQ(quantizer, dim, nlist or ivf_lists(n), pq_subquantizers(dim), 8, faiss.METRIC_INNER_PRODUCT)


def _training_sample(vectors: ShardVectors, n: int, nlist: int) -> np.ndarray:
    """A fixed-seed uniform sample: >= 64 points per IVF list and >= 65,536 for the 256-centroid
    PQ codebooks (6.3M passages, 10k lists: 640k x dim floats, 2.6 GB at 1024-d)."""
    rows = np.sort(np.random.default_rng(0).choice(n, size=min(n, max(65_536, 64 * nlist)), replace=False))
    return vectors.get(rows)


GPU_SEARCH = ("auto", "faiss", "torch")


def faiss_gpus() -> int:
    """GPUs faiss can use: 0 with a faiss-cpu build (or no faiss at all)."""
    try:
        import faiss
    except ImportError:
        return 0
    return faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0


class DenseIndex:
    """A loaded FAISS index plus exact vectors; `search` is called from one thread only.

    `gpu_search` picks who searches a flat index: "faiss" (on cuda: faiss-gpu, fp16 copies
    sharded over the GPUs), "torch" (retrieval/torch_flat.py: exact top-k from the float16
    shards on `device`, no faiss-gpu and no dense.faiss file needed), or "auto" (on cuda faiss
    when its build sees a GPU, else torch; on the CPU faiss). hnsw and ivfpq need faiss;
    without faiss-gpu they stay on the CPU.
    """

    def __init__(self, folder: Path, meta: dict, device: str = "cpu",
                 nprobe: int | None = None, ef_search: int | None = None, refine: int | None = None,
                 gpu_search: str = "auto"):
        if gpu_search not in GPU_SEARCH:
            raise ValueError(f"--gpu-search {gpu_search!r} is unknown; choose one of {GPU_SEARCH}")
        self.kind = meta["index"]
        self.n = int(meta["n_docs"])
        self.vectors = ShardVectors(folder, self.n, int(meta["shard_size"]))
        self.refine = 1
        cuda = device.startswith("cuda")
        if self.kind == "flat" and (gpu_search == "torch" or (cuda and gpu_search == "auto" and not faiss_gpus())):
            self.backend = "torch"
            devices = None if device == "cuda" else [device]       # "cuda": every visible GPU
            self.index = TorchFlatIndex(self.vectors.shards, self.n, devices=devices, progress=True)
            return
        if gpu_search == "torch":
            raise ValueError(f"--gpu-search torch serves flat indexes only; {folder} holds {self.kind}")
        import faiss  # lazy: heavy

        index = faiss.read_index(str(Path(folder) / INDEX_FILE))
        if self.kind == "hnsw":
            index.hnsw.efSearch = ef_search or HNSW_EF_SEARCH
        if self.kind == "ivfpq":
            index.nprobe = nprobe or IVF_NPROBE
        self.refine = (refine or IVF_REFINE) if self.kind == "ivfpq" else 1
        self.backend = "faiss-cpu"
        if cuda and self.kind != "hnsw" and faiss_gpus():   # no GPU HNSW in faiss
            options = faiss.GpuMultipleClonerOptions()
            options.useFloat16 = True
            options.shard = True
            index = faiss.index_cpu_to_all_gpus(index, co=options)
            self.backend = "faiss-gpu"
        elif cuda and gpu_search == "faiss" and self.kind != "hnsw":
            raise ValueError("--gpu-search faiss: this faiss build sees no GPU; install faiss-gpu-cu12 "
                             "(slurm/retrieval.sbatch says how) or use --gpu-search torch")
        self.index = index

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """[b, dim] f32 queries -> (scores [b, k] f32, rows [b, k] int64); missing hits are row -1."""
        k = max(1, min(k, self.n))
        if self.refine == 1:
            return self.index.search(queries, k)
        _, rows = self.index.search(queries, min(self.n, k * self.refine))
        scores = np.full(rows.shape, -np.inf, dtype=np.float32)
        for i, row in enumerate(rows):
            valid = row >= 0
            scores[i, valid] = self.vectors.get(row[valid]) @ queries[i]
        order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        rows = np.take_along_axis(rows, order, 1)
        scores = np.take_along_axis(scores, order, 1)
        rows[~np.isfinite(scores)] = -1
        return scores, rows

    def score_rows(self, query: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact top-k of one [dim] query over the given rows (an eid whitelist)."""
        if len(rows) == 0:
            return np.empty(0, np.float32), np.empty(0, np.int64)
        scores = self.vectors.get(rows) @ query
        top = np.argsort(-scores, kind="stable")[:k]
        return scores[top].astype(np.float32), np.asarray(rows)[top]
