"""What the static decoder patches into the model for its decode steps (orchestrator/engines/hf_static.py).

- Attention functions for one query token per row over a static grouped KV cache, registered with
  transformers' `AttentionInterface` under `ATTENTIONS[...]`: `decode_attention` (the query heads
  of a KV head as that head's query rows in one SDPA call, so the cache is not repeated per query
  head), `decode_attention_matmul` (the same as two matmuls and a float32 softmax) and
  `decode_attention_split` (split-KV Triton kernels, split_kv_attention.py). Longer queries
  (prefill) take the stock SDPA path.
- Fused projections: the q/k/v and gate/up linear layers of known decoder classes run as one GEMM
  each (`fusable_groups`), the original layers whenever gradients are on.
"""
from __future__ import annotations

import torch

from orchestrator.engines.split_kv_attention import split_decode_attention

DECODE_ATTENTION = "toolorchestra_static_decode"


def decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function: one query token per row over a static grouped KV
    cache, without repeating the KV heads; longer queries (prefill) take the stock SDPA path.
    query [B, H, 1, D], key/value [B, KV, L, D], attention_mask bool [B, 1, 1, S <= L]: only the
    first S slots are read -> [B, 1, H, D]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward  # lazy: heavy (seconds to import)

    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, heads, _, d = query.shape
    span = attention_mask.shape[-1]                                  # the slots written so far (rounded up)
    key, value = key[:, :, :span], value[:, :, :span]
    q = query.reshape(b, key.shape[1], heads // key.shape[1], d)   # the heads of one KV head as its query rows
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, 1, heads, d), None


def decode_attention_matmul(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                            **kwargs):
    """`decode_attention` written as two batched matmuls and a float32 softmax (plain torch ops
    that the compiler can fuse with the mask and the scaling) instead of one SDPA call."""
    if query.shape[2] != 1:
        return decode_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                **kwargs)
    b, heads, _, d = query.shape
    span = attention_mask.shape[-1]
    key, value = key[:, :, :span], value[:, :, :span]
    q = query.reshape(b, key.shape[1], heads // key.shape[1], d)            # [B, KV, G, D]
    scores = torch.matmul(q, key.transpose(-1, -2)).float() * (d ** -0.5 if scaling is None else scaling)
    scores = scores.masked_fill(~attention_mask, float("-inf"))             # [B, KV, G, S]
    out = torch.matmul(scores.softmax(dim=-1).to(value.dtype), value)        # [B, KV, G, D]
    return out.reshape(b, 1, heads, d), None


def decode_attention_split(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                           **kwargs):
    """`decode_attention` as one fused split-KV (flash-decoding) pass: the Triton kernels of
    orchestrator/engines/split_kv_attention.py on CUDA (the query heads of a KV head share one read of
    its slots, online softmax per split, then a reduction), their torch reference elsewhere."""
    if query.shape[2] != 1:
        return decode_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                **kwargs)
    return split_decode_attention(query, key, value, attention_mask, scaling), None


ATTENTIONS = {"sdpa": DECODE_ATTENTION, "matmul": DECODE_ATTENTION + "_matmul",
              "triton": DECODE_ATTENTION + "_split"}


def register_attention() -> None:
    from transformers import AttentionInterface  # lazy: heavy (seconds to import)

    AttentionInterface.register(DECODE_ATTENTION, decode_attention)
    AttentionInterface.register(ATTENTIONS["matmul"], decode_attention_matmul)
    AttentionInterface.register(ATTENTIONS["triton"], decode_attention_split)


# projections that read the same input, in the order these classes' forwards call them
_FUSABLE = {"attention": (("Qwen3Attention", "LlamaAttention", "MistralAttention"), ("q_proj", "k_proj", "v_proj")),
            "mlp": (("Qwen3MLP", "LlamaMLP", "MistralMLP"), ("gate_proj", "up_proj"))}


class FusedGroup:
    """Linear layers (no bias) of one module that read the same input: one GEMM over their
    weights concatenated (a copy, refreshed from the layers before each generation)."""

    def __init__(self, owner, names):
        self.owner, self.names = owner, names
        self.layers = [getattr(owner, n) for n in names]
        self.sizes = [m.out_features for m in self.layers]
        self.weight = torch.cat([m.weight.detach() for m in self.layers])
        self.parts = None
        self.members = [_FusedPart(self, i) for i in range(len(names))]

    def refresh(self) -> None:
        torch.cat([m.weight.detach() for m in self.layers], out=self.weight)


class _FusedPart(torch.nn.Module):
    """Stands in for layer `index` of a `FusedGroup`: the first one called runs the fused GEMM,
    each returns its slice (the owner's forward calls them in order, on the same input).  With
    gradients on (grad mode is per thread: a training forward elsewhere while a generation runs)
    it is the original layer."""

    def __init__(self, group: FusedGroup, index: int):
        super().__init__()
        self.index, self.last = index, index == len(group.sizes) - 1
        self.__dict__["group"] = group                    # not a submodule
        self.__dict__["layer"] = group.layers[index]

    def forward(self, x):
        if torch.is_grad_enabled():
            return self.layer(x)
        group = self.group
        if self.index == 0:
            group.parts = torch.nn.functional.linear(x, group.weight).split(group.sizes, dim=-1)
        out = group.parts[self.index]
        if self.last:
            group.parts = None
        return out


def fusable_groups(model) -> list[FusedGroup]:
    """The q/k/v and gate/up projections of the known decoder classes (bias-free nn.Linear)."""
    groups = []
    for module in model.modules():
        for classes, names in _FUSABLE.values():
            if type(module).__name__ not in classes:
                continue
            layers = [getattr(module, n, None) for n in names]
            if all(type(m) is torch.nn.Linear and m.bias is None for m in layers) and \
                    len({(m.in_features, m.weight.dtype, m.weight.device) for m in layers}) == 1:
                groups.append(FusedGroup(module, names))
    return groups
