"""Loading the policy and building its optimizer: the set-up pieces the single-process trainer
(training/train.py) and the Ray workers (training/distributed/) share."""
from __future__ import annotations

import math
from pathlib import Path

import torch

from training.config import ConfigError, TrainConfig
from training.precision import Precision


def load_policy(path: str, dtype: str, device: str, *, frozen: bool = False):
    """(model, tokenizer) for `model.dtype` = `dtype` (training/precision.py): the trained
    policy in its parameter dtype (float32 master weights for bfloat16), a `frozen` one
    (the KL reference) in the compute dtype."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: heavy (seconds to import)

    if not Path(path).exists():
        raise ConfigError(f"model.path: {path!r} does not exist (a Hugging Face model folder)")
    precision = Precision.of(dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=precision.frozen if frozen else precision.params)
    model = model.to(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer   # eval: no dropout, so training log-probs match sampling


def make_optimizer(model, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW over the policy's parameters (float32 for model.dtype bfloat16, see
    training/precision.py); the fused CUDA kernel on a GPU (one launch, not one per tensor)."""
    o = cfg.optim
    return torch.optim.AdamW(model.parameters(), lr=o.lr, betas=tuple(o.betas), eps=o.eps,
                             weight_decay=o.weight_decay, fused=torch.device(cfg.run.device).type == "cuda")


def make_scheduler(optimizer, kind: str, warmup: int, total: int):
    def factor(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return {"constant": 1.0, "linear": max(0.0, 1 - progress),
                "cosine": 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))}[kind]
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def reference_path(cfg: TrainConfig) -> str:
    """The frozen KL reference's folder: the initial policy (model.reference: same) or another."""
    return cfg.model.path if cfg.model.reference == "same" else cfg.model.reference


def pad_token_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
