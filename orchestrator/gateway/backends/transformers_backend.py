"""In-process generation with transformers for a local model folder (or hub id).

Each (path, dtype, device) is loaded once per process and shared between threads.
Prompts are rendered by `orchestrator.chat_template.prompt_ids`, the renderer training uses
(the tokenizer's chat template; tools written into the system message when the template
ignores them), tokenized without extra special tokens (as vLLM does), so `usage.prompt_tokens` matches a vLLM server of the
same model.  `usage.completion_tokens` counts generated ids including the end-of-
sequence token when one is produced (vLLM counts it too).  temperature == 0 is greedy.

Concurrent calls to one model are batched into one `generate` (transformers_batching.py).

Constrained decoding (`choices`): a prefix trie over each choice's token ids limits
every step to tokens that continue some choice, then end-of-sequence; the reply is
exactly one choice string (unless `max_tokens` cuts it first: finish_reason "length").
"""
from __future__ import annotations

import threading
import time
from typing import Any

from orchestrator.gateway.backends.base import BackendRequest, BackendResult
from orchestrator.gateway.backends.transformers_batching import Batcher, Job
from orchestrator.gateway.registry import ModelEntry
from orchestrator.gateway.retry import AttemptError
from orchestrator.records import Usage

_loaded: dict[tuple[str, str, str], tuple[Any, Any]] = {}
_batchers: dict[tuple[str, str, str], Batcher] = {}
_load_locks: dict[tuple[str, str, str], threading.Lock] = {}
_registry_lock = threading.Lock()
SUPPORTED_EXTRA = ("top_p", "top_k", "stop", "seed", "repetition_penalty")


def load_model(path: str, dtype: str = "float32", device: str = "cpu") -> tuple[Any, Any]:
    """(tokenizer, model) for `path`, loaded on first use and cached (thread-safe)."""
    key = (path, dtype, device)
    with _registry_lock:
        if key in _loaded:
            return _loaded[key]
        lock = _load_locks.setdefault(key, threading.Lock())
    with lock:    # one loader per key; other threads wait for it instead of loading twice
        if key not in _loaded:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            tokenizer = AutoTokenizer.from_pretrained(path)
            torch_dtype = dtype if dtype == "auto" else getattr(torch, dtype)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype).to(device).eval()
            with _registry_lock:
                _batchers[key] = Batcher(model, pad_id(tokenizer, eos_ids(tokenizer, model)))
                _loaded[key] = (tokenizer, model)
    return _loaded[key]


def pad_id(tokenizer, eos: list[int]) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]


def eos_ids(tokenizer, model) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [ids] if isinstance(ids, int) else list(ids or [])
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    return ids


class ChoiceTrie:
    """Allowed next token ids given the ids generated so far, for a fixed set of strings."""

    def __init__(self, tokenizer, choices: list[str], eos: list[int]):
        if not choices:
            raise ValueError("choices must hold at least one string")
        self.eos = eos
        self.by_ids: dict[tuple[int, ...], str] = {}
        self.next: dict[tuple[int, ...], set[int]] = {}
        for choice in choices:
            ids = tuple(tokenizer(choice, add_special_tokens=False).input_ids)
            self.by_ids.setdefault(ids, choice)
            for i in range(len(ids)):
                self.next.setdefault(ids[:i], set()).add(ids[i])

    def allowed(self, generated: tuple[int, ...]) -> list[int]:
        allowed = set(self.next.get(generated, ()))
        if generated in self.by_ids or not allowed:
            allowed.update(self.eos)      # a complete choice (or a dead end) may only stop
        return sorted(allowed)

    def match(self, generated: tuple[int, ...]) -> str | None:
        return self.by_ids.get(tuple(t for t in generated if t not in self.eos))


