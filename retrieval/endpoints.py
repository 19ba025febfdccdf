"""The endpoint registry: a pool of OpenAI-compatible replicas read from an endpoints JSON file.

    {"<model>": [{"base_url": "http://node1:8000/v1"}, {"base_url": "http://node2:8000/v1"}]}

Each key is a configs/models.yaml entry name (an entry's `endpoints_file`, default
$TOOLORCHESTRA_ENDPOINTS or endpoints.json, names the file); the launchers write them
(orchestrator/vllm_servers/launch.py, one process per server of orchestrator/vllm_servers/experts.py).

Requests go round-robin over the replicas.  When a replica fails, the file is re-read
(a launcher may have replaced a dead server) and the pool moves to the next replica;
the failed one is skipped for `cooldown_s` seconds; when every replica failed within that
time, the one whose last failure is oldest is tried.
Writers (`register_endpoint`, `unregister_endpoint`) replace the file atomically, so
readers never see half a file.

It lives here, in the bottom layer (docs/architecture.md, "Import rules"), because the retrieval
server registers itself in the same file the gateway reads (orchestrator/gateway/endpoints.py
re-exports it); so does the error both raise for a bad file, `GatewayConfigError`.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.redaction import redact   # the base layer below retrieval (tests/test_imports.py LAYERS)


class GatewayConfigError(ValueError):
    """A problem in configs/models.yaml or an endpoints file, as one line: file, key, problem, redacted
    (a preflight's line may quote what a server answered).  orchestrator.gateway.errors exports it;
    defined here so that this module needs nothing above it."""

    def __init__(self, message: str = "", *args):
        super().__init__(redact(str(message)), *args)


class Replica(BaseModel):
    model_config = ConfigDict(extra="allow")   # launchers may add host/port/pid notes
    base_url: str = Field(pattern=r"^https?://")
    max_model_len: int | None = Field(None, ge=1, description="the server's --max-model-len, when its launcher "
                                                                 "wrote it (orchestrator/vllm_servers/experts.py)")


def read_endpoints(path: Path) -> dict[str, list[Replica]]:
    """Parse an endpoints file; a missing file is an empty pool."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except json.JSONDecodeError as exc:
        raise GatewayConfigError(f"{path}: line {exc.lineno} column {exc.colno}: invalid JSON: {exc.msg}") from None
    if not isinstance(data, dict):
        raise GatewayConfigError(f"{path}: (top level): expected an object {{model: [{{base_url: ...}}]}}")
    pools: dict[str, list[Replica]] = {}
    for key, replicas in data.items():
        if not isinstance(replicas, list):
            raise GatewayConfigError(f"{path}: {key}: expected a list of {{\"base_url\": ...}} objects")
        try:
            pools[key] = [Replica.model_validate(r) for r in replicas]
        except ValidationError as exc:
            err = exc.errors()[0]
            raise GatewayConfigError(f"{path}: {key}: {'.'.join(map(str, err['loc'])) or 'replica'}: {err['msg']}") from None
    return pools


class EndpointPool:
    """Round-robin over the replicas listed for `keys[0]` (else `keys[1]`, ...) in `path`."""

    def __init__(self, path: Path, keys: list[str], cooldown_s: float = 10.0):
        self.path, self.keys, self.cooldown_s = Path(path), keys, cooldown_s
        self._lock = threading.Lock()
        self._cursor = 0
        self._failed_at: dict[str, float] = {}
        self._urls: list[str] = []
        self._window: int | None = None
        self._reload()

    def _reload(self) -> None:
        pools = read_endpoints(self.path)
        for key in self.keys:
            if pools.get(key):
                self._urls = [r.base_url for r in pools[key]]
                lens = [r.max_model_len for r in pools[key] if r.max_model_len]
                self._window = min(lens) if lens else None
                return
        self._urls, self._window = [], None

    @property
    def max_model_len(self) -> int | None:
        """The smallest --max-model-len its replicas' launcher wrote (None: not written): a request is
        fitted to it as well as to the registry's context window, so no replica rejects it."""
        with self._lock:
            if not self._urls:
                self._reload()
            return self._window

    def next(self) -> str:
        """The base URL for the next request; raises GatewayConfigError when the pool is empty."""
        with self._lock:
            if not self._urls:
                self._reload()
            if not self._urls:
                raise GatewayConfigError(
                    f"{self.path}: no replicas for {' or '.join(map(repr, self.keys))}; start a server "
                    f"(python -m orchestrator.vllm_servers.launch --model <its weights: a folder, hub id or "
                    f"embedded:smollm2-135m> --served-name {self.keys[-1]} --endpoints-file {self.path}) or add "
                    f'{{"{self.keys[0]}": [{{"base_url": "http://HOST:PORT/v1"}}]}}')
            now = time.monotonic()
            n = len(self._urls)
            for step in range(n):
                url = self._urls[(self._cursor + step) % n]
                if now - self._failed_at.get(url, -1e9) >= self.cooldown_s:
                    self._cursor = (self._cursor + step + 1) % n
                    return url
            # Every replica failed recently: try the one whose last failure is oldest.  A dead replica
            # fails each time it is tried, so it stays the most recent; a live one that failed now and
            # then (a 429, a 5xx) is preferred.  (Round-robin here sent every other attempt to a dead
            # replica while the live one had failed once in the last cooldown_s: at concurrency 32 and
            # 10% faults, 6 of 200 calls ran out of retries; bench/chaos_eval.py, docs/reliability.md.)
            url = min(self._urls, key=lambda u: self._failed_at.get(u, -1e9))
            self._cursor = (self._urls.index(url) + 1) % n
            return url

    def mark_failed(self, url: str) -> None:
        """Record a failed replica, re-read the file and move on to the next one."""
        with self._lock:
            self._failed_at[url] = time.monotonic()
            self._reload()

    @property
    def urls(self) -> list[str]:
        with self._lock:
            return list(self._urls)


_pools: dict[tuple[str, tuple[str, ...]], EndpointPool] = {}
_pools_lock = threading.Lock()


def pool_for(path: Path, keys: list[str]) -> EndpointPool:
    """One shared pool per (file, keys), so round-robin spreads load across threads."""
    cache_key = (str(Path(path).resolve()), tuple(keys))
    with _pools_lock:
        if cache_key not in _pools:
            _pools[cache_key] = EndpointPool(Path(path), keys)
        return _pools[cache_key]


# ---- writers (used by orchestrator.vllm_servers.launch) --------------------------------------------
@contextmanager
def _locked(path: Path):
    # Serialise read-modify-write cycles of concurrent launchers on one machine.
    lock_path = path.with_name(path.name + ".lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _write_atomic(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _raw(path: Path) -> dict:
    read_endpoints(path)             # validate first: never rewrite a file we cannot parse
    return json.loads(path.read_text()) if path.exists() else {}


def register_endpoint(path: str | Path, key: str, base_url: str, **notes) -> None:
    """Add `base_url` to the replicas of `key` in `path` (atomic; no duplicates)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        data = _raw(path)
        replicas = [r for r in data.get(key, []) if r.get("base_url") != base_url]
        data[key] = replicas + [{"base_url": base_url, **notes}]
        _write_atomic(path, data)


def unregister_endpoint(path: str | Path, key: str, base_url: str) -> None:
    """Remove `base_url` from `key`'s replicas (drops the key when none remain)."""
    path = Path(path)
    if not path.exists():
        return
    with _locked(path):
        data = _raw(path)
        replicas = [r for r in data.get(key, []) if r.get("base_url") != base_url]
        if replicas:
            data[key] = replicas
        else:
            data.pop(key, None)
        _write_atomic(path, data)
