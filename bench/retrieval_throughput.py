"""Retrieval speed and quality, side by side in one run; prints markdown tables for docs/benchmarks.md.

    python bench/retrieval_throughput.py [--work /tmp/retrieval-bench] [--sections server,slow,search,real,bm25,nq]

Sections:
  threads one-query encoder latency with 1 vs 2 torch threads (why servers default to --threads 1).
  encoder the query encoder's runtimes (torch, onnx, onnx-int8: retrieval/onnx_encoder.py), interleaved:
          single-query p50/p99, one batch of 64, and recall@10 of each against torch's top-10 over the
          real corpus (flat) for the 17 NQ questions and 200 title/first-sentence queries.
  server  our micro-batched server vs the Search-R1-style baseline (bench/retrieval_baseline.py),
          both as subprocesses over the same dense flat index: throughput and p50/p99 latency at
          1, 16 and 64 concurrent clients (1 query, top-5), on (a) the shared 1,000-passage corpus
          (the encoder dominates) and (b) 1M placeholder passages with clustered random vectors
          (the flat scan dominates, as on a Wikipedia-scale CPU index).
  slow    our server with --stalled half-sent requests held open (headers promise a body that never
          comes) while --clients-slow clients send normal requests: throughput, p99, how many
          stalled requests were answered 408 and when the last of their connections closed.
  search  FAISS alone on synthetic clustered N x 384 vectors (queries pre-encoded): flat, hnsw and
          ivfpq at default settings: build time, size, single-query p50/p99, batched q/s, recall@10.
  real    recall@10 of hnsw and ivfpq against flat on the real corpus' MiniLM embeddings.
  bm25    in-process latency of BM25 (pyserini) and dense (encoder + flat) per query, single and batched.
  nq      answer-in-top-5 of BM25 and dense on the 17 NQ questions (reported, not tuned to).
The dense index over the shared corpus is built once into --work and reused (the build resumes).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = ROOT.parent / "shared" / "benchmarks" / "corpus"
PY = sys.executable


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB; load average {load} (shared with other workers)"


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


def corpus_docs() -> list[dict]:
    return [json.loads(line) for line in (SHARED / "sample_data.jsonl").read_text().splitlines() if line.strip()]


def first_sentence_query(doc: dict) -> str:
    title, _, body = doc["contents"].partition("\n")
    return f"{title.strip(chr(34))} {re.split(r'(?<=[.!?]) ', body, maxsplit=1)[0][:200]}"


def dense_index(work: Path) -> Path:
    from retrieval.build_index import build
    out = work / "dense-flat"
    if not (out / "meta.json").exists():
        print(f"building the dense index of {SHARED / 'sample_data.jsonl'} into {out} (once) ...", flush=True)
        report = build(SHARED / "sample_data.jsonl", out, shard_size=250, bm25=True)
        print("\n".join(report.lines()), flush=True)
    return out


# ---- server: ours vs baseline --------------------------------------------------------------
def start(cmd: list[str], port: int) -> subprocess.Popen:
    import httpx
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd} exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{cmd} did not answer /health in 300 s")


async def load(url: str, queries: list[str], clients: int, requests: int) -> dict:
    """`clients` concurrent loops send one-query requests until `requests` are done.

    A failed request (connection error, non-200) is counted, not retried.
    """
    latencies, errors, wall = await load_raw(url, queries, clients, requests)
    return {"qps": len(latencies) / wall, "p50_ms": pct(latencies, 50), "p99_ms": pct(latencies, 99), "errors": errors}


async def load_raw(url: str, queries: list[str], clients: int, requests: int) -> tuple[list[float], int, float]:
    """`load`'s measurements: (seconds per answered request, failed requests, wall seconds)."""
    import httpx
    latencies: list[float] = []
    errors = 0
    todo = iter(range(requests))
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=httpx.Limits(max_connections=clients)) as http:
        async def client():
            nonlocal errors
            for i in todo:
                t0 = time.perf_counter()
                try:
                    r = await http.post("/retrieve", json={"queries": [queries[i % len(queries)]], "topk": 5})
                    r.raise_for_status()
                    latencies.append(time.perf_counter() - t0)
                except httpx.HTTPError:
                    errors += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(clients)))
        wall = time.perf_counter() - t0
    return latencies, errors, wall


