"""training/losses.py: clipped PPO with clip-higher, dual clip, token-mean and mse KL.

Defaults under test: eps_low 0.2 (ratio floor 0.8), eps_high 0.28 (ceiling 1.28),
dual clip c = 10, KL coefficient 1e-4.  Single-token cases use old logp = 0, so the
log-ratio is the new logp itself.
"""
import math

import pytest
import torch

from training.losses import PPOClipLoss


def one_token(log_ratio, advantage, loss_fn=None):
    """Loss, d loss / d logp and metrics for one masked token with logp_old = 0."""
    loss_fn = loss_fn or PPOClipLoss(kl_coef=0.0)
    logp = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)  # [1, 1]
    loss, metrics = loss_fn(logp, torch.zeros(1, 1, dtype=torch.float64),
                            torch.tensor([advantage], dtype=torch.float64), torch.ones(1, 1))
    loss.backward()
    return loss.item(), logp.grad.item(), {k: v.item() for k, v in metrics.items()}


def test_positive_advantage_ratio_inside_the_clip_range():
    # ratio = e^0.1 = 1.10517 in [0.8, 1.28]: loss = -A r = -1.10517, grad = -A r
    loss, grad, m = one_token(0.1, 1.0)
    assert loss == pytest.approx(-math.exp(0.1))
    assert grad == pytest.approx(-math.exp(0.1))
    assert m["clip_frac"] == 0.0 and m["ratio_mean"] == pytest.approx(1.10517, rel=1e-5)


def test_positive_advantage_ratio_above_is_clipped_at_1_28():
    # ratio = e^0.5 = 1.6487, clipped to 1.28: loss = max(-1.6487, -1.28) = -1.28, grad 0
    loss, grad, m = one_token(0.5, 1.0)
    assert loss == pytest.approx(-1.28)
    assert grad == 0.0
    assert m["clip_frac"] == 1.0 and m["clip_frac_high"] == 1.0 and m["clip_frac_low"] == 0.0


def test_clip_higher_lets_a_positive_ratio_of_1_25_through():
    # ratio 1.25 would be clipped at 1.2 by a symmetric 0.2 clip; ceiling is 1.28 -> -1.25
    loss, grad, _ = one_token(math.log(1.25), 1.0)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25)


def test_positive_advantage_ratio_below_is_not_clipped():
    # ratio = e^-0.5 = 0.60653; clipped 0.8; loss = max(-0.60653, -0.8) = -0.60653 (pessimistic)
    loss, grad, m = one_token(-0.5, 1.0)
    assert loss == pytest.approx(-math.exp(-0.5)) and grad == pytest.approx(-math.exp(-0.5))
    assert m["clip_frac"] == 0.0


def test_negative_advantage_ratio_below_is_clipped_at_0_8():
    # A = -1, ratio 0.60653: -A r = 0.60653, -A clip = 0.8 -> loss 0.8, grad 0
    loss, grad, m = one_token(-0.5, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0
    assert m["clip_frac_low"] == 1.0 and m["clip_frac"] == 1.0


def test_negative_advantage_ratio_above_1_28_is_not_clipped():
    # A = -1, ratio 1.6487 (< c = 10): max(1.6487, 1.28) = 1.6487, grad = -A r = 1.6487
    loss, grad, m = one_token(0.5, -1.0)
    assert loss == pytest.approx(math.exp(0.5)) and grad == pytest.approx(math.exp(0.5))
    assert m["clip_frac"] == 0.0 and m["dual_clip_frac"] == 0.0


def test_dual_clip_bounds_negative_advantage_loss_by_c_times_abs_a():
    # A = -2, ratio = e^3 = 20.0855: -A r = 40.171 > c |A| = 10 * 2 = 20 -> loss 20, grad 0
    loss, grad, m = one_token(3.0, -2.0)
    assert loss == pytest.approx(20.0) and grad == 0.0
    assert m["dual_clip_frac"] == 1.0
    # approx_kl (k3) = r - 1 - log r = 20.0855 - 1 - 3 = 16.0855
    assert m["approx_kl"] == pytest.approx(math.exp(3) - 4)


def test_positive_advantage_huge_ratio_is_only_clipped():
    # A = 2, ratio e^3: loss = max(-40.17, -2 * 1.28) = -2.56 (the dual clip is for A < 0)
    loss, _, m = one_token(3.0, 2.0)
    assert loss == pytest.approx(-2.56) and m["dual_clip_frac"] == 0.0


def test_token_mean_over_the_whole_batch_not_mean_of_sequences():
    # ratio 1 everywhere, so each masked token's loss is -A.
    # row 0: A = 1, two masked tokens -> -1, -1; row 1: A = -2, one masked token -> +2
    # token mean = (-1 - 1 + 2) / 3 = 0 ; the mean of row means would be (-1 + 2) / 2 = 0.5
    logp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss, _ = PPOClipLoss(kl_coef=0.0)(logp, logp.clone(), torch.tensor([1.0, -2.0]), mask)
    assert loss.item() == pytest.approx(0.0)


def test_micro_batches_with_global_token_count_sum_to_the_full_batch_loss():
    torch.manual_seed(0)
    logp, old, ref = (torch.randn(4, 5, dtype=torch.float64) * 0.3 for _ in range(3))
    adv = torch.tensor([1.0, -0.5, 2.0, -3.0], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    loss_fn = PPOClipLoss(kl_coef=0.1)
    full, _ = loss_fn(logp, old, adv, mask, ref)
    total = int(mask.sum())  # 11 tokens
    parts = [loss_fn(logp[s], old[s], adv[s], mask[s], ref[s], num_tokens=total)[0]
             for s in (slice(0, 1), slice(1, 4))]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), rel=1e-12)


