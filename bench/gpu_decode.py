"""Decode throughput of the transformers rollout engine (HFEngine) against the bandwidth bound.

    python bench/gpu_decode.py                    # on a GPU: Qwen3-0.6B shape, random bf16 weights
    python bench/gpu_decode.py --tiny --device cpu --tokens 8   # a seconds-long check of the script

Each decode step reads every weight once, so at batch B the bound is B tokens per
(weight bytes / memory bandwidth) seconds; the bandwidth is 4.3 TB/s (the H200's measured
device-to-device copy rate, also measured here).  Variants (HFEngine(decode=...)):
  loop     the step-by-step loop with a dynamic KV cache (decode="eager")
  static   static KV cache, compiled forward + sampling, CUDA graphs of several steps (decode="auto"
           on CUDA); "static:attention=triton,steps_per_graph=1" passes StaticDecoder options
  static-amp  the same from the trainer's engine with model.dtype bfloat16 (train.py): float32
           weights + compute_dtype bfloat16, decoded through the decoder's bfloat16 copy,
           refreshed from the float32 weights at every call (the refresh is in the rate)
Sampling at temperature 1, per-row seeds (as rollouts sample).  Random weights rarely emit
the EOS id, so rows run to --tokens; tokens/s counts the tokens returned.  The static path's
first call compiles and captures (timed separately, not in the rate).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

BANDWIDTH = 4.3e12          # bytes/s


def copy_bandwidth(device, gib: float = 4.0) -> float:
    """Device-to-device copy rate, bytes read + written per second (median of 10)."""
    a = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(12):
        torch.cuda.synchronize()
        t = time.perf_counter()
        b.copy_(a)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return 2 * a.numel() / statistics.median(times[2:])


def build(tiny: bool, device, size: str = "0.6b"):
    from gpu_train_step import qwen3_config
    from transformers import Qwen3ForCausalLM

    cfg = qwen3_config(tiny, size)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval()
    eos = cfg.vocab_size - 1
    tokenizer = SimpleNamespace(eos_token_id=eos, pad_token_id=eos, decode=lambda ids, **kw: "")
    return model, tokenizer


def measure(engine, batch: int, prompt: int, tokens: int, repeats: int) -> dict:
    from orchestrator.engines.interface import SamplingParams

    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, engine.vocab_size - 1, (prompt,), generator=g).tolist() for _ in range(batch)]
    started = time.perf_counter()
    engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=tokens, seed=100))   # warm-up
    first = time.perf_counter() - started
    rates = []
    for r in range(repeats):
        started = time.perf_counter()
        gens = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=tokens, seed=r))
        rates.append(sum(len(x.token_ids) for x in gens) / (time.perf_counter() - started))
    return {"batch": batch, "prompt": prompt, "tokens": tokens, "first_call_s": first,
            "tokens_per_s": statistics.median(rates), "rates": rates}


def _event_ms(fn, repeats: int = 100) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def _graph_ms(fn, calls: int = 28, repeats: int = 20) -> float:
    """ms of `calls` calls of fn captured in one CUDA graph (launch costs excluded, as in the
    decode graph); eager (`_event_ms`) if the capture fails."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(), fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
    except Exception:   # noqa: BLE001
        return _event_ms(fn) * calls
    return _event_ms(graph.replay, repeats=repeats)


def static_parts(engine) -> dict:
    """Where a static step's time goes: one graph replay alone (per step), the sampling alone."""
    from orchestrator.engines.sampling import row_keys, sample_rows

    static = engine._static
    (rows, length), state = next(reversed(static._shapes.items()))
    out = {"rows": rows, "cache_len": length}
    with torch.inference_mode():
        def reset():          # replay from slot 128 on (a graph of k steps writes slots 128..128+k-1)
            for layer in state.cache.layers:
                layer.cumulative_length.fill_(128)
            state.slot.fill_(128)
            state.step.fill_(1)
        reset_ms = _event_ms(reset, repeats=50)
        for (temperature, top_p, span, steps), graph in sorted(state.graphs.items()):
            ms = _event_ms(lambda g=graph: (reset(), g.replay()), repeats=30)
            out[f"replay_span{span}_steps{steps}_ms_per_step"] = (ms - reset_ms) / steps
        logits = torch.randn(rows, engine.vocab_size, device=engine.device)
        keys, step = row_keys(list(range(rows))).to(engine.device), torch.ones(1, dtype=torch.long, device=engine.device)
        out["sampling_eager_ms"] = _event_ms(lambda: sample_rows(logits, 1.0, 1.0, keys, step))
        compiled = torch.compile(sample_rows)
        out["sampling_compiled_alone_ms"] = _event_ms(lambda: compiled(logits, 1.0, 1.0, keys, step))
        from torch.profiler import ProfilerActivity, profile

        with static._decode_attention(), profile(activities=[ProfilerActivity.CUDA]) as prof:
            static._model_forward()(state.ids, state.pos, state.mask[..., :256], state.cache, state.keys,
                                    state.step, 1.0, 1.0)
            torch.cuda.synchronize()
    print("--- one compiled forward + sampling (eager launch, not a graph): top CUDA kernels")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=20, max_name_column_width=70))
    return out


