"""`HFEngine`'s fast decode: a static KV cache, the forward compiled, each step one CUDA graph.

`HFEngine` uses `StaticDecoder` on CUDA (`decode="auto"`) for requests without a choice or
grammar constraint; `decode="static"` forces it, also on the CPU, where the same steps run
eagerly and uncompiled (the tests do that).  Per batch shape (B = rows rounded up to a power
of two, at most `max_batch`; L = prompt width + max_tokens rounded up to 128) it keeps a
`transformers.StaticCache`, the step's input/output buffers and, per (temperature, top_p), a
captured CUDA graph of one decode step:

    open the new cache slot in the attention mask -> compiled forward of one token per row
    -> sample (temperature, top-p, inverse CDF with the row's uniform) -> next step's input

so a step is one graph launch instead of hundreds of Python-issued kernels.  Decode steps
attend through `decode_attention` (the model's attention implementation is switched to it
for the call): the query heads that share a KV head are passed to SDPA as that head's query
rows, so the grouped KV cache is read once per step instead of being repeated per query head
(what the stock SDPA path does whenever there is a mask).

Same sampling distribution and log-probs as the step-by-step loop (`HFEngine._next_tokens`,
through the same `_top_p_filter` / `inverse_cdf`).  What differs: each row draws all its
uniforms up front (`torch.rand(max_tokens, generator=<the row's>)`), so a seeded row gives
the same tokens in any batch but not the loop's tokens; rows that have finished keep
running (static shapes) until all have, checked on the host every `check_every` steps, and
are cut at their EOS / stop string.
"""
from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from orchestrator.engine import Generation, SamplingParams
from training.engines.common import completes_stop, decode

log = logging.getLogger(__name__)


DECODE_ATTENTION = "toolorchestra_static_decode"


def decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """transformers attention function: one query token per row over a static grouped KV
    cache, without repeating the KV heads; longer queries (prefill) take the stock SDPA path.
    query [B, H, 1, D], key/value [B, KV, L, D], attention_mask bool [B, 1, 1, S <= L]: only the
    first S slots are read -> [B, 1, H, D]."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    b, heads, _, d = query.shape
    span = attention_mask.shape[-1]                                  # the slots written so far (rounded up)
    key, value = key[:, :, :span], value[:, :, :span]
    q = query.reshape(b, key.shape[1], heads // key.shape[1], d)   # the heads of one KV head as its query rows
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, 1, heads, d), None


def _register_attention() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(DECODE_ATTENTION, decode_attention)


def sample_rows(logits: torch.Tensor, temperature: float, top_p: float,
                u: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of float32 `logits` [A, V] and its log-prob under the sampling
    distribution (`HFEngine._next_tokens`' formulas); `u` [A]: the rows' uniforms (T > 0)."""
    from training.engines.hf import _top_p_filter, inverse_cdf

    if temperature == 0:
        tokens = logits.argmax(dim=-1)                                        # [A]
        logprobs = logits.log_softmax(dim=-1)
    else:
        scaled = logits / temperature
        if top_p < 1:
            scaled = _top_p_filter(scaled, top_p)
        logprobs = scaled.log_softmax(dim=-1)                                 # [A, V]
        tokens = inverse_cdf(logprobs.exp(), u)
    return tokens, logprobs.gather(-1, tokens[:, None])[:, 0]


@dataclass
class _Shape:
    """Cache and step buffers of one (rows, cache length)."""

    cache: Any
    ids: torch.Tensor            # [B, 1] this step's input token
    pos: torch.Tensor            # [B, 1] its position
    mask: torch.Tensor           # [B, 1, 1, L] bool: cache slots each row attends to
    slot: torch.Tensor           # [1] the cache slot this step writes
    u: torch.Tensor              # [B] this step's uniforms
    token: torch.Tensor          # [B] sampled token
    logprob: torch.Tensor        # [B] its log-prob
    graphs: dict = field(default_factory=dict)   # (temperature, top_p, span) -> torch.cuda.CUDAGraph


