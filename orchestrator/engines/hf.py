"""In-process transformers rollout engine (CPU and GPU): the default engine here.

Batched, left-padded generation from token ids with a KV cache, written out step by step
(not `model.generate`) because RL needs three things it does not give together: the
log-prob of each sampled token under the *sampling* distribution (after temperature,
top-p and any constraint), a per-row seed, and choice-constrained decoding.

Log-probs (float32): for temperature T > 0, `log softmax(top_p(mask(logits) / T))[token]`;
for greedy (T = 0), `log softmax(mask(logits))[token]`, as vLLM's processed log-probs.
`mask` keeps only the tokens a choice constraint (or a grammar, `SamplingParams.grammar`,
through xgrammar: orchestrator/engines/grammar.py) allows, so the recorded log-prob is that of
the constrained sampler (renormalised over the allowed tokens).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from pathlib import Path

import torch

from orchestrator.engines.interface import Generation, SamplingParams
from orchestrator.engines.common import (STATIC_MEMORY_FRACTION, check_memory_fraction, completes_stop, decode, eos_token_ids, row_seeds,
                                         validate_request)
from orchestrator.engines.compile_regions import check_compile_mode
from orchestrator.engines.grammar import token_grammar
from orchestrator.engines.hf_static import StaticDecoder
from orchestrator.engines.sampling import top_p_filter

log = logging.getLogger(__name__)


class ChoiceTrie:
    """Prefix trie over the token ids of each choice followed by an EOS id.

    A node is a dict `{token_id: child}`; an empty dict marks the end of a choice.
    Built from the canonical tokenization of each string (vLLM's grammar also admits
    other tokenizations of the same text, so its log-probs can differ slightly).
    """

    def __init__(self, tokenizer, choices: list[str], eos_ids: list[int]):
        self.root: dict = {}
        for choice in choices:
            node = self.root
            for t in tokenizer(choice, add_special_tokens=False)["input_ids"]:
                node = node.setdefault(t, {})
            for e in eos_ids:
                node.setdefault(e, {})


def _load_folder_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a saved model folder (safetensors shards, else pytorch_model*.bin)."""
    from safetensors.torch import load_file  # lazy: heavy (torch)

    files = sorted(folder.glob("*.safetensors"))
    if files:
        return {k: v for f in files for k, v in load_file(str(f)).items()}
    files = sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"update_weights: no *.safetensors or pytorch_model*.bin in {folder}")
    return {k: v for f in files for k, v in torch.load(f, map_location="cpu", weights_only=True).items()}