def micro(device, hidden: int = 1024, inter: int = 3072, vocab: int = 151936, rows: int = 64) -> dict:
    """Kernel alternatives at the decode shapes, on random tensors: GEMM layouts (x @ W.T as
    F.linear does, or (W @ x.T).T) and decode attention (SDPA on grouped heads vs matmuls).
    GEMMs launched eagerly one after another: kernels shorter than a launch (~20 us) time the launch
    (the per-layer GEMMs did here); in the decode graph they take 5-7 us (the profile).  Attention:
    28 calls (one per layer) captured in one CUDA graph, with each variant's max abs error against
    the matmul form."""
    out = {}
    for name, (n, k) in {"q": (2048, hidden), "kv": (1024, hidden), "o": (hidden, 2048), "up": (inter, hidden),
                         "down": (hidden, inter), "head": (vocab, hidden)}.items():
        w = torch.randn(n, k, device=device, dtype=torch.bfloat16) * 0.02
        a = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
        lin = _event_ms(lambda a=a, w=w: torch.nn.functional.linear(a, w))
        tr = _event_ms(lambda a=a, w=w: torch.mm(w, a.T).T)
        out[name] = {"linear_ms": lin, "transposed_ms": tr, "linear_TBps": w.numel() * 2 / lin / 1e9}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from orchestrator.engines.decode_kernels import decode_attention, decode_attention_matmul
    from orchestrator.engines.split_kv_attention import split_decode_attention

    def sdpa_gqa(_, q, k, v, m, scaling, backend=None):   # stock SDPA, KV heads grouped by the kernel
        span = m.shape[-1]
        ctx = sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()
        with ctx:
            return torch.nn.functional.scaled_dot_product_attention(
                q, k[:, :, :span], v[:, :, :span], attn_mask=m if backend is None else None, scale=scaling,
                enable_gqa=True).transpose(1, 2), None

    mm_compiled = torch.compile(decode_attention_matmul)
    for span in (256, 384):
        q = torch.randn(rows, 16, 1, 128, device=device, dtype=torch.bfloat16)
        k = torch.randn(rows, 8, 512, 128, device=device, dtype=torch.bfloat16)
        v = torch.randn_like(k)
        mask = torch.ones(rows, 1, 1, span, dtype=torch.bool, device=device)
        mask[:, :, :, :5] = False
        mask[::3, :, :, :40] = False                 # rows of different prompt widths
        kv_bytes = 2 * k[:, :, :span].numel() * 2 * 28
        want = decode_attention_matmul(None, q, k, v, mask, scaling=128 ** -0.5)[0].float()
        fns = {"sdpa": decode_attention, "matmul_eager": decode_attention_matmul, "matmul_compiled": mm_compiled,
               "sdpa_gqa_masked": sdpa_gqa,
               "sdpa_gqa_flash_nomask": lambda *a, **kw: sdpa_gqa(*a, **kw, backend=SDPBackend.FLASH_ATTENTION)}
        for splits in (1, 2, 4, None):
            fns[f"triton_splits{splits or 'auto'}"] = (
                lambda _, q, k, v, m, scaling, n=splits: (split_decode_attention(q, k, v, m, scaling, n), None))
        for name, fn in fns.items():
            try:
                got = fn(None, q, k, v, mask, scaling=128 ** -0.5)[0]
                if "nomask" not in name:
                    out[f"attention_{name}_span{span}_max_abs_err_vs_matmul"] = \
                        (got.reshape(want.shape).float() - want).abs().max().item()
                ms = _graph_ms(lambda fn=fn, q=q, k=k, v=v, m=mask: fn(None, q, k, v, m, scaling=128 ** -0.5))
            except Exception as exc:   # noqa: BLE001 (report and go on)
                out[f"attention_{name}_span{span}_error"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            out[f"attention_{name}_span{span}_28layers_ms"] = ms
            out[f"attention_{name}_span{span}_TBps"] = kv_bytes / ms / 1e9
    return out


def read_weight_bytes(model) -> int:
    """Bytes of the weights one decode step reads: all of them but an untied input embedding
    (of which only the batch's rows are read)."""
    emb = model.get_input_embeddings().weight
    tied = emb is model.get_output_embeddings().weight
    return sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not emb)