class TransformersBackend:
    def __init__(self, name: str, entry: ModelEntry):
        self.name, self.entry = name, entry
        self.path = entry.resolved_path()
        self.endpoint = f"in-process:{self.path}"
        # Load here, before the gateway starts its clock: latency measures generation only.
        try:
            self.tokenizer, self.model = load_model(self.path, entry.dtype, entry.device)
            self.batcher = _batchers[(self.path, entry.dtype, entry.device)]
        except (OSError, ValueError) as exc:
            raise AttemptError(f"cannot load a transformers model from {self.path!r}: {str(exc)[:300]}",
                               endpoint=self.endpoint, retryable=False) from None

    def _render(self, tokenizer, request: BackendRequest) -> list[int]:
        from orchestrator.chat_template import prompt_ids   # the renderer training uses (TokenPolicy)
        return prompt_ids(tokenizer, request.messages, request.tools)

    def _generate_kwargs(self, request: BackendRequest, tokenizer, eos: list[int]) -> dict:
        unknown = set(request.extra) - set(SUPPORTED_EXTRA)
        if unknown:
            raise AttemptError(f"{self.name}: backend transformers does not take {sorted(unknown)}; "
                               f"supported extras: {list(SUPPORTED_EXTRA)}", endpoint=self.endpoint, retryable=False)
        greedy = request.temperature == 0
        kwargs: dict[str, Any] = dict(max_new_tokens=request.max_tokens, do_sample=not greedy,
                                      eos_token_id=eos, pad_token_id=pad_id(tokenizer, eos))
        if not greedy:
            # vLLM semantics: no top-k unless asked for.
            kwargs.update(temperature=1.0 if request.temperature is None else request.temperature, top_p=request.extra.get("top_p", 1.0),
                          top_k=request.extra.get("top_k", 0))
        if "repetition_penalty" in request.extra:
            kwargs["repetition_penalty"] = request.extra["repetition_penalty"]
        if request.extra.get("stop"):
            stop = request.extra["stop"]
            kwargs.update(stop_strings=[stop] if isinstance(stop, str) else list(stop), tokenizer=tokenizer)
        return kwargs

    def _job(self, request: BackendRequest, prompt: list[int], kwargs: dict, trie) -> Job:
        """A batcher job; requests batch together only when every generate setting agrees."""
        seed = int(request.extra["seed"]) if "seed" in request.extra else None
        settings = tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                for k, v in kwargs.items() if k != "tokenizer"))
        group = settings + (("choices", trie is not None),) + ((("seed", object()),) if seed is not None else ())
        return Job(prompt=prompt, kwargs=kwargs, group=group, deadline=time.monotonic() + request.timeout,
                   allowed=trie.allowed if trie is not None else None, seed=seed)

    def attempt(self, request: BackendRequest) -> BackendResult:
        tokenizer, model = self.tokenizer, self.model
        eos = eos_ids(tokenizer, model)
        prompt = self._render(tokenizer, request)
        kwargs = self._generate_kwargs(request, tokenizer, eos)
        trie = ChoiceTrie(tokenizer, request.choices, eos) if request.choices is not None else None
        job = self._job(request, prompt, kwargs, trie)
        generated = self.batcher.run(job)
        stopped = next((i for i, t in enumerate(generated) if t in eos), None)
        if stopped is not None:
            generated = generated[:stopped + 1]     # drop padding after end-of-sequence
        text = tokenizer.decode(generated, skip_special_tokens=True)
        hit_stop = False
        for stop in kwargs.get("stop_strings", ()):
            if stop in text:      # vLLM semantics: the stop string is not part of the reply
                text, hit_stop = text[:text.index(stop)], True
        finish = "stop" if stopped is not None or hit_stop else "length"
        if finish == "length" and len(generated) < request.max_tokens and time.monotonic() >= job.deadline:
            raise AttemptError(f"timed out after {request.timeout:g} s ({len(generated)} tokens generated)",
                               endpoint=self.endpoint, retryable=False)
        if trie is not None:
            text = trie.match(tuple(generated)) or text
        return BackendResult(text=text, usage=Usage(len(prompt), len(generated)),
                             endpoint=self.endpoint, finish_reason=finish)
