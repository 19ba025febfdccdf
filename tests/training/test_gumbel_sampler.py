"""The static decoder's sampler (orchestrator/engines/hf_static.py `sample_rows`): Gumbel-max over
counter-based hash uniforms.  Checked on the CPU: its draws follow softmax(top_p(logits / T))
(chi-square over many independent rows), its log-probs are that distribution's, and a draw
depends only on (the row's seed, the step), not on the batch."""
from __future__ import annotations

import torch

from orchestrator.engines.sampling import top_p_filter
from orchestrator.engines.sampling import _M32, hash_uniforms, row_keys, sample_rows

LOGITS = torch.tensor([2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0, 1.5])
ROWS = 40_000


def _chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    keep = expected > 0
    assert counts[~keep].sum() == 0                       # never a zero-probability token
    return float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())


def _draw(temperature: float, top_p: float, step: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    keys = row_keys(list(range(1000, 1000 + ROWS)))
    return sample_rows(LOGITS.expand(ROWS, -1).clone(), temperature, top_p, keys, torch.tensor([step]))


def test_draws_follow_the_softmax_of_the_scaled_logits():
    for temperature in (1.0, 0.7):
        tokens, logprobs = _draw(temperature, 1.0)
        want = (LOGITS / temperature).softmax(-1)
        # 7 degrees of freedom: P(chi2 > 30) ~ 1e-4; the seeds are fixed, so this is deterministic
        assert _chi_square(tokens, want) < 30.0
        torch.testing.assert_close(logprobs, want.log()[tokens])


def test_top_p_draws_stay_in_the_nucleus_with_renormalised_log_probs():
    tokens, logprobs = _draw(1.0, 0.8)
    want = top_p_filter(LOGITS[None], 0.8)[0].softmax(-1)
    assert 0 < (want == 0).sum() < LOGITS.numel()
    assert _chi_square(tokens, want) < 30.0
    torch.testing.assert_close(logprobs, want.log()[tokens])


def test_greedy_is_the_argmax():
    tokens, logprobs = sample_rows(LOGITS.expand(3, -1).clone(), 0.0, 1.0, row_keys([1, 2, 3]), 0)
    assert tokens.tolist() == [0, 0, 0]
    torch.testing.assert_close(logprobs, LOGITS.log_softmax(-1)[[0, 0, 0]])


def test_a_row_depends_on_its_seed_and_step_only():
    logits = torch.randn(6, 1000)
    keys = row_keys([7, 8, 9, 10, 11, 12])
    tokens, _ = sample_rows(logits, 1.0, 1.0, keys, torch.tensor([3]))
    again, _ = sample_rows(logits.clone(), 1.0, 1.0, keys.clone(), torch.tensor([3]))
    assert tokens.tolist() == again.tolist()
    alone = [sample_rows(logits[i:i + 1], 1.0, 1.0, keys[i:i + 1], torch.tensor([3]))[0].item() for i in range(6)]
    assert alone == tokens.tolist()                                   # any batch, any split
    u = hash_uniforms(keys, 3, 1000)
    assert not torch.equal(u, hash_uniforms(keys, 4, 1000))           # a new step, new noise
    assert not torch.equal(u[0], u[1])                                 # rows differ
    assert 0 < u.min() and u.max() < 1 and abs(u.mean().item() - 0.5) < 0.01


def test_uniforms_stay_inside_0_1_at_the_extreme_hashes(monkeypatch):
    """A uniform of exactly 1 gives +inf Gumbel noise: its token wins whatever its probability
    (with 24-bit uniforms the largest hashes rounded to 1.0 in float32: over Qwen's 151,936-token
    vocabulary ~1% of row-steps).  Checked where it happens, at the largest and smallest 32-bit
    hashes (every mixing round made to return them), then over a real vocabulary."""
    from orchestrator.engines import sampling

    keys = row_keys(list(range(64)))
    for extreme in (_M32, 0):
        monkeypatch.setattr(sampling, "_mix32", lambda x, v=extreme: torch.full_like(x, v))
        u = hash_uniforms(keys, 3, 1000)
        assert 0 < u.min() and u.max() < 1, extreme
        logits = torch.zeros(64, 1000)
        tokens, logp = sample_rows(logits, 1.0, 1.0, keys, torch.tensor([3]))
        assert torch.isfinite(logp).all(), extreme
    monkeypatch.undo()
    # the real hash over a real vocabulary (two steps: ~2 s each on one CPU core)
    logits = torch.full((64, 151_936), -30.0)
    logits[:, 0] = 30.0                                   # token 0 has all the probability
    for step in (0, 11):
        u = hash_uniforms(keys, step, 151_936)
        assert 0 < u.min() and u.max() < 1, step
        tokens, logp = sample_rows(logits, 1.0, 1.0, keys, torch.tensor([step]))
        assert tokens.eq(0).all() and torch.isfinite(logp).all(), step
