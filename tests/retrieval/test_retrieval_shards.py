"""Sharded dense retrieval: split an index into row-range shards, serve each, merge behind a router."""
from __future__ import annotations

import json
import zlib
from contextlib import contextmanager

import numpy as np
import pytest

from _retrieval_world import live
from retrieval.searcher import Query, Searcher
from retrieval.shards import ShardedService, merge_hits, split_index

DIM, N = 16, 300


class HashEncoder:
    """Deterministic unit vectors per text (no model): the same query vector in every process."""

    dim, device = DIM, "cpu"

    def encode_queries(self, texts):
        out = np.stack([np.random.default_rng(zlib.crc32(t.encode())).normal(size=DIM) for t in texts])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def full_index(tmp_path_factory):
    from retrieval.dense import build_faiss, write_shard
    from retrieval.docstore import write_docstore

    folder = tmp_path_factory.mktemp("sharding") / "full"
    folder.mkdir()
    corpus = folder.parent / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": f"d{i}", "contents": f"passage {i} " + "x" * (i % 7)}) + "\n"
                              for i in range(N)))
    write_docstore(corpus, folder, progress=False)
    x = np.random.default_rng(0).normal(size=(N, DIM))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for i, start in enumerate(range(0, N, 64)):      # embedding shards of 64: the split crosses them
        write_shard(folder, i, x[start:start + 64])
    build_faiss(folder, N, DIM, 64, "flat", progress=False)
    (folder / "meta.json").write_text(json.dumps({"n_docs": N, "shard_size": 64, "index": "flat", "dim": DIM,
                                                  "bm25": False, "encoder": "hash", "profile": "minilm"}))
    return folder


@pytest.fixture(scope="module")
def two_shards(full_index):
    return split_index(full_index, full_index.parent / "split", 2)


QUERIES = [f"question number {i}" for i in range(12)]


def ids_and_scores(rows):
    return [[(h["document"]["id"], round(h["score"], 5)) for h in row] for row in rows]


def test_split_keeps_every_document_once_in_row_order(two_shards):
    metas = [json.loads((f / "meta.json").read_text()) for f in two_shards]
    assert [m["shard"]["rows"] for m in metas] == [[0, 150], [150, 300]]
    assert [m["n_docs"] for m in metas] == [150, 150]
    from retrieval.docstore import DocStore
    ids = [DocStore(f).id(r) for f in two_shards for r in range(150)]
    assert ids == [f"d{i}" for i in range(N)]


def test_merged_shard_hits_equal_the_unsharded_index(full_index, two_shards):
    queries = [Query(q, topk=7) for q in QUERIES]
    want = Searcher(full_index, encoder=HashEncoder()).search(queries)
    parts = [Searcher(f, encoder=HashEncoder()).search(queries) for f in two_shards]
    got = merge_hits(parts, 7)
    assert ids_and_scores(got) == ids_and_scores(want)
    # both shards contribute (else the test would not exercise the merge)
    assert {int(h["document"]["id"][1:]) < 150 for row in got for h in row} == {True, False}


def test_merge_hits_orders_by_score_across_shards():
    a = [[{"document": {"id": "a1"}, "score": 0.9}, {"document": {"id": "a2"}, "score": 0.3}]]
    b = [[{"document": {"id": "b1"}, "score": 0.5}, {"document": {"id": "b2"}, "score": 0.4}]]
    assert [h["document"]["id"] for h in merge_hits([a, b], 3)[0]] == ["a1", "b1", "b2"]


def test_split_refuses_more_shards_than_documents(full_index, tmp_path):
    with pytest.raises(ValueError, match="--shards 301"):
        split_index(full_index, tmp_path / "x", 301)
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        split_index(tmp_path, tmp_path / "y", 2)


@contextmanager
def shard_server(folder):
    from retrieval.server import create_app
    from retrieval.service import RetrievalService
    with live(create_app(RetrievalService(Searcher(folder, encoder=HashEncoder())))) as url:
        yield url


def test_router_over_two_shard_servers_answers_like_the_full_index(full_index, two_shards):
    from fastapi.testclient import TestClient

    from retrieval.server import create_app
    from _retrieval_world import dead_url

    want = Searcher(full_index, encoder=HashEncoder()).search([Query(q, topk=5) for q in QUERIES])
    with shard_server(two_shards[0]) as url0, shard_server(two_shards[1]) as url1:
        service = ShardedService([[dead_url(), url0], [url1]])     # shard 0's first replica is down
        with TestClient(create_app(service)) as client:
            r = client.post("/retrieve", json={"queries": QUERIES, "topk": 5, "return_scores": True})
            assert r.status_code == 200, r.text
            assert ids_and_scores(r.json()["result"]) == ids_and_scores(want)
            health = client.get("/health").json()
            assert health["sharded"] == 2 and health["documents"] == N
            assert health["status"] == "ok"        # every shard has a live replica
            assert health["shards"][0][0]["status"].startswith("unreachable")


def test_router_needs_a_url_per_shard():
    with pytest.raises(ValueError, match="--shard"):
        ShardedService([["http://a:1"], []])
