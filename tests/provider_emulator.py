"""A local HTTP server that enforces the providers' documented request rules (no tests in this module).

It speaks OpenAI chat completions (`POST /v1/chat/completions`, for OpenAI and vLLM model
ids), Anthropic messages (`POST /v1/messages`), vLLM's `POST /tokenize` and the retrieval
service's `POST /retrieve`, and answers like evaluation.mock_backend (a scripted
orchestrator, experts that know the answers, a judge).  Before answering it checks each
request the way the real service does and, on a violation, returns that service's real
error body (texts as reported in public issue threads; see docs/evaluation.md):

- OpenAI reasoning models (gpt-5, gpt-5-mini, o3-mini): `temperature`/`top_p` other than 1 ->
  400 unsupported_value; `max_tokens` -> 400 unsupported_parameter ("Use
  'max_completion_tokens' instead."); a completion budget above the model's output limit ->
  400 invalid_value.
- vLLM: prompt + completion tokens above the served model's max_model_len -> 400
  "This model's maximum context length is N tokens. However, you requested ...".  Tokens
  are counted at 4 characters per token (about what Qwen/Llama tokenizers give for English).
- OpenAI structured output (`response_format`, any OpenAI id): a json_schema without a valid
  `name` or a `schema`, or in strict mode a schema whose object lacks `additionalProperties:
  false` or does not list every property in `required` -> 400 invalid_request_error (OpenAI's
  texts).  A request with a json_schema `ExtractedAnswer` (HLE's judge) is answered with that
  object: correct "yes" when the [correct_answer] appears in the [response], the response's
  "Confidence: X%" (else 100).
- Anthropic: missing `max_tokens` -> 400 "max_tokens: Field required"; temperature outside
  [0, 1] -> 400; `temperature` and `top_p` together for Claude Opus 4.1 -> 400.
- Retrieval (`/retrieve`, our own server's contract): the body checked with retrieval/server.py's
  own model and default limits (422 `{"error": "<field>: ..."}`), an eid it has no whitelist for
  -> 422, and the `min_score` / `min_length` filters applied to the generated hits.

Every rejection is kept in `rejected` (model, status, message) so a test can assert none
happened.  `reject_models` rejects every request for those models with the
OpenAI temperature error whatever they carry (a provider that changed its rules).

Hostile replies (`faults`: model id, or "*" for every model -> one of FAULTS), each answered with
status 200 to a chat request (OpenAI or Anthropic route) and counted in `fault_hits`:
- "html_echo_key": a text/html page that echoes the API key the request carried (Authorization /
  x-api-key), as a misconfigured proxy's login page does;
- wrong shapes of an OpenAI reply: "choices_string", "choices_object", "no_message",
  "message_null", "usage_string", "usage_null_counts", "usage_negative" (a count of -4,000,000:
  a negative cost), "usage_over_budget" (more completion tokens than the request allowed);
  on the Anthropic route "usage_negative" and "usage_string" are given in its shape;
- bodies too big to hold: "endless" (application/json streamed in 64 KiB chunks until the client
  hangs up, no Content-Length), "huge_declared" (the same with Content-Length 300 MB), "gzip_bomb"
  (Content-Encoding gzip: 64 KiB on the wire inflating to 64 MiB).  `bytes_streamed` counts the
  bytes the streaming faults handed to the server.
`gzip=True` compresses every reply of a client that accepts gzip (as many providers do).
"""
from __future__ import annotations

import asyncio
import json
import math
import re
import time
import zlib
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.gzip import GZipMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

from evaluation.mock_backend import MockBackend
from retrieval.server import Limits, invalid_field, request_model

RETRIEVE_BODY = request_model(Limits())   # our retrieval server's /retrieve body, with its default limits

