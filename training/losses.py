"""The policy loss of the paper's update (PAPER.md §5): clipped PPO with clip-higher,
dual clip for negative advantages, token-mean aggregation, and an "mse" KL loss to a
frozen reference.

All tensors are [B, L] and aligned with training/samples.py's batch: position t holds
the log-prob of token t.  `response_mask` [B, L] is 1 only on tokens the policy
generated in a trainable turn; prompt, tool output and padding positions are 0 and
never reach the loss, the KL or any metric, whatever values they hold (NaN included).

Per token, with ratio r = exp(logp - logp_old) and advantage A:

    clipped = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))
    loss    = min(clipped, -A c)   if A < 0   (dual clip: at most c |A|)
              clipped              otherwise
    kl      = 0.5 (logp - logp_ref)^2   ("mse")

    total = sum(mask * loss) / T + kl_coef * sum(mask * kl) / T,   T = masked tokens.

Asynchronous training (`algorithm.max_staleness > 0`) uses AReaL's decoupled objective: the
tokens were sampled by an older policy pi_behav (their engine log-probs), the ratio is taken
against the proximal policy pi_prox (the weights before this step's update, recomputed), and
each token's loss is weighted by w = pi_prox / pi_behav:

    r = exp(logp - logp_prox),   w = exp(logp_prox - logp_behav)   (no gradient through w)
    loss = w * (the clipped / dual-clipped term above, with this r)   where w <= cap,
           0                                                          where w > cap
    (dropped tokens stay in T: AReaL's behav_imp_weight_cap filters them out of the loss)

With fresh samples (pi_behav = pi_prox) w = 1 and this is the loss above exactly.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

# KL penalty per token, from (logp - logp_ref) [B, L]; all >= 0 except "k1".
KL_PENALTIES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "mse": lambda d: 0.5 * d.square(),     # the paper's choice ("k2")
    "k1": lambda d: d,
    "k3": lambda d: torch.expm1(-d) + d,   # exp(ref - logp) - (ref - logp) - 1
}


def masked_mean(values: torch.Tensor, mask: torch.Tensor, denominator: float | None = None) -> torch.Tensor:
    """sum(values where mask) / (denominator or the mask's token count); 0 for no tokens.

    values [B, L], mask [B, L] bool.  `torch.where` (not a product) so NaN/inf at masked
    positions cannot leak into the result or its gradient.
    """
    total = torch.where(mask, values, torch.zeros_like(values)).sum()  # []
    count = mask.sum() if denominator is None else torch.tensor(float(denominator), device=values.device)
    return total / count.clamp(min=1)


@torch.no_grad()
def behaviour_weights(prox_logprobs: torch.Tensor, behav_logprobs: torch.Tensor, mask: torch.Tensor,
                      cap: float, max_log_ratio: float = 20.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The decoupled objective's importance weight w = pi_prox / pi_behav per token, and the
    tokens that stay in the loss (masked and w <= `cap`; AReaL drops, not clips, the others).

    prox_logprobs / behav_logprobs / mask: [B, L]; returns (w [B, L], kept [B, L] bool), w = 1
    off the mask.  |logp_prox - logp_behav| is clamped to `max_log_ratio` before exp."""
    log_w = torch.where(mask, prox_logprobs - behav_logprobs, torch.zeros_like(prox_logprobs))   # [B, L]
    w = log_w.clamp(-max_log_ratio, max_log_ratio).exp()                                          # [B, L]
    return w, mask & (w <= cap)


class PPOClipLoss(nn.Module):
    """Clipped PPO policy loss + KL loss, token-mean over the batch's masked tokens.

    Args:
        eps_low: lower clip, ratio >= 1 - eps_low for A < 0 (paper: 0.2).
        eps_high: upper clip, ratio <= 1 + eps_high for A > 0 (paper: 0.28, "clip-higher").
        dual_clip: c > 1; the loss of a token with A < 0 is at most c |A| (paper: 10).
        kl_coef: weight of the KL loss (paper: 1e-4); 0 disables it.
        kl_type: key of `KL_PENALTIES` (paper: "mse").
        max_log_ratio: |logp - logp_old| is clamped to this before exp, so a
            stale token cannot overflow the ratio to inf (such tokens are clipped anyway).
        behav_weight_cap: decoupled objective only (`behav_logprobs` given): tokens whose
            w = pi_prox / pi_behav exceeds it leave the loss (AReaL's behav_imp_weight_cap; > 1).
    """

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.28, dual_clip: float = 10.0,
                 kl_coef: float = 1e-4, kl_type: str = "mse", max_log_ratio: float = 20.0,
                 behav_weight_cap: float = 5.0):
        super().__init__()
        if not (0 <= eps_low < 1 and eps_high >= 0):
            raise ValueError(f"need 0 <= eps_low < 1 and eps_high >= 0, got {eps_low}, {eps_high}")
        if dual_clip <= 1:
            raise ValueError(f"dual_clip must be > 1 (paper: 10), got {dual_clip}")
        if kl_type not in KL_PENALTIES:
            raise ValueError(f"unknown kl_type {kl_type!r}; choose one of {sorted(KL_PENALTIES)}")
        if kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0 (paper: 1e-4), got {kl_coef}")
        self.eps_low, self.eps_high, self.dual_clip = eps_low, eps_high, dual_clip
        if behav_weight_cap <= 1:
            raise ValueError(f"behav_weight_cap must be > 1 (AReaL's behav_imp_weight_cap), got {behav_weight_cap}")
        self.kl_coef, self.kl_type, self.max_log_ratio = kl_coef, kl_type, max_log_ratio
        self.behav_weight_cap = behav_weight_cap

    def forward(self, logprobs: torch.Tensor, old_logprobs: torch.Tensor,
                advantages: torch.Tensor, response_mask: torch.Tensor,
                ref_logprobs: torch.Tensor | None = None,
                num_tokens: float | None = None,
                behav_logprobs: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss and detached metrics of one (micro-)batch.

        Args:
            logprobs: [B, L] log p of each token under the policy being trained (grad).
            old_logprobs: [B, L] log p under the policy that sampled (no grad).
            advantages: [B] per sample, or [B, L] per token.
            response_mask: [B, L], 1 on trainable tokens.
            ref_logprobs: [B, L] under the frozen reference; None skips the KL loss.
            num_tokens: token-mean denominator; pass the masked-token count of the whole
                step when accumulating micro-batches, so the sum over micro-batches equals
                one big batch's loss whatever the split.  Default: this batch's count.
            behav_logprobs: [B, L] under the policy that sampled (engine), for the decoupled
                objective: `old_logprobs` is then pi_prox and each token's term is weighted by
                pi_prox / pi_behav (`behaviour_weights`).  None: the standard loss.

        Returns:
            (scalar loss, metrics): pg_loss, kl_loss (before kl_coef), clip_frac,
            clip_frac_low, clip_frac_high, dual_clip_frac, approx_kl (k3 of new vs
            old), ratio_mean, ratio_std; metrics are masked token means over this batch.
        """
        # Long because: half of it is the docstring of every tensor; the loss reads best in one piece.
        mask = response_mask.bool()                                                # [B, L]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(-1)                                  # [B, 1]
        advantages = advantages.expand_as(logprobs)                                # [B, L]
        zeros = torch.zeros_like(logprobs)
        log_ratio = torch.where(mask, logprobs - old_logprobs, zeros)              # [B, L]
        log_ratio = log_ratio.clamp(-self.max_log_ratio, self.max_log_ratio)
        ratio = log_ratio.exp()                                                    # [B, L]
        adv = torch.where(mask, advantages, zeros)                                 # [B, L]

        unclipped = -adv * ratio                                                   # [B, L]
        clipped = -adv * ratio.clamp(1 - self.eps_low, 1 + self.eps_high)          # [B, L]
        pg_clip = torch.maximum(unclipped, clipped)                                # [B, L]
        dual_bound = -adv * self.dual_clip                                         # [B, L]
        pg_tok = torch.where(adv < 0, torch.minimum(pg_clip, dual_bound), pg_clip)  # [B, L]
        pg_mask, decoupled, denominator = mask, {}, num_tokens
        if behav_logprobs is not None:   # decoupled objective (asynchronous training)
            w, pg_mask = behaviour_weights(old_logprobs, behav_logprobs, mask, self.behav_weight_cap,
                                           self.max_log_ratio)
            pg_tok = w * pg_tok                                                    # [B, L]
            decoupled = {"behav_weight_mean": masked_mean(w, mask),
                         "behav_capped_frac": masked_mean((mask & ~pg_mask).to(w.dtype), mask)}
            # dropped tokens (w > cap) contribute 0 but stay in the denominator (the step's token count)
            denominator = float(mask.sum()) if num_tokens is None else num_tokens
        pg_loss = masked_mean(pg_tok, pg_mask, denominator)                        # []
        loss = pg_loss

        kl_loss = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
        if ref_logprobs is not None and self.kl_coef > 0:
            ref_diff = torch.where(mask, logprobs - ref_logprobs, zeros)            # [B, L]
            kl_loss = masked_mean(KL_PENALTIES[self.kl_type](ref_diff), mask, num_tokens)
            loss = loss + self.kl_coef * kl_loss

        metrics = self._metrics(log_ratio.detach(), ratio.detach(), adv, mask, unclipped,
                                clipped, pg_clip, dual_bound)
        metrics.update(pg_loss=pg_loss.detach(), kl_loss=kl_loss.detach(), **decoupled)
        return loss, metrics

    @torch.no_grad()
    def _metrics(self, log_ratio, ratio, adv, mask, unclipped, clipped, pg_clip, dual_bound):
        """Masked token means over this batch; all inputs [B, L]."""
        low = mask & (adv < 0) & (ratio < 1 - self.eps_low)                        # [B, L]
        high = mask & (adv > 0) & (ratio > 1 + self.eps_high)                      # [B, L]
        dual = mask & (adv < 0) & (pg_clip > dual_bound)                           # [B, L]
        as_float = lambda m: m.to(ratio.dtype)
        return {
            "clip_frac": masked_mean(as_float(clipped > unclipped), mask),
            "clip_frac_low": masked_mean(as_float(low), mask),
            "clip_frac_high": masked_mean(as_float(high), mask),
            "dual_clip_frac": masked_mean(as_float(dual), mask),
            # k3 estimate of KL(old || new) on tokens sampled from old: r - 1 - log r >= 0
            "approx_kl": masked_mean(torch.expm1(log_ratio) - log_ratio, mask),
            "ratio_mean": masked_mean(ratio, mask),
            # the ratio's spread over the batch's tokens (0 on the first mini-batch of a step)
            "ratio_std": (masked_mean(ratio.square(), mask) - masked_mean(ratio, mask).square()).clamp(min=0).sqrt(),
        }
