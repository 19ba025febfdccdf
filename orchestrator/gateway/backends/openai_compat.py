"""OpenAI-compatible chat completions through the `openai` client: vLLM, OpenAI, Azure OpenAI.

vLLM servers come from a pool of replicas (orchestrator.gateway.endpoints) unless the
entry fixes one `base_url`.  Constrained decoding (`choices`) uses vLLM's structured
outputs: `extra_body={"structured_outputs": {"choice": [...]}}` (vLLM 0.32's
ChatCompletionRequest.structured_outputs / StructuredOutputsParams.choice).
"""
from __future__ import annotations

import json
import logging
import threading

import openai

from orchestrator.gateway.backends.base import BackendRequest, BackendResult, attempt_error, read_key
from orchestrator.gateway.endpoints import pool_for
from orchestrator.gateway.errors import GatewayConfigError
from orchestrator.gateway.registry import PROVIDER_URLS, ModelEntry
from orchestrator.gateway.replies import ChatCompletionReply, read_reply
from orchestrator.gateway.retry import AttemptError, attempt_deadline, http_client
from orchestrator.records import ToolCall, Usage
from orchestrator.redaction import redact

log = logging.getLogger("toolorchestra.gateway")
OPENAI_DEFAULT_URL = PROVIDER_URLS["openai"]

# One client per (backend, url, key): keeps HTTP connections alive across calls.
_clients: dict[tuple, openai.OpenAI] = {}
_clients_lock = threading.Lock()


def _client(entry: ModelEntry, base_url: str, key: str | None) -> openai.OpenAI:
    cache_key = (entry.backend, base_url, entry.api_version, hash(key), entry.max_reply_bytes)
    with _clients_lock:
        client = _clients.get(cache_key)
        if client is None:
            if entry.backend == "azure":
                client = openai.AzureOpenAI(azure_endpoint=base_url, api_version=entry.api_version,
                                            api_key=key, max_retries=0, http_client=http_client(entry.max_reply_bytes))
            else:
                # vLLM accepts any key unless started with --api-key; the SDK insists on one.
                client = openai.OpenAI(base_url=base_url, api_key=key or "EMPTY", max_retries=0,
                                       http_client=http_client(entry.max_reply_bytes))
            _clients[cache_key] = client
        return client


_tokenize_http = None


def _tokenize_client():
    global _tokenize_http
    with _clients_lock:
        if _tokenize_http is None:
            _tokenize_http = http_client()
        return _tokenize_http


def _convert_tool_calls(raw) -> list[ToolCall] | None:
    """OpenAI structured tool_calls (validated: replies.OpenAIToolCall) -> ToolCall (None when the
    message has none).  Arguments that are not a JSON object are dropped with a warning."""
    if not raw:
        return None
    calls = []
    for tc in raw:
        fn = tc.function
        try:
            text = json.dumps(fn.arguments) if isinstance(fn.arguments, dict) else fn.arguments or "{}"
            args = json.loads(redact(text, patterns=False))
        except json.JSONDecodeError:
            log.warning("dropping tool call %r: arguments are not JSON: %.120r", fn.name, fn.arguments)
            continue
        if isinstance(args, dict):
            calls.append(ToolCall(name=fn.name, arguments=args, id=tc.id))
    return calls


class OpenAICompatBackend:
    """One registry entry of backend openai, azure or vllm."""

    def __init__(self, name: str, entry: ModelEntry):
        self.name, self.entry = name, entry
        self.served = entry.model or name
        self.pool = None
        if entry.backend == "vllm" and not entry.base_url:
            self.pool = pool_for(entry.endpoints_path(), [name, self.served])

    def _endpoint(self) -> str:
        if self.pool is None:
            return self.entry.base_url or OPENAI_DEFAULT_URL
        try:
            return self.pool.next()
        except GatewayConfigError as exc:
            raise AttemptError(str(exc), endpoint=str(self.pool.path), retryable=False) from None

    def _window(self) -> int | None:
        """The largest context window declared for this model (registry rules, replicas' launcher):
        a reply reporting more tokens than this cannot be right."""
        known = [w for w in (self.entry.rules.context_window, self.pool.max_model_len if self.pool else None) if w]
        return max(known) if known else None

    def _body(self, request: BackendRequest) -> dict:
        extra_body = dict(self.entry.extra_body)
        extra_body.update(request.extra.pop("extra_body", None) or {})
        if request.choices is not None:
            if self.entry.backend != "vllm":
                raise AttemptError(f"{self.name}: `choices` (constrained decoding) needs backend vllm or "
                                   f"transformers, not {self.entry.backend}", endpoint=None, retryable=False)
            extra_body["structured_outputs"] = {"choice": list(request.choices)}
        body = dict(model=self.served, messages=request.messages, timeout=request.timeout, **request.extra)
        body[self.entry.rules.max_tokens_param] = request.max_tokens
        if request.temperature is not None:      # None: the model takes only its default (rules)
            body["temperature"] = request.temperature
        if request.tools:
            body["tools"] = request.tools
            if self.entry.backend == "vllm":
                # The server's chat template renders the tools; the reply comes back as text and
                # orchestrator.toolcall parses it (one parser everywhere), so servers need no
                # --tool-call-parser.  Pass tool_choice="auto" to use a server-side parser.
                body.setdefault("tool_choice", "none")
        if extra_body:
            body["extra_body"] = extra_body
        return body

    def count_tokens(self, messages: list[dict], tools: list[dict] | None = None) -> int | None:
        """vLLM only: the prompt's exact token count from the server's POST /tokenize (None when
        this is not a vLLM server or it cannot say within 10 s)."""
        if self.entry.backend != "vllm":
            return None
        try:
            endpoint = self._endpoint()
        except AttemptError:
            return None
        body: dict = {"model": self.served, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        try:
            with attempt_deadline(10.0):
                resp = _tokenize_client().post(endpoint.removesuffix("/v1") + "/tokenize", json=body, timeout=10.0)
            count = resp.json().get("count") if resp.status_code == 200 else None
        except Exception as exc:  # noqa: BLE001 - an unknown count falls back to the estimate
            log.info("%s: /tokenize at %s failed (%s); using the estimate", self.name, endpoint, exc)
            return None
        return count if isinstance(count, int) else None

    def attempt(self, request: BackendRequest) -> BackendResult:
        endpoint = self._endpoint()
        key = read_key(self.entry.key_env(), self.name, required=self.entry.backend in ("openai", "azure"))
        request = BackendRequest(**{**request.__dict__, "extra": dict(request.extra)})
        body = self._body(request)
        try:
            raw = _client(self.entry, endpoint, key).chat.completions.with_raw_response.create(**body)
            reply = read_reply(raw.http_response, ChatCompletionReply, endpoint=endpoint,
                               max_tokens=request.max_tokens, context_window=self._window())
        except (openai.OpenAIError, AttemptError) as exc:
            err = attempt_error(exc, openai, endpoint=endpoint, timeout=request.timeout)
            if err is None:
                raise
            if err.retryable and self.pool is not None:
                self.pool.mark_failed(endpoint)
            raise err from None
        choice = reply.choices[0]
        if reply.usage is None:
            log.warning("%s via %s reported no usage; counting 0 tokens", self.name, endpoint)
        prompt, completion = reply.counts() or (0, 0)
        return BackendResult(
            text=redact(choice.message.text(), patterns=False),
            tool_calls=_convert_tool_calls(choice.message.tool_calls),
            usage=Usage(prompt, completion), endpoint=endpoint, finish_reason=choice.finish_reason)
