"""The GPU retrieval server's batch worker under a closed loop, with the GPU modelled (CPU box).

    python bench/retrieval_worker.py [--clients 256 --frontends 8 --requests 4096 --repeats 2]

What it isolates: the batch-worker process of `retrieval.server --frontends N` (retrieval/frontends.py:
`worker_main`, its per-front-end reader and sender threads, the MicroBatcher, the RetrievalService,
the Searcher's tokenisation and docstore look-ups) with everything the GPU did replaced by a sleep
of the time the H200 took for that batch size (the encoder's CUDA graphs plus the 21M x 768 index,
docs/benchmarks.md "GPU retrieval: front ends, CUDA graphs, two-stage top-k"; linear between the
measured batch sizes). A sleep releases the GIL as a CUDA synchronize does. The front ends are
this process: one thread per pipe keeps clients / N requests of one query (top-5) outstanding,
sending the next when an answer arrives (with --frontend-tokens, each query tokenised here, as
the server's front ends send them since 2026-12-04). No HTTP.

Reported per run: queries/s, p50/p99 ms (pipe to pipe), batches and mean batch size, and the
ceiling a worker with no Python cost would reach at that mean batch (mean batch / modelled
seconds per batch), so `of ceiling` is the share the worker's own Python leaves; the CPU each
process used per wall second; and the batch thread's phases per batch (median ms: tokenise,
modelled GPU, hits, the hand-off gap, the whole cycle). 2 cores here: the worker and this
driver each get about one.
"""
from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing as mp
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# H200 milliseconds per batch (2026-12-04, 21M x 768): encoder graphs p50 and the index alone
# (two-stage top-k), docs/benchmarks.md
ENCODER_MS = {1: 1.15, 16: 1.84, 64: 3.69, 256: 13.09}
INDEX_MS = {1: 8.30, 16: 10.67, 64: 16.67, 256: 43.36}


def modelled_ms(table: dict[int, float], b: int) -> float:
    """Linear between the measured batch sizes; beyond the largest, proportional to it."""
    xs = sorted(table)
    if b >= xs[-1]:
        return table[xs[-1]] * b / xs[-1]
    return float(np.interp(b, xs, [table[x] for x in xs]))


class ModelledSearcher:
    """`Searcher`'s serving interface over a real docstore and tokenizer, the GPU work slept."""

    method = "dense"

    def __init__(self, folder: Path, tokenizer: str, n: int, scale: float, timing: str | None = None):
        from transformers import AutoTokenizer

        from retrieval.docstore import DocStore
        self.store, self.meta, self.index, self.encoder, self.whitelists = DocStore(folder), {}, None, None, None
        self.tokenizer, self.n, self.scale = AutoTokenizer.from_pretrained(tokenizer), n, scale
        self.rng, self.timing = np.random.default_rng(0), timing

    def check(self, query) -> None:
        pass

    def search(self, queries) -> list[list[dict]]:
        from retrieval.searcher import Searcher
        t0 = time.perf_counter()
        missing = [q.text for q in queries if q.tokens is None]     # as Encoder.encode_queries: given rows are used
        if missing:
            self.tokenizer(missing, truncation=True, max_length=512)
        t1 = time.perf_counter()
        b = len(queries)
        want = self.scale * (modelled_ms(ENCODER_MS, b) + modelled_ms(INDEX_MS, b)) / 1e3
        time.sleep(want)
        t2 = time.perf_counter()
        k = max(q.topk for q in queries)
        rows = self.rng.integers(0, self.n, size=(b, k))
        scores = np.sort(self.rng.random((b, k)).astype(np.float32), axis=1)[:, ::-1]
        out = [Searcher._hits(self, q, s, r) for q, s, r in zip(queries, scores, rows)]
        t3 = time.perf_counter()
        if self.timing:             # one line per batch: start, size, tokenise s, modelled s, slept s, hits s
            with open(self.timing, "a") as f:
                f.write(json.dumps([t0, b, t1 - t0, want, t2 - t1, t3 - t2]) + "\n")
        return out


def load_modelled(args):
    """worker_main's service loader (module level: the spawned worker unpickles it by name)."""
    from retrieval.service import RetrievalService
    return RetrievalService(ModelledSearcher(Path(args.folder), args.tokenizer, args.n, args.scale, args.timing),
                            max_batch=256, max_wait_s=args.max_wait_ms / 1000)


