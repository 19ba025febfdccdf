"""The torch flat index (the GPU search path without faiss-gpu) gives faiss' flat results.

Run here on the CPU (the same code path as on a GPU, with "cpu" devices): rows equal to faiss
IndexFlatIP over the same float16 shards, scores equal to float32 precision, across chunked
scoring and rows split over several devices.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

faiss = pytest.importorskip("faiss")
pytest.importorskip("torch")

from retrieval.dense import DenseIndex, write_shard  # noqa: E402
from retrieval.torch_flat import GROUP, TorchFlatIndex, candidates, chunk_topk  # noqa: E402


def unit(rng, n, dim):
    x = rng.normal(size=(n, dim)).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)


def shards_of(vectors, size):
    return [vectors[i:i + size] for i in range(0, len(vectors), size)]


def faiss_flat(vectors):
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors.astype(np.float32))
    return index


@pytest.mark.parametrize("devices,max_scores,group", [
    (["cpu"], 1 << 28, GROUP),           # one chunk of 2,000 columns: 31 groups of 64 and a tail of 16
    (["cpu"], 1 << 28, 0),               # plain top-k
    (["cpu"], 2_000, 4),                 # chunks of 220 columns (55 groups of 4), then a last one of 20
    (["cpu", "cpu", "cpu"], 500, GROUP),
])
@pytest.mark.parametrize("k", [1, 10])
def test_same_rows_and_scores_as_faiss_flat(devices, max_scores, group, k):
    rng = np.random.default_rng(0)
    vectors = unit(rng, 2_000, 32)
    # queries near stored rows (as real queries are near their passages) and plain random ones
    queries = np.concatenate([vectors[:5].astype(np.float32) + 0.3 * rng.normal(size=(5, 32)),
                              rng.normal(size=(4, 32))]).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    index = TorchFlatIndex(shards_of(vectors, 300), len(vectors), devices=devices, max_scores=max_scores,
                           group=group)
    scores, rows = index.search(queries, k)
    want_scores, want_rows = faiss_flat(vectors).search(queries, k)
    assert rows.dtype == np.int64 and scores.dtype == np.float32 and rows.shape == (9, k)
    np.testing.assert_array_equal(rows, want_rows)
    np.testing.assert_allclose(scores, want_scores, rtol=0, atol=2e-6)


def test_two_stage_topk_by_hand():
    import torch
    block = torch.tensor([[1, 9, 2, 8, 3, 3, 3, 3, 7, 0, 0, 6, 5],     # groups of 4: maxima 9, 3, 7; tail 5
                          [0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 9]],    # maxima 1, 2, 3; the best is the tail
                         dtype=torch.float32)
    values, cols = chunk_topk(block.T, 2, group=4)   # passages x queries; 3 groups > keep 2: two stages
    assert values.tolist() == [[9, 8], [9, 3]] and cols.tolist() == [[1, 3], [12, 11]]


@pytest.mark.parametrize("group", [2, 4, 7])
def test_two_stage_topk_gives_plain_topk_values_under_ties(group):
    """Scores from a handful of values (many ties) in a non-contiguous [passages, queries] block:
    the same values per query as torch.topk, and the columns returned hold them, each once."""
    import torch
    gen = torch.Generator().manual_seed(group)
    scores = torch.randint(0, 6, (8, 205), generator=gen).half()[:, :203].T      # [203, 8], strides (1, 205)
    assert not scores.is_contiguous()
    block = scores.T                                                             # [queries, passages]
    for keep in (1, 5, 17):
        values, cols = chunk_topk(scores, keep, group)
        assert torch.equal(values, block.topk(keep, dim=1).values)
        assert torch.equal(block.gather(1, cols), values)
        assert all(len(set(row)) == keep for row in cols.tolist())


def test_rows_split_over_devices_keep_their_global_numbers():
    """A shard straddling two devices' ranges lands on both; every row is found as itself."""
    rng = np.random.default_rng(1)
    vectors = unit(rng, 101, 16)
    index = TorchFlatIndex(shards_of(vectors, 40), 101, devices=["cpu", "cpu"])
    assert [len(p) for p in index.parts] == [51, 50] and index.starts == [0, 51]
    _, rows = index.search(vectors.astype(np.float32), 1)
    np.testing.assert_array_equal(rows[:, 0], np.arange(101))


def test_k_beyond_the_index_is_capped_and_candidates_keep_a_margin():
    vectors = unit(np.random.default_rng(2), 7, 8)
    scores, rows = TorchFlatIndex([vectors], 7, devices=["cpu"]).search(vectors[:2].astype(np.float32), 50)
    assert rows.shape == (2, 7) and sorted(rows[0]) == list(range(7))
    assert np.all(np.diff(scores, axis=1) <= 0)
    assert candidates(1) == 17 and candidates(10) == 26 and candidates(40) == 80


def test_shards_shorter_than_the_meta_say_are_refused():
    vectors = unit(np.random.default_rng(3), 10, 8)
    with pytest.raises(ValueError, match="shards hold 10 vectors, the index meta says 12"):
        TorchFlatIndex([vectors], 12, devices=["cpu"])


def _folder(tmp_path, kind="flat"):
    vectors = unit(np.random.default_rng(4), 50, 8)
    for i, shard in enumerate(shards_of(vectors, 20)):
        write_shard(tmp_path, i, shard)
    meta = {"n_docs": 50, "shard_size": 20, "index": kind, "dim": 8}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    return meta


def test_unknown_gpu_search_is_refused_naming_the_flag(tmp_path):
    with pytest.raises(ValueError, match=r"--gpu-search 'cupy' is unknown"):
        DenseIndex(tmp_path, _folder(tmp_path), device="cpu", gpu_search="cupy")


def test_torch_search_of_an_hnsw_index_is_refused_before_touching_a_gpu(tmp_path):
    with pytest.raises(ValueError, match="--gpu-search torch serves flat indexes only"):
        DenseIndex(tmp_path, _folder(tmp_path, "hnsw"), device="cuda", gpu_search="torch")


def test_dense_index_serves_a_flat_folder_without_its_faiss_file_through_torch(tmp_path):
    """--gpu-search torch needs only the shards (a 21M x 768 dense.faiss would be 64 GB more)."""
    meta = _folder(tmp_path)
    assert not (tmp_path / "dense.faiss").exists()
    index = DenseIndex(tmp_path, meta, device="cpu", gpu_search="torch")
    assert index.backend == "torch"
    vectors = index.vectors.get(np.arange(50))
    _, rows = index.search(vectors[[3, 41]], 2)
    assert rows[:, 0].tolist() == [3, 41]
