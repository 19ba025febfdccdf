"""A Search-R1-style retrieval server, the baseline for bench/retrieval_throughput.py.

It does what Search-R1's `retrieval_server.py` (and upstream ToolOrchestra's first
version) does per request: a synchronous FastAPI endpoint, run on Starlette's thread
pool, that encodes the request's queries and searches the index itself: one encoder call
and one FAISS search per request, no batching across requests, no lock. It reuses our
encoder, FAISS index and docstore, so the comparison measures the serving design only
(Search-R1 also reads documents through `datasets`, which is slower than our docstore).

    python bench/retrieval_baseline.py --index DIR --port 8001
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fastapi import FastAPI  # noqa: E402
from pydantic import BaseModel  # noqa: E402

from retrieval.encoders import set_cpu_threads  # noqa: E402
from retrieval.searcher import Searcher  # noqa: E402


class QueryRequest(BaseModel):
    queries: list[str]
    topk: int = 3
    return_scores: bool = False


def create_baseline_app(searcher: Searcher) -> FastAPI:
    app = FastAPI(title="Search-R1-style baseline")

    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict:      # sync: Starlette runs it on a worker thread
        vectors = searcher.encoder.encode_queries(request.queries)
        scores, rows = searcher.index.search(vectors, request.topk)
        result = []
        for score_row, doc_rows in zip(scores, rows):
            docs = [searcher.store.get(int(r)) for r in doc_rows if r >= 0]
            result.append([{"document": d, "score": float(s)} for d, s in zip(docs, score_row)]
                          if request.return_scores else docs)
        return {"result": result}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok"}

    return app


def main() -> None:
    import uvicorn

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--index", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8001)
    p.add_argument("--threads", type=int, default=1, help="torch/FAISS threads, as for our server")
    args = p.parse_args()
    from orchestrator.ports import PortError, check_port
    try:
        check_port(args.port, "--port", host=args.host)
    except PortError as exc:
        raise SystemExit(f"error: {exc}") from None
    set_cpu_threads(args.threads)
    uvicorn.run(create_baseline_app(Searcher(args.index, method="dense")), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
