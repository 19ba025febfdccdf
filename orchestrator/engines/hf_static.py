"""`HFEngine`'s fast decode: a static KV cache, the forward compiled, each step one CUDA graph.

`HFEngine` uses `StaticDecoder` on CUDA (`decode="auto"`) for requests without a choice or
grammar constraint; `decode="static"` forces it, also on the CPU, where the same steps run
eagerly and uncompiled (the tests do that).  Per batch shape (B = rows rounded up to a power
of two, at least 2, at most `max_batch`; L = prompt width + max_tokens rounded up to 128) it keeps a
`transformers.StaticCache`, the step's input/output buffers and, per (temperature, top_p), a
captured CUDA graph of one decode step:

    open the new cache slot in the attention mask -> forward of one token per row (each
    decoder layer compiled) -> sample (Gumbel-max, compiled) -> next step's input, history

and `steps_per_graph` such steps are captured into one graph, so k steps are one launch
instead of thousands of Python-issued kernels; the sampled tokens and log-probs are written
to device-side history buffers inside the graph (no host work between replays).  Decode steps
attend through `decode_attention` (the model's attention implementation is switched to it
for the call): the query heads that share a KV head are passed to SDPA as that head's query
rows, so the grouped KV cache is read once per step instead of being repeated per query head
(what the stock SDPA path does whenever there is a mask); on CUDA by default through
`decode_attention_split` instead, one fused split-KV Triton kernel (split_kv_attention.py).

Same sampling distribution and log-probs as the step-by-step loop (`HFEngine._next_tokens`:
softmax(top_p(logits / T)), through the same `top_p_filter`).  What differs is how a token
is drawn: Gumbel-max (`sample_rows`), token = argmax(logits / T + G) with G = -log(-log(U)),
U a counter-based hash of (the row's seed, the step, the token id) in torch integer ops, so
the whole draw is one fused pass over the vocabulary inside the compiled sampler (no
softmax / cumulative sum / search kernels).  A seeded row therefore gives the same tokens in
any batch (and any split), but not the loop's tokens.  Rows that have finished keep running
(static shapes) until all have, checked on the host every `check_every` steps, and are cut
at their EOS / stop string.

Compilation (`compile`): "regional" (the default on CUDA) compiles the decoder layer once and
every layer replays that graph, shapes dynamic from the first call, the sampler apart
(orchestrator/engines/compile_regions.py); "whole" compiles the whole forward with the sampler
as one graph (the mode before regional: ~3x the first-call compile time at 0.6B, and a second
compile when the attention span first changes; docs/benchmarks.md "cold compile"); "none" runs
the steps eagerly (inside CUDA graphs where `graphs` is on).
"""
from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from orchestrator.engines.interface import Generation, SamplingParams
from orchestrator.engines.capture_lock import exclusive_of_capture
from orchestrator.engines.common import STATIC_MEMORY_FRACTION, check_memory_fraction, completes_stop, decode
from orchestrator.engines.compile_regions import (check_compile_mode, compile_dynamic, compiled_layer_step,
                                                  regional_steps)
from orchestrator.engines.decode_kernels import ATTENTIONS, FusedGroup, fusable_groups, register_attention
from orchestrator.engines.sampling import row_keys, sample_rows

log = logging.getLogger(__name__)


