"""The model registry (`configs/models.yaml`): model name -> how to reach it.

    models:
      my-gpt:           {backend: openai, model: MODEL_ID, api_key_env: OPENAI_API_KEY}
      Qwen3-32B:        {backend: vllm, model: Qwen/Qwen3-32B}          # replicas in endpoints.json
      smollm2-135m:     {backend: transformers, path: "embedded:smollm2-135m"}

A user swaps a backend by editing this file, never code.  The path is
$TOOLORCHESTRA_MODELS or the repository's configs/models.yaml.  The file is re-read
when its modification time changes, so edits apply to a running process.
"""
from __future__ import annotations

import difflib
import os
import threading
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from orchestrator.gateway.errors import GatewayConfigError, UnknownModelError
from orchestrator.gateway.rules import ProviderRules
from orchestrator.redaction import add_secret
from orchestrator.textfile import NotUTF8, decode_utf8

DEFAULT_MODELS = Path(__file__).resolve().parents[2] / "configs" / "models.yaml"
EMBEDDED_PREFIX = "embedded:"
Backend = Literal["openai", "azure", "vllm", "transformers", "anthropic"]

# The per-call deadline of an entry that sets none (seconds): three full attempts of the slowest
# shipped model (GPT-5, timeout_s 600) fit, and a provider's `Retry-After` longer than what is left
# (a daily quota: hours) fails the call at once instead of sleeping through the run.
DEFAULT_DEADLINE_S = 1800.0

# The largest reply body the gateway reads (bytes, after gzip/deflate): a chat reply is kilobytes, a
# 40,000-token one well under 1 MiB; a body past this (a proxy streaming garbage, a 300 MB page) is cut
# while it streams in, never buffered whole (orchestrator/gateway/retry.py CappedTransport).
DEFAULT_MAX_REPLY_BYTES = 16 * 1024 * 1024

# Where a provider entry without `base_url` sends its calls (the backends read these).  Nothing in
# the environment changes them: OPENAI_BASE_URL, OPENAI_API_BASE, ANTHROPIC_BASE_URL and proxy
# variables are ignored, so the registry alone decides where a call goes.
PROVIDER_URLS = {"openai": "https://api.openai.com/v1", "anthropic": "https://api.anthropic.com"}

# Where each backend reads its key when the entry names no `api_key_env`.
_DEFAULT_KEY_ENV = {"openai": "OPENAI_API_KEY", "azure": "AZURE_OPENAI_API_KEY",
                    "anthropic": "ANTHROPIC_API_KEY"}


class VLLMServe(BaseModel):
    """How a `backend: vllm` model is served (orchestrator/vllm_servers/experts.py builds the vLLM command
    from this; one declaration per model).  `max_model_len` is also the gateway's context window."""

    model_config = ConfigDict(extra="forbid")

    weights: str | None = Field(None, min_length=1, description="hub id or folder to load (default: the entry's `model`)")
    max_model_len: int = Field(ge=256, description="vLLM --max-model-len; the gateway's rules.context_window")
    tool_call_parser: str = Field(min_length=1, description="vLLM --tool-call-parser (hermes, llama3_json, openai, ...)")
    chat_template: str | None = Field(None, min_length=1, description="vLLM --chat-template (default: the model's own)")
    tensor_parallel_size: int = Field(1, ge=1, le=8, description="GPUs of one server")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=0.95, description="share of each of its GPUs' memory; "
                                          "servers whose shares add up to <= 0.95 share a GPU")
    quantization: str | None = Field(None, min_length=1, description="vLLM --quantization (e.g. fp8)")
    extra_args: list[str] = Field(default_factory=list, description="more vLLM arguments, appended as given")

    @model_validator(mode="after")
    def _check(self) -> "VLLMServe":
        if self.tensor_parallel_size > 1 and self.gpu_memory_utilization <= 0.5:
            raise ValueError("gpu_memory_utilization: a tensor-parallel server (tensor_parallel_size > 1) takes "
                             "whole GPUs; give it more than 0.5")
        return self


