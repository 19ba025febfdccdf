"""The retrieval service on a GPU at Wikipedia scale: the torch flat index behind the real server.

    python bench/retrieval_gpu.py --n 21000000 --json gpu-retrieval.json   # one H200: ~32 GB of fp16 vectors
    python bench/retrieval_gpu.py --n 20000 --dim 64 --device cpu --layers 1 --requests 40   # a check of the script
    python bench/retrieval_gpu.py --n 200000 --dim 64 --device cpu --layers 1 --sections build,server \
        --frontends 1,2 --levels 1,16,64 --client-procs 2      # the front ends on a CPU box

Sections (all on one synthetic index folder, built once into --work):
  build   N x dim clustered unit vectors (float16 shards, as retrieval.build_index writes them), a docstore of
          N placeholder passages, and an e5-base-shape encoder (BERT, 12 layers x 768, random weights, the
          tokenizer from --tokenizer) saved as a local folder: seconds to write, bytes on disk.
  index   TorchFlatIndex alone (queries pre-encoded): seconds to load the shards onto the GPU, GPU memory,
          p50/p99 of one query, queries/s at batch 16/64/256, and the fraction of the bound reached
          (bound per batch = max(bytes of vectors / bandwidth, 2 x b x N x dim / peak fp16 FLOP/s)), for
          each --topk-groups value (64: the two-stage top-k per chunk, the default; 0: plain torch.topk).
  topk    the index's per-chunk work alone, on random data: for each batch b, the chunk the index uses
          (min(N, 2^28 / b) passages), torch.topk over a [chunk x b] fp16 score block against chunk_topk
          (k = 26, as for a top-10), and the [chunk x dim] x [dim x b] fp16 GEMM that makes the block.
  recall  recall@10 of the server's index against an exact float32 search over the same vectors, on
          --recall-queries queries (half near stored rows, half random).
  encoder the query encoder alone (tokenise, forward, pool) at batch 1/16/64/256, eager and replaying CUDA
          graphs of bucketed shapes (the server's default on cuda), and how far the two sets of vectors differ.
  server  `python -m retrieval.server --device cuda --gpu-search torch --frontends F` as a subprocess, for each
          F in --frontends (1: one process; F > 1: F HTTP processes feeding one batch-worker process):
          seconds until /health answers (encoder + vectors loaded), GPU memory in use, p50/p99 at 1 client,
          queries/s and p50/p99 at 16/64/256 clients (one-query requests, top-5), load spread over
          --client-procs processes.
  cpu     the Search-R1-style baseline's search on this machine's CPUs: faiss IndexFlatIP over the same
          vectors in RAM (float32, as Search-R1 serves a flat index), one request's search of 1 query and
          of a batch of 64; the baseline server can answer no faster than these.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BANDWIDTH = 4.3e12             # bytes/s, H200 measured copy rate (bench/gpu_decode.py)
PEAK_FP16 = 790e12             # FLOP/s, H200 dense bf16/fp16 (the device README's figure)
E5_BASE = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
               "vocab_size": 30522, "max_position_embeddings": 512}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")


def log(message: str) -> None:
    print(f"[retrieval_gpu {time.strftime('%H:%M:%S')}] {message}", flush=True)


def pct(values, q) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q))


# ---- build ---------------------------------------------------------------------------------
def build(work: Path, n: int, dim: int, shard: int, tokenizer: Path, layers: int, device: str) -> dict:
    """The index folder (meta.json last, so a half build is rebuilt); seconds per part."""
    import torch
    from transformers import BertConfig, BertModel

    from retrieval.dense import write_shard
    folder = work / f"synthetic-{n}x{dim}"
    if (folder / "meta.json").exists():
        return {"folder": str(folder), "reused": True}
    folder.mkdir(parents=True, exist_ok=True)
    out = {"folder": str(folder)}
    t0 = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(0)
    centres = torch.randn((max(1, n // 100), dim), generator=gen, device=device)
    for i, start in enumerate(range(0, n, shard)):
        m = min(shard, n - start)
        pick = torch.randint(0, len(centres), (m,), generator=gen, device=device)
        x = centres[pick] + 0.7 * torch.randn((m, dim), generator=gen, device=device)
        write_shard(folder, i, torch.nn.functional.normalize(x, dim=1).half().cpu().numpy())
    out["vectors_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    placeholder_docstore(folder, n)
    out["docstore_s"] = time.perf_counter() - t0
    encoder = folder / "encoder-e5-base-shape"
    torch.manual_seed(0)
    BertModel(BertConfig(**{**E5_BASE, "hidden_size": dim, "num_hidden_layers": layers,
                            "num_attention_heads": max(1, dim // 64), "intermediate_size": 4 * dim})
              ).half().save_pretrained(encoder)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, encoder / name)
    meta = {"n_docs": n, "shard_size": shard, "index": "flat", "dim": dim, "bm25": False,
            "encoder": str(encoder), "encoder_path": str(encoder), "profile": "e5", "max_length": 512,
            "note": "synthetic: no dense.faiss (served by --gpu-search torch from the shards)"}
    (folder / "meta.json").write_text(json.dumps(meta))
    out["disk_gb"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e9
    return out


def placeholder_docstore(folder: Path, n: int) -> None:
    """A docstore (retrieval/docstore.py's files) of n passages "synthetic passage <row>", ids = rows."""
    folder.mkdir(parents=True, exist_ok=True)
    ids = [str(i) for i in range(n)]
    id_len = np.fromiter((len(s) for s in ids), dtype=np.int64, count=n)
    (folder / "ids.bin").write_bytes("".join(ids).encode())
    (folder / "docs.bin").write_bytes("".join("synthetic passage " + s for s in ids).encode())
    del ids
    np.save(folder / "ids.offsets.npy", np.concatenate([[0], np.cumsum(id_len)]))
    np.save(folder / "docs.offsets.npy", np.concatenate([[0], np.cumsum(id_len + len("synthetic passage "))]))


def unit_queries(folder: Path, n: int, count: int, seed: int = 1) -> np.ndarray:
    """Half near stored rows (a stored vector plus noise: real queries sit near their passages), half random."""
    from retrieval.dense import ShardVectors
    meta = json.loads((folder / "meta.json").read_text())
    rng = np.random.default_rng(seed)
    near = ShardVectors(folder, n, meta["shard_size"]).get(rng.choice(n, count // 2, replace=False))
    near = near + 0.5 * rng.normal(size=near.shape) / np.sqrt(near.shape[1])
    q = np.concatenate([near, rng.normal(size=(count - count // 2, near.shape[1]))]).astype(np.float32)
    return q / np.linalg.norm(q, axis=1, keepdims=True)


# ---- index alone -----------------------------------------------------------------------------
def bench_index(folder: Path, n: int, dim: int, device: str, reps: int, groups: list[int]) -> tuple[dict, object]:
    """Per top-k group size (0: plain torch.topk per chunk), the index's time per batch; the
    rows of every setting must equal the first one's (all are exact)."""
    import torch

    from retrieval.dense import ShardVectors
    from retrieval.torch_flat import TorchFlatIndex
    meta = json.loads((folder / "meta.json").read_text())
    t0 = time.perf_counter()
    index = TorchFlatIndex(ShardVectors(folder, n, meta["shard_size"]).shards, n,
                           devices=None if device == "cuda" else [device], progress=True, group=groups[0])
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    out = {"load_s": time.perf_counter() - t0,
           "gpu_gb": torch.cuda.memory_allocated() / 1e9 if device == "cuda" else None}
    log(f"index loaded in {out['load_s']:.1f} s, {out['gpu_gb']} GB on the GPU")
    queries = unit_queries(folder, n, 256)
    rows, first = [], {}
    for group in groups:
        index.group = group
        for b in (1, 16, 64, 256):
            _, got = index.search(queries[:b], 10)            # warm (kernels, allocator)
            same = bool(np.array_equal(got, first.setdefault(b, got)))
            times = []
            for r in range(reps if b == 1 else max(3, reps // 10)):
                t = time.perf_counter()
                index.search(np.roll(queries, r, 0)[:b], 10)
                times.append(time.perf_counter() - t)
            med = statistics.median(times)
            bound = max(n * dim * 2 / BANDWIDTH, 2 * b * n * dim / PEAK_FP16)
            rows.append({"topk_group": group, "batch": b, "p50_ms": pct(times, 50), "p99_ms": pct(times, 99),
                         "qps": b / med, "bound_ms": bound * 1e3, "of_bound": bound / med,
                         "rows_equal_first_setting": same})
            print(rows[-1], flush=True)
    index.group = groups[0]
    out["rows"] = rows
    return out, index


def bench_topk(n: int, dim: int, device: str, reps: int) -> list[dict]:
    """Milliseconds per [chunk x b] score block: the GEMM, torch.topk, chunk_topk (median of reps)."""
    import torch

    from retrieval.torch_flat import GROUP, MAX_SCORES, candidates, chunk_topk
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    keep, rows = candidates(10), []

    def timed(fn) -> float:
        fn()
        sync()
        times = []
        for _ in range(max(3, reps // 10)):
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3

    def chunk_row(b: int, gen) -> dict:
        c = min(n, MAX_SCORES // b) // GROUP * GROUP
        vectors = torch.randn((c, dim), generator=gen, device=device, dtype=torch.float16)
        q = torch.randn((b, dim), generator=gen, device=device, dtype=torch.float16)
        scores = vectors @ q.T                                  # [chunk, b], as the index multiplies
        return {"batch": b, "chunk": c, "gemm_ms": timed(lambda: vectors @ q.T),
                "torch_topk_ms": timed(lambda: scores.T.topk(keep, dim=1)),
                "chunk_topk_ms": timed(lambda: chunk_topk(scores, keep, GROUP)),
                "same_values": bool(torch.equal(scores.T.topk(keep, dim=1).values, chunk_topk(scores, keep, GROUP)[0]))}

    gen = torch.Generator(device=device).manual_seed(0)
    for b in (1, 16, 64, 256):
        rows.append(chunk_row(b, gen))       # its tensors are freed on return
        print(rows[-1], flush=True)
    return rows


def bench_recall(index, folder: Path, n: int, count: int, device: str) -> dict:
    """recall@10 of `index` against float32 scores of every row, computed in chunks."""
    import torch
    queries = unit_queries(folder, n, count, seed=2)
    _, got = index.search(queries, 10)
    q = torch.from_numpy(queries).to(device)
    best_s = torch.full((count, 10), -np.inf, device=device)
    best_r = torch.zeros((count, 10), dtype=torch.int64, device=device)
    for start, part in zip(index.starts, index.parts):
        for c0 in range(0, len(part), 1 << 20):
            s = q.to(part.device) @ part[c0:c0 + (1 << 20)].float().T
            v, i = s.topk(min(10, s.shape[1]), dim=1)
            cat_s, cat_r = torch.cat([best_s, v.to(device)], 1), torch.cat([best_r, (i + start + c0).to(device)], 1)
            best_s, sel = cat_s.topk(10, dim=1)
            best_r = cat_r.gather(1, sel)
    want = best_r.cpu().numpy()
    hits = sum(len(set(g) & set(w)) for g, w in zip(got.tolist(), want.tolist()))
    return {"queries": count, "recall_at_10": hits / (10 * count)}


# ---- encoder alone -------------------------------------------------------------------------
def bench_encoder(folder: Path, device: str, reps: int) -> dict:
    """The query encoder alone (tokenise + forward + pool) per batch size: eager, and replaying
    CUDA graphs of bucketed shapes (as the server does on cuda); the largest difference between
    the two sets of vectors and whether each query's nearest text (by cosine) is the same."""
    import torch

    from retrieval.encoders import Encoder
    meta = json.loads((folder / "meta.json").read_text())
    texts = query_texts(256, seed=3)
    rows, vectors = [], {}
    for mode in ("eager", "graphs"):
        t0 = time.perf_counter()
        enc = Encoder(meta["encoder_path"], profile="e5", device=device, query_graphs=mode == "graphs")
        log(f"encoder ({mode}) ready in {time.perf_counter() - t0:.1f} s")
        for b in (1, 16, 64, 256):
            enc.encode_queries(texts[:b])
            times = []
            for r in range(max(3, reps // (10 if b > 1 else 1))):
                t = time.perf_counter()
                enc.encode_queries(texts[r % 8:][:b] if b < 256 else texts)
                if device == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t)
            rows.append({"mode": mode, "batch": b, "p50_ms": pct(times, 50), "qps": b / statistics.median(times)})
            print(rows[-1], flush=True)
        vectors[mode] = enc.encode_queries(texts)
        del enc
    eager, graphs = vectors["eager"], vectors["graphs"]
    nearest = lambda v: np.argsort(-(v @ v.T) + 2 * np.eye(len(v)), axis=1)[:, 0]
    agreement = {"max_abs_diff": float(np.abs(eager - graphs).max()),
                 "min_cosine": float((eager * graphs).sum(1).min()),
                 "same_nearest_text": float(np.mean(nearest(eager) == nearest(graphs)))}
    print(agreement, flush=True)
    return {"rows": rows, "graphs_vs_eager": agreement}


# ---- server --------------------------------------------------------------------------------
def query_texts(count: int, seed: int = 0) -> list[str]:
    import random
    words = ("population capital river mountain author album film season war treaty company founded "  # noqa: SIM905
             "president university species island language award election bridge museum").split()
    rng = random.Random(seed)
    return [f"what is the {' '.join(rng.choices(words, k=rng.randint(3, 9)))} of item {rng.randint(0, 10**6)}"
            for _ in range(count)]


def _load_proc(args) -> tuple[list[float], int, float]:
    from retrieval_throughput import (
        load_raw,  # one client loop for both retrieval benches
    )
    return asyncio.run(load_raw(*args))


def load(url: str, clients: int, requests: int, procs: int) -> dict:
    """`clients` concurrent one-query loops over `procs` processes (one asyncio client caps near
    a few thousand requests/s, below what the server may answer)."""
    procs = max(1, min(procs, clients))
    texts = query_texts(2000)
    with mp.get_context("spawn").Pool(procs) as pool:
        parts = pool.map(_load_proc, [(url, texts[p::procs], clients // procs + (p < clients % procs),
                                       requests // procs) for p in range(procs)])
    lat = [x for p in parts for x in p[0]]
    return {"clients": clients, "requests": len(lat), "qps": len(lat) / max(p[2] for p in parts),
            "p50_ms": pct(lat, 50), "p99_ms": pct(lat, 99), "errors": sum(p[1] for p in parts)}


def bench_server(folder: Path, port: int, levels: list[int], requests: int, procs: int, device: str,
                 frontends: int = 1, py_spy: Path | None = None) -> dict:
    """The server as a subprocess under load; with `py_spy`, the last level is sampled by py-spy
    (collapsed stacks per thread, `--format raw`; with front ends, the batch worker's process)
    to show where a request's time goes."""
    import signal

    import httpx
    cmd = [sys.executable, "-m", "retrieval.server", "--index", str(folder), "--port", str(port),
           "--device", device, "--gpu-search", "torch", "--threads", "0", "--frontends", str(frontends)]
    t0 = time.perf_counter()
    server_log = folder.parent / f"server-{frontends}.log"
    with server_log.open("wb") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd} exited: {server_log.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        out = {"frontends": frontends, "start_s": time.perf_counter() - t0,
               "health": httpx.get(url + "/health").json(), "rows": []}
        if device == "cuda":
            import torch
            free, total = torch.cuda.mem_get_info()
            out["gpu_used_gb"] = (total - free) / 1e9
        log(f"server with {frontends} front end(s) answered /health after {out['start_s']:.1f} s: {out['health']}")
        load(url, 4, 64, 1)                                                    # warm-up
        load(url, 64, 512, procs)                                              # every batch shape once
        for n, clients in enumerate(levels):
            spy = None
            if py_spy and n == len(levels) - 1:
                pid = out["health"].get("worker_pid", proc.pid)
                spy = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--threads", "--rate", "200",
                                        "--format", "raw", "--output", str(py_spy), "--nonblocking"],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1)
            before = httpx.get(url + "/health").json().get("batches", 0)
            row = load(url, clients, max(requests, clients * 8) if clients > 1 else requests, procs)
            # how full the worker's batches ran under this load (requests of one query each)
            row["batches"] = httpx.get(url + "/health").json().get("batches", 0) - before
            row["mean_batch"] = row["requests"] / row["batches"] if row["batches"] else None
            if spy:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
            out["rows"].append(row)
            print(row, flush=True)
        out["log_tail"] = server_log.read_text(errors="replace")[-2000:]
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---- CPU baseline --------------------------------------------------------------------------
def bench_cpu(folder: Path, n: int, dim: int) -> dict:
    import faiss

    from retrieval.dense import ShardVectors
    meta = json.loads((folder / "meta.json").read_text())
    t0 = time.perf_counter()
    index = faiss.IndexFlatIP(dim)
    for shard in ShardVectors(folder, n, meta["shard_size"]).shards:
        index.add(np.ascontiguousarray(shard, dtype=np.float32))
    out = {"threads": faiss.omp_get_max_threads(), "build_s": time.perf_counter() - t0,
           "ram_gb": n * dim * 4 / 1e9}
    queries = unit_queries(folder, n, 64)
    for label, q, reps in (("1 query", queries[:1], 3), ("batch of 64", queries, 1)):
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            index.search(q, 10)
            times.append(time.perf_counter() - t)
        out[label] = {"s": statistics.median(times), "qps": len(q) / statistics.median(times)}
        print(label, out[label], flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=21_000_000, help="passages (default: Wikipedia's 21M)")
    p.add_argument("--dim", type=int, default=768, help="vector size (default: e5-base's 768)")
    p.add_argument("--shard", type=int, default=1_000_000, help="vectors per shard file")
    p.add_argument("--layers", type=int, default=12, help="encoder layers (e5-base: 12)")
    p.add_argument("--tokenizer", type=Path, help="a BERT uncased tokenizer folder (default: the shipped MiniLM's)")
    p.add_argument("--work", type=Path, default=Path("/tmp/retrieval-gpu"))
    p.add_argument("--device", default="cuda")
    p.add_argument("--sections", default="build,index,recall,topk,encoder,server,cpu")
    p.add_argument("--reps", type=int, default=50, help="single-query repetitions (batches: a tenth)")
    p.add_argument("--recall-queries", type=int, default=200)
    p.add_argument("--levels", default="1,16,64,256", help="server client counts")
    p.add_argument("--frontends", default="1,8", help="server runs: HTTP processes per run (1: one process)")
    p.add_argument("--topk-groups", default="64,0", help="index runs: chunk_topk group sizes (0: plain top-k)")
    p.add_argument("--requests", type=int, default=400, help="requests per level (at least 8 per client)")
    p.add_argument("--client-procs", type=int, default=8)
    p.add_argument("--port", type=int, default=8790)
    p.add_argument("--json", type=Path, help="write every number here")
    p.add_argument("--py-spy", type=Path, help="sample the server under the last level's load into this file "
                                               "(needs py-spy on PATH)")
    args = p.parse_args()
    from orchestrator.ports import PortError, check_port
    try:
        check_port(args.port, "--port", zero_ok=False)
    except PortError as exc:
        raise SystemExit(f"error: {exc}") from None
    import torch
    sections = set(args.sections.split(","))
    if args.tokenizer is None:
        from retrieval.shipped_models import minilm_path
        args.tokenizer = Path(minilm_path())
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    results = {"machine": {"gpu": torch.cuda.get_device_name() if args.device == "cuda" else None,
                           "cpus": os.cpu_count(), "host": platform.node(), "torch": torch.__version__},
               "shape": {"n": args.n, "dim": args.dim, "layers": args.layers}}

    def save():
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    log(f"build {args.n} x {args.dim} into {args.work} (reused when there)")
    results["build"] = build(args.work, args.n, args.dim, args.shard, args.tokenizer, args.layers, args.device)
    print(results["build"], flush=True)
    save()
    folder = Path(results["build"]["folder"])
    if sections & {"index", "recall"}:
        log("index alone")
        results["index"], index = bench_index(folder, args.n, args.dim, args.device, args.reps,
                                              [int(g) for g in args.topk_groups.split(",")])
        save()
        if "recall" in sections:
            log("recall against exact float32 search")
            results["recall"] = bench_recall(index, folder, args.n, args.recall_queries, args.device)
            print(results["recall"], flush=True)
            save()
        del index
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if "topk" in sections:
        log("top-k per score chunk")
        results["topk"] = bench_topk(args.n, args.dim, args.device, args.reps)
        save()
        if args.device == "cuda":
            torch.cuda.empty_cache()
    if "encoder" in sections:
        log("encoder alone")
        results["encoder"] = bench_encoder(folder, args.device, args.reps)
        save()
    if "server" in sections:
        results["server"] = []
        for frontends in (int(f) for f in args.frontends.split(",")):
            log(f"server, {frontends} front end(s)")
            try:
                results["server"].append(bench_server(
                    folder, args.port, [int(x) for x in args.levels.split(",")], args.requests, args.client_procs,
                    args.device, frontends, args.py_spy and args.py_spy.with_stem(f"{args.py_spy.stem}-{frontends}")))
            except Exception as err:   # noqa: BLE001 -- one failed setting must not lose the others
                log(f"server with {frontends} front end(s) failed: {err}")
                results["server"].append({"frontends": frontends, "error": str(err)[-3000:]})
            save()
    if "cpu" in sections:
        log("Search-R1-style baseline on the CPUs")
        results["cpu"] = bench_cpu(folder, args.n, args.dim)
        save()
    log("done" + (f": {args.json}" if args.json else ""))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
