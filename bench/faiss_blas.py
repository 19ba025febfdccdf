"""Flat search per query, FAISS's default BLAS threshold vs ours, as the retrieval server runs it.

    python bench/faiss_blas.py [--n 1000000] [--dim 384] [--threads 1] [--repeats 3]

FAISS >= 1.13 takes the BLAS path of a flat search only when nq * dim >= 128,000 (before: nq >= 20);
`retrieval.encoders.set_cpu_threads` sets 800 per OpenMP thread (FAISS PR #5109's crossover). This
times one search of nq queries (1, 8, 32, 64: the micro-batches a server worker forms) on a random
n x dim IndexFlatIP under each threshold, interleaved, `--repeats` times (median), and checks that
both return the same ids.  Prints a markdown table.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--threads", type=int, default=1, help="FAISS OpenMP threads (the servers' CPU default: 1)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    import faiss

    from retrieval.encoders import blas_threshold

    faiss.omp_set_num_threads(args.threads)
    default = faiss.cvar.distance_compute_blas_threshold
    ours = blas_threshold(default, args.threads)
    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()}; FAISS {faiss.__version__}; "
          f"{args.threads} thread(s); thresholds: default {default}, ours {ours}", flush=True)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((args.n, args.dim), dtype=np.float32)
    index = faiss.IndexFlatIP(args.dim)
    index.add(x)
    queries = x[:max(args.batches)] + 0.1 * rng.standard_normal((max(args.batches), args.dim), dtype=np.float32)
    times = {(nq, t): [] for nq in args.batches for t in (default, ours)}
    for _ in range(args.repeats):
        for nq in args.batches:
            ids = {}
            for threshold in (default, ours):
                faiss.cvar.distance_compute_blas_threshold = threshold
                t0 = time.perf_counter()
                ids[threshold] = index.search(queries[:nq], 10)[1]
                times[nq, threshold].append(time.perf_counter() - t0)
            assert (ids[default] == ids[ours]).all(), f"the two paths disagree at nq={nq}"
    faiss.cvar.distance_compute_blas_threshold = default
    print(f"\n{args.n:,} x {args.dim} flat, top-10, {args.threads} thread(s), median of {args.repeats}; "
          f"load average at the end {os.getloadavg()}\n")
    print("| queries per search | default threshold: q/s | ours: q/s | ours / default |\n|---:|---:|---:|---:|")
    for nq in args.batches:
        d, o = (nq / statistics.median(times[nq, t]) for t in (default, ours))
        print(f"| {nq} | {d:.1f} | {o:.1f} | {o / d:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
