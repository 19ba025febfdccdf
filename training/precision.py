"""What `model.dtype` means for training: the dtype of the trained weights (and so of AdamW's
state and updates) and the dtype the forward/backward math runs in.

| model.dtype | parameters + AdamW state | forward / backward |
|---|---|---|
| float32 | float32 | float32 |
| bfloat16 | float32 ("master weights") | bfloat16 autocast |
| float16 | float32 ("master weights") | float16 autocast, dynamic loss scaling |

Why bfloat16 keeps float32 parameters: bf16 holds 8 significant bits, so a weight of size
~0.02 moves only in steps of ~6e-5; AdamW's update at the paper's lr 1e-6 is ~1e-6 per
weight and rounds away to nothing (the weights never change).  With float32 parameters the
update lands, and autocast still runs the matrix products in bf16.  The frozen reference,
which has no optimizer, is kept in the compute dtype (half the memory).

float16 (for GPUs without bf16) has 3 more significant bits but a range that ends at 65504
and small gradients that flush to zero, so it also needs the loss scaled: `scaler` gives a
`torch.amp.GradScaler` (the loss multiplied by 2^16 to start, halved and the step skipped
when a gradient overflows, doubled after 2000 clean steps), saved in checkpoints.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Precision:
    params: torch.dtype                 # trained weights, gradients, AdamW state
    compute: torch.dtype | None = None  # autocast dtype of forward/backward; None: the params'

    @classmethod
    def of(cls, dtype: str) -> "Precision":
        """The precision `model.dtype` names ("float32" | "bfloat16" | "float16")."""
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"model.dtype: {dtype!r} is not one of float32, bfloat16, float16")
        if dtype in ("bfloat16", "float16"):
            return cls(torch.float32, getattr(torch, dtype))
        return cls(torch.float32)

    @property
    def frozen(self) -> torch.dtype:
        """dtype of a model that is never updated (the KL reference)."""
        return self.compute or self.params

    def scaler(self, device):
        """A loss scaler for float16 compute (see the module docstring), else None."""
        if self.compute != torch.float16:
            return None
        return torch.amp.GradScaler(torch.device(device).type)

    @property
    def rollout(self) -> str:
        """dtype name a separate rollout engine (vLLM, or HF in its own process) loads the
        weights in: the frozen dtype, i.e. what the training forward computes in."""
        return str(self.frozen).removeprefix("torch.")

    def autocast(self, device) -> contextlib.AbstractContextManager:
        """Context for forward/backward passes on `device` (a no-op without a compute dtype)."""
        if self.compute is None:
            return contextlib.nullcontext()
        return torch.autocast(torch.device(device).type, dtype=self.compute)