OPENAI_REASONING = {"gpt-5": 128000, "gpt-5-mini": 128000, "o3-mini": 100000}
VLLM_WINDOWS = {"Qwen/Qwen3-8B": 40960, "Qwen/Qwen3-32B": 40960, "Qwen/Qwen2.5-Coder-32B-Instruct": 32768,
                "meta-llama/Llama-3.3-70B-Instruct": 131072, "Qwen/Qwen2.5-Math-72B-Instruct": 4096,
                "Qwen/Qwen2.5-Math-7B-Instruct": 4096, "Qwen/Qwen3-235B-A22B": 40960}
ANTHROPIC_EXCLUSIVE_SAMPLING = {"claude-opus-4-1"}
CHARS_PER_TOKEN = 4
_HLE_RE = re.compile(r"\[response\]: (.*?)\n\nYour judgement must be.*?\[correct_answer\]: (.*?)\n\nreasoning:",
                     re.DOTALL)
_STUDENT_RE = re.compile(r"Student answer: (.*?)\n\nReference answer: (.*?)\n\n", re.DOTALL)
SHAPE_FAULTS = ("choices_string", "choices_object", "no_message", "message_null", "usage_string",
                "usage_null_counts", "usage_negative", "usage_over_budget")
SIZE_FAULTS = ("endless", "huge_declared", "gzip_bomb")
FAULTS = ("html_echo_key", *SHAPE_FAULTS, *SIZE_FAULTS)
CHUNK = b" " * 65536


def count_tokens(messages: list[dict], tools: list | None = None) -> int:
    chars = sum(len(str(m.get("content") or "")) for m in messages) + (len(json.dumps(tools)) if tools else 0)
    return math.ceil(chars / CHARS_PER_TOKEN) + 4 * len(messages)


def openai_error(message: str, param: str | None, code: str | None) -> dict:
    return {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}


def check_openai_reasoning(model: str, body: dict) -> dict | None:
    for name in ("temperature", "top_p"):
        value = body.get(name)
        if value is not None and value != 1:
            return openai_error(f"Unsupported value: '{name}' does not support {value!r} with this model. "
                                f"Only the default (1) value is supported.", name, "unsupported_value")
    if "max_tokens" in body:
        return openai_error("Unsupported parameter: 'max_tokens' is not supported with this model. "
                            "Use 'max_completion_tokens' instead.", "max_tokens", "unsupported_parameter")
    budget, limit = body.get("max_completion_tokens"), OPENAI_REASONING[model]
    if budget is not None and budget > limit:
        return openai_error(f"max_tokens is too large: {budget}. This model supports at most {limit} completion "
                            f"tokens, whereas you provided {budget}.", "max_tokens", "invalid_value")
    return None


