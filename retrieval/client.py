"""The client the orchestrator's `search` tool calls: HTTP replicas or in-process, one interface.

    client = RetrievalClient()                        # replicas from endpoints.json ($TOOLORCHESTRA_ENDPOINTS)
    client = RetrievalClient(["http://node3:8000"])   # or explicit base URLs
    client = RetrievalClient.in_process("indexes/wiki")   # no HTTP: the embedded default
    client = web_retriever_from_env()                  # Tavily's web search as the corpus (run_gaia.py)

    hits = client.retrieve(["who wrote hamlet"], topk=5)
    hits[0][0] == {"document": {"id": "...", "contents": "..."}, "score": 0.71}
    cost = catalog.search_cost(hits.web_searches, hits.pages)   # web fallback fees, if any

Endpoints file (the LLM gateway's format): {"retrieval": [{"base_url": "http://host:port"}]}.
HTTP mode: per-request timeout, bounded retries with backoff on connection errors, 5xx, 429,
timeouts and 200 replies that are not JSON (tenacity), moving to the next replica and re-reading
the file after a failure.  The retries are sized to ride out a restart of the service: up to
`attempts` (20) tries within `retry_s` (120 s), waits doubling from 0.2 s to 5 s.  A 4xx (bad
request) is not retried: it raises RetrievalError with the server's message.  Proxy variables
of the environment (HTTP_PROXY, ALL_PROXY) are ignored: the URL given is where the call goes.
A reply body over `max_reply_bytes` (64 MiB) is refused from its Content-Length or cut while it
streams in, never held whole (RetrievalReplyTooLarge, not retried: the same query gets the same
reply); 1,000 hits of 5 kB passages are ~5 MB.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
from tenacity import (RetryError, Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay,
                      wait_exponential)

from retrieval.endpoints import GatewayConfigError, pool_for
from retrieval.searcher import Query, QueryError, Searcher
from retrieval.service import RetrievalService
from retrieval.web import web_search_from_env

SERVICE_KEY = "retrieval"
MAX_REPLY_BYTES = 64 * 1024 * 1024


class RetrievalError(RuntimeError):
    """Retrieval failed: a bad request (not retried) or every attempt failed."""


class RetrievalRejected(RetrievalError):
    """The service refused the request itself (HTTP 4xx: an unknown `eid`, a bad filter, a
    too-long query).  The same request cannot succeed on retry, and no choice of the
    orchestrator can fix it: callers end the task with it instead of feeding it back."""


class RetrievalReplyTooLarge(RetrievalError):
    """A reply body over the client's `max_reply_bytes`: refused, not retried."""


class _Transient(Exception):
    """A failure worth retrying on another replica."""


class Retrieved(list):
    """Hits per query (a list of lists of {"document", "score"}) plus the request's web usage."""

    def __init__(self, hits=(), web_searches: int = 0, pages: int = 0):
        super().__init__(hits)
        self.web_searches, self.pages = web_searches, pages


