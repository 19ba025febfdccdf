"""log p(target) = log_softmax(hidden @ W^T / T)[target] without the full [N, V] logits.

`linear_logprobs(hidden, weight, targets, temperature)` is the LM head + log-softmax + gather
of `training.ppo.response_logprobs`, computed over chunks of rows: each chunk's logits
([rows, V], float32) exist only while that chunk is worked on, in the forward and again
(recomputed) in the backward, which needs only the per-row log-sum-exp from the forward.
For Qwen3's 151,936-token vocabulary and 14k response tokens that is ~2.5 GB of float32 at a
time instead of ~9 GB of logits plus as much again for their gradient.

Numerics: the matrix product runs in the autocast dtype when autocast is on (else in
`hidden`'s dtype), the softmax in float32, as `lm_head(hidden).float()` then
`logits - logsumexp` would.  The gradient is the exact one:
d logp_i / d logits_ij = (1[j = t_i] - softmax_ij) / T.

On CUDA the per-chunk softmax arithmetic is a `torch.compile`d function (one fused pass over
the chunk's logits instead of several); on the CPU it runs eagerly (same formulas).

`compiled_layers(model)`: inside the block, on CUDA, the decoder layers run through
`torch.compile` (regional compilation: the layers share their code, so one compiled graph
serves all of them; RMSNorm, rotary, SiLU-gate and residual arithmetic become a few fused
kernels).  Only the training forward passes use it (`training.ppo.response_logprobs`);
the rollout engine, sharing the same module, is not affected.  Off on the CPU, with gradient
checkpointing, with DeepSpeed ZeRO-3 (its per-module gather hooks inside the compiled region
recompile per layer until dynamo's limit; measured slower than eager on two H200s), or with
`model.compile_update: false` (`set_layer_compile`).  Shapes are dynamic from the first pass (`compile_dynamic`: rows and
sequence length symbolic, no duck sizing), so the first passes compile one graph per kind of
pass (the reference's and the old policy's no-grad forwards, the policy's forward + backward)
and later lengths reuse them; before, each kind compiled static first and again dynamic when
the length first changed (docs/benchmarks.md "cold compile").
"""
from __future__ import annotations

import contextlib
import functools

import torch

from orchestrator.engines.compile_regions import compile_dynamic

CHUNK_ELEMENTS = 1 << 28            # float32 logits per chunk: 1 GiB


def _chunk_forward(logits: torch.Tensor, targets: torch.Tensor, temperature: float):
    """logits [C, V] (matmul dtype), targets [C] -> (log p(target) [C], logsumexp [C]), float32."""
    z = logits.float() / temperature                                         # [C, V]
    lse = torch.logsumexp(z, dim=-1)                                          # [C]
    return z.gather(-1, targets[:, None])[:, 0] - lse, lse


def _chunk_backward(logits: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, grad: torch.Tensor,
                    temperature: float) -> torch.Tensor:
    """d loss / d logits [C, V] in the logits' dtype, given d loss / d logp = grad [C]."""
    p = torch.exp(logits.float() / temperature - lse[:, None])               # softmax [C, V]
    onehot = torch.arange(p.shape[-1], device=p.device) == targets[:, None]  # [C, V]
    return ((onehot.float() - p) * (grad / temperature)[:, None]).to(logits.dtype)


COMPILE_BACKEND = "inductor"        # torch.compile's backend here (the tests count graphs with "eager")


@functools.cache
def _compiled(fn):
    return compile_dynamic(fn, COMPILE_BACKEND)


def _kernel(fn, device: torch.device):
    return _compiled(fn) if device.type == "cuda" else fn


def _matmul_dtype(hidden: torch.Tensor) -> torch.dtype:
    kind = hidden.device.type
    return torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else hidden.dtype


class _LinearLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, chunk: int):
        dtype = _matmul_dtype(hidden)
        h, w = hidden.to(dtype), weight.to(dtype)
        out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
        lse = torch.empty_like(out)
        fwd = _kernel(_chunk_forward, h.device)
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, h.shape[0], chunk):
                out[s:s + chunk], lse[s:s + chunk] = fwd(h[s:s + chunk] @ w.t(), targets[s:s + chunk], temperature)
        ctx.save_for_backward(h, w, targets, lse)
        ctx.temperature, ctx.chunk, ctx.dtypes = temperature, chunk, (hidden.dtype, weight.dtype)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, w, targets, lse = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[:2]
        grad_h = torch.empty_like(h) if need_h else None
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device) if need_w else None
        bwd = _kernel(_chunk_backward, h.device)
        chunk = ctx.chunk
        with torch.autocast(h.device.type, enabled=False):
            for s in range(0, h.shape[0], chunk):
                hc = h[s:s + chunk]
                g = bwd(hc @ w.t(), targets[s:s + chunk], lse[s:s + chunk], grad_out[s:s + chunk].float(),
                        ctx.temperature)
                if need_h:
                    grad_h[s:s + chunk] = g @ w
                if need_w:
                    grad_w += (g.t() @ hc).float()
        hidden_dtype, weight_dtype = ctx.dtypes
        return (grad_h.to(hidden_dtype) if need_h else None, grad_w.to(weight_dtype) if need_w else None,
                None, None, None)


def linear_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                    temperature: float = 1.0, chunk: int | None = None) -> torch.Tensor:
    """log_softmax((hidden @ weight^T) / T)[targets] -> [N] float32, chunked over the N rows.

    hidden [N, H], weight [V, H] (the LM head / tied embeddings), targets [N] token ids;
    T <= 0 means no temperature scaling.  `chunk`: rows per chunk (default: 1 GiB of float32
    logits).  Differentiable in hidden and weight.
    """
    rows = chunk or max(1, CHUNK_ELEMENTS // weight.shape[0])
    return _LinearLogprobs.apply(hidden, weight, targets, temperature if temperature > 0 else 1.0, rows)


def set_layer_compile(model, enabled: bool) -> None:
    """`model.compile_update` for this model: false keeps its training passes eager."""
    model._toolorchestra_compile_layers = bool(enabled)


def _compile_enabled(model, device: torch.device) -> bool:
    return (device.type == "cuda" and getattr(model, "_toolorchestra_compile_layers", True)
            and not getattr(model, "is_gradient_checkpointing", False)
            and not hasattr(next(model.parameters(), None), "ds_id"))   # ZeRO-3 partitioned parameters


@contextlib.contextmanager
def compiled_layers(model, device: torch.device):
    """Run `model`'s decoder layers compiled inside the block (see the module docstring)."""
    layers = getattr(model.get_decoder(), "layers", None)
    if layers is None or not _compile_enabled(model, device):
        yield
        return
    for layer in layers:
        if "forward" not in vars(layer):
            layer.forward = _compiled_forward(layer)
    try:
        yield
    finally:
        for layer in layers:
            vars(layer).pop("forward", None)


def _compiled_forward(layer):
    cached = getattr(layer, "_toolorchestra_compiled", None)
    if cached is None:
        cached = compile_dynamic(layer.forward, COMPILE_BACKEND)
        object.__setattr__(layer, "_toolorchestra_compiled", cached)
    return cached