def synthetic_index(work: Path, n: int, dim: int = 384, shard: int = 50_000) -> Path:
    """An index folder of n placeholder passages whose vectors are clustered random unit vectors.

    Queries are still encoded by MiniLM, so a request costs what it would on a real n-passage
    flat index; only the hits are meaningless.
    """
    from retrieval.dense import build_faiss, write_shard
    from retrieval.docstore import write_docstore
    from retrieval.encoders import resolve_encoder
    out = work / f"synthetic-server-{n}"
    if (out / "meta.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    corpus = out / "corpus.jsonl"
    with corpus.open("w") as f:
        for i in range(n):
            f.write(json.dumps({"id": str(i), "contents": f"placeholder passage number {i}"}) + "\n")
    write_docstore(corpus, out, progress=False)
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(max(1, n // 100), dim)).astype(np.float32)
    for start in range(0, n, shard):
        m = min(shard, n - start)
        x = centres[rng.integers(0, len(centres), m)] + 0.7 * rng.normal(size=(m, dim)).astype(np.float32)
        write_shard(out, start // shard, x / np.linalg.norm(x, axis=1, keepdims=True))
    build_faiss(out, n, dim, shard, "flat", progress=False)
    meta = {"n_docs": n, "shard_size": shard, "index": "flat", "dim": dim, "bm25": False, "encoder": "minilm",
            "encoder_path": resolve_encoder("minilm"), "profile": "minilm", "max_length": 256}
    (out / "meta.json").write_text(json.dumps(meta))
    return out


def bench_server(work: Path, levels: list[int], per_client: int, threads: int, synthetic_n: int,
                 with_torch: bool = False, real: bool = True) -> list[dict]:
    queries = [first_sentence_query(d) for d in random.Random(0).sample(corpus_docs(), 500)]
    rows = []
    scenarios = {"1k real passages (encoder-bound)": dense_index(work)} if real else {}
    if synthetic_n:
        scenarios[f"{synthetic_n // 1000}k flat (index-bound)"] = synthetic_index(work, synthetic_n)
    for scenario, index in scenarios.items():
        common = ["--index", str(index), "--threads", str(threads)]
        systems = {
            "baseline (Search-R1 style, torch encoder)": ([PY, "bench/retrieval_baseline.py", *common, "--port", "8731"],
                                                          8731),
            "ours (micro-batched, onnx encoder)": ([PY, "-m", "retrieval.server", *common, "--port", "8732",
                                                    "--encoder-runtime", "onnx"], 8732),
        }
        if with_torch:       # which part of the gain is the batching, which the runtime
            systems["ours, torch encoder"] = ([PY, "-m", "retrieval.server", *common, "--port", "8733",
                                               "--encoder-runtime", "torch"], 8733)
        procs = {name: start(cmd, port) for name, (cmd, port) in systems.items()}
        try:
            for name, (_, port) in systems.items():      # warm both up (first encoder calls are slow)
                asyncio.run(load(f"http://127.0.0.1:{port}", queries, 4, 16))
            for clients in levels:                       # interleaved, so load drift hits both alike
                requests = max(40, clients * per_client)
                for name, (_, port) in systems.items():
                    stats = asyncio.run(load(f"http://127.0.0.1:{port}", queries, clients, requests))
                    rows.append({"index": scenario, "system": name, "clients": clients, "requests": requests, **stats,
                                 "load": ", ".join(f"{x:.1f}" for x in os.getloadavg())})
                    print(rows[-1], flush=True)
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(30)
    return rows


# ---- slow clients: half-sent requests beside normal load -----------------------------------
def _half_sent(port: int):
    import socket
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(b"POST /retrieve HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n" + b'{"queries"')
    return sock


def _watch_closed(socks: list, opened: float, limit_s: float) -> tuple[list[bytes], list[float]]:
    """What each socket received, and the seconds after `opened` at which the server closed it."""
    import selectors
    sel = selectors.DefaultSelector()
    received = {sock: b"" for sock in socks}
    closed_at = []
    for sock in socks:
        sock.setblocking(False)
        sel.register(sock, selectors.EVENT_READ)
    deadline = time.monotonic() + limit_s
    while sel.get_map() and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=0.1):
            try:
                chunk = key.fileobj.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                received[key.fileobj] += chunk
            else:
                closed_at.append(time.monotonic() - opened)
                sel.unregister(key.fileobj)
    sel.close()
    return [received[sock] for sock in socks], closed_at


def bench_slow(work: Path, stalled: int, clients: int, requests: int, body_timeout: float, threads: int) -> list[dict]:
    queries = [first_sentence_query(d) for d in random.Random(0).sample(corpus_docs(), 500)]
    port = 8733
    url = f"http://127.0.0.1:{port}"
    proc = start([PY, "-m", "retrieval.server", "--index", str(dense_index(work)), "--threads", str(threads),
                  "--port", str(port), "--body-timeout", str(body_timeout)], port)
    rows = []
    try:
        asyncio.run(load(url, queries, 4, 16))           # warm-up
        rows.append({"case": "no stalled clients", "clients": clients, "requests": requests,
                     **asyncio.run(load(url, queries, clients, requests))})
        print(rows[-1], flush=True)
        opened = time.monotonic()
        socks = [_half_sent(port) for _ in range(stalled)]
        with ThreadPoolExecutor(1) as pool:   # watches the stalled sockets while the load runs
            watched = pool.submit(_watch_closed, socks, opened, body_timeout + 120)
            stats = asyncio.run(load(url, queries, clients, requests))
            answers, closed_at = watched.result()
        for sock in socks:
            sock.close()
        answered = sum(a.startswith(b"HTTP/1.1 408 ") for a in answers)
        last_closed = max(closed_at) if len(closed_at) == len(socks) else float("inf")
        rows.append({"case": f"{stalled} half-sent requests held open", "clients": clients, "requests": requests,
                     **stats, "stalled_answered_408": answered, "last_stalled_closed_s": last_closed,
                     "body_timeout_s": body_timeout})
        print(rows[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    return rows


# ---- FAISS alone: flat / hnsw / ivfpq on synthetic vectors ---------------------------------
def clustered(n: int, dim: int, seed: int = 0) -> np.ndarray:
    """Unit vectors around n/100 random centres: clustered like text embeddings, unlike iid noise."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(max(1, n // 100), dim))
    x = centres[rng.integers(0, len(centres), n)] + 0.7 * rng.normal(size=(n, dim))
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def index_kinds(folder: Path, vectors: np.ndarray, queries: np.ndarray, kinds: list[str], shard: int) -> list[dict]:
    from retrieval.dense import INDEX_FILE, DenseIndex, build_faiss, write_shard
    n, dim = vectors.shape
    for i in range(0, n, shard):
        write_shard(folder, i // shard, vectors[i:i + shard])
    exact = None
    rows = []
    for kind in kinds:
        t0 = time.perf_counter()
        build_faiss(folder, n, dim, shard, kind, progress=False)
        build_s = time.perf_counter() - t0
        index = DenseIndex(folder, {"index": kind, "n_docs": n, "shard_size": shard})
        single = []
        for q in queries[:200]:
            t0 = time.perf_counter()
            index.search(q[None], 10)
            single.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        _, found = index.search(queries, 10)
        batched_qps = len(queries) / (time.perf_counter() - t0)
        if kind == "flat":
            exact = found
        recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, exact)])) if exact is not None else None
        rows.append({"kind": kind, "n": n, "build_s": build_s, "index_mib": (folder / INDEX_FILE).stat().st_size / 2**20,
                     "single_p50_ms": pct(single, 50), "single_p99_ms": pct(single, 99),
                     "batched_qps": batched_qps, "recall@10_vs_flat": recall})
        print(rows[-1], flush=True)
    return rows


def bench_search(work: Path, n: int) -> list[dict]:
    folder = work / f"synthetic-{n}"
    shutil.rmtree(folder, ignore_errors=True)
    vectors = clustered(n, 384)
    rng = np.random.default_rng(1)
    # A query = a stored vector moved by noise of norm ~0.3 (documents are unit vectors).
    queries = vectors[rng.choice(n, 1000, replace=False)] + 0.015 * rng.normal(size=(1000, 384)).astype(np.float32)
    queries = (queries / np.linalg.norm(queries, axis=1, keepdims=True)).astype(np.float32)
    return index_kinds(folder, vectors, queries, ["flat", "hnsw", "ivfpq"], 50_000)


def bench_real(work: Path) -> list[dict]:
    from retrieval.encoders import Encoder
    index = dense_index(work)
    meta = json.loads((index / "meta.json").read_text())
    shards = sorted((index / "emb").glob("shard-*.npy"))
    vectors = np.concatenate([np.load(s) for s in shards]).astype(np.float32)
    nq = [json.loads(line)["question"] for line in (SHARED / "nq_test.jsonl").read_text().splitlines() if line.strip()]
    texts = nq + [first_sentence_query(d) for d in random.Random(2).sample(corpus_docs(), 200)]
    queries = Encoder(meta["encoder_path"], max_length=meta["max_length"]).encode_queries(texts)
    folder = work / "real-kinds"
    shutil.rmtree(folder, ignore_errors=True)
    return index_kinds(folder, vectors, queries, ["flat", "hnsw", "ivfpq"], meta["shard_size"])


# ---- in-process latency: BM25 vs dense ------------------------------------------------------
def bench_bm25(work: Path) -> list[dict]:
    from retrieval.searcher import Query, Searcher
    index = dense_index(work)
    queries = [first_sentence_query(d) for d in random.Random(3).sample(corpus_docs(), 128)]
    rows = []
    for method in ("bm25", "dense"):
        searcher = Searcher(index, method=method)
        searcher.search([Query(q, 5) for q in queries[:8]])          # warm-up (JIT, first calls)
        single = []
        for q in queries[:64]:
            t0 = time.perf_counter()
            searcher.search([Query(q, 5)])
            single.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        searcher.search([Query(q, 5) for q in queries[64:128]])
        rows.append({"method": method, "single_p50_ms": pct(single, 50), "single_p99_ms": pct(single, 99),
                     "batch64_qps": 64 / (time.perf_counter() - t0)})
        print(rows[-1], flush=True)
    return rows


def bench_nq(work: Path) -> list[dict]:
    from retrieval.searcher import Query, Searcher
    index = dense_index(work)
    tasks = [json.loads(line) for line in (SHARED / "nq_test.jsonl").read_text().splitlines() if line.strip()]
    docs = corpus_docs()

    def has_answer(text, answers):
        return any(a.lower() in text.lower() for a in answers)
    reachable = sum(any(has_answer(d["contents"], t["golden_answers"]) for d in docs) for t in tasks)
    rows = [{"method": "any passage in the corpus (upper bound)", "hits": reachable, "of": len(tasks)}]
    for method in ("bm25", "dense"):
        found = Searcher(index, method=method).search([Query(t["question"], 5) for t in tasks])
        hits = sum(any(has_answer(h["document"]["contents"], t["golden_answers"]) for h in row)
                   for t, row in zip(tasks, found))
        rows.append({"method": method, "hits": hits, "of": len(tasks)})
    print(rows, flush=True)
    return rows


def bench_encoder(work: Path) -> list[dict]:
    """Each runtime's query latency (interleaved) and recall@10 against torch's top-10 (flat, real corpus)."""
    from retrieval.encoders import Encoder
    index = dense_index(work)
    meta = json.loads((index / "meta.json").read_text())
    passages = np.concatenate([np.load(s) for s in sorted((index / "emb").glob("shard-*.npy"))]).astype(np.float32)
    nq = [json.loads(line)["question"] for line in (SHARED / "nq_test.jsonl").read_text().splitlines() if line.strip()]
    titles = [first_sentence_query(d) for d in random.Random(2).sample(corpus_docs(), 200)]
    timing = [first_sentence_query(d) for d in random.Random(5).sample(corpus_docs(), 128)]
    encoders = {rt: Encoder(meta["encoder_path"], max_length=meta["max_length"], device="cpu", runtime=rt)
                for rt in ("torch", "onnx", "onnx-int8")}
    for enc in encoders.values():
        enc.encode_queries(timing[:8])                                   # warm-up
    single: dict[str, list[float]] = {rt: [] for rt in encoders}
    for q in timing[:64]:
        for rt, enc in encoders.items():
            t0 = time.perf_counter()
            enc.encode_queries([q])
            single[rt].append(time.perf_counter() - t0)
    top = {}
    rows = []
    for rt, enc in encoders.items():
        t0 = time.perf_counter()
        enc.encode_queries(timing[64:128])
        batch_qps = 64 / (time.perf_counter() - t0)
        row = {"runtime": rt, "single_p50_ms": pct(single[rt], 50), "single_p99_ms": pct(single[rt], 99),
               "batch64_qps": batch_qps, "load": ", ".join(f"{x:.1f}" for x in os.getloadavg())}
        for name, texts in (("nq", nq), ("titles", titles)):
            vecs = enc.encode_queries(texts)
            found = np.argsort(-(vecs @ passages.T), axis=1, kind="stable")[:, :10]
            top[rt, name] = (found, vecs)
            want, ref = top["torch", name]
            row[f"recall@10_{name}"] = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(found, want)]))
            row[f"max_abs_diff_{name}"] = float(np.abs(vecs - ref).max())
        rows.append(row)
        print(row, flush=True)
    return rows


def bench_threads() -> list[dict]:
    """One-query encoder latency with 1 vs 2 torch threads, interleaved."""
    import torch

    from retrieval.encoders import Encoder
    encoder = Encoder()
    queries = [first_sentence_query(d) for d in random.Random(4).sample(corpus_docs(), 30)]
    times: dict[int, list[float]] = {1: [], 2: []}
    for q in queries:
        for n in (1, 2):
            torch.set_num_threads(n)
            t0 = time.perf_counter()
            encoder.encode_queries([q])
            times[n].append(time.perf_counter() - t0)
    rows = [{"torch_threads": n, "single_query_p50_ms": pct(t, 50), "p99_ms": pct(t, 99)} for n, t in times.items()]
    print(rows, flush=True)
    return rows


# ---- report ---------------------------------------------------------------------------------
def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        return f"{v:,.2f}" if isinstance(v, float) else str(v)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", type=Path, default=Path("/tmp/retrieval-bench"))
    p.add_argument("--sections", default="threads,server,slow,search,real,bm25,nq")
    p.add_argument("--clients", default="1,16,64")
    p.add_argument("--requests-per-client", type=int, default=5)
    p.add_argument("--stalled", type=int, default=500, help="slow section: half-sent requests held open")
    p.add_argument("--clients-slow", type=int, default=16, help="slow section: normal clients beside them")
    p.add_argument("--body-timeout", type=float, default=10.0, help="slow section: the server's --body-timeout")
    p.add_argument("--synthetic-n", type=int, default=100_000, help="vectors for the search section")
    p.add_argument("--server-synthetic-n", type=int, default=1_000_000,
                   help="passages of the index-bound server scenario (0: skip it)")
    p.add_argument("--threads", type=int, default=1, help="torch/FAISS threads here and in both servers")
    p.add_argument("--server-with-torch", action="store_true",
                   help="server section: also run ours with the torch encoder (what the runtime adds)")
    p.add_argument("--server-real", type=int, default=1, help="server section: 0 skips the 1k real-corpus scenario")
    p.add_argument("--json", type=Path, default=None, help="also write all rows here")
    args = p.parse_args()
    if not SHARED.exists():
        sys.exit(f"{SHARED} not found: the shared benchmark corpus lives in ../shared beside the repository")
    args.work.mkdir(parents=True, exist_ok=True)
    sections = args.sections.split(",")
    started = time.time()
    print(f"machine: {machine()}", flush=True)
    results, out = {}, []
    if "threads" in sections:
        results["threads"] = bench_threads()
        out.append(table(results["threads"], ["torch_threads", "single_query_p50_ms", "p99_ms"]))
    from retrieval.encoders import set_cpu_threads
    set_cpu_threads(args.threads)
    if "encoder" in sections:
        results["encoder"] = bench_encoder(args.work)
        out.append(table(results["encoder"], ["runtime", "single_p50_ms", "single_p99_ms", "batch64_qps",
                                              "recall@10_nq", "recall@10_titles", "max_abs_diff_nq", "load"]))
    if "server" in sections:
        results["server"] = bench_server(args.work, [int(c) for c in args.clients.split(",")],
                                         args.requests_per_client, args.threads, args.server_synthetic_n,
                                         with_torch=args.server_with_torch, real=bool(args.server_real))
        out.append(table(results["server"], ["index", "system", "clients", "requests", "qps", "p50_ms", "p99_ms",
                                             "errors", "load"]))
    if "slow" in sections:
        results["slow"] = bench_slow(args.work, args.stalled, args.clients_slow, max(40, args.clients_slow * 5),
                                     args.body_timeout, args.threads)
        out.append(table(results["slow"], ["case", "clients", "requests", "qps", "p50_ms", "p99_ms", "errors",
                                           "stalled_answered_408", "last_stalled_closed_s"]))
    if "search" in sections:
        results["search"] = bench_search(args.work, args.synthetic_n)
        out.append(table(results["search"], ["kind", "n", "build_s", "index_mib", "single_p50_ms", "single_p99_ms",
                                             "batched_qps", "recall@10_vs_flat"]))
    if "real" in sections:
        results["real"] = bench_real(args.work)
        out.append(table(results["real"], ["kind", "n", "single_p50_ms", "batched_qps", "recall@10_vs_flat"]))
    if "bm25" in sections:
        results["bm25"] = bench_bm25(args.work)
        out.append(table(results["bm25"], ["method", "single_p50_ms", "single_p99_ms", "batch64_qps"]))
    if "nq" in sections:
        results["nq"] = bench_nq(args.work)
        out.append(table(results["nq"], ["method", "hits", "of"]))
    print(f"\nmachine at the end: {machine()}; {time.time() - started:.0f} s in all\n")
    print("\n\n".join(out))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), **results}, indent=2))


if __name__ == "__main__":
    main()