def kv_slot_bytes(config, itemsize: int = 2) -> int:
    """Bytes of K and V one cache slot (one token of one row) holds over all layers."""
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * itemsize


def long_context(engine, batch: int, width: int, tokens: int, bandwidth: float) -> dict:
    """One call of `batch` prompts of `width` tokens + `tokens` new ones (compiles and captures
    where the shape is new; its seconds include the prefill), then the decode step alone: the
    widest span's captured graph of steps_per_graph steps replayed from slot `width` on (events,
    median of 10), against two bounds: the weights read once per step (the old figure) and the
    weights + every row's KV cache up to that span read once per step (the full one)."""
    from orchestrator.engines.interface import SamplingParams

    static, model = engine._static, engine.model
    g = torch.Generator().manual_seed(batch * 100_003 + width)
    prompts = [torch.randint(0, engine.vocab_size - 1, (width,), generator=g).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=1.0, max_tokens=tokens, seed=100)
    cuda = engine.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    started = time.perf_counter()
    engine.generate(prompts, params)
    sync()
    first = time.perf_counter() - started
    key = static.shape(prompts, params)
    if key not in static._shapes:
        raise RuntimeError(f"batch {batch} x {width}: the static decoder did not serve the call (KV cache too large "
                           f"for memory_fraction {static.memory_fraction}); the step-by-step loop did")
    state = static._shapes[key]
    span = static.shape(prompts, params)[1]

    def reset():
        for layer in state.cache.layers:
            layer.cumulative_length.fill_(width)
        state.slot.fill_(width)
        state.step.fill_(1)
    with torch.inference_mode():
        if cuda:
            (_, _, span, steps), graph = max(((k, v) for k, v in state.graphs.items() if k[3] == static.steps_per_graph),
                                             key=lambda kv: kv[0][2])
            reset_ms = _event_ms(reset, repeats=20)
            times = [(_event_ms(lambda: (reset(), graph.replay()), repeats=1) - reset_ms) / steps for _ in range(10)]
        else:                      # a check of the script: eager steps, host clock
            times = []
            for _ in range(3):
                reset()
                started = time.perf_counter()
                with static._decode_attention():
                    static._step(state, 1.0, 1.0, span)
                times.append(1e3 * (time.perf_counter() - started))
    step_ms = statistics.median(times)
    weights = read_weight_bytes(model)
    kv = key[0] * span * kv_slot_bytes(model.config.get_text_config(decoder=True))
    return {"batch": batch, "rows": key[0], "width": width, "tokens": tokens, "span": span, "first_call_s": first,
            "step_ms": step_ms, "tokens_per_s": batch / step_ms * 1e3, "weight_bytes_read": weights, "kv_bytes_read": kv,
            "of_weights_bound": weights / bandwidth / (step_ms / 1e3),
            "of_full_bound": (weights + kv) / bandwidth / (step_ms / 1e3),
            "achieved_TBps": (weights + kv) / (step_ms / 1e3) / 1e12,
            "reserved_gib": torch.cuda.memory_reserved() / 2**30 if cuda else None}


