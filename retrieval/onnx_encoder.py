"""The encoder's forward pass in ONNX Runtime on the CPU: the same model, exported once.

`Encoder(runtime="onnx")` runs the model's forward + pooling + L2 normalisation as one ONNX graph
in ONNX Runtime instead of torch (on this project's 2-core CPU box: 1.3-1.7x less time per
query for all-MiniLM-L6-v2, vectors equal to torch's within 2e-7).  `runtime="onnx-int8"`
additionally quantises the weights of the matrix products to int8 (ONNX Runtime's dynamic
quantisation, per channel): faster on CPUs with int8 dot-product instructions (VNNI/AMX), not on
plain AVX2, and the vectors move (cosine to torch's >= ~0.98), so its recall is measured before use
(docs/benchmarks.md).

The export (torch.onnx, eager attention so that no SDPA fast path is traced in) is cached under
`$TOOLORCHESTRA_CACHE/onnx/` (default `~/.cache/toolorchestra/onnx/`), keyed by the model
folder's config and weight files (name, size, modification time), the pooling, the runtime and
the torch version; a second process loads the cached file in well under a second.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np

from retrieval.pooling import pool

RUNTIMES = ("torch", "onnx", "onnx-int8")


def cache_root() -> Path:
    return Path(os.environ.get("TOOLORCHESTRA_CACHE", Path.home() / ".cache" / "toolorchestra")) / "onnx"


def export_key(model_path: str, pooling: str, runtime: str) -> str:
    import torch  # lazy: heavy (torch)

    folder = Path(model_path)
    files = sorted(p for p in folder.iterdir() if p.suffix in (".json", ".safetensors", ".bin")) if folder.is_dir() else []
    stamp = [(p.name, p.stat().st_size, int(p.stat().st_mtime)) for p in files] or [str(model_path)]
    blob = json.dumps([str(folder.resolve()) if folder.is_dir() else model_path, stamp, pooling, runtime,
                       torch.__version__])
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def export(model_path: str, tokenizer, pooling: str, runtime: str) -> Path:
    """The cached .onnx file for (model, pooling, runtime); exported (and quantised) when missing."""
    if runtime not in RUNTIMES[1:]:
        raise ValueError(f"runtime {runtime!r}: the ONNX runtimes are {RUNTIMES[1:]}")
    out = cache_root() / f"{Path(model_path).name}-{export_key(model_path, pooling, runtime)}" / "model.onnx"
    if out.exists():
        return out
    import torch  # lazy: heavy (torch)
    from transformers import AutoModel  # lazy: heavy (seconds to import)

    names = list(tokenizer.model_input_names)
    model = AutoModel.from_pretrained(model_path, attn_implementation="eager", dtype=torch.float32).eval()

    class Embed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            inputs = dict(zip(names, tensors))
            hidden = self.model(**inputs).last_hidden_state
            return torch.nn.functional.normalize(pool(hidden, inputs["attention_mask"], pooling).float(), dim=-1)

    example = tokenizer(["an example query", "a second, longer example query to pad the first"], padding=True,
                        return_tensors="pt")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        plain = Path(tmp) / "model.onnx"
        axes = {n: {0: "batch", 1: "length"} for n in names}
        with warnings.catch_warnings():   # the legacy exporter's deprecation and tracer notes
            warnings.simplefilter("ignore")
            torch.onnx.export(Embed(), tuple(example[n] for n in names), str(plain), input_names=names,
                              output_names=["embedding"], dynamic_axes={**axes, "embedding": {0: "batch"}},
                              opset_version=17, dynamo=False)
        final = plain
        if runtime == "onnx-int8":
            from onnxruntime.quantization import QuantType, quantize_dynamic  # lazy: heavy; only for the ONNX encoder

            final = Path(tmp) / "model-int8.onnx"
            quantize_dynamic(str(plain), str(final), weight_type=QuantType.QInt8, per_channel=True)
        os.replace(final, out)          # atomic: a concurrent process sees the whole file or none
    return out


class OnnxForward:
    """padded numpy inputs -> [b, dim] float32 L2-normalised vectors, through an ORT session."""

    def __init__(self, model_path: str, tokenizer, pooling: str, runtime: str, threads: int | None = None):
        try:
            import onnxruntime as ort
        except ImportError as e:
            raise ImportError(f"encoder runtime {runtime!r} needs onnxruntime and onnx (pip install onnxruntime onnx); "
                              "or use runtime 'torch'") from e
        self.path = export(model_path, tokenizer, pooling, runtime)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or 0          # 0: ORT's default (all cores)
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]

    def __call__(self, batch: dict) -> np.ndarray:
        return self.session.run(None, {n: np.asarray(batch[n], dtype=np.int64) for n in self.names})[0]