def _inverse_cdf_sample(probs: torch.Tensor, gens: list[torch.Generator]) -> torch.Tensor:
    """One token per row of `probs` [A, V], row r drawing its uniform from `gens[r]`. -> [A]

    One uniform per row and a batched search over the cumulative sums: `torch.multinomial`
    costs ~40 ms per 49k-token row here.  `u` is scaled by the row's total so rounding in
    the cumulative sum can never run past the last token; `right=True` never lands on a
    zero-probability token.
    """
    if all(g is gens[0] for g in gens):                                       # one launch, not A
        u = torch.rand(len(gens), generator=gens[0], device=probs.device)
    else:
        u = torch.cat([torch.rand(1, generator=g, device=probs.device) for g in gens])
    return inverse_cdf(probs, u)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token of each row of `probs` [A, V] whose cumulative mass first exceeds u [A] in [0, 1). -> [A]"""
    cdf = probs.cumsum(dim=-1)                                                # [A, V]
    u = (u * cdf[:, -1]).unsqueeze(-1)                                        # [A, 1]
    return torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=probs.shape[-1] - 1)


class HFEngine:
    """`Engine` over an in-process `transformers` causal LM.

    Args:
        model: a saved model folder (or hub id available offline) or a loaded model.
        tokenizer: a tokenizer or its folder; default: the model's folder.
        device: "cpu", "cuda", "cuda:1", ...; default: cuda when available.
        dtype: torch dtype for a model loaded here; default float32 on CPU, bfloat16 on GPU.
        max_batch: most rows per forward pass (larger calls are split), bounds memory.
        seed: seeds the generator of rows sampled without `SamplingParams.seed`.
        compute_dtype: run forward passes under `torch.autocast` to this dtype (the trainer's
            float32 master weights with model.dtype bfloat16, training/precision.py).
        decode: "auto" (static KV cache + compiled CUDA-graph steps on CUDA for requests without
            a constraint, orchestrator/engines/hf_static.py; the step-by-step loop otherwise),
            "static" (that path on any device: eager on the CPU) or "eager" (always the loop).
        static_memory_fraction: most of the free GPU memory one batch shape's static KV cache may
            take, in (0, 1]; a shape needing more takes the loop, with a warning once per shape.
        static_compile: the static decoder's torch.compile on CUDA: "regional" (the decoder layer
            compiled once for every layer and shape), "whole" (the whole forward as one graph) or
            "none"; None: regional on CUDA, none elsewhere (orchestrator/engines/compile_regions.py).
    """

    def __init__(self, model, tokenizer=None, *, device: str | None = None, dtype=None,
                 max_batch: int = 32, seed: int | None = None, compute_dtype: torch.dtype | None = None,
                 decode: str = "auto", static_memory_fraction: float = STATIC_MEMORY_FRACTION,
                 static_compile: str | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer  # lazy: heavy (seconds to import)

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if isinstance(model, (str, Path)):
            path = str(model)
            if dtype is None:
                dtype = torch.float32 if self.device.type == "cpu" else torch.bfloat16
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        else:
            path = getattr(model, "name_or_path", None) or None
        self.model = model.to(self.device).eval()
        if tokenizer is None or isinstance(tokenizer, (str, Path)):
            source = tokenizer or path
            if not source:
                raise ValueError("HFEngine: pass tokenizer= when the model is an object without name_or_path")
            tokenizer = AutoTokenizer.from_pretrained(str(source))
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(tokenizer, generation_config=getattr(model, "generation_config", None))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.vocab_size = model.get_input_embeddings().weight.shape[0]
        self.max_batch = max_batch
        self.compute_dtype = compute_dtype
        if decode not in ("auto", "static", "eager"):
            raise ValueError(f"HFEngine(decode={decode!r}): choose 'auto', 'static' or 'eager'")
        self.decode = decode
        check_memory_fraction(static_memory_fraction, "HFEngine(static_memory_fraction)")
        if static_compile is not None:
            check_compile_mode(static_compile, "HFEngine(static_compile)")
        self._static = None
        if decode == "static" or (decode == "auto" and self.device.type == "cuda"):
            self._static = StaticDecoder(self, memory_fraction=static_memory_fraction,
                                         compile=static_compile if self.device.type == "cuda" else None)
        # rows decoded per path, for a static decoder's users to see how much fell back to the loop
        # (constrained or deadline requests, a cache too large, a failed static path): the trainer
        # logs them per step (engine/static_rows, engine/loop_rows)
        self.static_expected = self._static is not None
        self.decode_rows: Counter[str] = Counter()
        self._rng = torch.Generator(device=self.device)
        self._rng.manual_seed(seed if seed is not None else int(torch.randint(2**62, ()).item()))
        # generate and update_weights never interleave (the batcher is one caller; others may not be)
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- public API
    def generate(self, prompts: list[list[int]], params: SamplingParams, *,
                 seeds: list[int | None] | None = None,
                 deadlines: list[float | None] | None = None,
                 cancels: list[threading.Event | None] | None = None) -> list[Generation]:
        """Continue each prompt (token ids) once; one `Generation` per prompt, in order.

        `seeds` (optional, one per prompt) overrides the per-row seeds `params.seed + i`;
        the batcher uses it to merge seeded calls without changing their samples.
        `deadlines` (optional, one `time.monotonic()` per prompt, None: none): a row still
        generating when its deadline passes stops with finish_reason "timeout" (the gateway's
        per-request timeout); rows with deadlines run the step-by-step loop.
        `cancels` (optional, one event per prompt, None: none): a row whose event is set stops at
        its next token with finish_reason "cancelled" (its caller went away: orchestrator/cancellation.py);
        rows with events run the step-by-step loop too (the prompt's one prefill pass is not cut).
        """
        validate_request(prompts, params, self.vocab_size)
        seeds = row_seeds(params, len(prompts)) if seeds is None else list(seeds)
        deadlines = [None] * len(prompts) if deadlines is None else list(deadlines)
        cancels = [None] * len(prompts) if cancels is None else list(cancels)
        for name, given in (("seeds", seeds), ("deadlines", deadlines), ("cancel events", cancels)):
            if len(given) != len(prompts):
                raise ValueError(f"generate: {len(given)} {name} for {len(prompts)} prompts")
        out: list[Generation] = []
        cast = (torch.autocast(self.device.type, dtype=self.compute_dtype) if self.compute_dtype is not None
                else contextlib.nullcontext())
        with self._lock, cast:
            for start in range(0, len(prompts), self.max_batch):
                stop = start + self.max_batch
                out += self._generate_rows(prompts[start:stop], params, seeds[start:stop], deadlines[start:stop],
                                           cancels[start:stop])
        return out

    def _generate_rows(self, prompts, params: SamplingParams, seeds, deadlines, cancels) -> list[Generation]:
        """The static-cache path where it applies (no deadlines, no cancel events), else the step-by-step loop.
        With decode="auto" a failure of the static path (e.g. torch.compile) is logged once and
        the loop serves this and every later request."""
        if (self._static is None or any(d is not None for d in deadlines) or any(c is not None for c in cancels)
                or not self._static.supports(prompts, params)):
            self.decode_rows["loop"] += len(prompts)
            return self._generate_batch(prompts, params, seeds, deadlines, cancels)
        try:
            out = self._static.generate(prompts, params, seeds)
            self.decode_rows["static"] += len(prompts)
            return out
        except Exception as exc:
            if self.decode == "static":
                raise
            log.warning("HFEngine: static-cache decoding failed (%s: %s); using the step-by-step loop from now on",
                        type(exc).__name__, str(exc)[:300])
            self._static = None
            self.decode_rows["loop"] += len(prompts)
            return self._generate_batch(prompts, params, seeds, deadlines, cancels)

    def update_weights(self, state_dict_or_path) -> None:
        """Copy new weights into the model in place (a state dict or a saved model folder).

        Tensors are cast to the model's dtype and device. Keys must match the model's; a
        tied weight (e.g. `lm_head.weight` = the embeddings) may be absent.
        """
        if isinstance(state_dict_or_path, (str, Path)):
            state_dict = _load_folder_state_dict(Path(state_dict_or_path))
        else:
            state_dict = state_dict_or_path
        with self._lock, torch.no_grad():
            result = self.model.load_state_dict(state_dict, strict=False)
            missing = set(result.missing_keys) - self._tied_to_loaded(state_dict)
            if missing or result.unexpected_keys:
                raise ValueError(
                    f"update_weights: state dict does not match the model: missing "
                    f"{sorted(missing)[:5]}, unexpected {sorted(result.unexpected_keys)[:5]} "
                    "(strip wrapper prefixes such as 'module.' or '_orig_mod.' first)")

    # ---------------------------------------------------------------- internals
    def _tied_to_loaded(self, state_dict) -> set[str]:
        """Parameter names that share storage with a parameter present in `state_dict`."""
        by_ptr: dict[int, list[str]] = {}
        for name, tensor in self.model.state_dict(keep_vars=True).items():
            by_ptr.setdefault(tensor.data_ptr(), []).append(name)
        tied: set[str] = set()
        for names in by_ptr.values():
            if len(names) > 1 and any(n in state_dict for n in names):
                tied.update(names)
        return tied

    def _grammar(self):
        return token_grammar(self.tokenizer, self.vocab_size, self.eos_ids)

    def _generators(self, seeds: list[int | None]) -> list[torch.Generator]:
        gens = []
        for s in seeds:
            if s is None:
                gens.append(self._rng)
            else:
                g = torch.Generator(device=self.device)
                g.manual_seed(s)
                gens.append(g)
        return gens

    def _next_tokens(self, logits: torch.Tensor, allowed: list[list[int] | torch.Tensor | None],
                     params: SamplingParams, gens: list[torch.Generator]) -> tuple[list[int], list[float]]:
        """Pick one token per row and its log-prob under the sampling distribution. logits: [A, V].

        `allowed[row]`: None (free), the allowed ids (choices) or a bool mask (grammar)."""
        logits = logits.float()
        free = logits
        if any(a is not None for a in allowed):
            mask = torch.zeros_like(logits)
            for row, ids in enumerate(allowed):
                if isinstance(ids, torch.Tensor):                              # grammar: bool [V']
                    mask[row, :ids.shape[0]].masked_fill_(~ids.to(mask.device), float("-inf"))
                    mask[row, ids.shape[0]:] = float("-inf")
                elif ids is not None:
                    mask[row].fill_(float("-inf"))
                    mask[row, ids] = 0.0
            logits = logits + mask                                            # [A, V]
        if params.temperature == 0:
            tokens = logits.argmax(dim=-1)                                    # [A]
            logprobs = logits.log_softmax(dim=-1)
        else:
            scaled = logits / params.temperature
            if params.top_p < 1:
                scaled = top_p_filter(scaled, params.top_p)
            logprobs = scaled.log_softmax(dim=-1)                             # [A, V]
            tokens = _inverse_cdf_sample(logprobs.exp(), gens)
        if params.unconstrained_logprobs and free is not logits:              # before the constraint's mask
            logprobs = (free / (params.temperature or 1.0)).log_softmax(dim=-1)  # [A, V]
        picked = logprobs.gather(-1, tokens[:, None])[:, 0]                  # [A]
        return tokens.tolist(), picked.tolist()

    jump_forward = True     # choices: forced tokens without a forward pass (False: one pass per token)

    @staticmethod
    def _forced(node: dict, room: int) -> tuple[list[int], bool]:
        """The tokens a choice trie forces from `node` on (each the only child of the one before),
        at most `room`; and whether they end the choice (the last one's node is a leaf)."""
        chain = []
        while len(node) == 1 and len(chain) < room:
            token, node = next(iter(node.items()))
            chain.append(token)
        return chain, bool(chain) and not node

    def _generate_batch(self, prompts, params: SamplingParams, seeds, deadlines=None, cancels=None) -> list[Generation]:
        # Long because: one decode loop whose per-step state (cache, ids, masks, finished rows,
        # deadlines, cancels) every line reads and writes; split, the pieces would pass all of it around.
        from transformers import DynamicCache  # lazy: heavy (seconds to import)

        n, width = len(prompts), max(len(p) for p in prompts)
        deadlines = [None] * n if deadlines is None else deadlines
        cancels = [None] * n if cancels is None else cancels

        def ended(r: int) -> str | None:
            """Why row r must stop now, whatever it generates: its caller went away or its deadline passed."""
            if cancels[r] is not None and cancels[r].is_set():
                return "cancelled"
            if deadlines[r] is not None and time.monotonic() >= deadlines[r]:
                return "timeout"
            return None

        early = [ended(r) for r in range(n)]
        if all(early):                                                        # expired or cancelled while queued
            return [Generation(token_ids=[], logprobs=[], text="", finish_reason=why) for why in early]
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((n, width), dtype=torch.long)
        for i, p in enumerate(prompts):                                       # left padding
            ids[i, width - len(p):] = torch.tensor(p)
            attention[i, width - len(p):] = 1
        ids, attention = ids.to(self.device), attention.to(self.device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)                  # [n, width]
        trie = ChoiceTrie(self.tokenizer, params.choices, self.eos_ids) if params.choices else None
        nodes = [trie.root if trie else None for _ in prompts]
        grammar = self._grammar() if params.grammar else None
        matchers = [grammar.matcher(params.grammar) for _ in prompts] if grammar else None
        tokens: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        finish = ["length"] * n
        gens = self._generators(seeds)
        live = list(range(n)) if params.max_tokens > 0 else []               # rows still generating
        cache = DynamicCache(config=self.model.config)

        def accept(r: int, token: int, logprob: float) -> bool:
            """Append `token` to row r; False when the row is finished."""
            tokens[r].append(token)
            logprobs[r].append(logprob)
            if trie:
                nodes[r] = nodes[r][token]
            if grammar:
                matchers[r].accept_token(token)
            if token in self.eos_ids or completes_stop(self.tokenizer, tokens[r], params.stop):
                finish[r] = "stop"
            elif why := ended(r):
                finish[r] = why
            elif len(tokens[r]) >= params.max_tokens:
                pass                                                          # finish "length"
            else:
                return True
            return False

        with torch.inference_mode():
            while live:
                out = self.model(input_ids=ids, attention_mask=attention, position_ids=positions,
                                 past_key_values=cache, use_cache=True, logits_to_keep=1)
                allowed = [list(nodes[r]) if trie else grammar.allowed(matchers[r]) if grammar else None
                           for r in live]
                picked, lps = self._next_tokens(out.logits[:, -1, :], allowed, params, [gens[r] for r in live])
                going = [accept(r, picked[k], lps[k]) for k, r in enumerate(live)]
                start = [len(tokens[r]) - 1 for r in live]
                # jump-forward: where the choices leave one token, append it without a forward pass
                # (its log-prob under the constrained distribution is exactly 0; the row's generator
                # still draws the uniform a step would, so a seeded row's samples do not change).  A row whose
                # forced tokens run to its end takes them all; the others take as many as every
                # such row can, so the rows' new tokens stay the same length (a padded hole inside
                # a row would shift a sliding attention window and change its logits)
                chains = {k: self._forced(nodes[r], params.max_tokens - len(tokens[r]))
                          for k, r in enumerate(live) if going[k] and trie and self.jump_forward}
                aligned = [len(c) for c, ends in chains.values() if not ends]
                for k, (chain, ends) in chains.items():
                    for token in chain if ends else chain[:min(aligned)]:
                        torch.rand(1, generator=gens[live[k]], device=self.device)
                        going[k] = accept(live[k], token, 0.0)
                        if not going[k]:
                            break
                keep = [k for k, g in enumerate(going) if g]
                if not keep:
                    break
                if len(keep) < len(live):                                     # drop finished rows
                    index = torch.tensor(keep, device=self.device)
                    cache.batch_select_indices(index)
                    attention, positions = attention[index], positions[index]
                    live = [live[k] for k in keep]
                ids = torch.tensor([tokens[r][start[k]:] for k, r in zip(keep, live)], device=self.device)
                step = ids.shape[1]
                attention = torch.cat([attention, attention.new_ones((len(live), step))], dim=1)
                positions = positions[:, -1:] + torch.arange(1, step + 1, device=self.device)
        return [Generation(token_ids=tokens[r], logprobs=logprobs[r], text=decode(self.tokenizer, tokens[r]),
                           finish_reason=finish[r]) for r in range(n)]