def test_mse_kl_loss_with_default_coefficient():
    # A = 0 -> policy loss 0.  logp - logp_ref = [0.3, 0.1] on two masked tokens:
    # kl = 0.5 * [0.09, 0.01] = [0.045, 0.005], mean 0.025; loss = 1e-4 * 0.025 = 2.5e-6
    # d loss / d logp_0 = 1e-4 * 0.3 / 2 tokens = 1.5e-5
    logp = torch.tensor([[0.3, 0.1, 7.0]], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([[0.0, 0.0, 0.0]], dtype=torch.float64)
    loss, m = PPOClipLoss()(logp, logp.detach(), torch.zeros(1, dtype=torch.float64),
                            torch.tensor([[1, 1, 0]]), ref)
    loss.backward()
    assert m["kl_loss"].item() == pytest.approx(0.025)
    assert loss.item() == pytest.approx(2.5e-6)
    assert logp.grad.tolist()[0] == pytest.approx([1.5e-5, 0.5e-5, 0.0])


def test_padding_and_tool_positions_change_nothing_and_get_zero_grad():
    # Same masked tokens; the masked positions hold garbage (NaN, inf, huge) in one copy.
    mask = torch.tensor([[0, 0, 1, 1, 0], [0, 1, 0, 1, 0]])  # 0 = prompt / tool output / padding
    clean = torch.tensor([[0.0, 0.0, -0.4, -1.2, 0.0], [0.0, -0.3, 0.0, -2.0, 0.0]])
    old = torch.tensor([[0.0, 0.0, -0.6, -1.0, 0.0], [0.0, -0.1, 0.0, -2.5, 0.0]])
    ref = torch.tensor([[0.0, 0.0, -0.5, -1.1, 0.0], [0.0, -0.2, 0.0, -2.2, 0.0]])
    junk = torch.tensor([[float("nan"), 50.0, 0.0, 0.0, -float("inf")],
                         [float("inf"), 0.0, -80.0, 0.0, float("nan")]])
    masked = mask == 0
    adv = torch.tensor([1.5, -2.0])
    loss_fn = PPOClipLoss(kl_coef=0.5)

    logp_a = clean.clone().requires_grad_()
    loss_a, m_a = loss_fn(logp_a, old, adv, mask, ref)
    logp_b = torch.where(masked, junk, clean).requires_grad_()
    loss_b, m_b = loss_fn(logp_b, torch.where(masked, -junk, old), adv, mask,
                          torch.where(masked, junk * 2, ref))
    (loss_a + loss_b).backward()

    assert torch.isfinite(loss_b) and loss_b.item() == pytest.approx(loss_a.item(), rel=1e-6)
    for key in m_a:
        assert m_b[key].item() == pytest.approx(m_a[key].item(), rel=1e-6), key
    for grad in (logp_a.grad, logp_b.grad):
        assert torch.isfinite(grad).all()
        assert (grad[masked] == 0).all()
        assert (grad[~masked] != 0).all()


def test_no_masked_tokens_gives_zero_loss_not_nan():
    logp = torch.zeros(1, 3, requires_grad=True)
    loss, m = PPOClipLoss()(logp, torch.zeros(1, 3), torch.ones(1), torch.zeros(1, 3), torch.zeros(1, 3))
    loss.backward()
    assert loss.item() == 0.0 and m["ratio_mean"].item() == 0.0
    assert (logp.grad == 0).all()


def test_per_token_advantages_are_accepted():
    # [B, L] advantages: tokens with A = +1 and A = -1 at ratio 1 -> (-1 + 1) / 2 = 0
    logp = torch.zeros(1, 2)
    loss, _ = PPOClipLoss()(logp, logp, torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    assert loss.item() == pytest.approx(0.0)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        PPOClipLoss(dual_clip=1.0)
    with pytest.raises(ValueError, match="unknown kl_type 'l2'.*mse"):
        PPOClipLoss(kl_type="l2")
    with pytest.raises(ValueError, match="kl_coef"):
        PPOClipLoss(kl_coef=-1.0)


# ---------------------------------------------------------------------------- decoupled (asynchronous)
def test_decoupled_objective_hand_worked():
    """AReaL's decoupled loss, w = pi_prox / pi_behav, r = pi / pi_prox, cap 5, T = 4 tokens:
      1. A=+1, pi .55, prox .5, behav .25: r 1.1 (inside), w 2        -> -2 * 1.1   = -2.2,  grad -2.2 / 4
      2. A=+1, pi .6,  prox .4, behav .4:  r 1.5 -> clipped 1.28, w 1 -> -1.28,              grad 0
      3. A=-1, pi .3,  prox .9, behav .1:  w 9 > cap: dropped          -> 0,                  grad 0
      4. A=-1, pi .3,  prox .2, behav .3:  r 1.5 (A<0: not clipped), w 2/3 -> 2/3 * 1.5 = 1, grad +1 / 4
    loss = (-2.2 - 1.28 + 0 + 1) / 4 = -0.62; the 5th position is padding (NaN there)."""
    nan = float("nan")
    p = lambda *xs: torch.tensor([[math.log(x) if x == x else x for x in xs]], dtype=torch.float64)
    logp = p(0.55, 0.6, 0.3, 0.3, nan).requires_grad_(True)                         # [1, 5]
    prox, behav = p(0.5, 0.4, 0.9, 0.2, nan), p(0.25, 0.4, 0.1, 0.3, nan)            # [1, 5]
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0, 0.0]], dtype=torch.float64)          # [1, 5]
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, m = PPOClipLoss(kl_coef=0.0, behav_weight_cap=5.0)(logp, prox, adv, mask, behav_logprobs=behav)
    loss.backward()
    assert loss.item() == pytest.approx(-0.62)
    assert logp.grad[0].tolist() == pytest.approx([-0.55, 0.0, 0.0, 0.25, 0.0])
    assert m["behav_weight_mean"].item() == pytest.approx((2 + 1 + 9 + 2 / 3) / 4)
    assert m["behav_capped_frac"].item() == pytest.approx(0.25)
    # a larger cap keeps token 3: + 9 * max(-A r, -A clip(r)) = 9 * 1/3 (r = 1/3, clipped 0.8: max(1/3, .8) = .8)
    loss_uncapped, _ = PPOClipLoss(kl_coef=0.0, behav_weight_cap=10.0)(logp, prox, adv, mask, behav_logprobs=behav)
    assert loss_uncapped.item() == pytest.approx((-2.2 - 1.28 + 9 * 0.8 + 1) / 4)


def test_decoupled_objective_with_fresh_samples_is_the_standard_loss_exactly():
    """pi_behav = pi_prox (no staleness): w = 1, same loss and gradient bit for bit."""
    torch.manual_seed(0)
    logp = torch.randn(3, 6, dtype=torch.float64)
    old = logp + 0.3 * torch.randn(3, 6, dtype=torch.float64)
    adv, mask = torch.randn(3, dtype=torch.float64), torch.rand(3, 6) > 0.3
    results = []
    for behav in (None, old.clone()):
        x = logp.clone().requires_grad_(True)
        loss, _ = PPOClipLoss(kl_coef=0.0)(x, old, adv, mask, num_tokens=11, behav_logprobs=behav)
        loss.backward()
        results.append((loss.detach(), x.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_behaviour_weight_cap_must_exceed_one():
    with pytest.raises(ValueError, match="behav_weight_cap must be > 1"):
        PPOClipLoss(behav_weight_cap=1.0)
