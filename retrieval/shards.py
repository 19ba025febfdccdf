"""A dense index split into row-range shards, each served by its own server, behind one router.

    python -m retrieval.shards split --index indexes/wiki --shards 4 --out indexes/wiki-4
    python -m retrieval.server --index indexes/wiki-4/shard-0 --port 8101      # one per shard (or replica)
    python -m retrieval.shards route --shard http://a:8101,http://a2:8101 --shard http://b:8102 ... --port 8000

`split` cuts a built dense index (retrieval.build_index) into S standalone index folders of
consecutive rows: each has its own docstore (document ids kept), its embedding shards and its
FAISS index of the same kind, so any `retrieval.server` serves it unchanged.  `route` serves
the same /retrieve contract (retrieval/server.py's app: limits, 422/413/503) over the shards:
each micro-batch of queries goes to every shard at once (one replica per shard, the next one on
failure, as `RetrievalClient` does), and each query's hits are merged by score, best first.
Scores are comparable across shards (same encoder, cosine), so with flat shards the merged
top-k is exactly the unsharded index's; per-request filters (min_score, min_length, eid
whitelists given to every shard server) apply on each shard before the merge.
docs/scaling.md has the layout for Wikipedia (21M x 768).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import httpx

from orchestrator.ports import check_port  # the base layer below retrieval (tests/test_imports.py LAYERS)
from retrieval.client import RetrievalClient
from retrieval.dense import ShardVectors, build_faiss, write_shard
from retrieval.docstore import DocStore, write_docstore
from retrieval.searcher import META_FILE, Query


def split_index(index: str | Path, out: str | Path, shards: int, progress: bool = False) -> list[Path]:
    """Write `shards` index folders (out/shard-0 ...) of consecutive rows of `index`; returns them."""
    index, out = Path(index), Path(out)
    meta_path = index / META_FILE
    if not meta_path.exists():
        raise FileNotFoundError(f"--index {index}: no {META_FILE}; build it with `python -m retrieval.build_index`")
    meta = json.loads(meta_path.read_text())
    if not meta.get("index"):
        raise ValueError(f"--index {index}: has no dense index (built with --index none); split needs one")
    n = int(meta["n_docs"])
    if not 1 <= shards <= n:
        raise ValueError(f"--shards {shards}: choose between 1 and the index's {n} documents")
    store, size = DocStore(index), int(meta["shard_size"])
    vectors = ShardVectors(index, n, size)
    per = math.ceil(n / shards)
    folders = []
    for s in range(shards):
        lo, hi = s * per, min(n, (s + 1) * per)
        folder = out / f"shard-{s}"
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", suffix=".jsonl", dir=out, delete=False) as f:
            for row in range(lo, hi):
                f.write(json.dumps(store.get(row)) + "\n")
        write_docstore(f.name, folder, progress=progress)
        Path(f.name).unlink()
        for i, start in enumerate(range(lo, hi, size)):
            write_shard(folder, i, vectors.get(range(start, min(hi, start + size))))
        build_faiss(folder, hi - lo, int(meta["dim"]), size, meta["index"], progress=progress)
        shard_meta = {**meta, "n_docs": hi - lo, "bm25": False, "shard": {"index": s, "of": shards, "rows": [lo, hi],
                                                                         "source": str(index.resolve())}}
        (folder / META_FILE).write_text(json.dumps(shard_meta, indent=1))
        folders.append(folder)
    return folders


def merge_hits(per_shard: list[list[list[dict]]], topk: int) -> list[list[dict]]:
    """[shard][query][hit] -> [query][hit]: each query's hits from every shard, best score first, top `topk`."""
    merged = []
    for q in range(len(per_shard[0]) if per_shard else 0):
        hits = [h for shard in per_shard for h in shard[q]]
        merged.append(sorted(hits, key=lambda h: -h["score"])[:topk])
    return merged



class ShardedService:
    """The RetrievalService interface (submit / finish / health / close) over shard servers.

    `shards`: per shard, the base URLs of its replicas.  Each `submit` fans the queries out to
    every shard in parallel (a `RetrievalClient` per shard: timeouts, retries, next replica),
    and the Future gives the merged hits."""

    web = None      # no web fallback at the router: the shard servers' indexes are the corpus

    def __init__(self, shards: list[list[str]], timeout_s: float = 30.0, threads: int = 64):
        if not shards or any(not urls for urls in shards):
            raise ValueError("--shard: give each shard at least one base URL (--shard URL[,REPLICA...] per shard)")
        self.urls = shards
        self.clients = [RetrievalClient(urls, timeout_s=timeout_s) for urls in shards]
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="shard")
        self.batches = 0

    def submit(self, queries: list[Query]) -> Future:
        q = queries[0]
        texts = [x.text for x in queries]
        calls = [self.pool.submit(c.retrieve, texts, q.topk, eid=q.eid, min_score=q.min_score,
                                  min_length=q.min_length or None) for c in self.clients]
        done: Future = Future()
        self.batches += 1

        def gather(_):
            if done.done() or not all(c.done() for c in calls):
                return
            try:
                done.set_result(merge_hits([list(c.result()) for c in calls], q.topk))
            except Exception as err:   # noqa: BLE001 - the request answers with the shard's error
                done.set_exception(err)
        for c in calls:
            c.add_done_callback(gather)
        return done

    def finish(self, queries, hits):
        return hits, {"web_searches": 0, "pages": 0}

    def health(self) -> dict:
        shards = []
        for urls in self.urls:
            replicas = []
            for url in urls:
                try:
                    replicas.append({"url": url, **httpx.get(url.rstrip("/") + "/health", timeout=5).json()})
                except (httpx.HTTPError, ValueError) as err:
                    replicas.append({"url": url, "status": f"unreachable: {type(err).__name__}"})
            shards.append(replicas)
        ok = all(any(r.get("status") == "ok" for r in replicas) for replicas in shards)
        documents = sum(next((r.get("documents", 0) for r in replicas if r.get("status") == "ok"), 0)
                        for replicas in shards)
        return {"status": "ok" if ok else "degraded", "method": "dense", "sharded": len(shards),
                "documents": documents, "batches": self.batches, "shards": shards}

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        for c in self.clients:
            c.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("split", help="cut a built dense index into row-range shard folders")
    s.add_argument("--index", required=True)
    s.add_argument("--shards", type=int, required=True)
    s.add_argument("--out", required=True)
    r = sub.add_parser("route", help="serve /retrieve over shard servers")
    r.add_argument("--shard", action="append", required=True, metavar="URL[,REPLICA...]",
                   help="one per shard: its servers' base URLs, comma-separated")
    r.add_argument("--host", default="127.0.0.1")
    r.add_argument("--port", type=int, default=8000)
    r.add_argument("--timeout", type=float, default=30.0, help="seconds per shard request")
    args = p.parse_args(argv)
    if args.command == "split":
        try:
            folders = split_index(args.index, args.out, args.shards, progress=True)
        except (FileNotFoundError, ValueError) as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        print("\n".join(str(f) for f in folders))
        return 0
    import uvicorn  # lazy: only when serving

    from retrieval.server import Limits, create_app  # lazy: pulls in fastapi, starlette
    try:
        check_port(args.port, "--port", host=args.host, zero_ok=False)
        service = ShardedService([u.split(",") for u in args.shard], timeout_s=args.timeout)
    except ValueError as err:   # PortError too
        print(f"error: {err}", file=sys.stderr)
        return 2
    app = create_app(service, Limits(request_timeout_s=args.timeout + 5))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
