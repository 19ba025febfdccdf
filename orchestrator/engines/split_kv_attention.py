"""Split-KV ("flash-decoding") grouped-query decode attention: one query token per row against a
static KV cache, as one Triton kernel pass plus a small reduction on CUDA.

    q [B, H, 1, D], k / v [B, KV, L, D] (H = KV * G), keep bool [B, 1, 1, S <= L] (slot open) ->
    out [B, 1, H, D] = softmax(scale * q.K[:S]^T, masked) . V[:S]   per query head, its KV head h // G

Each program of the first kernel takes one (row, KV head, split): the G query heads of that KV
head share one read of the split's K and V slots, in blocks of BLOCK_N slots, with an online
softmax (running max m, running sum l, unnormalized accumulator acc, all float32).  With one split
it writes acc / l; with several, it writes (m, l, acc) per split and the second kernel combines
them: out = sum_s exp(m_s - M) acc_s / sum_s exp(m_s - M) l_s, M = max_s m_s.  No host
synchronization and shapes fixed by (B, S): capturable in a CUDA graph.

`split_decode_attention_reference` is the same split / block / online-softmax arithmetic in torch
(the specification, tested against plain softmax attention on the CPU, and the fallback off CUDA).
On CUDA `split_decode_attention` calls the kernels through a custom op (`torch.ops.toolorchestra.
split_decode_attention`), opaque to torch.compile.
"""
from __future__ import annotations

import math

import torch

BLOCK_N = 64


