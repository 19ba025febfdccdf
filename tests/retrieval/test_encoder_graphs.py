"""Bucketed query shapes for the CUDA-graph encoder (retrieval/encoder_graphs.py).

The graphs themselves need a GPU; everything around them runs here: the buckets, the padding,
and the bucketed forward (run eagerly on the CPU, as it would be replayed on cuda) giving the
vectors of today's unbucketed encoder.
"""
from __future__ import annotations

import numpy as np
import pytest

from retrieval.encoder_graphs import bucket_of, buckets, pad_to_bucket
from retrieval.encoders import Encoder

pytestmark = pytest.mark.usefixtures("one_cpu_thread")   # conftest.py


def test_buckets_by_hand():
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert buckets(512, 16) == [16, 32, 64, 128, 256, 512]
    assert buckets(100, 16) == [16, 32, 64, 100] and buckets(8, 16) == [8]
    assert [bucket_of(n, buckets(512, 16)) for n in (1, 16, 17, 64, 65, 512)] == [16, 16, 32, 64, 128, 512]
    with pytest.raises(ValueError, match="513 is beyond the largest bucket 512"):
        bucket_of(513, buckets(512, 16))


def test_padding_to_a_bucket_by_hand():
    rows = {"input_ids": [[101, 7, 102], [101, 102]], "token_type_ids": [[0, 0, 0], [0, 0]],
            "attention_mask": [[1, 1, 1], [1, 1]]}
    right = pad_to_bucket(rows, batch=4, length=4, pad_id=9)
    assert right["input_ids"].tolist() == [[101, 7, 102, 9], [101, 102, 9, 9], [9, 9, 9, 9], [9, 9, 9, 9]]
    assert right["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 0, 0, 0]]
    assert right["token_type_ids"].tolist() == [[0] * 4] * 4 and right["input_ids"].dtype == np.int64
    left = pad_to_bucket(rows, batch=3, length=4, pad_id=9, left=True)
    assert left["input_ids"].tolist() == [[9, 101, 7, 102], [9, 9, 101, 102], [9, 9, 9, 9]]
    assert left["attention_mask"].tolist() == [[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]]


TEXTS = ["what is the capital of Japan", "jazz", "who created the Python programming language and in which year",
         "highest mountain above sea level in the Himalayas, on the border of Nepal and China " * 3, "Seine"]


def test_bucketed_queries_give_todays_vectors():
    plain = Encoder()
    bucketed = Encoder(query_graphs=True, batch_size=4)      # passes of <= 4 queries: batch buckets 1, 2, 4
    assert bucketed._bucketed is not None and not bucketed._bucketed.graphs   # eager on the CPU
    assert bucketed._lengths == [16, 32, 64, 128, 256] and bucketed._batches == [1, 2, 4]
    texts = TEXTS * 3                                         # 15 queries: passes of 4, 4, 4, 3 (bucket 4)
    want, got = plain.encode_queries(texts), bucketed.encode_queries(texts)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-6)
    np.testing.assert_allclose(bucketed.encode_queries(TEXTS[:1]), want[:1], rtol=0, atol=2e-6)   # batch 1
    passages = ["Tokyo is the capital of Japan.", "Jazz is a music genre."]
    assert np.array_equal(bucketed.encode_passages(passages), plain.encode_passages(passages))    # untouched
