"""Web-search fallback through Tavily, on only when TAVILY_API_KEY is set.

When fewer than `min_docs` index documents survive a query's filters, the server (or the
in-process client) asks Tavily: one search for the query, then one extract call for the
pages it needs to fill topk. Web hits are marked inside the document, in both response
shapes (with and without scores):

    {"document": {"id": "web:<url>", "contents": "...", "url": "...", "source": "web"}, "score": s}

Each fallback costs 1 web search + n extracted pages; the response reports these counts
(`usage`) so callers charge `Catalog.search_cost(web_searches, pages)`. Prices live in
tools.json only. TAVILY_API_BASE_URL points the client at another endpoint (tests use a
local fake).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

log = logging.getLogger(__name__)
MAX_WEB_CHARS = 4000        # the orchestrator truncates each document to ~4,000 chars anyway


@dataclass
class WebResult:
    hits: list[dict] = field(default_factory=list)
    web_searches: int = 0
    pages: int = 0


class WebSearch:
    """A Tavily client with bounded timeouts; every failure degrades to "no web hits"."""

    def __init__(self, api_key: str, min_docs: int = 3, timeout_s: float = 20.0,
                 base_url: str | None = None):
        from tavily import TavilyClient  # lazy: only for web search

        self.client = TavilyClient(api_key=api_key, api_base_url=base_url)
        self.min_docs, self.timeout_s = min_docs, timeout_s

    def needed(self, n_hits: int, topk: int) -> int:
        """How many web documents to fetch for a query that kept `n_hits` index hits."""
        return 0 if n_hits >= min(self.min_docs, topk) else topk - n_hits

    def fetch(self, query: str, count: int, strict: bool = False) -> WebResult:
        """Search the web for `query` and extract up to `count` pages, best first.  A failure gives
        no web hits, or with `strict` (the web as the only corpus: WebRetriever) is raised."""
        result = WebResult()
        if count <= 0 or not query.strip():
            return result
        try:
            found = self.client.search(query=query[:400], search_depth="advanced",
                                       max_results=count, timeout=self.timeout_s)
            result.web_searches = 1
            ranked = [r for r in found.get("results", []) if r.get("url")][:count]
            if not ranked:
                return result
            result.pages = len(ranked)
            extracted = self.client.extract(urls=[r["url"] for r in ranked], format="text",
                                             timeout=self.timeout_s)
        except Exception as err:   # noqa: BLE001 -- the fallback must never fail the request
            if strict:
                raise
            log.warning("web search fallback failed for %r: %s", query[:80], err)
            return result
        text_of = {e.get("url"): e.get("raw_content") or "" for e in extracted.get("results", [])}
        for r in ranked:
            text = text_of.get(r["url"]) or r.get("content") or ""
            if text.strip():
                doc = {"id": f"web:{r['url']}", "contents": text[:MAX_WEB_CHARS], "url": r["url"], "source": "web"}
                result.hits.append({"document": doc, "score": float(r.get("score") or 0.0)})
        return result


def web_search_from_env(min_docs: int = 3) -> WebSearch | None:
    """A WebSearch when TAVILY_API_KEY is set, else None (no fallback, no network)."""
    key = os.environ.get("TAVILY_API_KEY", "").strip()
    if not key:
        return None
    return WebSearch(key, min_docs=min_docs, base_url=os.environ.get("TAVILY_API_BASE_URL") or None)


def add_web_hits(web: WebSearch | None, texts: list[str], topks: list[int],
                 hits: list[list[dict]]) -> tuple[int, int]:
    """Append web hits in place where a query kept too few; returns (web_searches, pages)."""
    searches = pages = 0
    if web is None:
        return 0, 0
    for text, topk, found in zip(texts, topks, hits):
        need = web.needed(len(found), topk)
        if need:
            extra = web.fetch(text, need)
            found.extend(extra.hits)
            searches += extra.web_searches
            pages += extra.pages
    return searches, pages
