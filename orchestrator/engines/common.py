"""What every rollout engine shares: request validation, per-row seeds, EOS ids, stop strings.

Kept engine-neutral so the transformers and vLLM engines agree on the same semantics:

- row `i` of a `generate` call is sampled with seed `params.seed + i` (None: unseeded), so a
  group of identical prompts gives different, reproducible samples;
- generation stops at an EOS id, at `max_tokens`, or at the first token whose decoded text
  completes one of `params.stop`; the stop string stays in `token_ids` and `text` (what the
  trainer sees is exactly what was generated);
- `Generation.text` is `tokenizer.decode(token_ids, skip_special_tokens=True)`.
"""
from __future__ import annotations

import json
from pathlib import Path

from orchestrator.engines.interface import SamplingParams

# HFEngine's static-cache decoder: the most of the free GPU memory one batch shape's KV cache may
# take (else the step-by-step loop serves the call, with a warning).  The default leaves room for
# the trainer beside a shared engine; at 8B a 64 x 8k-token shape needs ~78 GB (docs/engines.md).
STATIC_MEMORY_FRACTION = 0.25


def check_memory_fraction(value, name: str) -> float:
    """`value` as a float in (0, 1]; else ValueError naming `name` (the setting that holds it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"{name}: must be a number in (0, 1] (the share of free GPU memory one batch "
                         f"shape's KV cache may take; docs/engines.md), got {value!r}")
    return float(value)


def validate_request(prompts: list[list[int]], params: SamplingParams, vocab_size: int,
                     max_len: int | None = None) -> None:
    """Raise ValueError naming the bad field of a `generate` call (prompts as token ids)."""
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("generate(prompts=...): expected a non-empty list of token-id lists")
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)) or not p:
            raise ValueError(f"generate: prompts[{i}] must be a non-empty list of token ids "
                             f"(tokenize text first, e.g. tokenizer(text)['input_ids'])")
        bad = [t for t in p if not isinstance(t, int) or not 0 <= t < vocab_size]
        if bad:
            raise ValueError(f"generate: prompts[{i}] holds ids outside [0, {vocab_size}): {bad[:5]}")
        if max_len is not None and len(p) + params.max_tokens > max_len:
            raise ValueError(f"generate: prompts[{i}] has {len(p)} tokens + max_tokens="
                             f"{params.max_tokens} > the engine's max_model_len={max_len}; "
                             "shorten the prompt, lower max_tokens or raise max_model_len")
    if params.temperature < 0:
        raise ValueError(f"SamplingParams.temperature={params.temperature} must be >= 0 (0: greedy)")
    if not 0 < params.top_p <= 1:
        raise ValueError(f"SamplingParams.top_p={params.top_p} must lie in (0, 1]")
    if params.max_tokens < 1:
        raise ValueError(f"SamplingParams.max_tokens={params.max_tokens} must be >= 1")
    if params.choices is not None and (not params.choices or not all(
            isinstance(c, str) and c for c in params.choices)):
        raise ValueError("SamplingParams.choices must be None or a non-empty list of non-empty strings")
    if params.grammar is not None and (not isinstance(params.grammar, str) or not params.grammar.strip()):
        raise ValueError("SamplingParams.grammar must be None or a non-empty EBNF grammar string")
    if params.choices is not None and params.grammar is not None:
        raise ValueError("SamplingParams: set at most one of choices and grammar")
    if any(not isinstance(s, str) or not s for s in params.stop):
        raise ValueError(f"SamplingParams.stop must be a list of non-empty strings, got {params.stop!r}")


def row_seeds(params: SamplingParams, n: int) -> list[int | None]:
    """Seed of each of the `n` rows of one call: `seed + i`, or None when unseeded."""
    return [None if params.seed is None else params.seed + i for i in range(n)]


def eos_token_ids(tokenizer, model_dir: str | Path | None = None, generation_config=None) -> list[int]:
    """EOS ids: the tokenizer's plus the model's generation config's (deduplicated, ordered)."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    extra = getattr(generation_config, "eos_token_id", None)
    if extra is None and model_dir is not None and (Path(model_dir) / "generation_config.json").exists():
        extra = json.loads((Path(model_dir) / "generation_config.json").read_text()).get("eos_token_id")
    for t in ([extra] if isinstance(extra, int) else extra or []):
        if t not in ids:
            ids.append(t)
    if not ids:
        raise ValueError("the tokenizer defines no eos_token and the model's generation_config "
                         "no eos_token_id: set tokenizer.eos_token before building the engine")
    return ids


def completes_stop(tokenizer, token_ids: list[int], stops: list[str]) -> bool:
    """True when the newest token completes one of `stops` in the decoded response.

    Decodes only a tail long enough to hold the longest stop string (a token is at least
    one character, plus slack for byte-level pieces), so the check is O(1) per step.
    """
    if not stops:
        return False
    tail = token_ids[-(max(len(s) for s in stops) + 4):]
    text = tokenizer.decode(tail, skip_special_tokens=False)
    return any(s in text for s in stops)


def decode(tokenizer, token_ids: list[int]) -> str:
    return tokenizer.decode(token_ids, skip_special_tokens=True)