class StaticDecoder:
    """Static-cache decoding for one `HFEngine` (see the module docstring).

    graphs / compile: CUDA graphs and torch.compile (default: on CUDA only).
    check_every: steps between the host's checks for EOS / stop strings.
    memory_fraction: most of the free GPU memory one shape's KV cache may take (else the
        engine's step-by-step loop serves the request).
    """

    def __init__(self, engine, *, graphs: bool | None = None, compile: bool | None = None, check_every: int = 16,
                 len_multiple: int = 128, max_shapes: int = 2, memory_fraction: float = 0.25):
        cuda = engine.device.type == "cuda"
        self.engine, self.check_every, self.len_multiple = engine, check_every, len_multiple
        self.graphs = cuda if graphs is None else graphs
        self.compile = cuda if compile is None else compile
        self.max_shapes, self.memory_fraction = max_shapes, memory_fraction
        config = engine.model.config.get_text_config(decoder=True)
        self.types = sorted(set(getattr(config, "layer_types", None) or ["full_attention"]))
        self.layers = config.num_hidden_layers
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.attn = getattr(config, "_attn_implementation", None) or "sdpa"
        self._shapes: OrderedDict[tuple[int, int], _Shape] = OrderedDict()
        self._forward = None
        _register_attention()

    # ---------------------------------------------------------------- when
    def shape(self, prompts: list[list[int]], params: SamplingParams) -> tuple[int, int]:
        n = len(prompts)
        rows = max(n, min(1 << (n - 1).bit_length(), self.engine.max_batch))
        width = max(len(p) for p in prompts)
        return rows, -(-(width + params.max_tokens) // self.len_multiple) * self.len_multiple

    def supports(self, prompts: list[list[int]], params: SamplingParams) -> bool:
        """Unconstrained requests on an SDPA full-attention model whose cache fits."""
        if params.choices or getattr(params, "grammar", None) or self.attn != "sdpa" or self.types != ["full_attention"]:
            return False
        rows, length = self.shape(prompts, params)
        if (rows, length) in self._shapes or self.engine.device.type != "cuda":
            return True
        need = 2 * self.layers * rows * self.kv_heads * length * self.head_dim * self._kv_dtype().itemsize
        return need <= self.memory_fraction * torch.cuda.mem_get_info(self.engine.device)[0]

    @contextlib.contextmanager
    def _decode_attention(self):
        """The model attends through `decode_attention` inside the block (restored after)."""
        config = self.engine.model.config
        before = config._attn_implementation
        config._attn_implementation = DECODE_ATTENTION
        try:
            yield
        finally:
            config._attn_implementation = before

    def _kv_dtype(self) -> torch.dtype:
        return self.engine.compute_dtype or next(self.engine.model.parameters()).dtype

    # ---------------------------------------------------------------- state per shape
    def _state(self, rows: int, length: int) -> _Shape:
        from transformers import StaticCache

        key = (rows, length)
        if key in self._shapes:
            self._shapes.move_to_end(key)
            return self._shapes[key]
        while len(self._shapes) >= self.max_shapes:
            self._shapes.popitem(last=False)
        dev = self.engine.device
        cache = StaticCache(config=self.engine.model.config, max_cache_len=length)
        cache.early_initialization(rows, self.kv_heads, self.head_dim, self._kv_dtype(), dev)
        state = _Shape(cache, torch.zeros((rows, 1), dtype=torch.long, device=dev),
                       torch.zeros((rows, 1), dtype=torch.long, device=dev),
                       torch.zeros((rows, 1, 1, length), dtype=torch.bool, device=dev),
                       torch.zeros(1, dtype=torch.long, device=dev), torch.zeros(rows, device=dev),
                       torch.zeros(rows, dtype=torch.long, device=dev), torch.zeros(rows, device=dev))
        self._shapes[key] = state
        return state

    def _model_forward(self):
        if self._forward is None:
            model = self.engine.model

            def forward(ids, pos, mask, cache):                               # -> [B, V] float32
                out = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache,
                            use_cache=True)                                   # a 4D mask is used as given
                return out.logits[:, -1].float()
            self._forward = torch.compile(forward) if self.compile else forward
        return self._forward

    def _step(self, s: _Shape, temperature: float, top_p: float, span: int) -> None:
        """One decode step attending to the first `span` cache slots (those written so far)."""
        s.mask.index_fill_(3, s.slot, True)
        logits = self._model_forward()(s.ids, s.pos, s.mask[..., :span], s.cache)
        token, logprob = sample_rows(logits, temperature, top_p, s.u)
        s.token.copy_(token)
        s.logprob.copy_(logprob)
        s.ids.copy_(token[:, None])
        s.pos.add_(1)
        s.slot.add_(1)

    def _capture(self, s: _Shape, temperature: float, top_p: float, span: int):
        """Warm up (compiling the forward the first time) on a side stream, then capture one step."""
        s.cache.reset()
        for t in (s.ids, s.pos, s.slot, s.mask, s.u):
            t.zero_()
        stream = torch.cuda.Stream(self.engine.device)
        stream.wait_stream(torch.cuda.current_stream(self.engine.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                self._step(s, temperature, top_p, span)
        torch.cuda.current_stream(self.engine.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._step(s, temperature, top_p, span)
        return graph

    # ---------------------------------------------------------------- generate
    def _uniforms(self, n: int, rows: int, params: SamplingParams, seeds) -> torch.Tensor:
        u = torch.zeros((rows, params.max_tokens), device=self.engine.device)          # [B, T]
        if params.temperature > 0:
            for r, g in enumerate(self.engine._generators(seeds)):
                u[r] = torch.rand(params.max_tokens, generator=g, device=self.engine.device)
        return u

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds) -> list[Generation]:
        with self._decode_attention():
            return self._generate(prompts, params, seeds)

    def _generate(self, prompts: list[list[int]], params: SamplingParams, seeds) -> list[Generation]:
        engine, dev = self.engine, self.engine.device
        n, width = len(prompts), max(len(p) for p in prompts)
        rows, length = self.shape(prompts, params)
        temperature, top_p = float(params.temperature), float(params.top_p)
        s = self._state(rows, length)
        # step t writes slot width + t - 1 and attends to the slots before it, rounded up to a
        # multiple of len_multiple: one graph per such span, so early steps read less of the cache
        spans = [min(length, -(-(width + t) // self.len_multiple) * self.len_multiple)
                 for t in range(params.max_tokens)]
        for span in sorted(set(spans[1:])) if self.graphs else ():
            if (temperature, top_p, span) not in s.graphs:
                s.graphs[(temperature, top_p, span)] = self._capture(s, temperature, top_p, span)
        u = self._uniforms(n, rows, params, seeds)

        ids = torch.full((rows, width), engine.pad_id, dtype=torch.long)
        attention = torch.zeros((rows, width), dtype=torch.bool)
        for i in range(rows):                                                 # left padding; spare rows: one pad
            p = prompts[i] if i < n else [engine.pad_id]
            ids[i, width - len(p):] = torch.tensor(p)
            attention[i, width - len(p):] = True
        ids, attention = ids.to(dev), attention.to(dev)
        positions = (attention.long().cumsum(-1) - 1).clamp(min=0)           # [B, W]
        open_slots = torch.zeros((rows, length), dtype=torch.bool, device=dev)
        open_slots[:, :width] = attention                                     # [B, L]
        q, k = torch.arange(width, device=dev)[:, None], torch.arange(length, device=dev)[None, :]
        prefill_mask = ((k <= q) & open_slots[:, None, :]) | (k == q)        # [B, W, L]; a pad query sees itself
        s.cache.reset()
        out = engine.model(input_ids=ids, position_ids=positions, past_key_values=s.cache, use_cache=True,
                           attention_mask=prefill_mask[:, None], logits_to_keep=1)
        token, logprob = sample_rows(out.logits[:, -1].float(), temperature, top_p, u[:, 0])
        history = torch.zeros((rows, params.max_tokens), dtype=torch.long, device=dev)
        history_lp = torch.zeros((rows, params.max_tokens), device=dev)
        history[:, 0], history_lp[:, 0] = token, logprob
        s.mask.copy_(open_slots[:, None, None, :])
        s.ids.copy_(token[:, None])
        s.pos.copy_(positions[:, -1:] + 1)
        s.slot.fill_(width)

        tokens: list[list[int]] = [[] for _ in range(n)]
        finish, done, checked = ["length"] * n, [False] * n, 0
        eos = set(engine.eos_ids)
        for t in range(params.max_tokens):
            if t > 0:
                s.u.copy_(u[:, t])
                graph = s.graphs.get((temperature, top_p, spans[t]))
                if graph is not None:
                    graph.replay()
                else:
                    self._step(s, temperature, top_p, spans[t])
                history[:, t], history_lp[:, t] = s.token, s.logprob
            if (t + 1) % self.check_every and t + 1 < params.max_tokens:
                continue
            for r, new in enumerate(history[:n, checked:t + 1].tolist()):
                for tok in (() if done[r] else new):
                    tokens[r].append(tok)
                    if tok in eos or completes_stop(engine.tokenizer, tokens[r], params.stop):
                        finish[r], done[r] = "stop", True
                        break
            checked = t + 1
            if all(done):
                break
        lps = history_lp[:n].tolist()
        return [Generation(token_ids=tokens[r], logprobs=lps[r][:len(tokens[r])],
                           text=decode(engine.tokenizer, tokens[r]), finish_reason=finish[r]) for r in range(n)]
