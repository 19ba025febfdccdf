"""The ONNX Runtime query encoder: the same vectors as torch's, a cached export, clear errors."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")

TEXTS = ["who got the first nobel prize in physics", "a", "when is the next deadpool movie being released",
         "Evan Morris was a lobbyist for Genentech and its parent company Roche in Washington " * 8]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    folder = tmp_path_factory.mktemp("onnx-cache")
    mp.setenv("TOOLORCHESTRA_CACHE", str(folder))
    yield folder
    mp.undo()


@pytest.fixture(scope="module")
def torch_encoder():
    from retrieval.encoders import Encoder
    return Encoder("minilm", device="cpu", max_batch_tokens=64)   # several passes of different widths


def test_onnx_vectors_equal_torch(cache, torch_encoder):
    from retrieval.encoders import Encoder

    onnx = Encoder("minilm", device="cpu", runtime="onnx", max_batch_tokens=64)
    assert onnx.dim == torch_encoder.dim == 384
    for fn in ("encode_queries", "encode_passages"):
        got, want = getattr(onnx, fn)(TEXTS), getattr(torch_encoder, fn)(TEXTS)
        assert got.shape == want.shape == (len(TEXTS), 384)
        np.testing.assert_allclose(got, want, atol=1e-5)
    assert len(list(cache.rglob("model.onnx"))) == 1
    again = Encoder("minilm", device="cpu", runtime="onnx")   # loads the cached export
    assert again._onnx.path == onnx._onnx.path
    np.testing.assert_allclose(again.encode_queries(TEXTS[:1]), want[:1], atol=1e-5)


def test_int8_vectors_stay_close(cache, torch_encoder):
    from retrieval.encoders import Encoder

    int8 = Encoder("minilm", device="cpu", runtime="onnx-int8")
    got, want = int8.encode_queries(TEXTS), torch_encoder.encode_queries(TEXTS)
    cosine = (got * want).sum(1)
    assert cosine.min() > 0.95 and not np.allclose(got, want, atol=1e-4)   # quantised: close, not equal
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_runtime_errors_name_the_choice():
    from retrieval.encoders import Encoder, resolve_runtime

    with pytest.raises(ValueError, match="runtime 'tensorrt' is unknown"):
        Encoder("minilm", device="cpu", runtime="tensorrt")
    with pytest.raises(ValueError, match="runs on the CPU only"):
        Encoder("minilm", device="cuda", runtime="onnx")
    assert resolve_runtime("auto", "cpu") == "onnx"
    assert resolve_runtime("auto", "cuda") == "torch"
    assert resolve_runtime("torch", "cpu") == "torch"
