"""The paper profile's retrieval filters, applied by our real server, keep what upstream's keep.

Upstream's servers take FAISS's top 1,000 and keep, in rank order, the first `topk` documents
with `len(content) > 100` (and, for HLE, `score > 0.1`; in training `score > 0.8`):
retrieval_hle.py:346-358, retrieval_wiki.py:332-345, retrieval_general_thought.py:331-345.
Ours keeps `len >= min_length` and `score >= min_score`, so the profile sends 101. Here the
real server (retrieval/server.py under uvicorn, on a tiny index) answers with each section's
filters, and upstream's rule is run by hand over the server's own unfiltered ranking.
"""
from __future__ import annotations

import pytest
from _retrieval_world import live, write_jsonl

from orchestrator.settings import load_profile
from retrieval.build_index import build
from retrieval.client import RetrievalClient
from retrieval.encoders import Encoder
from retrieval.searcher import FILTER_CANDIDATES, Searcher
from retrieval.server import create_app, server_config
from retrieval.service import RetrievalService

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # conftest.py

# DEEP: 120 short documents outrank every long one, so the long ones lie past the first 100
# candidates. SCORED: the query's own text, then copies with more and more words swapped out:
# scores from ~0.97 down to ~0.1, on both sides of training's 0.8; ledgers: below HLE's 0.1.
DEEP = "volcano lava eruption"
SCORED = ("A travel guide to the volcano island: markets, museums, trains, food, hotels, beaches and the "
          "lava fields at dawn.")
SHORT = 120
SWAPS = ["ledger", "invoice", "tax", "audit", "payroll", "spreadsheet", "budget", "accountant", "receipt",
         "pension", "bank", "loan", "credit", "deposit", "fund", "bond", "stock", "share"]


def corpus() -> list[dict]:
    rows = [{"id": f"short{i}", "contents": f"Volcano lava eruption, report {i}."} for i in range(SHORT)]
    # the length edge: 99, 100, 101 and 102 characters
    edge = "Lava from a volcano eruption flows downhill and cools into new rock; "
    rows += [{"id": f"len{n}", "contents": (edge * 3)[:n]} for n in (99, 100, 101, 102)]
    # long documents, from close to the query (scores above 0.8) to barely related
    rows += [{"id": f"echo{i}", "contents": ("Volcano lava eruption. " * (5 + i))} for i in range(3)]
    rows += [{"id": f"long{i}", "contents": f"Chapter {i} of a travel guide: markets, museums, trains, food and "
              f"hotels; one day trip visits a volcano. " * 2} for i in range(40)]
    words = SCORED.split()
    for k in range(0, 19, 2):
        varied = list(words)
        for j in range(k):
            varied[(j * 7) % len(words)] = SWAPS[j]
        rows.append({"id": f"var{k}", "contents": " ".join(varied) + " Open all year."})
    rows.append({"id": "short-scored", "contents": SCORED[:90]})
    rows += [{"id": f"ledger{i}", "contents": f"Quarterly payroll ledger {i}: invoices, tax audit, pension fund "
              "deposits, bank loan credit and the accountant's receipts, reconciled in the spreadsheet."}
             for i in range(3)]   # long and unrelated: below HLE's 0.1
    assert len(rows) <= 200        # the server's topk cap: one unfiltered request lists the whole ranking
    return rows


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("upstream-filter")
    build(write_jsonl(folder / "corpus.jsonl", corpus()), folder / "index", encoder=Encoder(), progress=False)
    app = create_app(RetrievalService(Searcher(folder / "index")))
    with live(app, server_config(app, "127.0.0.1", 0)) as url:
        yield RetrievalClient([url], attempts=2, retry_s=10)


def upstream_keeps(ranking: list[dict], topk: int, score_above: float | None) -> list[str]:
    """Upstream's loop over its top 1,000 (retrieval_hle.py:356-360), by hand."""
    kept = []
    for hit in ranking[:1000]:
        if len(hit["document"]["contents"]) > 100 and (score_above is None or hit["score"] > score_above):
            kept.append(hit["document"]["id"])
        if len(kept) >= topk:
            break
    return kept


def test_the_corpus_puts_long_documents_deep_and_scores_on_both_sides_of_the_cuts(server):
    [deep] = server.retrieve([DEEP], topk=200)         # unfiltered: the whole corpus, best first
    first_long = next(i for i, h in enumerate(deep) if len(h["document"]["contents"]) > 100)
    assert first_long >= FILTER_CANDIDATES, first_long
    [scored] = server.retrieve([SCORED], topk=200)
    long_scores = [h["score"] for h in scored if h["document"]["id"].startswith("var")]
    assert max(long_scores) > 0.8 > min(long_scores)
    assert max(h["score"] for h in scored if h["document"]["id"].startswith("ledger")) < 0.1
    assert scored[1]["document"]["id"] == "short-scored"   # a short document among the best: filtered out


@pytest.mark.parametrize("query", ["DEEP", "SCORED"])
@pytest.mark.parametrize("use, topk", [("hle", None), ("frames", None), ("train", None),
                                       ("hle", 3), ("frames", 3), ("train", 3), ("hle", 200), ("frames", 200)])
def test_server_side_filters_keep_what_upstreams_strict_filters_keep(server, use, topk, query):
    text = {"DEEP": DEEP, "SCORED": SCORED}[query]
    retrieval = load_profile("paper").section("qa", use).retrieval
    topk = topk or retrieval.topk                       # the profile's: 50, 150, 30
    [ranking] = server.retrieve([text], topk=200)       # unfiltered: the whole corpus, best first
    [ours] = server.retrieve([text], topk=topk, min_score=retrieval.min_score, min_length=retrieval.min_length)
    theirs = upstream_keeps(ranking, topk, {"hle": 0.1, "frames": None, "train": 0.8}[use])
    assert [h["document"]["id"] for h in ours] == theirs
    assert "len100" not in theirs and all(len(h["document"]["contents"]) > 100 for h in ours)
    assert theirs or (use, query) == ("train", "DEEP")  # no long document of DEEP's scores above 0.8
    if (topk, query) == (200, "SCORED"):                # HLE's 0.1 drops the ledgers, FRAMES keeps them
        assert any(i.startswith("ledger") for i in theirs) == (use == "frames")
