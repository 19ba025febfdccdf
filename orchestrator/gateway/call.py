"""`get_llm_response`: one call to any registered LLM, with retries, cost and latency.

The public entry is the top-level module `LLM_CALL` (which re-exports this).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from orchestrator.catalog import DEFAULT_CATALOG, Catalog, load_catalog
from orchestrator.gateway.backends import BackendRequest, make_backend
from orchestrator.gateway.errors import GatewayConfigError, LLMCallError, ProviderRejected
from orchestrator.gateway.registry import load_registry
from orchestrator.gateway.retry import AttemptError, RetryPolicy
from orchestrator.gateway.rules import ProviderRules, RuleRefusal, apply_rules
from orchestrator.records import LLMResponse
from orchestrator.toolcall import parse_tool_calls

log = logging.getLogger("toolorchestra.gateway")
_catalog_cache: dict[str, tuple[bytes, Catalog]] = {}
_catalog_lock = threading.Lock()


def default_catalog() -> Catalog:
    """The repository's tools.json, parsed again only when its contents change."""
    data = Path(DEFAULT_CATALOG).read_bytes()
    with _catalog_lock:
        hit = _catalog_cache.get("default")
        if hit is None or hit[0] != data:
            hit = (data, load_catalog())
            _catalog_cache["default"] = hit
        return hit[1]


def served_rules(entry, backend) -> ProviderRules:
    """The entry's rules, its context window lowered to the replicas' --max-model-len when their
    launcher wrote a smaller one in the endpoints file (e.g. a stand-in server)."""
    pool = getattr(backend, "pool", None)
    served = pool.max_model_len if pool is not None else None
    window = entry.rules.context_window
    if served is None or (window is not None and window <= served):
        return entry.rules
    return ProviderRules.model_validate({**entry.rules.model_dump(), "context_window": served})