class RetrievalClient:
    """Thread-safe. `retrieve(queries, topk) -> Retrieved`; see the module docstring."""

    def __init__(self, base_urls: list[str] | None = None, *, endpoints_file: str | Path | None = None,
                 timeout_s: float = 30.0, attempts: int = 20, retry_s: float = 120.0,
                 max_reply_bytes: int = MAX_REPLY_BYTES):
        if max_reply_bytes < 1:
            raise ValueError(f"max_reply_bytes={max_reply_bytes}: must be >= 1 (bytes of one reply body)")
        self._service = None
        self._static = list(base_urls or [])
        self._pool = None
        if not self._static:
            path = Path(endpoints_file or os.environ.get("TOOLORCHESTRA_ENDPOINTS", "endpoints.json"))
            self._pool = pool_for(path, [SERVICE_KEY])
        self._cursor = 0
        self.timeout_s, self.attempts, self.retry_s = timeout_s, attempts, retry_s
        self.max_reply_bytes = max_reply_bytes
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s, connect=min(5.0, timeout_s)), trust_env=False)

    @classmethod
    def in_process(cls, index_dir: str | Path, method: str | None = None, eid_file: str | Path | None = None,
                   device: str | None = None, **service_options) -> "RetrievalClient":
        """Load the index into this process: same interface, no server, no HTTP."""
        self = cls.__new__(cls)
        searcher = Searcher(index_dir, method=method, device=device, eid_file=eid_file)
        self._service = RetrievalService(searcher, web_search_from_env(), **service_options)
        return self

    def retrieve(self, queries: list[str], topk: int = 3, *, eid: str | None = None,
                 min_score: float | None = None, min_length: int | None = None) -> Retrieved:
        """Top `topk` hits for each query, best first: `[[{"document", "score"}, ...], ...]`."""
        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings, e.g. retrieve([question], topk=5)")
        if not queries:
            return Retrieved()
        if self._service is not None:
            return self._retrieve_local(queries, topk, eid, min_score, min_length)
        body = {"queries": list(queries), "topk": topk, "return_scores": True}
        body.update({k: v for k, v in (("eid", eid), ("min_score", min_score), ("min_length", min_length)) if v is not None})
        try:
            for attempt in Retrying(stop=stop_after_attempt(self.attempts) | stop_after_delay(self.retry_s),
                                    reraise=False, wait=wait_exponential(multiplier=0.2, max=5.0),
                                    retry=retry_if_exception_type(_Transient)):
                with attempt:
                    data = self._post(body)
        except RetryError as err:
            raise RetrievalError(f"retrieval failed after {err.last_attempt.attempt_number} attempts: "
                                 f"{err.last_attempt.exception()}") from None
        usage = data.get("usage") or {}
        return Retrieved(data["result"], usage.get("web_searches", 0), usage.get("pages", 0))

    def _retrieve_local(self, queries, topk, eid, min_score, min_length) -> Retrieved:
        batch = [Query(q, topk, eid, min_score, min_length or 0) for q in queries]
        try:
            hits, usage = self._service.retrieve(batch)
        except QueryError as err:
            raise RetrievalRejected(str(err)) from None
        return Retrieved(hits, usage["web_searches"], usage["pages"])

    def _next_url(self) -> str:
        if self._pool is not None:
            try:
                return self._pool.next()
            except GatewayConfigError as err:
                raise RetrievalError(f"{err} (for retrieval: `python -m retrieval.server --index DIR "
                                     f"--endpoints-file FILE` registers itself)") from None
        url = self._static[self._cursor % len(self._static)]
        self._cursor += 1
        return url

    def _post(self, body: dict) -> dict:
        url = self._next_url()
        try:
            with self._http.stream("POST", url.rstrip("/") + "/retrieve", json=body) as resp:
                status, kind, raw = resp.status_code, resp.headers.get("content-type", "none"), self._capped_body(url, resp)
        except httpx.HTTPError as err:      # connection refused, timeouts, protocol errors
            self._failed(url)
            raise _Transient(f"{url}: {type(err).__name__}: {err}") from None
        text = raw.decode("utf-8", errors="replace")
        if status >= 500 or status == 429:
            self._failed(url)
            raise _Transient(f"{url}: HTTP {status}: {text[:200]}")
        try:
            data = json.loads(raw)
        except ValueError:   # a proxy's HTML page, a body cut short: another attempt may succeed (a 2xx)
            data = None
        if status >= 400:
            message = (data.get("error") if isinstance(data, dict) else None) or text
            raise RetrievalRejected(f"{url} rejected the request (HTTP {status}): {message[:500]}")
        if data is None:
            self._failed(url)
            raise _Transient(f"{url}: HTTP {status} reply is not JSON (Content-Type {kind}): {text[:80]!r}")
        return data

    def _capped_body(self, url: str, resp: httpx.Response) -> bytes:
        """The reply's body, refused when its Content-Length or the bytes read pass `max_reply_bytes`."""
        cap, declared = self.max_reply_bytes, resp.headers.get("content-length", "").strip()
        if declared.isdigit() and int(declared) > cap:
            raise RetrievalReplyTooLarge(f"{url}: reply declares Content-Length {declared}, over max_reply_bytes "
                                         f"{cap}: ask for fewer hits (topk) or pass a larger max_reply_bytes")
        chunks, size = [], 0
        for chunk in resp.iter_bytes():
            size += len(chunk)
            if size > cap:
                raise RetrievalReplyTooLarge(f"{url}: reply body over max_reply_bytes {cap}, stopped reading at the "
                                             f"cap: ask for fewer hits (topk) or pass a larger max_reply_bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    def _failed(self, url: str) -> None:
        if self._pool is not None:
            self._pool.mark_failed(url)     # re-reads the endpoints file

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
        else:
            self._http.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class WebRetriever:
    """The search tool's retriever when the web is the corpus (run_gaia.py with TAVILY_API_KEY
    set): each query is one Tavily search plus the extraction of its top `topk` pages, the calls
    of the index's web fallback (retrieval/web.py WebSearch.fetch), with the same marked hits and fees (`Retrieved.web_searches`,
    `.pages`, charged by the runtime at tools.json's prices).  The interface is
    RetrievalClient.retrieve's; the index-side filters (`eid`, `min_score`, `min_length`) do not
    apply to the web and are ignored.  Tavily refusing the request (a wrong or missing key, a
    plan or credit limit, a bad request: HTTP 400/401/403/432/433) raises RetrievalRejected,
    which ends the task (no choice of the orchestrator can fix it); other failures (timeouts,
    429 rate limits, 5xx) raise RetrievalError, recorded on the call like any tool failure."""

    def __init__(self, web):   # a retrieval.web.WebSearch
        self.web = web

    def retrieve(self, queries: list[str], topk: int = 3, **_index_filters):
        # lazy: only for web search
        from tavily.errors import BadRequestError, ForbiddenError, InvalidAPIKeyError, MissingAPIKeyError

        if isinstance(queries, str):
            raise TypeError("queries must be a list of strings, e.g. retrieve([question], topk=5)")
        hits, searches, pages = [], 0, 0
        for query in queries:
            try:
                found = self.web.fetch(query, topk, strict=True)
            except (BadRequestError, ForbiddenError, InvalidAPIKeyError, MissingAPIKeyError) as err:
                raise RetrievalRejected(f"Tavily refused the request ({type(err).__name__}): {err}") from None
            except Exception as err:   # noqa: BLE001 -- timeouts, rate limits, server errors
                raise RetrievalError(f"Tavily search failed: {type(err).__name__}: {err}") from None
            hits.append(found.hits)
            searches += found.web_searches
            pages += found.pages
        return Retrieved(hits, searches, pages)

    def close(self) -> None:
        self.web.client.close()


def web_retriever_from_env() -> WebRetriever | None:
    """A WebRetriever when TAVILY_API_KEY is set (TAVILY_API_BASE_URL: another endpoint), else None."""
    web = web_search_from_env()
    return WebRetriever(web) if web is not None else None
