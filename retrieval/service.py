"""The retrieval service without HTTP: a Searcher behind a micro-batcher, plus web fallback.

Both the FastAPI server and the in-process client are thin layers over this class, so
they answer identically. Usage is what the request cost outside the index:
{"web_searches": int, "pages": int} (charge with `Catalog.search_cost`).
"""
from __future__ import annotations

from concurrent.futures import Future

from retrieval.batcher import MicroBatcher
from retrieval.searcher import Query, Searcher
from retrieval.web import WebSearch, add_web_hits


class RetrievalService:
    """Thread-safe: any number of callers, `workers` batch threads (default: 1)."""

    def __init__(self, searcher: Searcher, web: WebSearch | None = None, max_batch: int = 256,
                 max_wait_s: float = 0.0, max_pending: int = 4096, workers: int = 1):
        self.searcher, self.web = searcher, web
        self.batcher = MicroBatcher(searcher.search, max_batch=max_batch, max_wait_s=max_wait_s,
                                    max_pending=max_pending, workers=workers)

    def submit(self, queries: list[Query]) -> Future:
        """Validate (QueryError) and queue; the Future gives hits per query (index only)."""
        for q in queries:
            self.searcher.check(q)
        return self.batcher.submit(queries)

    def finish(self, queries: list[Query], hits: list[list[dict]]) -> tuple[list[list[dict]], dict]:
        """Add web hits where too few index hits survived (blocking network I/O when `web`)."""
        return web_finish(self.web, queries, hits)

    def retrieve(self, queries: list[Query], timeout_s: float | None = None) -> tuple[list[list[dict]], dict]:
        """Blocking call: (hits per query, usage)."""
        hits = self.submit(queries).result(timeout=timeout_s)
        return self.finish(queries, hits)

    def health(self) -> dict:
        meta = self.searcher.meta
        return {"status": "ok", "method": self.searcher.method, "index": meta.get("index"),
                "documents": len(self.searcher.store), "backend": getattr(self.searcher.index, "backend", None),
                "encoder": meta.get("encoder") if self.searcher.encoder else None,
                "eid_whitelists": len(self.searcher.whitelists or {}), "web_fallback": self.web is not None,
                "batches": self.batcher.batches, "pretokenized": getattr(self.searcher, "pretokenized", 0)}

    def close(self) -> None:
        self.batcher.close()


def web_finish(web: WebSearch | None, queries: list[Query], hits: list[list[dict]]) -> tuple[list[list[dict]], dict]:
    """`hits` with web hits added where too few index hits survived, and the request's usage."""
    searches, pages = add_web_hits(web, [q.text for q in queries], [q.topk for q in queries], hits)
    return hits, {"web_searches": searches, "pages": pages}
