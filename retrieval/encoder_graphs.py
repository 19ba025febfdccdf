"""The query encoder's forward over bucketed shapes, replayed as CUDA graphs on a GPU.

An e5-base-shape encoder spends ~15 ms of Python dispatch (12 BERT layers, ~130 kernel launches)
on a 256-query batch whose GPU time is 3.5 ms (docs/benchmarks.md). Captured once per shape, a
CUDA graph replays all those kernels in one launch. Shapes must be static, so each forward pass
is padded up to a bucket: batch to the next power of two (up to the encoder's batch size), length
to the next of 16, 32, 64, ... (up to its max_length). Padded columns are masked, as the
tokenizer's own padding is; filler rows attend to one pad token and are dropped. The vectors are
those of the unbucketed forward up to float rounding (tests/retrieval/test_encoder_graphs.py
checks that on the CPU, where the same bucketed forward runs eagerly).

Graphs are captured on first use of a shape (`warm` captures the short ones up front) and share
one memory pool: they run one at a time, under a lock. A shape whose capture fails runs eagerly
(logged once), so a model that cannot be captured still answers as before.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np

log = logging.getLogger(__name__)
MIN_LENGTH = 16
WARM_MAX_LENGTH = 64            # lengths up to this are captured at start (questions: ~8-40 tokens)


def buckets(limit: int, start: int = 1) -> list[int]:
    """start, 2 start, 4 start, ... below `limit`, then `limit` itself."""
    out, n = [], start
    while n < limit:
        out.append(n)
        n *= 2
    return out + [limit]


def bucket_of(n: int, sizes: list[int]) -> int:
    """The smallest of `sizes` (ascending) holding n."""
    for size in sizes:
        if n <= size:
            return size
    raise ValueError(f"{n} is beyond the largest bucket {sizes[-1]}")


def pad_to_bucket(rows: dict[str, list[list[int]]], batch: int, length: int, pad_id: int,
                  left: bool = False) -> dict[str, np.ndarray]:
    """Tokenizer output (unpadded lists per key) -> int64 [batch, length] arrays per key.
    Real rows keep their tokens (right-padded, or left-padded when `left`, as the tokenizer
    pads); padding is `pad_id` in input_ids, 0 elsewhere, masked out in attention_mask. Filler
    rows (from len(rows) to `batch`) are one attended pad token."""
    n = len(rows["input_ids"])
    out = {key: np.full((batch, length), pad_id if key == "input_ids" else 0, dtype=np.int64) for key in rows}
    mask = out.setdefault("attention_mask", np.zeros((batch, length), dtype=np.int64))
    for r in range(n):
        m = len(rows["input_ids"][r])
        span = slice(length - m, length) if left else slice(0, m)
        for key, values in rows.items():
            if key != "attention_mask":
                out[key][r, span] = values[r]
        mask[r, span] = 1
    mask[n:, -1 if left else 0] = 1
    return out


class BucketedForward:
    """`run(arrays) -> [batch, dim] float32` for arrays of a bucket shape: a CUDA graph replay per
    shape when `graphs` (cuda), else `forward` itself (the CPU; a failed capture)."""

    def __init__(self, forward: Callable[[dict], object], device: str, graphs: bool, keys: tuple[str, ...]):
        self.forward, self.device, self.graphs = forward, device, graphs
        self.keys = tuple(dict.fromkeys(("input_ids", "attention_mask", *keys)))   # the tokenizer's inputs
        self._captured: dict[tuple[int, int], tuple | None] = {}   # None: this shape runs eagerly
        self._lock = threading.Lock()
        self._pool = None

    def run(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        import torch  # lazy: heavy (torch)

        shape = arrays["input_ids"].shape
        with self._lock, torch.inference_mode():
            entry = self._capture(shape) if self.graphs and shape not in self._captured else self._captured.get(shape)
            if entry is None:
                batch = {k: torch.from_numpy(v).to(self.device) for k, v in arrays.items()}
                return self.forward(batch).float().cpu().numpy()
            graph, inputs, output = entry
            for key, tensor in inputs.items():
                tensor.copy_(torch.from_numpy(arrays[key]))
            graph.replay()
            return output.float().cpu().numpy()

    def _capture(self, shape: tuple[int, int]):
        """Capture the forward for `shape` (warm-up on a side stream first, as torch.cuda.graph asks)."""
        import torch  # lazy: heavy (torch)

        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            inputs = {k: torch.zeros(shape, dtype=torch.int64, device=self.device) for k in self.keys}
            inputs["attention_mask"][:, 0] = 1
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    self.forward(inputs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool):
                output = self.forward(inputs)
            entry = (graph, inputs, output)
        except Exception as err:        # noqa: BLE001 -- any capture failure: eager for this shape
            log.warning("CUDA graph capture failed for encoder shape %s (%s: %s); it runs eagerly",
                        shape, type(err).__name__, err)
            entry = None
        self._captured[shape] = entry
        return entry

    def warm(self, batches: list[int], lengths: list[int]) -> int:
        """Capture every (batch, length) pair now; returns how many shapes are graphs."""
        import torch  # lazy: heavy (torch)

        if not self.graphs:
            return 0
        with self._lock, torch.inference_mode():
            for b in batches:
                for length in lengths:
                    if (b, length) not in self._captured:
                        self._capture((b, length))
        return sum(entry is not None for entry in self._captured.values())
