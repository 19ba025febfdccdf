"""The one interface between the loop / trainer and whatever generates tokens.

An `Engine` generates from token ids and returns the sampled token ids and their
log-probs.  Implementations: in-process transformers (`orchestrator/engines/hf.py`) and
vLLM (`orchestrator/engines/vllm_engine.py`); both also accept new weights after a
policy step (`update_weights`).  The gateway's transformers backend serves a local model
through the same `HFEngine` and `BatchingEngine`, so a checkpoint is evaluated with the
sampler and constraints it was trained with.

Constrained decoding: `SamplingParams.choices`, when set, restricts the whole
response to exactly one of the given strings (then end-of-sequence).  The loop uses
it to force a parseable, valid `<tool_call>` from small or untrained policies.
`SamplingParams.grammar` (an EBNF grammar in xgrammar's dialect, which vLLM's structured
outputs also read) restricts the response to the grammar's language (then end-of-sequence);
the domain (tau2) episodes use it for calls that take arguments
(`orchestrator.toolcall.call_grammar`).  At most one of the two is set.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    choices: list[str] | None = None    # constrained decoding: the response is one of these
    grammar: str | None = None          # constrained decoding: the response matches this EBNF grammar
    # log-probs under the model's temperature-scaled distribution *before* the choices/grammar mask
    # (the distribution the trainer differentiates); False: under the constrained sampler.  HFEngine
    # only; asynchronous training (algorithm.max_staleness > 0) asks for them as behaviour log-probs
    unconstrained_logprobs: bool = False


@dataclass
class Generation:
    token_ids: list[int]                 # generated ids (no prompt), EOS included when emitted
    logprobs: list[float]                # log p of each generated id under the sampling policy
    text: str                            # decoded token_ids without special tokens
    finish_reason: str = "stop"          # "stop" | "length" | "timeout" (a deadline passed: HFEngine)
                                         # | "cancelled" (the caller went away: HFEngine)
    policy_version: int | None = None    # the weights' version that generated it (training.async_rollouts)


@runtime_checkable
class Engine(Protocol):
    """Generates continuations for a batch of prompts given as token ids."""

    tokenizer: object  # a transformers tokenizer (chat template, decode)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        ...

    def update_weights(self, state_dict_or_path) -> None:
        """Take the policy's new weights (a state dict or a saved folder)."""
        ...