class ModelEntry(BaseModel):
    """One model: its backend and how to reach it.  Units: seconds."""

    model_config = ConfigDict(extra="forbid")

    backend: Backend
    model: str | None = Field(None, min_length=1, description="provider / served model id (default: the entry's name)")
    path: str | None = Field(None, min_length=1, description="transformers: local folder, hub id, or embedded:<name>")
    base_url: str | None = Field(None, min_length=1, description="one fixed OpenAI-compatible / Anthropic base URL")
    endpoints_file: str | None = Field(None, min_length=1, description="vllm: JSON pool of replicas (default $TOOLORCHESTRA_ENDPOINTS or endpoints.json)")
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="name of the env var holding the key")
    api_version: str | None = Field(None, description="azure: API version, e.g. 2024-10-21")
    timeout_s: float = Field(120.0, gt=0, description="deadline of one attempt: connect, headers and body together")
    deadline_s: float = Field(DEFAULT_DEADLINE_S, gt=0, description="deadline of a whole call, retries and waits "
                                                                    "included (a longer Retry-After is not waited for)")
    max_retries: int = Field(3, ge=0, le=20, description="retries after the first attempt")
    max_reply_bytes: int = Field(DEFAULT_MAX_REPLY_BYTES, ge=1024, le=256 * 1024 * 1024,
                                 description="largest reply body read (bytes, decompressed); a larger one is cut "
                                             "at this size and retried like a 5xx")
    backoff_initial_s: float = Field(1.0, ge=0, description="first wait between attempts (doubles, with jitter)")
    backoff_max_s: float = Field(20.0, ge=0, description="longest wait between attempts")
    price_model: str | None = Field(None, min_length=1, description="tools.json price entry to charge when the caller gives none")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="OpenAI-compatible: merged into every request body")
    rules: ProviderRules = Field(default_factory=ProviderRules, description="what the provider accepts "
                                                                           "(orchestrator/gateway/rules.py)")
    serve: VLLMServe | None = Field(None, description="vllm: how to start its server "
                                                      "(orchestrator/vllm_servers/experts.py)")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    device: str = "cpu"

    @field_validator("base_url")
    @classmethod
    def _url(cls, url: str | None) -> str | None:
        """An http(s) URL with a host and a port in 1-65535 (a bad one failed later, at the first call)."""
        if url is None:
            return url
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1 or port == 0:
            raise ValueError(f"{url!r} is not an http(s) URL with a host and a port in 1-65535, "
                             f"e.g. http://HOST:8000/v1")
        return url

    @model_validator(mode="after")
    def _backend_fields(self) -> "ModelEntry":
        if self.backend == "transformers":
            if not self.path:
                raise ValueError("path: required for backend 'transformers' (a local folder, hub id or embedded:smollm2-135m)")
            for name in ("base_url", "endpoints_file", "api_key_env", "api_version"):
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: not used by backend 'transformers'; remove it")
        else:
            if self.path is not None:
                raise ValueError(f"path: only backend 'transformers' loads a local path; backend {self.backend!r} uses 'model'")
            if self.endpoints_file and self.backend != "vllm":
                raise ValueError("endpoints_file: only backend 'vllm' reads a pool of replicas; use base_url")
        if self.backend == "azure" and not (self.base_url and self.api_version):
            raise ValueError("base_url: backend 'azure' needs base_url (https://<resource>.openai.azure.com) and api_version")
        if self.backend == "vllm" and self.base_url and self.endpoints_file:
            raise ValueError("base_url: give either base_url (one server) or endpoints_file (a pool), not both")
        if self.serve is not None:
            if self.backend != "vllm":
                raise ValueError(f"serve: only backend 'vllm' is started by orchestrator.vllm_servers.experts, "
                                 f"not {self.backend!r}")
            window = self.rules.context_window
            if window is not None and window != self.serve.max_model_len:
                raise ValueError(f"serve: max_model_len {self.serve.max_model_len} differs from rules.context_window "
                                 f"{window}; declare the window once, as serve.max_model_len")
            if window is None:    # the served window is the gateway's window: one declaration
                self.rules = ProviderRules.model_validate({**self.rules.model_dump(),
                                                           "context_window": self.serve.max_model_len})
        return self

    def key_env(self) -> str | None:
        """The env var the key is read from (None: no key, e.g. a local vLLM server)."""
        return self.api_key_env or _DEFAULT_KEY_ENV.get(self.backend)

    def endpoints_path(self) -> Path:
        """vllm pool file: the entry's, else $TOOLORCHESTRA_ENDPOINTS, else ./endpoints.json."""
        return Path(self.endpoints_file or os.environ.get("TOOLORCHESTRA_ENDPOINTS", "endpoints.json"))

    def resolved_path(self) -> str:
        """transformers: the folder / hub id to load (embedded:<name> built on first use)."""
        assert self.path is not None
        if not self.path.startswith(EMBEDDED_PREFIX):
            return self.path
        name = self.path.removeprefix(EMBEDDED_PREFIX)
        from orchestrator import embedded
        if name != embedded.SMOLLM2:
            raise GatewayConfigError(f"path: unknown embedded model {name!r}; available: [{embedded.SMOLLM2!r}]")
        return str(embedded.smollm2_path())