def static_shape(n: int, width: int, max_tokens: int, max_batch: int, len_multiple: int = 128) -> tuple[int, int]:
    """(rows, cache length) of the static shape serving n prompts of at most `width` tokens:
    rows rounded up to a power of two, at least 2 (a one-row batch would compile its own graphs:
    torch.compile specializes a size of 1), at most max_batch; width + max_tokens up to len_multiple."""
    rows = max(n, min(max(2, 1 << (n - 1).bit_length()), max_batch))
    return rows, -(-(width + max_tokens) // len_multiple) * len_multiple


def _sample(logits, temperature: float, top_p: float, keys, step):
    """`sample_rows` on the logits in float32 (compiled with the cast: one pass over the vocabulary)."""
    return sample_rows(logits.float(), temperature, top_p, keys, step)


@dataclass
class _Shape:
    """Cache and step buffers of one (rows, cache length)."""

    cache: Any
    ids: torch.Tensor            # [B, 1] this step's input token
    pos: torch.Tensor            # [B, 1] its position
    mask: torch.Tensor           # [B, 1, 1, L + 1] bool: cache slots each row attends to; the spare last
                                 # column is never opened nor attended: every span's slice is a strided
                                 # view (one compiled graph for all spans, not a contiguous one for L)
    slot: torch.Tensor           # [1] the cache slot this step writes
    keys: torch.Tensor           # [B, 2] the rows' sampling keys (`row_keys`)
    step: torch.Tensor           # [1] this step's index in the generation (the sampler's counter)
    tokens: torch.Tensor         # [B, L] sampled tokens, by step
    logprobs: torch.Tensor       # [B, L] their log-probs
    graphs: dict = field(default_factory=dict)   # (temperature, top_p, span, steps) -> torch.cuda.CUDAGraph


class StaticDecoder:
    """Static-cache decoding for one `HFEngine` (see the module docstring).

    graphs: CUDA graphs (default: on CUDA only).
    compile: "regional", "whole" or "none" (module docstring; True: regional, False: none;
        default: regional on CUDA, none elsewhere).  train.py's `engine.compile`.
    check_every: steps between the host's checks for EOS / stop strings.
    steps_per_graph: decode steps captured into one CUDA graph (a multiple of it is checked).
    attention: "sdpa" (`decode_attention`), "matmul" (`decode_attention_matmul`), "triton"
        (`decode_attention_split`: split-KV kernels on CUDA, their torch reference elsewhere) or
        "auto" (on CUDA triton, where it measured fastest at 256-384 slots, else matmul; sdpa elsewhere).
    fuse_projections: run q/k/v and gate/up as one GEMM each (`fusable_groups`; default: on
        CUDA), from concatenated copies of those weights (extra memory: their size),
        refreshed from the model at each generation.
    memory_fraction: most of the free GPU memory one shape's KV cache may take, in (0, 1]
        (`HFEngine(static_memory_fraction=)`, train.py's `engine.static_memory_fraction`).  A
        shape whose cache needs more is served by the engine's step-by-step loop: warned once
        per shape (bytes needed vs allowed) and counted in `fallbacks` (shape -> calls).
    prefill_tokens: most prompt tokens (rows x columns) one prefill forward takes; wider
        prompts are prefilled in column chunks of a multiple of len_multiple, each attending
        to the cache written so far, so the prefill's activations stay bounded (at 8B, 64 rows
        x 8k columns in one forward would need ~60 GB of activations beside a 77 GB cache).
    shared_pool: capture every CUDA graph of this decoder into one memory pool (default on):
        the graphs run one at a time and keep nothing they allocate (state lives in buffers
        made outside them), so one pool serves them all instead of a pool per graph (measured:
        70 MB less over three shapes at 64 rows, identical tokens; docs/benchmarks.md).

    Where the engine's model holds wider weights than its compute dtype (the trainer's float32
    master weights with `compute_dtype=bfloat16`), decoding runs on a copy of the model in the
    compute dtype with autocast off (extra memory: the weights at that dtype), refreshed from
    the model at each generation (one cast-copy of the weights per call, inside the measured
    `static-amp` rate of docs/benchmarks.md), so it always decodes the current weights; a model
    whose parameter objects changed (replaced, loaded with assign=True) gets a new copy.
    Decoding the float32 model under autocast instead would cast every weight at every step
    (read 4 bytes, write and read 2, per weight, where a bf16 step reads 2) and leaves K
    (rotary in float32) and V (bfloat16) in different dtypes for the cache.
    Numerics: the copy is a plain bfloat16 model (bf16 residual stream), as a vLLM engine is;
    the trainer's forward under autocast keeps float32 residuals, so its log-probs differ
    from the engine's: 0.044 per token on average for SmolLM2 (0.029 for the step-by-step
    loop under autocast; bench/logprob_gap.py).  algorithm.old_logprobs "recompute", the
    default, uses the trainer's.
    """

    def __init__(self, engine, *, graphs: bool | None = None, compile: bool | str | None = None, check_every: int = 16,
                 len_multiple: int = 128, max_shapes: int = 2, memory_fraction: float = STATIC_MEMORY_FRACTION,
                 steps_per_graph: int = 8, attention: str = "auto", fuse_projections: bool | None = None,
                 shared_pool: bool = True, prefill_tokens: int = 1 << 16):
        cuda = engine.device.type == "cuda"
        self.engine, self.check_every, self.len_multiple = engine, check_every, len_multiple
        self.steps_per_graph = steps_per_graph
        if attention == "auto":
            attention = ("triton" if importlib.util.find_spec("triton") else "matmul") if cuda else "sdpa"
        if attention not in ATTENTIONS:
            raise ValueError(f"StaticDecoder(attention={attention!r}): choose from {sorted(ATTENTIONS)} or 'auto'")
        self.attention = attention
        self.fuse_projections = cuda if fuse_projections is None else fuse_projections
        self._groups: list[FusedGroup] | None = None
        self.graphs = cuda if graphs is None else graphs
        if compile is None or isinstance(compile, bool):
            compile = "regional" if (cuda if compile is None else compile) else "none"
        self.compile = check_compile_mode(compile, "StaticDecoder(compile)")
        self.backend = "inductor"        # torch.compile's backend (the tests count graphs with a cheaper one)
        self.max_shapes = max_shapes
        self.memory_fraction = check_memory_fraction(memory_fraction, "StaticDecoder(memory_fraction)")
        self.fallbacks: Counter[tuple[int, int]] = Counter()   # calls the loop served because the cache did not fit
        self.unsupported: Counter[str] = Counter()   # calls the loop served for another reason (logged once each)
        self.prefill_tokens = prefill_tokens
        config = engine.model.config.get_text_config(decoder=True)
        self.types = sorted(set(getattr(config, "layer_types", None) or ["full_attention"]))
        self.layers = config.num_hidden_layers
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.attn = getattr(config, "_attn_implementation", None) or "sdpa"
        self._shapes: OrderedDict[tuple[int, int], _Shape] = OrderedDict()
        self._forward = None
        self._layer_step = None          # the compiled decoder-layer region (compile "regional")
        self._replica = None
        self._pairs: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.shared_pool = shared_pool
        self._pool = None
        self._source = None          # the engine model everything above was built from
        register_attention()

    @property
    def model(self):
        """The model decode steps run: the engine's, or its copy in the compute dtype."""
        return self._replica if self._replica is not None else self.engine.model

    def _needs_replica(self) -> bool:
        dtype = self.engine.compute_dtype
        return dtype is not None and any(p.is_floating_point() and p.dtype != dtype
                                         for p in self.engine.model.parameters())

    def _reset(self) -> None:
        """Forget everything built from the decoded model (compiled forward, fused groups,
        caches and graphs)."""
        self._replica, self._pairs, self._forward, self._groups, self._pool = None, [], None, None, None
        self._shapes.clear()

    def release(self) -> None:
        """Drop every shape's KV cache and CUDA graphs (their memory back to the allocator at the
        next `torch.cuda.empty_cache()`); the compiled forward stays."""
        self._shapes.clear()
        self._pool = None

    def _sync_model(self) -> bool:
        """Make the decoded model current: the engine's model, or its compute-dtype copy with
        the current weights (rebuilt where the model or its parameter objects were replaced).
        Returns whether a copy is decoded."""
        model = self.engine.model
        stale = self._source is not None and model is not self._source
        if self._replica is not None and not stale:
            params = list(model.parameters())
            stale = len(params) != len(self._pairs) or any(src is not p for (_, src), p in zip(self._pairs, params))
        if stale:
            self._reset()
        self._source = model
        if self._replica is None and not self._needs_replica():
            return False
        self._refresh_replica()
        return True

    def _refresh_replica(self) -> None:
        """Make (first call) or refresh the compute-dtype copy from the engine's model's
        current weights; buffers (rotary frequencies) are copied as they are."""
        if self._replica is None:
            model, dtype = self.engine.model, self.engine.compute_dtype
            memo = {}
            for p in model.parameters():                 # tied weights: one parameter, one copy
                memo[id(p)] = torch.nn.Parameter(torch.empty_like(p, dtype=dtype if p.is_floating_point() else p.dtype),
                                                 requires_grad=False)
            self._replica = copy.deepcopy(model, memo).eval()
            for module in self._replica.modules():       # training/logprobs.py's compiled forward of the original
                compiled = module.__dict__.pop("_toolorchestra_compiled", None)
                if compiled is not None and module.__dict__.get("forward") is compiled:
                    del module.__dict__["forward"]       # copied while compiled_layers was active
            self._pairs = [(memo[id(p)], p) for p in model.parameters()]
        for dst, src in self._pairs:
            dst.copy_(src)

    # ---------------------------------------------------------------- when
    def shape(self, prompts: list[list[int]], params: SamplingParams) -> tuple[int, int]:
        return static_shape(len(prompts), max(len(p) for p in prompts), params.max_tokens, self.engine.max_batch,
                            self.len_multiple)

    def supports(self, prompts: list[list[int]], params: SamplingParams) -> bool:
        """Unconstrained requests on an SDPA full-attention model whose cache fits."""
        reason = ("constrained decoding (choices)" if params.choices else
                  "constrained decoding (grammar)" if getattr(params, "grammar", None) else
                  f"attention implementation {self.attn!r} (static decoding needs 'sdpa')" if self.attn != "sdpa" else
                  f"layer types {self.types} (static decoding needs full attention only)"
                  if self.types != ["full_attention"] else None)
        if reason is not None:
            if not self.unsupported[reason]:
                log.info("HFEngine: static-cache decoding not used for %s; the token-by-token loop decodes these "
                         "requests (slower; counted in StaticDecoder.unsupported)", reason)
            self.unsupported[reason] += 1
            return False
        rows, length = self.shape(prompts, params)
        if (rows, length) in self._shapes:
            return True
        free = self._free_bytes()
        if free is None:
            return True
        need = 2 * self.layers * rows * self.kv_heads * length * self.head_dim * self._kv_dtype().itemsize
        if need <= self.memory_fraction * free:
            return True
        if not self.fallbacks[(rows, length)]:
            self._warn_too_large(rows, length, need, free)
        self.fallbacks[(rows, length)] += 1
        return False

    def _warn_too_large(self, rows: int, length: int, need: int, free: int) -> None:
        fix = (f"raise engine.static_memory_fraction (train.py's config) or HFEngine(static_memory_fraction=) "
               f"to at least {need / free:.2f}" if need <= free else
               "it exceeds the free memory itself: lower engine.max_batch (rows) or the prompt + max_tokens length")
        log.warning(f"HFEngine: static-cache decoding skipped for shape {rows} rows x {length} slots: its KV cache "
                    f"needs {need:,} bytes ({need / 1e9:.1f} GB), more than memory_fraction={self.memory_fraction:g} "
                    f"of the {free:,} bytes free allows ({int(self.memory_fraction * free):,}); this shape takes the "
                    f"step-by-step loop, many times slower (warned once per shape): {fix} (docs/engines.md)")

    def _free_bytes(self) -> int | None:
        """Free memory on the engine's GPU (None on other devices: no limit is applied)."""
        if self.engine.device.type != "cuda":
            return None
        return torch.cuda.mem_get_info(self.engine.device)[0]

    @contextlib.contextmanager
    def _decode_attention(self):
        """Inside the block the model attends through `decode_attention` (or its matmul form),
        with fuse_projections runs its fused projections and with compile "regional" its decode
        steps through the compiled layer (all restored after)."""
        config = self.model.config
        before = config._attn_implementation
        config._attn_implementation = ATTENTIONS[self.attention]
        if self.fuse_projections and self._groups is None:
            self._groups = fusable_groups(self.model)
        groups = self._groups if self.fuse_projections else []
        if self.compile == "regional" and self._layer_step is None:
            self._layer_step = compiled_layer_step(self.backend)
        regions = regional_steps(self.model, self._layer_step) if self.compile == "regional" else contextlib.nullcontext()
        try:
            for g in groups:
                g.refresh()
                for name, member in zip(g.names, g.members):
                    setattr(g.owner, name, member)
            with regions:
                yield
        finally:
            config._attn_implementation = before
            for g in groups:
                for name, layer in zip(g.names, g.layers):
                    setattr(g.owner, name, layer)

    def _kv_dtype(self) -> torch.dtype:
        return self.engine.compute_dtype or next(self.engine.model.parameters()).dtype

    # ---------------------------------------------------------------- state per shape
    def _state(self, rows: int, length: int) -> _Shape:
        from transformers import StaticCache  # lazy: heavy (seconds to import)

        key = (rows, length)
        if key in self._shapes:
            self._shapes.move_to_end(key)
            return self._shapes[key]
        while len(self._shapes) >= self.max_shapes:
            self._shapes.popitem(last=False)
        if not self._shapes:
            self._pool = None      # its graphs are gone and so is the pool: capturing into it fails in the allocator
        dev = self.engine.device
        cache = StaticCache(config=self.model.config, max_cache_len=length)
        cache.early_initialization(rows, self.kv_heads, self.head_dim, self._kv_dtype(), dev)
        state = _Shape(cache, torch.zeros((rows, 1), dtype=torch.long, device=dev),
                       torch.zeros((rows, 1), dtype=torch.long, device=dev),
                       torch.zeros((rows, 1, 1, length + 1), dtype=torch.bool, device=dev),
                       torch.zeros(1, dtype=torch.long, device=dev), torch.zeros((rows, 2), dtype=torch.long, device=dev),
                       torch.zeros(1, dtype=torch.long, device=dev),
                       torch.zeros((rows, length), dtype=torch.long, device=dev), torch.zeros((rows, length), device=dev))
        self._shapes[key] = state
        return state

    def _model_forward(self):
        if self._forward is None:
            model = self.model

            sample = compile_dynamic(_sample, self.backend) if self.compile == "regional" else _sample

            def forward(ids, pos, mask, cache, keys, step, temperature, top_p):   # -> token [B], log-prob [B]
                out = model(input_ids=ids, position_ids=pos, attention_mask=mask, past_key_values=cache,
                            use_cache=True)                                   # a 4D mask is used as given
                return sample(out.logits[:, -1], temperature, top_p, keys, step)
            self._forward = torch.compile(forward, backend=self.backend) if self.compile == "whole" else forward
        return self._forward

    def _step(self, s: _Shape, temperature: float, top_p: float, span: int) -> None:
        """One decode step attending to the first `span` cache slots (those written so far)."""
        s.mask.index_fill_(3, s.slot, True)
        token, logprob = self._model_forward()(s.ids, s.pos, s.mask[..., :span], s.cache, s.keys, s.step,
                                               temperature, top_p)
        s.tokens.index_copy_(1, s.step, token[:, None])
        s.logprobs.index_copy_(1, s.step, logprob[:, None])
        s.ids.copy_(token[:, None])
        s.pos.add_(1)
        s.slot.add_(1)
        s.step.add_(1)

    def _capture(self, s: _Shape, temperature: float, top_p: float, span: int, steps: int):
        """Warm up (compiling the forward the first time) on a side stream, then capture `steps` steps."""
        with exclusive_of_capture():   # no policy update in another thread meanwhile (capture_lock.py)
            return self._capture_exclusive(s, temperature, top_p, span, steps)

    def _capture_exclusive(self, s: _Shape, temperature: float, top_p: float, span: int, steps: int):
        s.cache.reset()
        for t in (s.ids, s.pos, s.slot, s.mask, s.step):
            t.zero_()
        stream = torch.cuda.Stream(self.engine.device)
        stream.wait_stream(torch.cuda.current_stream(self.engine.device))
        with torch.cuda.stream(stream):
            for _ in range(3):
                self._step(s, temperature, top_p, span)
        torch.cuda.current_stream(self.engine.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        if self.shared_pool and self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        # thread_local: another thread's stream work during the capture (the trainer's thread in an
        # asynchronous run) is not refused; device-wide synchronizes are kept out by the capture lock
        with torch.cuda.graph(graph, pool=self._pool if self.shared_pool else None, capture_error_mode="thread_local"):
            for _ in range(steps):
                self._step(s, temperature, top_p, span)
        return graph

    # ---------------------------------------------------------------- generate
    def _keys(self, rows: int, seeds) -> torch.Tensor:
        """[rows, 2] sampling keys: from the row's seed, else from the engine's generator; spare rows 0."""
        seeds = list(seeds)
        free = [i for i, x in enumerate(seeds) if x is None]
        if free:
            drawn = torch.randint(2**62, (len(free),), generator=self.engine._rng, device=self.engine.device).tolist()
            for i, x in zip(free, drawn):
                seeds[i] = x
        return row_keys(seeds + [0] * (rows - len(seeds))).to(self.engine.device)

    def prefill_chunks(self, rows: int, width: int) -> list[tuple[int, int]]:
        """Column ranges [a, b) of the prefill: at most `prefill_tokens` // rows columns each,
        rounded down to a multiple of len_multiple (at least one multiple)."""
        step = max(self.len_multiple, self.prefill_tokens // rows // self.len_multiple * self.len_multiple)
        return [(a, min(width, a + step)) for a in range(0, width, step)]

    def _plan(self, spans: list[int]) -> list[tuple[int, int]]:
        """(steps, span) chunks covering steps 1.. of the generation: `steps_per_graph` steps at a
        time, each chunk attending to its last step's span (masked slots beyond are not read)."""
        k, t, plan = max(1, self.steps_per_graph), 1, []
        while t < len(spans):
            n = k if t + k <= len(spans) else 1
            plan.append((n, spans[t + n - 1]))
            t += n
        return plan

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams, seeds) -> list[Generation]:
        replica = self._sync_model()
        off = torch.autocast(self.engine.device.type, enabled=False) if replica else contextlib.nullcontext()
        with off, self._decode_attention():
            return self._generate(prompts, params, seeds)

    def _generate(self, prompts: list[list[int]], params: SamplingParams, seeds) -> list[Generation]:
        # Long because: the static decode loop (prefill, then one captured graph per span) shares its
        # buffers across every step; split, the pieces would pass all of them around.
        engine, dev = self.engine, self.engine.device
        n, width = len(prompts), max(len(p) for p in prompts)
        rows, length = self.shape(prompts, params)
        temperature, top_p = float(params.temperature), float(params.top_p)
        s = self._state(rows, length)
        # step t writes slot width + t - 1 and attends to the slots before it, rounded up to a
        # multiple of len_multiple: one graph per such span, so early steps read less of the cache
        spans = [min(length, -(-(width + t) // self.len_multiple) * self.len_multiple)
                 for t in range(params.max_tokens)]
        plan = self._plan(spans)
        for key in sorted(set(plan)) if self.graphs else ():
            if (temperature, top_p, key[1], key[0]) not in s.graphs:
                s.graphs[(temperature, top_p, key[1], key[0])] = self._capture(s, temperature, top_p, key[1], key[0])
        s.keys.copy_(self._keys(rows, seeds))

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
        k = torch.arange(length, device=dev)[None, :]
        s.cache.reset()
        for a, b in self.prefill_chunks(rows, width):                        # columns a..b-1 write slots a..b-1
            q = torch.arange(a, b, device=dev)[:, None]
            mask = ((k <= q) & open_slots[:, None, :]) | (k == q)            # [B, b-a, L]; a pad query sees itself
            out = self.model(input_ids=ids[:, a:b], position_ids=positions[:, a:b], past_key_values=s.cache,
                             use_cache=True, attention_mask=mask[:, None], logits_to_keep=1)
        token, logprob = sample_rows(out.logits[:, -1].float(), temperature, top_p, s.keys, 0)
        s.tokens[:, 0], s.logprobs[:, 0] = token, logprob
        s.mask[..., :length].copy_(open_slots[:, None, None, :])
        s.ids.copy_(token[:, None])
        s.pos.copy_(positions[:, -1:] + 1)
        s.slot.fill_(width)
        s.step.fill_(1)

        tokens: list[list[int]] = [[] for _ in range(n)]
        finish, done, checked, t = ["length"] * n, [False] * n, 0, 1
        eos = set(engine.eos_ids)
        for steps, span in [(0, 0)] + plan:                                   # (0, 0): check the prefill's token
            graph = s.graphs.get((temperature, top_p, span, steps))
            if graph is not None:
                graph.replay()
            else:
                for _ in range(steps):
                    self._step(s, temperature, top_p, span)
            t += steps
            if t - checked < self.check_every and t < params.max_tokens:
                continue
            for r, new in enumerate(s.tokens[:n, checked:t].tolist()):
                for tok in (() if done[r] else new):
                    tokens[r].append(tok)
                    if tok in eos or completes_stop(engine.tokenizer, tokens[r], params.stop):
                        finish[r], done[r] = "stop", True
                        break
            checked = t
            if all(done):
                break
        lps = s.logprobs[:n, :params.max_tokens].tolist()
        return [Generation(token_ids=tokens[r], logprobs=lps[r][:len(tokens[r])],
                           text=decode(engine.tokenizer, tokens[r]), finish_reason=finish[r]) for r in range(n)]