def grid(model, tokenizer, device, args, bandwidth: float) -> list[dict]:
    """`long_context` for each --grid BATCH:WIDTH, one engine (its compiled forward shared), the
    previous shape's cache and graphs dropped before the next."""
    pairs = [tuple(int(x) for x in item.split(":")) for item in args.grid]
    engine = variant_engine(args.variants[0], model, tokenizer, device, max(b for b, _ in pairs))
    out = []
    for batch, width in pairs:
        try:
            row = long_context(engine, batch, width, args.tokens, bandwidth)
        except Exception as exc:   # noqa: BLE001 (report and go on)
            row = {"batch": batch, "width": width, "error": f"{type(exc).__name__}: {exc}"[:600]}
        engine._static.release()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        out.append(row)
        print(json.dumps(row), flush=True)
    return out


def _number(text: str):
    """A StaticDecoder option's value: int, float, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def variant_engine(variant: str, model, tokenizer, device, max_batch: int):
    """The HFEngine a --variants entry names: "loop" | "static" | "static-amp", then optionally
    ":key=value,..." StaticDecoder options."""
    from orchestrator.engines.hf import HFEngine
    from orchestrator.engines.hf_static import StaticDecoder

    kind, _, opts = variant.partition(":")
    amp = kind == "static-amp"
    engine = HFEngine(copy.deepcopy(model).float() if amp else model, tokenizer, device=str(device),
                      max_batch=max_batch, seed=0, decode="eager" if kind == "loop" else "static",
                      compute_dtype=torch.bfloat16 if amp else None)
    if opts:
        engine._static = StaticDecoder(engine, **{k: _number(v) for k, v in (o.split("=") for o in opts.split(","))})
    return engine


def shapes(model, tokenizer, device, args) -> list[dict]:
    """Per variant, prompts of `args.widths` in turn at the first batch size: seconds of the
    first call at each width (compile / capture for a new shape) and of a second one, and the
    GPU memory reserved after it."""
    from orchestrator.engines.interface import SamplingParams

    out = []
    for variant in args.variants:
        engine = variant_engine(variant, model, tokenizer, device, args.batches[0])
        g = torch.Generator().manual_seed(1)
        for width in args.widths:
            prompts = [torch.randint(0, engine.vocab_size - 1, (width,), generator=g).tolist()
                       for _ in range(args.batches[0])]
            times = []
            for r in range(2):
                torch.cuda.synchronize() if device.type == "cuda" else None
                started = time.perf_counter()
                gens = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=args.tokens, seed=r))
                torch.cuda.synchronize() if device.type == "cuda" else None
                times.append(time.perf_counter() - started)
            tokens = hashlib.sha256(json.dumps([x.token_ids for x in gens]).encode()).hexdigest()[:12]
            row = {"variant": variant, "width": width, "first_s": times[0], "second_s": times[1],
                   "reserved_gib": torch.cuda.memory_reserved() / 2**30 if device.type == "cuda" else None,
                   "tokens_sha": tokens}       # equal across variants: the same samples
            out.append(row)
            print(json.dumps(row), flush=True)
        del engine
        torch.cuda.empty_cache() if device.type == "cuda" else None
    return out


def main() -> int:

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--model", default="0.6b", choices=["0.6b", "8b"], help="Qwen3 shape (random bf16 weights)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens per row")
    parser.add_argument("--tokens", type=int, default=256, help="generated tokens per row (static)")
    parser.add_argument("--loop-tokens", type=int, default=32, help="generated tokens per row (loop: slow)")
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 8, 1])
    parser.add_argument("--variants", nargs="+", default=["static", "loop"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--micro", action="store_true", help="also time kernel alternatives at the decode shapes")
    parser.add_argument("--widths", type=int, nargs="+", default=None,
                        help="instead of the rate runs: prompts of these widths in turn (new cache shapes, as a "
                             "multi-turn rollout's), per call the seconds of its first and second run and the "
                             "GPU memory reserved after")
    parser.add_argument("--grid", nargs="+", metavar="BATCH:WIDTH", default=None,
                        help="instead of the rate runs: per BATCH:WIDTH one call with prompts of WIDTH tokens, then "
                             "the decode step's time against the weights-only and the weights + KV-cache bounds "
                             "(first --variants entry; give it memory_fraction=0.9 for long contexts)")
    parser.add_argument("--no-parts", action="store_true", help="skip the static path's breakdown (replay, profile)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    device = torch.device(args.device)
    model, tokenizer = build(args.tiny, device, args.model)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())   # tied: counted once
    step_bound_s = weight_bytes / BANDWIDTH
    results = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "weight_bytes": weight_bytes, "bandwidth_assumed": BANDWIDTH,
               "copy_bandwidth_measured": copy_bandwidth(device) if device.type == "cuda" else None, "runs": []}
    if args.micro and device.type == "cuda":
        results["micro"] = micro(device)
        print(json.dumps(results["micro"]), flush=True)
    if args.grid:
        results["grid"] = rows = grid(model, tokenizer, device, args, results["copy_bandwidth_measured"] or BANDWIDTH)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_decode.json").write_text(json.dumps(results, indent=1))
        print(f"\n{results['device']}, torch {results['torch']}, copy bandwidth "
              f"{(results['copy_bandwidth_measured'] or 0) / 1e12:.2f} TB/s (the bounds' rate)")
        print("| rows | prompt | slots read | ms/step | tokens/s | weights GB | KV GB | of weights-only bound | "
              "of weights + KV bound | TB/s | first call s |")
        for r in rows:
            if "error" in r:
                print(f"| {r['batch']} | {r['width']} | error: {r['error'][:300]} |")
            else:
                print(f"| {r['batch']} | {r['width']:,} | {r['span']:,} | {r['step_ms']:.2f} | {r['tokens_per_s']:,.0f} | "
                      f"{r['weight_bytes_read'] / 1e9:.1f} | {r['kv_bytes_read'] / 1e9:.1f} | {r['of_weights_bound']:.1%} | "
                      f"{r['of_full_bound']:.1%} | {r['achieved_TBps']:.2f} | {r['first_call_s']:.1f} |")
        return 0
    if args.widths:
        results["shapes"] = shapes(model, tokenizer, device, args)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "gpu_decode.json").write_text(json.dumps(results, indent=1))
        return 0
    for variant in args.variants:
        kind = variant.partition(":")[0]
        engine = variant_engine(variant, model, tokenizer, device, max(args.batches))
        for batch in args.batches if kind != "loop" else args.batches[:1]:
            tokens = args.tokens if kind != "loop" else args.loop_tokens
            try:
                r = measure(engine, batch, args.prompt, tokens, args.repeats)
                bound = batch / step_bound_s
                r.update({"variant": variant, "bound_tokens_per_s": bound, "of_bound": r["tokens_per_s"] / bound,
                          "ms_per_step": 1e3 * batch / r["tokens_per_s"]})
            except Exception as exc:   # noqa: BLE001 (report and go on)
                r = {"variant": variant, "batch": batch, "error": f"{type(exc).__name__}: {exc}"[:800]}
            results["runs"].append(r)
            print(json.dumps(r), flush=True)
        if kind != "loop" and device.type == "cuda" and not args.no_parts:
            try:
                results.setdefault("static_parts", {})[variant] = parts = static_parts(engine)
                print(json.dumps(parts), flush=True)
            except Exception as exc:   # noqa: BLE001 (diagnostics only)
                print(f"static_parts({variant}): {type(exc).__name__}: {exc}"[:800], flush=True)
        del engine
        torch.cuda.empty_cache() if device.type == "cuda" else None
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_decode.json").write_text(json.dumps(results, indent=1))
    print(f"\n{results['device']}, torch {results['torch']}, weights {weight_bytes / 1e9:.2f} GB, "
          f"bound step {step_bound_s * 1e3:.3f} ms at {BANDWIDTH / 1e12:.1f} TB/s "
          f"(copy measured {(results['copy_bandwidth_measured'] or 0) / 1e12:.2f} TB/s)")
    print(f"{'variant':8s} {'batch':>5s} {'tokens':>6s} {'tok/s':>9s} {'ms/step':>8s} {'bound tok/s':>11s} "
          f"{'of bound':>8s} {'1st call s':>10s}")
    for r in results["runs"]:
        if "error" in r:
            print(f"{r['variant']:8s} {r['batch']:5d} error: {r['error'][:300]}")
        else:
            print(f"{r['variant']:8s} {r['batch']:5d} {r['tokens']:6d} {r['tokens_per_s']:9.0f} {r['ms_per_step']:8.2f} "
                  f"{r['bound_tokens_per_s']:11.0f} {r['of_bound']:8.2%} {r['first_call_s']:10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
