"""Per-turn training samples and their padded batch (PAPER.md §4).

A rollout of K turns gives up to K samples: prompt = that turn's rebuilt context
(`Turn.prompt_ids`), response = the tokens the policy generated in that turn
(`Turn.response_ids`), mask = `Turn.loss_mask`, old log-probs = `Turn.logprobs`, and
every turn carries its rollout's advantage.  Turns whose tool call was invalid are
dropped (training/filters.py), as are turns with no trainable token.

Batch layout ([B, L], right-padded): row b is prompt + response + padding.  Position t
of `old_logprobs` (and of `token_logprobs(...)`) holds log p(token t | tokens < t), so
the response tokens' log-probs sit at the response's own positions and the mask
selects them directly.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from orchestrator.records import Rollout, Turn
from training.filters import valid_turns


@dataclass
class TurnSample:
    """One orchestrator turn ready for the policy loss (token ids, not text)."""

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]                 # len(response_ids); 1 on policy-generated tokens
    old_logprobs: list[float] | None     # len(response_ids); None when the engine gave none
    advantage: float                     # the rollout's advantage (unitless)
    task_id: str
    turn_index: int
    policy_version: int | None = None    # the weights' version that generated the turn (asynchronous training)


@dataclass
class SampleBatch:
    """Right-padded tensors of B samples; L = longest prompt + response."""

    input_ids: torch.Tensor              # [B, L] long, padding = pad_token_id
    attention_mask: torch.Tensor         # [B, L] long, 1 on prompt and response tokens
    response_mask: torch.Tensor          # [B, L] long, 1 on trainable response tokens only
    old_logprobs: torch.Tensor | None    # [B, L] float32, 0 outside the response
    advantages: torch.Tensor             # [B] float32

    @property
    def num_tokens(self) -> int:
        """Trainable tokens in the batch (the token-mean denominator)."""
        return int(self.response_mask.sum())

    def to(self, device: torch.device | str) -> SampleBatch:
        move = lambda t: None if t is None else t.to(device)
        return SampleBatch(move(self.input_ids), move(self.attention_mask),
                           move(self.response_mask), move(self.old_logprobs),
                           move(self.advantages))


def build_turn_samples(rollouts: Sequence[Rollout],
                       advantages: Sequence[float] | torch.Tensor) -> list[TurnSample]:
    """Samples of every valid, trainable turn; `advantages[i]` goes to rollout i's turns.

    Args:
        rollouts: [N] rollouts (already filtered for a final answer and group std).
        advantages: [N] one advantage per rollout.
    """
    advantages = torch.as_tensor(advantages, dtype=torch.float64).reshape(-1).tolist()
    if len(advantages) != len(rollouts):
        raise ValueError(f"got {len(rollouts)} rollouts but {len(advantages)} advantages; "
                         "pass one advantage per rollout")
    samples = []
    for rollout, advantage in zip(rollouts, advantages):
        for turn in valid_turns(rollout):
            _check_turn(rollout, turn)
            if not any(turn.loss_mask):
                continue  # nothing the policy generated here; it would only cost compute
            samples.append(TurnSample(
                prompt_ids=list(turn.prompt_ids), response_ids=list(turn.response_ids),
                loss_mask=[int(m) for m in turn.loss_mask],
                old_logprobs=None if turn.logprobs is None else [float(x) for x in turn.logprobs],
                advantage=float(advantage), task_id=rollout.task_id, turn_index=turn.index,
                policy_version=turn.policy_version))
    return samples


def _check_turn(rollout: Rollout, turn: Turn) -> None:
    where = f"task {rollout.task_id!r} turn {turn.index}"
    if not turn.prompt_ids:
        raise ValueError(f"{where}: prompt_ids is empty or missing; the loop must record "
                         "the token ids of each turn's context")
    if not turn.response_ids:
        raise ValueError(f"{where}: response_ids is empty or missing; the loop must record "
                         "the generated token ids")
    n = len(turn.response_ids)
    if turn.loss_mask is None or len(turn.loss_mask) != n:
        got = None if turn.loss_mask is None else len(turn.loss_mask)
        raise ValueError(f"{where}: loss_mask has length {got}, response_ids {n}; "
                         "they must match one to one")
    if any(m not in (0, 1) for m in turn.loss_mask):
        raise ValueError(f"{where}: loss_mask must hold only 0 and 1")
    if turn.logprobs is not None and len(turn.logprobs) != n:
        raise ValueError(f"{where}: logprobs has length {len(turn.logprobs)}, "
                         f"response_ids {n}; they must match one to one")


def collate_samples(samples: Sequence[TurnSample], pad_token_id: int = 0) -> SampleBatch:
    """Right-pad samples into a `SampleBatch`.

    `old_logprobs` is a tensor when every sample has them and None when none has
    (the trainer then computes them with the current policy); a mix is an error.
    """
    if not samples:
        raise ValueError("no samples to collate: every turn was filtered out")
    with_logprobs = [s.old_logprobs is not None for s in samples]
    if any(with_logprobs) and not all(with_logprobs):
        raise ValueError("some samples have old log-probs and some do not; use one engine "
                         "setting (return log-probs) for the whole batch")
    b = len(samples)
    length = max(len(s.prompt_ids) + len(s.response_ids) for s in samples)
    input_ids = torch.full((b, length), pad_token_id, dtype=torch.long)    # [B, L]
    attention_mask = torch.zeros((b, length), dtype=torch.long)            # [B, L]
    response_mask = torch.zeros((b, length), dtype=torch.long)             # [B, L]
    old_logprobs = torch.zeros((b, length)) if all(with_logprobs) else None  # [B, L]
    for i, s in enumerate(samples):
        p, r = len(s.prompt_ids), len(s.response_ids)
        input_ids[i, :p + r] = torch.tensor(s.prompt_ids + s.response_ids)   # [p + r]
        attention_mask[i, :p + r] = 1
        response_mask[i, p:p + r] = torch.tensor(s.loss_mask)                # [r]
        if old_logprobs is not None:
            old_logprobs[i, p:p + r] = torch.tensor(s.old_logprobs)          # [r]
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)  # [B]
    return SampleBatch(input_ids, attention_mask, response_mask, old_logprobs, advantages)


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(input_ids[:, t] | input_ids[:, :t]) at position t, in the batch's layout.

    logits [B, L, V] from a causal LM on input_ids [B, L] -> [B, L] float32; position 0
    (no context) is 0.  Computed in float32 so bf16 logits do not round the ratio.
    """
    logits = logits[:, :-1].float()                                         # [B, L-1, V]
    targets = input_ids[:, 1:].unsqueeze(-1)                                # [B, L-1, 1]
    picked = logits.gather(-1, targets).squeeze(-1)                         # [B, L-1]
    logp = picked - torch.logsumexp(logits, dim=-1)                         # [B, L-1]
    return torch.nn.functional.pad(logp, (1, 0))                            # [B, L]


def mini_batch_count(n_samples: int, ppo_mini_batch_size: int) -> int:
    """Optimizer steps per PPO epoch for `n_samples` per-turn samples: ceil(n / size), at
    least 1; size 0 = one step.  Upstream (verl) cuts the step's samples into mini-batches of
    `ppo_mini_batch_size` (16 in its training script); we cut them into this many near-equal
    mini-batches (none larger than the size)."""
    if ppo_mini_batch_size < 0:
        raise ValueError(f"ppo_mini_batch_size must be >= 0, got {ppo_mini_batch_size}")
    if ppo_mini_batch_size == 0 or n_samples <= ppo_mini_batch_size:
        return 1
    return -(-n_samples // ppo_mini_batch_size)
