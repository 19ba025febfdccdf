"""The orchestrator policy behind one small interface, `act(messages, tools, ...)`.

`choices` (a list of allowed responses) and `grammar` (an EBNF grammar) constrain decoding;
see orchestrator/engines/interface.py.

- `ChatPolicy`: any model the gateway reaches (GPT-5, a vLLM server, in-process
  transformers); records text and the backend's usage, no token ids.
- `TokenPolicy`: an `Engine` generating from token ids (training and the embedded
  default); records prompt ids, response ids and sampled log-probs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from orchestrator.chat_template import cut_middle, prompt_ids
from orchestrator.engines.interface import Engine, SamplingParams
from orchestrator.gateway import get_llm_response
from orchestrator.records import ToolCall, Usage


@dataclass
class PolicyOutput:
    text: str
    usage: Usage
    latency: float
    tool_calls: list[ToolCall] | None = None   # already parsed by the backend (None: parse text)
    prompt_ids: list[int] | None = None
    response_ids: list[int] | None = None
    logprobs: list[float] | None = None
    policy_version: int | None = None          # the engine weights' version (asynchronous training)


class ChatPolicy:
    """A policy served through LLM_CALL; `price_model` names its row in the price table."""

    def __init__(self, model: str, price_model: str | None = None, llm: Callable[..., Any] | None = None):
        self.model = model
        self.price_model = price_model or model
        self._llm = llm

    def act(self, messages, tools, *, choices=None, grammar=None, temperature=1.0, max_tokens=1024) -> PolicyOutput:
        if grammar is not None:
            raise ValueError(f"ChatPolicy({self.model}): grammar-constrained decoding (function-calling tasks "
                             "with constrained=true) needs a TokenPolicy over an Engine; turn constraining off")
        llm = self._llm or get_llm_response
        started = time.monotonic()
        r = llm(self.model, messages, tools=tools, temperature=temperature, max_tokens=max_tokens,
                price_model=self.price_model, choices=choices)
        return PolicyOutput(text=r.text, usage=r.usage, latency=time.monotonic() - started,
                            tool_calls=r.tool_calls or None)


class TokenPolicy:
    """A policy generating from token ids with an `Engine` (training, the embedded default).

    `max_prompt_tokens`: a templated prompt longer than this is cut in the middle
    (`cut_middle`, upstream training's truncation='middle'); None sends it whole."""

    def __init__(self, engine: Engine, price_model: str, max_prompt_tokens: int | None = None):
        self.engine = engine
        self.price_model = price_model
        self.max_prompt_tokens = max_prompt_tokens

    def act(self, messages, tools, *, choices=None, grammar=None, temperature=1.0, max_tokens=1024) -> PolicyOutput:
        tok = self.engine.tokenizer
        ids = prompt_ids(tok, messages, tools)
        if self.max_prompt_tokens is not None:
            ids = cut_middle(ids, self.max_prompt_tokens)
        started = time.monotonic()
        gen = self.engine.generate([ids], SamplingParams(
            temperature=temperature, max_tokens=max_tokens, choices=choices, grammar=grammar))[0]
        return PolicyOutput(text=gen.text, usage=Usage(len(ids), len(gen.token_ids)),
                            latency=time.monotonic() - started, prompt_ids=ids,
                            response_ids=list(gen.token_ids), logprobs=list(gen.logprobs),
                            policy_version=gen.policy_version)