class Registry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    models: dict[str, ModelEntry] = Field(min_length=1)
    source: str = Field("<models.yaml>", exclude=True, description="the file it came from (set by the loader)")

    def register_keys(self) -> None:
        """Register every key this registry reads from the environment as a secret
        (orchestrator/redaction.py): no error, log line or record of this process can show it."""
        for entry in self.models.values():
            env = entry.key_env()
            if env:
                add_secret(os.environ.get(env))

    def entry(self, name: str) -> ModelEntry:
        try:
            return self.models[name]
        except KeyError:
            close = difflib.get_close_matches(name, list(self.models), n=1)
            raise UnknownModelError(
                f"unknown model {name!r}: not in {self.source} ({f'did you mean {close[0]!r}? ' if close else ''}"
                f"known: {', '.join(sorted(self.models))}). "
                f"To add it, add an entry under 'models:' in that file, e.g. "
                f"`{name}: {{backend: vllm, model: <served id>}}` (backends: openai, azure, vllm, "
                f"transformers, anthropic; see docs/gateway.md)") from None


    def endpoint(self, name: str) -> dict[str, Any]:
        """Where calls to `name` go, as the gateway resolves them now (run configs record it):
        {backend, base_url} / {backend, endpoints_file, replicas} / {backend, path}."""
        entry = self.entry(name)
        if entry.backend == "transformers":
            return {"backend": entry.backend, "path": entry.path}
        if entry.base_url or entry.backend in PROVIDER_URLS:
            return {"backend": entry.backend, "base_url": entry.base_url or PROVIDER_URLS[entry.backend]}
        from orchestrator.gateway.endpoints import read_endpoints

        path = entry.endpoints_path()
        pools = read_endpoints(path)
        replicas = pools.get(name) or pools.get(entry.model or name) or []
        return {"backend": entry.backend, "endpoints_file": str(path), "replicas": [r.base_url for r in replicas]}


def _location(loc: tuple) -> str:
    return ".".join(str(p) for p in loc) or "(top level)"


def parse_registry(data: object, source: str) -> Registry:
    """Validate parsed YAML; raise GatewayConfigError with one line: file, key, problem."""
    if not isinstance(data, dict):
        raise GatewayConfigError(f"{source}: (top level): expected a mapping with a 'models:' key, got {type(data).__name__}")
    try:
        registry = Registry.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(p for p in err["loc"] if p != "__root__")
        msg = err["msg"].removeprefix("Value error, ")
        # An entry's cross-field check names its own field as "field: problem".
        if len(loc) == 2 and loc[0] == "models" and ":" in msg and " " not in msg.split(":", 1)[0]:
            field, msg = msg.split(":", 1)
            loc, msg = loc + (field,), msg.strip()
        more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise GatewayConfigError(f"{source}: {_location(loc)}: {msg}{more}") from None
    registry.source = source
    return registry


_cache: dict[Path, tuple[bytes, Registry]] = {}
_cache_lock = threading.Lock()


def registry_path(path: str | Path | None = None) -> Path:
    return Path(path or os.environ.get("TOOLORCHESTRA_MODELS") or DEFAULT_MODELS)


def load_registry(path: str | Path | None = None) -> Registry:
    """Load and validate the registry (cached until the file's contents change: an edit that keeps
    the size within the file system's timestamp granularity is seen too)."""
    path = registry_path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise GatewayConfigError(f"{path}: cannot read: {exc.strerror}; set TOOLORCHESTRA_MODELS or create it") from None
    with _cache_lock:
        hit = _cache.get(path)
        if hit and hit[0] == data:
            hit[1].register_keys()      # the environment may have changed since it was parsed
            return hit[1]
    try:
        parsed = yaml.safe_load(decode_utf8(data, path))
    except NotUTF8 as exc:
        raise GatewayConfigError(str(exc)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "(unknown place)"
        raise GatewayConfigError(f"{path}: {where}: invalid YAML: {getattr(exc, 'problem', exc)}") from None
    registry = parse_registry(parsed, str(path))
    registry.register_keys()
    with _cache_lock:
        _cache[path] = (data, registry)
    return registry


def main(argv: list[str] | None = None) -> int:
    """`python -m orchestrator.gateway [PATH]`: validate and list the models."""
    import sys
    argv = sys.argv[1:] if argv is None else argv
    try:
        reg = load_registry(argv[0] if argv else None)
    except GatewayConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, e in reg.models.items():
        where = e.path if e.backend == "transformers" else (e.base_url or f"pool {e.endpoints_path()}" if e.backend == "vllm" else e.base_url or "provider default")
        print(f"{name:32s} {e.backend:12s} {e.model or name:36s} {where}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
