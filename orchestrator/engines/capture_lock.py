"""One lock between CUDA-graph capture and the policy update when both run in one process.

An asynchronous run (`algorithm.max_staleness > 0`) with an in-process engine decodes in a
rollout thread while the trainer's thread updates the policy.  A CUDA-graph capture in the
rollout thread (the static decoder meets a new batch shape) fails if the other thread
synchronizes the whole device meanwhile: Inductor's autotuner calls `torch.cuda.synchronize()`
the first time a compiled kernel runs with new sizes, and a device-wide synchronize waits on
the capturing stream, which CUDA refuses (`cudaErrorStreamCaptureUnsupported` in the updating
thread, `cudaErrorStreamCaptureInvalidated` in the capturing one: measured on an H200, see
docs/history.md, "Staleness 2 first crashed").  `capture_error_mode="thread_local"` does not cover that case, so the two
are serialised: a capture waits for a running update to end and an update for a running
capture, which is rare after the first batches (one capture per new shape bucket).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager

CAPTURE_LOCK = threading.Lock()


@contextmanager
def exclusive_of_capture(enabled: bool = True):
    """Hold CAPTURE_LOCK for the block (nothing when `enabled` is false)."""
    if not enabled:
        yield
        return
    with CAPTURE_LOCK:
        yield
