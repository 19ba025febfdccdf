"""Backends behind the gateway, chosen by a registry entry's `backend` field."""
from __future__ import annotations

from orchestrator.gateway.backends.base import Backend, BackendRequest, BackendResult
from orchestrator.gateway.registry import ModelEntry


def make_backend(name: str, entry: ModelEntry) -> Backend:
    """The backend object for registry entry `name` (cheap: clients and models are cached)."""
    if entry.backend in ("openai", "azure", "vllm"):
        from orchestrator.gateway.backends.openai_compat import OpenAICompatBackend
        return OpenAICompatBackend(name, entry)
    if entry.backend == "anthropic":
        from orchestrator.gateway.backends.anthropic_backend import AnthropicBackend
        return AnthropicBackend(name, entry)
    if entry.backend == "transformers":
        from orchestrator.gateway.backends.transformers_backend import TransformersBackend
        return TransformersBackend(name, entry)
    raise AssertionError(f"unhandled backend {entry.backend!r}")   # the registry validates this


__all__ = ["Backend", "BackendRequest", "BackendResult", "make_backend"]
