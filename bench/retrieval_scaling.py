"""FAISS index kinds as the corpus grows: flat, hnsw and ivfpq at 100k, 1M and 10M synthetic vectors.

    python bench/retrieval_scaling.py [--sizes 100000 1000000 10000000] [--dim 128] [--work /tmp/retrieval-scaling]

Each size is built the way `retrieval.build_index` builds a real index (float16 shards on disk,
then `retrieval.dense.build_faiss`) and searched through `retrieval.dense.DenseIndex` (ivfpq
with its exact re-score from the shards): build seconds, bytes per vector (the FAISS index in
RAM; ivfpq also reads the 2 x dim-byte shards on disk for its re-score), single-query p50 / p99
latency (top-10, one FAISS thread), batched queries per second, and recall@10 against flat
(exact) on the same queries.  Vectors: unit vectors around n/100 random centres (clustered like
text embeddings); queries: stored vectors moved by noise of norm ~0.3.

Limits of this box (2 shared cores, 24 GiB shared by several jobs): `--dim` defaults to 128,
because a 10M x 384 float32 flat index is 15.4 GB; hnsw is built only up to `--hnsw-max`
vectors (its build took ~7 minutes per 100k x 384 here); ivfpq's list count is capped at
`--max-nlist` (the default 4 sqrt(n) is 12,649 lists at 10M, whose k-means and assignment
would take hours on two cores).  Rows say which settings they ran with.  `--json` writes all rows.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def write_vectors(folder: Path, n: int, dim: int, shard: int, seed: int = 0) -> np.ndarray:
    """Clustered unit vectors into float16 shards; returns 1,000 query vectors (stored + noise)."""
    from retrieval.dense import write_shard

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(1, n // 100), dim)).astype(np.float32)
    pick = np.sort(rng.choice(n, 1000, replace=False))
    queries = np.empty((1000, dim), np.float32)
    for i, start in enumerate(range(0, n, shard)):
        m = min(shard, n - start)
        x = centres[rng.integers(0, len(centres), m)] + 0.7 * rng.normal(size=(m, dim)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        write_shard(folder, i, x)
        inside = pick[(pick >= start) & (pick < start + m)]
        queries[np.searchsorted(pick, inside)] = x[inside - start].astype(np.float16).astype(np.float32)
    queries += (0.3 / math.sqrt(dim)) * rng.normal(size=queries.shape).astype(np.float32)
    return (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)


def measure(folder: Path, n: int, dim: int, shard: int, kind: str, queries: np.ndarray, singles: int, batched: int,
            exact: np.ndarray | None, nlist: int | None, threads: tuple[int, int] = (1, 1)) -> tuple[dict, np.ndarray]:
    """`threads`: FAISS threads for (the build, the searches)."""
    import faiss

    from retrieval import dense
    from retrieval.dense import INDEX_FILE, DenseIndex, build_faiss, ivf_lists

    faiss.omp_set_num_threads(threads[0])
    t0 = time.perf_counter()
    built = build_faiss(folder, n, dim, shard, kind, progress=False, nlist=nlist)
    build_s = time.perf_counter() - t0
    del built
    faiss.omp_set_num_threads(threads[1])
    size = (folder / INDEX_FILE).stat().st_size
    index = DenseIndex(folder, {"index": kind, "n_docs": n, "shard_size": shard})
    index.search(queries[:2], 10)                    # first touch of the index pages
    single, found = [], []
    for q in queries[:singles]:
        t0 = time.perf_counter()
        _, rows = index.search(q[None], 10)
        single.append(time.perf_counter() - t0)
        found.append(rows[0])
    t0 = time.perf_counter()
    index.search(queries[singles:singles + batched], 10)
    batched_qps = batched / (time.perf_counter() - t0)
    found = np.asarray(found)
    recall = 1.0 if exact is None else float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)]))
    settings = {"flat": "exact",
                "hnsw": f"M {dense.HNSW_M}, efConstruction {dense.HNSW_EF_CONSTRUCTION}, efSearch {dense.HNSW_EF_SEARCH}",
                "ivfpq": f"nlist {nlist or ivf_lists(n)}, {dim // 4} x 8-bit codes, nprobe 32, re-score 80"}[kind]
    row = {"n": n, "dim": dim, "kind": kind, "settings": settings, "build_threads": threads[0], "build_s": build_s, "bytes_per_vector": size / n,
           "index_mib": size / 2**20, "single_p50_ms": pct(single, 50), "single_p99_ms": pct(single, 99),
           "singles": singles, "batched_qps": batched_qps, "recall@10_vs_flat": recall, "load": load()}
    del index
    (folder / INDEX_FILE).unlink()
    return row, found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--kinds", nargs="+", default=["flat", "hnsw", "ivfpq"])
    p.add_argument("--hnsw-max", type=int, default=100_000, help="largest size hnsw is built at")
    p.add_argument("--max-nlist", type=int, default=2048, help="cap on ivfpq's list count")
    p.add_argument("--threads", type=int, default=1, help="FAISS threads for the searches")
    p.add_argument("--build-threads", type=int, help="FAISS threads for the builds (default: --threads)")
    p.add_argument("--ef-construction", type=int,
                   help="hnsw's efConstruction for this run (default: retrieval.dense's, 200)")
    p.add_argument("--work", type=Path, default=Path("/tmp/retrieval-scaling"))
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    import faiss

    from retrieval import dense
    from retrieval.dense import ivf_lists
    if args.ef_construction:
        dense.HNSW_EF_CONSTRUCTION = args.ef_construction
    threads = (args.build_threads or args.threads, args.threads)   # measure() sets them per phase
    rows = []
    print(f"machine: {os.cpu_count()} cores; FAISS {faiss.__version__}; build threads {threads[0]}, "
          f"search threads {threads[1]}; load average at the start: {load()}", flush=True)
    for n in args.sizes:
        folder = args.work / f"n{n}"
        shutil.rmtree(folder, ignore_errors=True)
        shard = 100_000 if n >= 1_000_000 else 50_000
        t0 = time.perf_counter()
        queries = write_vectors(folder, n, args.dim, shard)
        print(f"n={n}: vectors written in {time.perf_counter() - t0:.0f} s", flush=True)
        singles = 200 if n <= 1_000_000 else 50
        batched = 1000 - singles if n <= 1_000_000 else 200
        exact = None
        for kind in ["flat"] + [k for k in args.kinds if k != "flat"]:
            if kind == "hnsw" and n > args.hnsw_max:
                print(f"n={n}: hnsw skipped (--hnsw-max {args.hnsw_max})", flush=True)
                continue
            nlist = min(ivf_lists(n), args.max_nlist) if kind == "ivfpq" else None
            row, found = measure(folder, n, args.dim, shard, kind, queries, singles, batched, exact, nlist, threads)
            if kind == "flat":
                exact = found
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
        shutil.rmtree(folder, ignore_errors=True)
    print(f"load average at the end: {load()}", flush=True)
    cols = ["n", "kind", "settings", "build_threads", "build_s", "bytes_per_vector", "single_p50_ms", "single_p99_ms", "batched_qps",
            "recall@10_vs_flat", "load"]
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:,.2f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