def check_response_format(body: dict) -> dict | None:
    """OpenAI's checks of a `response_format` (structured outputs, strict mode)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if fmt.get("type") not in ("text", "json_object", "json_schema"):
        return openai_error(f"Invalid value: '{fmt.get('type')}'. Supported values are: 'json_object', "
                            f"'json_schema', and 'text'.", "response_format.type", "invalid_value")
    if fmt["type"] != "json_schema":
        return None
    spec = fmt.get("json_schema") or {}
    if not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", str(spec.get("name", ""))):
        return openai_error("Invalid 'response_format.json_schema.name': string does not match pattern. Expected a "
                            "string that matches the pattern '^[a-zA-Z0-9_-]+$'.", "response_format.json_schema.name",
                            "invalid_value")
    schema = spec.get("schema")
    if not isinstance(schema, dict):
        return openai_error("Missing required parameter: 'response_format.json_schema.schema'.",
                            "response_format.json_schema.schema", "missing_required_parameter")
    if spec.get("strict"):
        if schema.get("additionalProperties") is not False:
            return openai_error(f"Invalid schema for response_format '{spec['name']}': In context=(), "
                                f"'additionalProperties' is required to be supplied and to be false.",
                                "response_format", None)
        missing = [k for k in schema.get("properties", {}) if k not in (schema.get("required") or [])]
        if missing:
            return openai_error(f"Invalid schema for response_format '{spec['name']}': In context=(), 'required' is "
                                f"required to be supplied and to be an array including every key in properties. "
                                f"Missing '{missing[0]}'.", "response_format", None)
    return None


def hle_judge_reply(text: str) -> str:
    """HLE's judge as a script: the ExtractedAnswer object for a prompt in HLE's wording."""
    m = _HLE_RE.search(text)
    response, reference = (m.group(1), m.group(2)) if m else ("", "")
    answer = re.findall(r"(?im)^answer:\s*(.+)$", response)
    stated = re.findall(r"(?i)confidence:\s*(\d+)\s*%", response)
    ok = bool(reference.strip()) and reference.strip().lower() in response.lower()
    return json.dumps({"extracted_final_answer": answer[-1].strip() if answer else "None",
                       "reasoning": "scripted", "correct": "yes" if ok else "no",
                       "confidence": int(stated[-1]) if stated else 100, "strict": True})


def check_vllm(model: str, body: dict) -> dict | None:
    window = VLLM_WINDOWS[model]
    prompt = count_tokens(body.get("messages", []), body.get("tools"))
    completion = body.get("max_completion_tokens") or body.get("max_tokens") or max(window - prompt, 0)
    if prompt + completion > window:
        return {"object": "error", "type": "BadRequestError", "param": None, "code": 400,
                "message": f"This model's maximum context length is {window} tokens. However, you requested "
                           f"{prompt + completion} tokens ({prompt} in the messages, {completion} in the "
                           f"completion). Please reduce the length of the messages or completion."}
    return None


def check_anthropic(body: dict) -> dict | None:
    def err(message: str) -> dict:
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    if "max_tokens" not in body:
        return err("max_tokens: Field required")
    t = body.get("temperature")
    if t is not None and t > 1:
        return err("temperature: Input should be less than or equal to 1")
    if t is not None and t < 0:
        return err("temperature: Input should be greater than or equal to 0")
    if body.get("model") in ANTHROPIC_EXCLUSIVE_SAMPLING and t is not None and body.get("top_p") is not None:
        return err("`temperature` and `top_p` cannot both be specified for this model. Please use only one.")
    return None


class ProviderEmulator(MockBackend):
    """MockBackend's scripted answers behind the providers' request rules.

    The orchestrator's script (a request with an `answer` tool): `plan[i]` where i counts
    the evidence already in its prompt (documents present: +1, code output present: +1);
    each step is (tool, alias).  `doc_chars`: length of each retrieved document.
    """

    def __init__(self, answers: dict[str, str], plan=(("search", "search-1"), ("enhance_reasoning", "reasoner-3"),
                                                      ("answer", "answer-1")),
                 reject_models: set[str] | None = None, doc_chars: int = 3000, answer_prefix: str = "",
                 eids: set[str] | None = None, faults: dict[str, str] | None = None, gzip: bool = False,
                 **kw: Any):
        super().__init__(answers=answers, **kw)
        unknown = sorted(set((faults or {}).values()) - set(FAULTS))
        if unknown:
            raise ValueError(f"faults: unknown {unknown}; known: {FAULTS}")
        self.faults = dict(faults or {})
        self.gzip = gzip                        # gzip every reply a client accepts gzip for
        self.fault_hits = 0
        self.bytes_streamed = 0
        if "gzip_bomb" in self.faults.values():     # 64 MiB of JSON whitespace, compressed piece by piece
            packer = zlib.compressobj(9, zlib.DEFLATED, 31)
            self._bomb = b"".join([packer.compress(b"["), *(packer.compress(CHUNK) for _ in range(1024)),
                                   packer.compress(b"]"), packer.flush()])
        self.eids = eids                        # eid whitelists it has (None: no eid file, as our server)
        self.plan = list(plan)
        self.reject_models = reject_models or set()
        self.doc_chars = doc_chars
        self.answer_prefix = answer_prefix      # e.g. "It is " so that only a judge can grade it
        self.rejected: list[dict] = []
        self.seen: list[dict] = []            # every chat body, with its route
        self.retrievals: list[dict] = []

    @property
    def root(self) -> str:
        return self.base_url.removesuffix("/v1")

    # ---- what to say ------------------------------------------------------------------------
    def _step(self, text: str) -> tuple[str, str]:
        i = int("Doc 1:" in text or "Document 1" in text) + int("```output" in text or "Output:" in text)
        return self.plan[min(i, len(self.plan) - 1)]

    def _content(self, text: str) -> str:
        question = self._question(text)
        answer = self.answer_prefix + self.answers.get(question, "I do not know")
        m = _STUDENT_RE.search(text)
        if m:   # the upstream judge
            ok = m.group(2).strip().lower() in m.group(1).strip().lower()
            return f"<correct>{ok}</correct>"
        if "\\boxed{}" in text:
            return f"Step by step... so the answer is \\boxed{{{answer}}}."
        if "<answer>" in text:
            return f"<think>\nreasoning\n</think>\n<answer>\n{answer}\n</answer>"
        if "<query>" in text:
            return "<query>the missing fact</query>"
        return "```python\nprint(6 * 7)\n```"

    def reply(self, body: dict) -> tuple[int, dict]:
        names = {t.get("function", {}).get("name") for t in body.get("tools") or []}
        text = "\n".join(str(m.get("content") or "") for m in body.get("messages", []))
        schema_name = ((body.get("response_format") or {}).get("json_schema") or {}).get("name")
        if schema_name == "ExtractedAnswer":
            message: dict[str, Any] = {"role": "assistant", "content": hle_judge_reply(text), "refusal": None}
        elif "answer" not in names and ("Student answer:" in text or "\\boxed{}" in text or "<answer>" in text
                                      or "<query>" in text or "```python" in text) and "Answer to grade:" not in text:
            message = {"role": "assistant", "content": self._content(text)}
        elif "answer" in names:
            tool, alias = self._step(text)
            message = {"role": "assistant", "content": None, "tool_calls": [self._call(tool, {"model": alias})]}
        else:
            return super().reply(body)
        out = message.get("content") or json.dumps(message.get("tool_calls"))
        budget = body.get("max_completion_tokens") or body.get("max_tokens")     # a server never reports more
        usage = {"prompt_tokens": count_tokens(body.get("messages", [])),
                 "completion_tokens": min(len(out) // 4 + 1, budget if isinstance(budget, int) else 1 << 30)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return 200, {"id": "emu", "object": "chat.completion", "created": int(time.time()),
                     "model": body.get("model"), "usage": usage,
                     "choices": [{"index": 0, "message": message,
                                  "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}]}

    def _reject(self, model: str, status: int, payload: dict) -> JSONResponse:
        inner = payload.get("error", payload)
        self.rejected.append({"model": model, "status": status,
                              "message": inner.get("message") if isinstance(inner, dict) else str(inner)})
        return JSONResponse(payload, status_code=status)

    # ---- hostile replies ------------------------------------------------------------------------
    def _fault(self, model: str | None) -> str | None:
        fault = self.faults.get(model or "", self.faults.get("*"))
        if fault is not None:
            with self._lock:
                self.fault_hits += 1
        return fault

    def _streamed(self, declared: int | None) -> StreamingResponse:
        async def forever():
            while True:                      # until the client hangs up (the server then stops us)
                with self._lock:
                    self.bytes_streamed += len(CHUNK)
                yield CHUNK
                await asyncio.sleep(0)
        headers = {"content-length": str(declared)} if declared else {}
        return StreamingResponse(forever(), media_type="application/json", headers=headers)

    def _hostile(self, fault: str, request: Request, body: dict, route: str) -> Response:
        """The 200 reply of `fault` (see the module docstring)."""
        if fault == "html_echo_key":
            auth = request.headers.get("authorization", "")
            key = auth.split(" ", 1)[1] if " " in auth else request.headers.get("x-api-key", auth)
            return Response(f"<html><body>Signed in as {key}. Your session expired; sign in again."
                            f"</body></html>", media_type="text/html")
        if fault == "endless":
            return self._streamed(None)
        if fault == "huge_declared":
            return self._streamed(300 * 1000 * 1000)
        if fault == "gzip_bomb":
            return Response(self._bomb, media_type="application/json", headers={"content-encoding": "gzip"})
        if route == "anthropic":
            payload = {"id": "msg_emu", "type": "message", "role": "assistant", "model": body.get("model"),
                       "content": [{"type": "text", "text": "hello"}], "stop_reason": "end_turn",
                       "usage": {"input_tokens": 10, "output_tokens": -4_000_000} if fault == "usage_negative"
                       else "lots"}
            return JSONResponse(payload)
        status, payload = self.reply(body)
        budget = body.get("max_completion_tokens") or body.get("max_tokens") or 1024
        change: dict[str, Any] = {
            "choices_string": {"choices": "hello"},
            "choices_object": {"choices": {"0": payload["choices"][0]}},
            "no_message": {"choices": [{"index": 0, "finish_reason": "stop"}]},
            "message_null": {"choices": [{"index": 0, "message": None, "finish_reason": "stop"}]},
            "usage_string": {"usage": "lots"},
            "usage_null_counts": {"usage": {"prompt_tokens": None, "completion_tokens": None, "total_tokens": None}},
            "usage_negative": {"usage": {"prompt_tokens": 10, "completion_tokens": -4_000_000,
                                         "total_tokens": -3_999_990}},
            "usage_over_budget": {"usage": {"prompt_tokens": 10, "completion_tokens": budget + 1000,
                                            "total_tokens": budget + 1010}},
        }[fault]
        return JSONResponse({**payload, **change}, status_code=status)

    # ---- the server --------------------------------------------------------------------------
    def _app(self):
        app = FastAPI()
        if self.gzip:
            app.add_middleware(GZipMiddleware, minimum_size=1)

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            body = await request.json()
            model = body.get("model")
            with self._lock:
                self.requests += 1
                self.seen.append({"route": "openai", **body})
            fault = self._fault(model)
            if fault is not None:
                return self._hostile(fault, request, body, "openai")
            if model in self.reject_models:
                return self._reject(model, 400, openai_error(
                    f"Unsupported value: 'temperature' does not support {body.get('temperature', 1.0)!r} with this "
                    f"model. Only the default (1) value is supported.", "temperature", "unsupported_value"))
            problem = (check_openai_reasoning(model, body) if model in OPENAI_REASONING
                       else check_vllm(model, body) if model in VLLM_WINDOWS else None) or check_response_format(body)
            if problem is not None:
                return self._reject(model, 400, problem)
            status, payload = self.reply(body)
            return JSONResponse(payload, status_code=status)

        @app.post("/v1/messages")
        async def messages(request: Request):
            body = await request.json()
            with self._lock:
                self.requests += 1
                self.seen.append({"route": "anthropic", **body})
            fault = self._fault(body.get("model"))
            if fault is not None:
                return self._hostile(fault, request, body, "anthropic")
            problem = check_anthropic(body)
            if problem is not None:
                return self._reject(body.get("model"), 400, problem)
            text = "\n".join(str(b.get("text", "")) if isinstance(b, dict) else str(b)
                             for m in body.get("messages", [])
                             for b in (m["content"] if isinstance(m["content"], list) else [m["content"]]))
            content = self._content(text)
            return JSONResponse({"id": "msg_emu", "type": "message", "role": "assistant", "model": body["model"],
                                 "content": [{"type": "text", "text": content}], "stop_reason": "end_turn",
                                 "stop_sequence": None,
                                 "usage": {"input_tokens": len(text) // 4 + 1,
                                           "output_tokens": min(len(content) // 4 + 1, body["max_tokens"])}})

        @app.post("/tokenize")
        async def tokenize(request: Request):
            body = await request.json()
            window = VLLM_WINDOWS.get(body.get("model"), 0)
            return {"count": count_tokens(body.get("messages", []), body.get("tools")), "max_model_len": window,
                    "tokens": []}

        @app.post("/retrieve")
        async def retrieve(request: Request):
            body = await request.json()
            self.retrievals.append(body)
            try:                                    # the real server's body model and limits (retrieval/server.py)
                parsed = RETRIEVE_BODY.model_validate(body)
            except ValidationError as exc:
                field, msg = invalid_field([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()])
                self.rejected.append({"model": "retrieval", "status": 422, "message": f"{field}: {msg}"})
                return JSONResponse({"error": f"{field}: {msg}"}, status_code=422)
            eid = body.get("eid")
            if eid is not None and (self.eids is None or eid not in self.eids):   # retrieval/searcher.py's 422s
                why = ("this server has no eid whitelists; start it with --eid-file" if self.eids is None
                       else f"unknown eid {eid[:100]!r}; it is not a key of the eid file")
                self.rejected.append({"model": "retrieval", "status": 422, "message": f"eid: {why}"})
                return JSONResponse({"error": f"eid: {why}"}, status_code=422)
            k = parsed.topk or 3
            docs = [({"id": f"{body.get('eid', 'doc')}-{i}",
                      "contents": f"Document {i} about the missing fact. " + "filler " * (self.doc_chars // 7)},
                     1.0 - i / 1000) for i in range(k)]
            # the server's filters (retrieval/searcher.py _hits): a hit scoring at least min_score, a
            # document of at least min_length characters
            docs = [(d, score) for d, score in docs
                    if (parsed.min_score is None or score >= parsed.min_score)
                    and len(d["contents"]) >= (parsed.min_length or 0)]
            hits = [[{"document": d, "score": score} for d, score in docs] for _ in parsed.queries]
            return {"result": hits, "usage": {"web_searches": 0, "pages": 0}}

        @app.get("/health")
        async def health():
            return {"ok": True}

        return app


def emulator_registry(root: str, key_env: str = "EMULATOR_KEY", drop_rules: set[str] = frozenset()) -> dict:
    """The shipped configs/models.yaml with every provider pointed at the emulator at `root`.

    Rules are kept as shipped (that is what is under test), except for the models in
    `drop_rules` (to show what the provider does without them): those entries are checked to
    leave the gateway no rule at all, so a registry field that also implies one (as `serve:`'s
    max_model_len implies the context window) stops here naming it, not as a request the
    gateway quietly shortened (a test's "DID NOT RAISE")."""
    from orchestrator.gateway.registry import DEFAULT_MODELS, ModelEntry, load_registry
    from orchestrator.gateway.rules import ProviderRules

    out = {}
    for name, entry in load_registry(DEFAULT_MODELS).models.items():
        data = entry.model_dump(mode="json", exclude_none=True)
        if entry.backend == "transformers":
            out[name] = data
            continue
        data.pop("endpoints_file", None)
        data.update(base_url=root if entry.backend == "anthropic" else f"{root}/v1", timeout_s=30, max_retries=0)
        if entry.backend in ("openai", "anthropic"):
            data["api_key_env"] = key_env
        if name in drop_rules:
            data.pop("rules", None)
            data.pop("serve", None)          # its max_model_len is the rules' context window
            left = ModelEntry.model_validate(data).rules
            if left != ProviderRules():
                raise AssertionError(f"emulator_registry: {name} keeps provider rules with `rules:` and `serve:` "
                                     f"dropped ({left!r}); drop the registry field that sets them too")
        out[name] = data
    return {"models": out}