def _check_arguments(messages, max_tokens, timeout, choices) -> None:
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ValueError("messages: expected a non-empty list of {'role': ..., 'content': ...} dicts")
    if not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens: expected a positive int, got {max_tokens!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout: expected seconds > 0, got {timeout!r}")
    if choices is not None and (not choices or not all(isinstance(c, str) and c for c in choices)):
        raise ValueError("choices: expected a non-empty list of non-empty strings")


def _split_tool_calls(text: str, result_calls, choices) -> tuple[str, list]:
    """Text and ToolCalls: structured calls as given, else parsed from hermes markup.

    Markup is removed from the text only when every block parsed (so a caller can still
    see and re-parse a malformed call) and never under `choices` (the text must stay
    exactly the chosen string).
    """
    if result_calls is not None:
        return text, result_calls
    if "<tool_call>" not in text:
        return text, []
    content, calls, errors = parse_tool_calls(text)
    if errors:
        log.info("tool-call markup kept in text: %s", "; ".join(errors))
    return (text if errors or choices is not None else content), calls


def _rejected(model: str, exc: AttemptError, attempts: int) -> ProviderRejected:
    provider = exc.provider_message or str(exc)
    return ProviderRejected(f"{model}: request rejected (HTTP {exc.status} from {exc.endpoint}, not retried): "
                            f"{provider}",
                            model=model, endpoint=exc.endpoint, status=exc.status, provider_message=provider,
                            attempts=attempts)


def get_llm_response(model: str, messages: list[dict[str, Any]], tools: list[dict] | None = None,
                     temperature: float = 1.0, max_tokens: int = 1024, *, price_model: str | None = None,
                     catalog: Catalog | None = None, timeout: float | None = None,
                     max_retries: int | None = None, choices: list[str] | None = None,
                     deadline: float | None = None, **extra: Any) -> LLMResponse:
    """Ask registered model `model` for one chat completion.

    messages: OpenAI-style chat messages.  tools: OpenAI function schemas (rendered into
    the prompt by local backends).  max_tokens: completion tokens.  timeout: seconds per
    attempt (default: the entry's timeout_s).  max_retries: retries after the first try
    (default: the entry's).  deadline: seconds for the whole call, retries and waits included
    (default: the entry's deadline_s).  choices: constrained decoding, the reply text is exactly one
    of these strings (vllm and transformers backends).  price_model: the tools.json price
    entry to charge (default: the entry's price_model, else `model`).  extra: passed to the
    backend (e.g. top_p, seed, stop; OpenAI-compatible: extra_body).

    The entry's provider rules (configs/models.yaml `rules:`, orchestrator/gateway/rules.py)
    are applied first: e.g. GPT-5 gets no temperature, a request too long for a vLLM
    model's window is shortened or refused before it is sent.

    Returns LLMResponse: usage as the backend reports it, cost in dollars from the price
    table, latency in wall-clock seconds including retries.  Raises ProviderRejected (an
    LLMCallError) when the provider refuses the request itself (HTTP 4xx: retrying cannot
    help) or the rules refuse it; LLMCallError (naming model and endpoint, never a key)
    when the call fails for good otherwise; GatewayConfigError for a registry / price-table
    problem; ValueError for bad arguments.
    """
    _check_arguments(messages, max_tokens, timeout, choices)
    entry = load_registry().entry(model)
    catalog = catalog or default_catalog()
    charged = price_model or entry.price_model or model
    if charged not in catalog.prices:
        raise GatewayConfigError(
            f"no price for {charged!r} (model {model!r}): add it to 'prices' in tools.json, pass "
            f"price_model=..., or set price_model in the registry entry")
    try:
        backend = make_backend(model, entry)      # may load a local model (not timed)
    except AttemptError as exc:
        raise LLMCallError(f"{model}: {exc}", model=model, endpoint=exc.endpoint) from None
    request = BackendRequest(messages=messages, tools=tools, temperature=temperature, max_tokens=max_tokens,
                             choices=choices, timeout=timeout or entry.timeout_s, extra=extra)
    try:
        request = apply_rules(served_rules(entry, backend), request, count=getattr(backend, "count_tokens", None))
    except RuleRefusal as exc:
        raise ProviderRejected(f"{model}: request rejected (refused before sending, by configs/models.yaml "
                               f"rules): {exc}", model=model, endpoint=None, provider_message=str(exc),
                               attempts=0) from None
    policy = RetryPolicy(max_retries=entry.max_retries if max_retries is None else max_retries,
                         initial_s=entry.backoff_initial_s, max_wait_s=entry.backoff_max_s,
                         attempt_s=request.timeout, deadline_s=deadline or entry.deadline_s)
    attempts = 0

    def attempt(_: int):
        nonlocal attempts
        attempts += 1
        return backend.attempt(request)

    start = time.perf_counter()
    try:
        result = policy.run(attempt, model=model)
    except AttemptError as exc:
        if not exc.retryable and exc.status is not None and 400 <= exc.status < 500:
            raise _rejected(model, exc, attempts) from None
        gave_up = "gave up after" if exc.retryable else "failed (not retryable) after"
        why = f"; {exc.gave_up}" if exc.gave_up else ""
        if exc.before is not None:      # the last attempt only ran out of the call's time: say what failed before
            why += f"; the attempt before failed: {exc.before}"
        raise LLMCallError(f"{model}: {gave_up} {attempts} attempt(s); last endpoint "
                           f"{exc.endpoint or 'none'}: {exc}{why}", model=model, endpoint=exc.endpoint,
                           attempts=attempts, retryable=exc.retryable) from None
    latency = time.perf_counter() - start
    text, calls = _split_tool_calls(result.text, result.tool_calls, choices)
    cost = catalog.llm_cost(charged, result.usage)
    log.debug("%s via %s: %d+%d tokens, $%.6f, %.2f s", model, result.endpoint,
              result.usage.prompt_tokens, result.usage.completion_tokens, cost, latency)
    return LLMResponse(model=model, text=text, tool_calls=calls, usage=result.usage, cost=cost,
                       latency=latency, endpoint=result.endpoint, raw_finish_reason=result.finish_reason)
