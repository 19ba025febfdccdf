"""Kind `search`: the alias's expert writes a query, the retriever returns documents."""
from __future__ import annotations

from typing import Literal

from orchestrator.context import Document
from orchestrator.extract import extract_query, split_query
from orchestrator.tools.registry import AliasKind, register
from orchestrator.tools.spec import AliasToolSpec

# Search fee per local search (settings `costs.search_fee`): "web" charges what a web search with its
# page extractions costs (upstream's training charge: one search + WEB_PAGES_PER_SEARCH pages);
# "tokens" the query's tokens at the orchestrator's input price; "none" nothing (web fallbacks
# the retriever reports are charged in every mode).
SEARCH_FEES = ("web", "tokens", "none")
WEB_PAGES_PER_SEARCH = 30


class Spec(AliasToolSpec):
    kind: Literal["search"]


@register
class Search(AliasKind):
    name = "search"
    spec = Spec
    qa = True
    needs_retriever = True

    def run(self, runtime, call, state, catalog):
        if runtime.retriever is None:
            raise RuntimeError("no retriever configured: start the retrieval service or pass --index")
        search, retrieval = runtime.qa.search, runtime.qa.retrieval
        reply = runtime._ask_expert(call, runtime.prompts.render(
            "expert_search", question=state.question, context=runtime._context(state, call)), catalog)
        query = extract_query(reply, fallback=state.question) if search.query == "ours" else split_query(reply)
        if len(query) < search.min_query_chars:
            call.output = f"query {query!r} is shorter than {search.min_query_chars} characters: no search"
            return None
        filters = {"eid": state.task_id if retrieval.send_eid else None,
                   "min_score": retrieval.min_score, "min_length": retrieval.min_length}
        result = runtime.retriever.retrieve([query], retrieval.topk,
                                            **{k: v for k, v in filters.items() if v is not None})
        docs = [Document(id=str(h["document"]["id"]), contents=h["document"]["contents"],
                         source=h["document"].get("source", "local")) for h in result[0]]
        # web fallback fees, as the retriever reports them (RetrievalClient's `Retrieved`)
        call.cost += catalog.search_cost(web_searches=getattr(result, "web_searches", 0),
                                         pages=getattr(result, "pages", 0))
        call.cost += search_fee(runtime, query, catalog)
        new = state.add_documents(docs[::-1] if search.doc_order == "reverse" else docs, by=search.dedupe,
                                  merge=search.merge)
        listing = "".join(f"\n[{d.id}{' web' if d.source == 'web' else ''}] {d.contents[:200]}" for d in docs)
        call.output = f"query: {query!r}; {len(docs)} documents ({new} new){listing}"
        return None


def search_fee(runtime, query: str, catalog) -> float:
    fee = runtime.qa.costs.search_fee
    if fee == "web":
        return catalog.search_cost(web_searches=1, pages=WEB_PAGES_PER_SEARCH)
    if fee == "tokens" and catalog.orchestrator_price_model:
        price = catalog.price(catalog.orchestrator_price_model)
        return price.input * runtime.counter.count(query) / 1_000_000
    return 0.0