def num_splits(rows: int, kv_heads: int, span: int, block: int = BLOCK_N, programs: int = 512) -> int:
    """Splits of the span so that rows * kv_heads * splits reaches about `programs` programs
    (about 4 per multiprocessor of an H200), each split at least one block.  On the H200 at 64
    rows x 8 KV heads (512 programs) one split measured fastest: 0.61 / 0.66 / 0.73 ms for 1 / 2 / 4
    splits over 28 layers at 256 slots (docs/benchmarks.md)."""
    want = max(1, -(-programs // max(1, rows * kv_heads)))
    return max(1, min(want, -(-span // block)))


def _chunk(span: int, splits: int, block: int) -> int:
    """Slots per split: the span divided by the splits, rounded up to whole blocks."""
    return -(-(-(-span // splits)) // block) * block


def split_decode_attention_reference(q, k, v, keep, scale: float | None = None, splits: int | None = None,
                                     block: int = BLOCK_N):
    """The kernels' arithmetic in torch (float32): split the span into `splits` chunks of whole
    blocks, run the online softmax over each chunk's blocks, then combine the splits."""
    b, heads, _, d = q.shape
    kv = k.shape[1]
    g = heads // kv
    span = keep.shape[-1]
    scale = d ** -0.5 if scale is None else scale
    splits = num_splits(b, kv, span, block) if splits is None else splits
    chunk = _chunk(span, splits, block)
    qf = q.reshape(b, kv, g, d).float()                                         # [B, KV, G, D]
    open_ = keep.reshape(b, 1, 1, span)
    ms, ls, accs = [], [], []
    for s in range(splits):
        m = torch.full((b, kv, g), -math.inf)
        l = torch.zeros(b, kv, g)
        acc = torch.zeros(b, kv, g, d)
        for n0 in range(s * chunk, min((s + 1) * chunk, span), block):
            n1 = min(n0 + block, (s + 1) * chunk, span)
            scores = torch.einsum("bhgd,bhnd->bhgn", qf, k[:, :, n0:n1].float()) * scale
            scores = scores.masked_fill(~open_[..., n0:n1], -math.inf)
            m_new = torch.maximum(m, scores.amax(-1))
            m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
            alpha = torch.exp(m - m_safe)
            p = torch.exp(scores - m_safe[..., None])
            l = l * alpha + p.sum(-1)
            acc = acc * alpha[..., None] + torch.einsum("bhgn,bhnd->bhgd", p.to(v.dtype).float(),
                                                        v[:, :, n0:n1].float())
            m = m_new
        ms.append(m)
        ls.append(l)
        accs.append(acc)
    m, l, acc = torch.stack(ms), torch.stack(ls), torch.stack(accs)            # [splits, B, KV, G(, D)]
    top = m.amax(0)
    w = torch.exp(m - torch.where(torch.isinf(top), torch.zeros_like(top), top))
    den = (w * l).sum(0)
    out = (w[..., None] * acc).sum(0) / torch.where(den == 0, torch.ones_like(den), den)[..., None]
    return out.to(q.dtype).reshape(b, 1, heads, d)


# ------------------------------------------------------------------------------------------ CUDA
_KERNELS = None


def _kernels():
    # Long because: the two Triton kernels are defined here, together, so that triton is imported
    # only on a GPU that runs them; split, each would still need this function's imports.
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    import triton  # lazy: GPU only
    import triton.language as tl

    @triton.jit
    def split_kernel(Q, K, V, Keep, Out, Part, ML, span, chunk, scale,
                     sqb, sqh, skb, skh, sks, svb, svh, svs, smb, sob, soh,
                     KV: tl.constexpr, G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr,
                     BLOCK: tl.constexpr, SPLITS: tl.constexpr):
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = bh // KV
        h = bh % KV
        offs_g = tl.arange(0, GP)
        offs_d = tl.arange(0, D)
        gmask = offs_g < G
        q = tl.load(Q + b * sqb + (h * G + offs_g)[:, None] * sqh + offs_d[None, :], mask=gmask[:, None],
                    other=0.0)                                                       # [GP, D]
        m_i = tl.full([GP], float("-inf"), tl.float32)
        l_i = tl.zeros([GP], tl.float32)
        acc = tl.zeros([GP, D], tl.float32)
        start = split * chunk
        end = tl.minimum(start + chunk, span)
        kbase = K + b * skb + h * skh
        vbase = V + b * svb + h * svh
        for n0 in range(start, end, BLOCK):
            offs_n = n0 + tl.arange(0, BLOCK)
            valid = offs_n < end
            keep = tl.load(Keep + b * smb + offs_n, mask=valid, other=0) != 0
            k = tl.load(kbase + offs_n[:, None] * sks + offs_d[None, :], mask=valid[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale                                       # [GP, BLOCK] fp32
            s = tl.where(keep[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            p = tl.exp(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(vbase + offs_n[:, None] * svs + offs_d[None, :], mask=valid[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        if SPLITS == 1:
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            tl.store(Out + b * sob + (h * G + offs_g)[:, None] * soh + offs_d[None, :],
                     out.to(Out.dtype.element_ty), mask=gmask[:, None])
        else:
            row = (bh * SPLITS + split) * G + offs_g                                 # [B*KV, SPLITS, G]
            tl.store(Part + row[:, None] * D + offs_d[None, :], acc, mask=gmask[:, None])
            tl.store(ML + row * 2, m_i, mask=gmask)
            tl.store(ML + row * 2 + 1, l_i, mask=gmask)

    @triton.jit
    def combine_kernel(Out, Part, ML, sob, soh,
                       H: tl.constexpr, KV: tl.constexpr, G: tl.constexpr, D: tl.constexpr,
                       SPLITS: tl.constexpr, SP: tl.constexpr):
        pid = tl.program_id(0)                    # b * H + head
        b = pid // H
        head = pid % H
        h = head // G
        g = head % G
        offs_s = tl.arange(0, SP)
        offs_d = tl.arange(0, D)
        smask = offs_s < SPLITS
        row = ((b * KV + h) * SPLITS + offs_s) * G + g                             # [SP]
        m = tl.load(ML + row * 2, mask=smask, other=float("-inf"))
        l = tl.load(ML + row * 2 + 1, mask=smask, other=0.0)
        acc = tl.load(Part + row[:, None] * D + offs_d[None, :], mask=smask[:, None], other=0.0)
        top = tl.max(m, 0)
        top = tl.where(top == float("-inf"), 0.0, top)
        w = tl.exp(m - top)
        den = tl.sum(w * l, 0)
        out = tl.sum(w[:, None] * acc, 0) / tl.where(den == 0.0, 1.0, den)
        tl.store(Out + b * sob + head * soh + offs_d, out.to(Out.dtype.element_ty))

    _KERNELS = (split_kernel, combine_kernel)
    return _KERNELS


def _launch(q, k, v, keep, scale: float, splits: int = 0) -> torch.Tensor:
    """[B, H, D]; splits 0: `num_splits` (decided here, on concrete shapes, also under torch.compile)."""
    b, heads, _, d = q.shape
    kv = k.shape[1]
    g = heads // kv
    span = keep.shape[-1]
    splits = splits or num_splits(b, kv, span)
    chunk = _chunk(span, splits, BLOCK_N)
    splits = -(-span // chunk)                     # no split left empty
    keep = keep.reshape(b, span) if keep.stride(-1) == 1 else keep.reshape(b, span).contiguous()
    keep = keep.view(torch.uint8)
    out = torch.empty((b, heads, d), dtype=q.dtype, device=q.device)
    if splits > 1:
        part = torch.empty((b * kv * splits * g, d), dtype=torch.float32, device=q.device)
        ml = torch.empty((b * kv * splits * g, 2), dtype=torch.float32, device=q.device)
    else:
        part = ml = out
    split_kernel, combine_kernel = _kernels()
    gp = max(16, 1 << (g - 1).bit_length())
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    split_kernel[(b * kv, splits)](q, k, v, keep, out, part, ml, span, chunk, scale,
                                   q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
                                   v.stride(0), v.stride(1), v.stride(2), keep.stride(0), out.stride(0), out.stride(1),
                                   KV=kv, G=g, GP=gp, D=d, BLOCK=BLOCK_N, SPLITS=splits, num_warps=4, num_stages=2)
    if splits > 1:
        combine_kernel[(b * heads,)](out, part, ml, out.stride(0), out.stride(1), H=heads, KV=kv, G=g, D=d,
                                     SPLITS=splits, SP=max(2, 1 << (splits - 1).bit_length()), num_warps=4)
    return out


@torch.library.custom_op("toolorchestra::split_decode_attention", mutates_args=())
def _split_decode_attention_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor,
                               scale: float, splits: int) -> torch.Tensor:
    return _launch(q, k, v, keep, scale, splits)


@_split_decode_attention_op.register_fake
def _(q, k, v, keep, scale, splits):
    return q.new_empty((q.shape[0], q.shape[1], q.shape[3]))


def split_decode_attention(q, k, v, keep, scale: float | None = None, splits: int | None = None):
    """[B, 1, H, D]: the kernels on CUDA (`_launch`), the torch reference elsewhere."""
    b, heads, _, d = q.shape
    scale = d ** -0.5 if scale is None else float(scale)
    if q.device.type != "cuda":
        return split_decode_attention_reference(q, k, v, keep, scale, splits)
    return _split_decode_attention_op(q, k, v, keep, scale, splits or 0).reshape(b, 1, heads, d)
