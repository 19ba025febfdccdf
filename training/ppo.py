"""The policy update of one GRPO step: trainer log-probs and clipped PPO over per-turn samples.

    metrics = ppo_update(model, reference, optimizer, samples, loss_fn, ...)   # clipped PPO + mse KL

Old log-probs (the PPO ratio's denominator) are *recomputed with the trained model*, not
taken from the engine, by default (`algorithm.old_logprobs: recompute`): the engine's
log-probs are those of the *constrained, temperature-scaled sampler* (renormalised over
the tokens a choice constraint allows), and a vLLM engine computes them with other
kernels/precision, so their ratio to the trainer's log-probs would not be 1 even before
any update.  With 1 PPO epoch and 1 mini-batch (`ppo_mini_batch_size: 0`) the weights that
sampled are the weights being updated, so the old log-probs equal the current ones
exactly and we take them from the same forward pass (no extra pass); with more epochs or
mini-batches one extra no-grad pass runs before the first optimizer step.
`old_logprobs: engine` uses the engine's (importance-sampling-style, for unconstrained
decoding with an engine of the same precision).  `old_logprobs="decoupled"` (asynchronous
training, `algorithm.max_staleness > 0`): the ratio's denominator is recomputed as with
`recompute` (pi_prox) and the engine's log-probs (pi_behav) weight each token
(training/losses.py, AReaL's decoupled objective).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch

from training.logprobs import compiled_layers, linear_logprobs
from training.losses import PPOClipLoss
from training.samples import SampleBatch, TurnSample, collate_samples, token_logprobs


# ---------------------------------------------------------------------------- log-probs
def response_logprobs(model, batch: SampleBatch, temperature: float = 1.0) -> torch.Tensor:
    """log p(token t | tokens < t) at every response position of `batch`, 0 elsewhere. [B, L]

    Runs the decoder body over the whole sequence (over its last `receptive_field` tokens
    before the response where every layer attends within a sliding window: `receptive_crop`)
    but the LM head (the [*, V] part) only at the positions that predict a response token,
    which is most of the cost saved on long prompts.  Logits are divided by the sampling
    temperature (T > 0), so the log-probs are those of the distribution the rollouts were
    sampled from.
    """
    mask = batch.response_mask.bool()                                          # [B, L]
    rows, cols = mask.nonzero(as_tuple=True)                                   # [N], [N]
    ids, attention, positions, start = receptive_crop(batch, receptive_field(model.config))
    with compiled_layers(model, batch.input_ids.device):                      # CUDA: fused layer kernels
        hidden = model.get_decoder()(input_ids=ids, attention_mask=attention, position_ids=positions,
                                     use_cache=False).last_hidden_state      # [B, L', H]; no KV cache built
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError(f"{type(model).__name__}: the LM head has a bias; training/logprobs.py assumes none")
    h, targets = hidden[rows, cols - 1 - start[rows]], batch.input_ids[rows, cols]  # [N, H], [N]
    if hasattr(head.weight, "ds_id"):
        # DeepSpeed ZeRO-3 partitions the weight; only the module's own forward gathers it
        logits = head(h).float() / (temperature if temperature > 0 else 1.0)       # [N, V]
        logp = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    else:   # the LM head + log-softmax over chunks of rows: never the full [N, V] float32 logits
        logp = linear_logprobs(h, head.weight, targets, temperature)              # [N]
    out = torch.zeros(mask.shape, dtype=torch.float32, device=logp.device)    # [B, L]
    return out.index_put((rows, cols), logp)


def receptive_field(config) -> int | None:
    """How many tokens, itself included, a position's last hidden state can depend on when every
    layer attends within a sliding window of `config.sliding_window` (transformers' window: a query
    sees the `sliding_window` keys ending at itself, so each layer reaches `sliding_window - 1`
    further back); None when any layer attends globally (or the config names no layer types)."""
    types, window = getattr(config, "layer_types", None), getattr(config, "sliding_window", None)
    if not types or not window or any(t != "sliding_attention" for t in types):
        return None
    return len(types) * (window - 1) + 1


def receptive_crop(batch: SampleBatch, field: int | None):
    """(input_ids, attention_mask, position_ids, start) for the decoder: each row without the
    tokens before the receptive field (`field`) of its first response position, which no
    response log-prob depends on; positions keep their uncut numbers (rotary embeddings see the
    same positions), so the log-probs equal the uncut ones up to float rounding.  `start` [B]:
    the tokens cut from each row's left.  `field` None, or nothing to cut: the batch as it is
    (position_ids None, the model's own arange)."""
    rows = batch.input_ids.shape[0]
    none = torch.zeros(rows, dtype=torch.long, device=batch.input_ids.device)
    has = batch.response_mask.bool()
    if field is None or not has.any():
        return batch.input_ids, batch.attention_mask, None, none
    first = torch.where(has.any(1), has.float().argmax(1), torch.full_like(none, batch.input_ids.shape[1]))  # [B]
    start = (first - field).clamp(min=0)                       # the first response token's predictor is first - 1
    if not start.any():
        return batch.input_ids, batch.attention_mask, None, none
    width = int((batch.attention_mask.sum(1) - start).clamp(min=1).max())                 # right padding: length - start
    index = start[:, None] + torch.arange(width, device=start.device)[None]                  # [B, L']
    inside = index < batch.input_ids.shape[1]
    index = index.clamp(max=batch.input_ids.shape[1] - 1)
    return (batch.input_ids.gather(1, index), batch.attention_mask.gather(1, index) * inside, index, start)


def check_logprob_path(model, vocab_size: int, device) -> None:
    """Refuse models whose logits are not just `lm_head(decoder(x))` (e.g. soft-capped)."""
    ids = torch.randint(0, vocab_size, (1, 12), device=device)
    batch = SampleBatch(ids, torch.ones_like(ids), torch.zeros_like(ids), None, torch.zeros(1))
    batch.response_mask[:, 6:] = 1
    with torch.no_grad():
        fast = response_logprobs(model, batch)
        full = token_logprobs(model(input_ids=ids).logits, ids) * batch.response_mask
    # half-precision weights: the full logits are rounded to it, ~1e-2 on a log-prob; a
    # soft cap or a logit scale on a real model moves log-probs by whole units
    atol = 1e-4 if next(model.parameters()).dtype == torch.float32 else 5e-2
    if not torch.allclose(fast, full, atol=atol):
        raise ValueError(f"{type(model).__name__}: logits are not lm_head(decoder(x)) "
                         "(soft-capping or scaling?); training/ppo.py response_logprobs needs a path for it")


# ---------------------------------------------------------------------------- update
def _micro_batches(samples: Sequence[TurnSample], size: int) -> list[list[TurnSample]]:
    """Length-sorted chunks (less padding); token-mean over the step keeps the loss split-invariant."""
    order = sorted(samples, key=lambda s: len(s.prompt_ids) + len(s.response_ids))
    return [order[i:i + size] for i in range(0, len(order), size)]


@torch.no_grad()
def micro_logprobs(model, micro: list[list[TurnSample]], pad_id: int, temperature: float, device):
    """`response_logprobs` of each micro-batch, without gradients (reference / old policy)."""
    return [response_logprobs(model, collate_samples(m, pad_id).to(device), temperature) for m in micro]


def run_ppo_epochs(model, micro: list[list[list[TurnSample]]], tokens: Sequence[int], loss_fn: PPOClipLoss, *,
                   backward: Callable[[torch.Tensor], None], step: Callable[[], float], pad_id: int, device,
                   temperature: float, epochs: int = 1, ref_lp=None, old_lp=None, old_logprobs: str = "recompute",
                   seed: int = 0, filler: Sequence[Sequence[bool]] | None = None):
    """The PPO epochs over prepared micro-batches, shared by `ppo_update` (one process) and
    `training.distributed.update.rank_update` (one DeepSpeed rank).

    micro[k][b]: micro-batch b of mini-batch k; tokens[k]: mini-batch k's trainable tokens
    (every rank's), the loss's divisor.  ref_lp / old_lp: None or [k][b] log-probs (a None
    entry per mini-batch also allowed).  backward(loss) after each micro-batch, step() after
    each mini-batch, returning the gradient norm.  filler[k][b]: padding micro-batches (all
    tokens masked: zero loss) that still run backward but are not counted in the metrics.
    Returns (metric sums, counted micro-batches, grad norms)."""
    rng = np.random.default_rng(seed)
    sums: dict[str, float] = {}
    count, grad_norms = 0, []
    for _ in range(epochs):
        for k in rng.permutation(len(micro)):
            if not micro[k]:        # fewer samples than mini-batches: nothing to step on
                continue
            for b, m in enumerate(micro[k]):
                batch = collate_samples(m, pad_id).to(device)
                logp = response_logprobs(model, batch, temperature)                  # [B, L]
                if old_logprobs == "engine":
                    old = batch.old_logprobs
                else:   # recomputed (decoupled: this is pi_prox)
                    old = old_lp[k][b] if old_lp is not None and old_lp[k] is not None else logp.detach()
                ref = ref_lp[k][b] if ref_lp is not None and ref_lp[k] is not None else None
                extra = {"behav_logprobs": batch.old_logprobs} if old_logprobs == "decoupled" else {}
                loss, metrics = loss_fn(logp, old, batch.advantages, batch.response_mask, ref, num_tokens=tokens[k],
                                        **extra)
                backward(loss)
                if filler is not None and filler[k][b]:
                    continue
                for name, value in {"loss": loss, **metrics}.items():
                    sums[name] = sums.get(name, 0.0) + float(value.detach())
                count += 1
            grad_norms.append(step())
    return sums, count, grad_norms


def ppo_update(model, reference, optimizer, samples: Sequence[TurnSample], loss_fn: PPOClipLoss, *,
               pad_id: int, device, temperature: float, micro_batch_size: int, ppo_epochs: int = 1,
               mini_batches: int = 1, grad_clip: float = 1.0, old_logprobs: str = "recompute",
               seed: int = 0, scaler: torch.amp.GradScaler | None = None) -> dict[str, float]:
    """Clipped PPO on per-turn samples; returns means of the loss metrics over micro-batches.

    Each mini-batch is one optimizer step; its loss is the token mean over all of its
    micro-batches (`num_tokens` = the mini-batch's trainable tokens), so the update does
    not depend on `micro_batch_size`.  `scaler` (float16 compute, training/precision.py):
    losses are scaled before backward and gradients unscaled before clipping; a step whose
    gradients overflowed is skipped (its grad norm is reported as inf or nan).
    """
    steps = ppo_epochs * mini_batches
    chunks = np.array_split(np.arange(len(samples)), mini_batches)
    micro_all = [_micro_batches([samples[i] for i in idx], micro_batch_size) for idx in chunks]
    tokens = [sum(sum(s.loss_mask) for m in micro for s in m) for micro in micro_all]
    ref_lp = [micro_logprobs(reference, m, pad_id, temperature, device) for m in micro_all] if reference is not None else None
    old_lp = ([micro_logprobs(model, m, pad_id, temperature, device) for m in micro_all]
              if old_logprobs in ("recompute", "decoupled") and steps > 1 else None)

    def backward(loss: torch.Tensor) -> None:
        (scaler.scale(loss) if scaler is not None else loss).backward()

    def step() -> float:
        if scaler is not None:
            scaler.unscale_(optimizer)
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
        if scaler is not None:
            scaler.step(optimizer)          # skipped when a gradient is inf / nan
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm

    optimizer.zero_grad(set_to_none=True)
    sums, count, grad_norms = run_ppo_epochs(model, micro_all, tokens, loss_fn, backward=backward,
                                          step=step, pad_id=pad_id, device=device, temperature=temperature,
                                          epochs=ppo_epochs, ref_lp=ref_lp, old_lp=old_lp,
                                          old_logprobs=old_logprobs, seed=seed)
    out = {f"train/{k}": v / max(1, count) for k, v in sums.items()}
    # per-micro-batch losses are partial sums (divided by the mini-batch's tokens): report the total
    out["train/loss"] = sums.get("loss", 0.0) / max(1, steps)
    out["train/pg_loss"] = sums.get("pg_loss", 0.0) / max(1, steps)
    out["train/kl_loss"] = sums.get("kl_loss", 0.0) / max(1, steps)
    out["train/grad_norm"] = float(np.mean(grad_norms)) if grad_norms else 0.0
    return out
