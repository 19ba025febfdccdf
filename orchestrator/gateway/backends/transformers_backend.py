"""In-process generation with transformers for a local model folder (or hub id), through the
engine training uses: a trained checkpoint is served with the prompt, sampler and constrained
decoding it was trained with.

- Prompt: `orchestrator.chat_template.prompt_ids`, the renderer `TokenPolicy` uses (the
  tokenizer's chat template; tools written into the system message when the template ignores
  them), no extra special tokens (as vLLM), so `usage.prompt_tokens` matches a vLLM server.
- Generation: `orchestrator.engines.hf.HFEngine` (sampling, top-p, per-row seeds, `choices`
  through its choice trie) behind one `orchestrator.engines.batcher.BatchingEngine` per
  (path, dtype, device), loaded once per process and shared between threads: concurrent calls
  with equal settings run as one batched engine call (on CPU ~3-4x faster than one by one).
- A request with a `seed` runs in an engine call of its own (`seeded_alone`), so a greedy reply
  cannot depend, through padding, on which requests happened to share its batch.
- `timeout` is the request's deadline, time queued included; a reply cut by it is an error.
- A call made under a cancel event (orchestrator/cancellation.py: the server's request whose
  client went away) stops generating at the next token once the event is set; an error.
- `usage.completion_tokens` counts generated ids including the end-of-sequence token when one
  is produced (vLLM counts it too).  temperature == 0 is greedy.  A `stop` string ends the
  reply and, as in vLLM, is not part of its text.
"""
from __future__ import annotations

import threading
import time
from typing import Any

from orchestrator import cancellation
from orchestrator.engines.interface import SamplingParams
from orchestrator.engines.batcher import BatchingEngine
from orchestrator.engines.hf import HFEngine
from orchestrator.gateway.backends.base import BackendRequest, BackendResult
from orchestrator.gateway.registry import ModelEntry
from orchestrator.gateway.retry import AttemptError, remaining
from orchestrator.records import Usage

_engines: dict[tuple[str, str, str], BatchingEngine] = {}
_load_locks: dict[tuple[str, str, str], threading.Lock] = {}
_registry_lock = threading.Lock()
SUPPORTED_EXTRA = ("top_p", "stop", "seed")
MAX_BATCH = 8           # most requests per engine call
GATHER_MS = 50.0        # how long the first request of a batch waits for company (ms)


def load_engine(path: str, dtype: str = "float32", device: str = "cpu") -> BatchingEngine:
    """The batching engine over `path`, loaded on first use and cached (thread-safe)."""
    key = (path, dtype, device)
    with _registry_lock:
        if key in _engines:
            return _engines[key]
        lock = _load_locks.setdefault(key, threading.Lock())
    with lock:    # one loader per key; other threads wait for it instead of loading twice
        if key not in _engines:
            import torch
            engine = HFEngine(path, device=device, dtype=dtype if dtype == "auto" else getattr(torch, dtype))
            with _registry_lock:
                _engines[key] = BatchingEngine(engine, max_batch=MAX_BATCH, max_wait_ms=GATHER_MS,
                                               seeded_alone=True)
    return _engines[key]


def load_model(path: str, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """(tokenizer, model) the gateway serves for `path` (one copy per process)."""
    engine = load_engine(path, dtype, device).engine
    return engine.tokenizer, engine.model


class TransformersBackend:
    def __init__(self, name: str, entry: ModelEntry):
        self.name, self.entry = name, entry
        self.path = entry.resolved_path()
        self.endpoint = f"in-process:{self.path}"
        # Load here, before the gateway starts its clock: latency measures generation only.
        try:
            self.engine = load_engine(self.path, entry.dtype, entry.device)
        except (OSError, ValueError) as exc:
            raise AttemptError(f"cannot load a transformers model from {self.path!r}: {str(exc)[:300]}",
                               endpoint=self.endpoint, retryable=False) from None

    def sampling_params(self, request: BackendRequest) -> SamplingParams:
        """The request as the engine's `SamplingParams` (vLLM semantics: temperature None is 1)."""
        unknown = set(request.extra) - set(SUPPORTED_EXTRA)
        if unknown:
            raise AttemptError(f"{self.name}: backend transformers does not take {sorted(unknown)}; "
                               f"supported extras: {list(SUPPORTED_EXTRA)}", endpoint=self.endpoint, retryable=False)
        stop = request.extra.get("stop") or []
        seed = request.extra.get("seed")
        return SamplingParams(temperature=1.0 if request.temperature is None else request.temperature,
                              top_p=request.extra.get("top_p", 1.0), max_tokens=request.max_tokens,
                              seed=None if seed is None else int(seed),
                              stop=[stop] if isinstance(stop, str) else list(stop), choices=request.choices)

    def attempt(self, request: BackendRequest) -> BackendResult:
        from orchestrator.chat_template import prompt_ids   # the renderer training uses (TokenPolicy)

        prompt = prompt_ids(self.engine.tokenizer, request.messages, request.tools)
        params = self.sampling_params(request)
        try:
            left = remaining()          # the attempt's deadline: timeout_s, cut by what is left of deadline_s
            seconds = request.timeout if left is None else min(request.timeout, max(left, 0.0))
            gen = self.engine.generate([prompt], params, deadline=time.monotonic() + seconds,
                                       cancel=cancellation.current())[0]
        except ValueError as exc:        # the engine names the bad field
            raise AttemptError(f"{self.name}: {exc}", endpoint=self.endpoint, retryable=False) from None
        if gen.finish_reason == "cancelled":
            raise AttemptError(f"cancelled: the caller went away ({len(gen.token_ids)} tokens generated)",
                               endpoint=self.endpoint, retryable=False)
        if gen.finish_reason == "timeout":
            raise AttemptError(f"timed out after {request.timeout:g} s ({len(gen.token_ids)} tokens generated)",
                               endpoint=self.endpoint, retryable=False, timed_out=True)
        text = gen.text
        cuts = [text.index(s) for s in params.stop if s in text]
        if cuts:                        # vLLM semantics: the stop string is not part of the reply
            text = text[:min(cuts)]
        return BackendResult(text=text, usage=Usage(len(prompt), len(gen.token_ids)),
                             endpoint=self.endpoint, finish_reason=gen.finish_reason)