def drive(conns, clients: int, requests: int, texts: list[str], tokenize=None) -> dict:
    """Closed loop over the pipes: clients / len(conns) outstanding on each; pipe-to-pipe latencies.
    `tokenize` (a QueryTokenizer): each query goes out with its tokens, as the front ends send it."""
    from dataclasses import replace

    from retrieval.searcher import Query
    per = [clients // len(conns) + (i < clients % len(conns)) for i in range(len(conns))]
    quota = [requests // len(conns) + (i < requests % len(conns)) for i in range(len(conns))]
    latencies: list[list[float]] = [[] for _ in conns]
    errors = [0] * len(conns)

    def run(i: int) -> None:
        conn, sent, started = conns[i], 0, {}

        def send() -> None:
            nonlocal sent
            started[sent] = time.perf_counter()
            query = Query(texts[(i * 7919 + sent) % len(texts)], topk=5)
            if tokenize is not None:
                query = replace(query, tokens=tokenize([query.text])[0])
            conn.send(("retrieve", sent, [query]))
            sent += 1

        for _ in range(min(per[i], quota[i])):
            send()
        for _ in range(quota[i]):
            kind, rid, _payload = conn.recv()
            latencies[i].append(time.perf_counter() - started.pop(rid))
            errors[i] += kind != "result"
            if sent < quota[i]:
                send()

    t0 = time.perf_counter()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(conns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = sorted(x for part in latencies for x in part)
    return {"qps": len(lat) / wall, "p50_ms": statistics.median(lat) * 1e3,
            "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1e3, "errors": sum(errors), "wall_s": wall}


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    import psutil
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def phases(path: Path, since: float) -> dict:
    """Median milliseconds per batch thread phase over the batches that started after `since`:
    tokenise, the modelled GPU sleep (asked / slept), the hits, and the gap to the next batch
    (the batcher's result hand-off and the next take); the cycle is start to start."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows = [r for r in rows if r[0] >= since]
    ms = lambda xs: round(statistics.median(xs) * 1e3, 2) if xs else None
    ends = [r[0] + r[2] + r[4] + r[5] for r in rows]
    return {"tokenise_ms": ms([r[2] for r in rows]), "gpu_modelled_ms": ms([r[3] for r in rows]),
            "gpu_slept_ms": ms([r[4] for r in rows]), "hits_ms": ms([r[5] for r in rows]),
            "gap_ms": ms([b[0] - e for b, e in zip(rows[1:], ends)]),
            "cycle_ms": ms([b[0] - a[0] for a, b in itertools.pairwise(rows)])}


def health(conn) -> dict:
    conn.send(("health", -1, None))
    while True:
        _kind, rid, payload = conn.recv()
        if rid == -1:
            return payload


def run_once(args, texts: list[str]) -> dict:
    from retrieval.frontends import worker_main
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe(duplex=True) for _ in range(args.frontends)]
    ready_recv, ready_send = ctx.Pipe(duplex=False)
    worker = ctx.Process(target=worker_main, args=(args, [w for w, _ in pipes], ready_send, os.getpid(), load_modelled))
    worker.start()
    status = ready_recv.recv()
    if status[0] != "ok":
        raise RuntimeError(f"the worker failed to load: {status}")
    conns = [f for _, f in pipes]
    tokenize = None
    if args.frontend_tokens:
        from retrieval.encoders import QueryTokenizer
        tokenize = QueryTokenizer(args.tokenizer, "", 512)
    try:
        drive(conns, min(args.clients, 64), 512, texts, tokenize)            # warm-up
        before = health(conns[0])["batches"]
        cpu0, wcpu0, start = time.process_time(), proc_cpu_s(worker.pid), time.perf_counter()
        row = drive(conns, args.clients, args.requests, texts, tokenize)
        # CPU seconds per wall second: how close each process came to a core of its own
        row["driver_cpu"] = (time.process_time() - cpu0) / row["wall_s"]
        row["worker_cpu"] = (proc_cpu_s(worker.pid) - wcpu0) / row["wall_s"]
        row["batches"] = health(conns[0])["batches"] - before
        row["mean_batch"] = args.requests / row["batches"]
        per_batch_s = args.scale * (modelled_ms(ENCODER_MS, row["mean_batch"])
                                    + modelled_ms(INDEX_MS, row["mean_batch"])) / 1e3
        row["ceiling_qps"] = row["mean_batch"] / per_batch_s
        row["of_ceiling"] = row["qps"] / row["ceiling_qps"]
        row.update(phases(Path(args.timing), start))
        return row
    finally:
        for _, f in pipes:
            f.close()
        worker.join(10)
        if worker.is_alive():
            worker.kill()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=256)
    p.add_argument("--frontends", type=int, default=8)
    p.add_argument("--requests", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--n", type=int, default=1_000_000, help="passages in the placeholder docstore")
    p.add_argument("--scale", type=float, default=1.0, help="multiply the modelled GPU times")
    p.add_argument("--max-wait-ms", type=float, default=0.0, help="the batcher's linger (server --max-wait-ms)")
    p.add_argument("--frontend-tokens", action="store_true",
                   help="queries arrive tokenised, as the server's front ends send them (the driver tokenises)")
    p.add_argument("--work", type=Path, default=Path("/tmp/retrieval-worker"))
    p.add_argument("--tokenizer", help="a BERT uncased tokenizer folder (default: the shipped MiniLM's)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    if args.tokenizer is None:
        from retrieval.shipped_models import minilm_path
        args.tokenizer = str(minilm_path())
    args.folder = args.index = str(args.work / f"docstore-{args.n}")
    args.timing = str(args.work / "phases.jsonl")
    Path(args.timing).unlink(missing_ok=True)
    from retrieval_gpu import (  # the GPU bench's passages and queries
        placeholder_docstore,
        query_texts,
    )
    if not (Path(args.folder) / "docs.offsets.npy").exists():
        placeholder_docstore(Path(args.folder), args.n)
    texts = query_texts(1000)
    rows = []
    for r in range(args.repeats):
        row = {"run": r + 1, "clients": args.clients, "frontends": args.frontends,
               "frontend_tokens": args.frontend_tokens, **run_once(args, texts)}
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
