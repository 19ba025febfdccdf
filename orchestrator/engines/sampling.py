"""Sampling pieces of the in-process decoders (orchestrator/engines/hf.py, hf_static.py): the
nucleus filter both share, and the static decoder's counter-based Gumbel-max sampler (`sample_rows`)."""
from __future__ import annotations

import torch


def top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Set to -inf every token outside the nucleus of mass `top_p` (top-1 always kept). [A, V]"""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs           # mass of strictly better tokens
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit integer hash (xorshift-multiply rounds) of int64 tensors holding
    uint32 values; the multipliers are below 2**31 so no product leaves int64."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x27D4EB2D) & _M32
    x = x ^ (x >> 16)
    x = (x * 0x2C1B3C6D) & _M32
    return x ^ (x >> 15)


def hash_uniforms(keys: torch.Tensor, step: torch.Tensor | int, vocab: int) -> torch.Tensor:
    """U(0, 1) float32 [A, V]: one per (row key, step, token id); keys [A, 2] int64 (uint32 values).

    Counter-based: the value depends on those three only (not on the batch or on other draws).
    23 random bits each: (h >> 9 + 0.5) / 2**23, in [2**-24, 1 - 2**-24], never 0 or 1 in
    float32 (24 bits would round the largest value, (2**24 - 0.5) / 2**24, up to exactly 1,
    whose Gumbel noise is +inf: a uniformly random token)."""
    step = torch.as_tensor(step, device=keys.device).reshape(-1)[:1]
    row = _mix32(keys[:, :1] ^ _mix32(keys[:, 1:] ^ (step & _M32)))           # [A, 1]: this row at this step
    token = torch.arange(vocab, device=keys.device)                          # [V]
    h = _mix32(_mix32(token ^ row) ^ keys[:, 1:])                            # [A, V]
    return ((h >> 9).float() + 0.5) * (1.0 / (1 << 23))


def row_keys(seeds: list[int]) -> torch.Tensor:
    """[A, 2] int64: two uint32 keys per integer seed (splitmix64 of the seed)."""
    out = []
    for seed in seeds:
        z = (int(seed) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        z ^= z >> 31
        out.append([z & _M32, z >> 32])
    return torch.tensor(out, dtype=torch.long).reshape(-1, 2)


def sample_rows(logits: torch.Tensor, temperature: float, top_p: float, keys: torch.Tensor,
                step: torch.Tensor | int) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of float32 `logits` [A, V] and its log-prob under the sampling
    distribution softmax(top_p(logits / T)) (`HFEngine._next_tokens`' formulas).

    T > 0: Gumbel-max, argmax(scaled + G), G = -log(-log(U)) with U = `hash_uniforms(keys,
    step)`: an exact draw from softmax(scaled) (up to U's 24-bit resolution), and pointwise
    work plus two row reductions, which the compiler fuses into one pass over the logits."""
    if temperature == 0:
        scaled = logits
        tokens = logits.argmax(dim=-1)                                        # [A]
    else:
        scaled = logits / temperature
        if top_p < 1:
            scaled = top_p_filter(scaled, top_p)
        gumbel = -torch.log(-torch.log(hash_uniforms(keys, step, logits.shape[-1])))
        tokens = (scaled + gumbel).argmax(dim=-1)                             # [A]
    picked = scaled.gather(-1, tokens[:, None])[:, 0] - scaled.logsumexp(dim=-1)
    return tokens, picked
