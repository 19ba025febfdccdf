"""Cold compile time of a GRPO step's compiled parts, by compile mode, each mode in a fresh process
with empty Inductor / Triton caches.

    python bench/compile_cold.py --device cpu --layers 4        # Inductor's CPU backend, a small Qwen3
    python bench/compile_cold.py --device cuda --json $OUT/compile_cold.json   # Qwen3-0.6B shape, bf16

Modes (`--modes`):
  previous  the static decoder's whole forward compiled as one graph (`engine.compile: whole`), the
            update's decoder layers compiled with torch.compile's default shapes (static first, then
            dynamic when a size first changes): the tree before regional compilation;
  regional  the decoder layer compiled once for every layer and every shape (`engine.compile:
            regional`, the default), the update's layers dynamic from the first pass (compile_regions.py);
  none      eager (the speeds' baseline; nothing compiles).
Phases, in a GRPO step's order, each a list of calls on shapes that change as in a real step:
  decode     `HFEngine.generate` through the static decoder: `--decode-shapes` ROWSxPROMPTxTOKENS calls
             (random weights: every row runs to TOKENS), CUDA graphs on CUDA; then `--repeats` calls
             on the first shape: steady tokens/s;
  reference  the frozen reference's log-probs (`training.ppo.micro_logprobs`, no grad) over
             micro-batches of `--micro` rows of the lengths in `--update-lengths`;
  old        the policy's no-grad log-probs over the same micro-batches (ppo_update's extra pass with
             several mini-batches);
  update     the policy's forward + backward (`response_logprobs(...).sum().backward()`) per micro-batch,
             then `--repeats` passes over them: steady tokens/s.
Per call: wall seconds (synchronised), CPU seconds of the process and its compile children
(`TORCHINDUCTOR_COMPILE_THREADS=1` on the CPU, so Inductor's C++ compiles are children counted when
they end: a fair measure on a shared machine), and the graphs torch._dynamo compiled in it
(`compiles`; a recompile for a new shape counts one).  Compile seconds of a phase = its calls'
seconds minus the same calls run again warm.  Outputs: the first decode call's tokens and
log-probs are compared across modes (max |log-prob difference|, share of equal tokens).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def cpu_seconds() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


class Clock:
    """Wall and CPU seconds and new graphs of one call."""

    def __init__(self, device):
        self.device = device

    def __enter__(self):
        self._sync()
        self.t, self.c, self.g = time.perf_counter(), cpu_seconds(), graphs()
        return self

    def __exit__(self, *exc):
        self._sync()
        self.wall, self.cpu, self.compiles = time.perf_counter() - self.t, cpu_seconds() - self.c, graphs() - self.g

    def _sync(self):
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def row(self, **extra) -> dict:
        return {"wall_s": round(self.wall, 3), "cpu_s": round(self.cpu, 2), "compiles": self.compiles, **extra}


def model_config(args):
    from gpu_train_step import qwen3_config
    from transformers import Qwen3Config

    if args.size == "0.6b":
        return qwen3_config(False)
    return Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                       num_hidden_layers=args.layers, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=args.hidden // 4, tie_word_embeddings=True)


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    try:
        return [tuple(int(x) for x in s.split("x")) for s in text.split(",")]
    except ValueError:
        raise SystemExit(f"--decode-shapes {text!r}: write ROWSxPROMPTxTOKENS,... e.g. 8x40x32,4x60x24") from None


def use_mode(mode: str) -> None:
    """The update's compile for `mode` (the decoder's is StaticDecoder(compile=))."""
    import torch

    import training.logprobs as lp

    lp._compile_enabled = lambda model, device: mode != "none"       # also on the CPU: what is measured
    if mode == "previous":                                             # torch.compile's default shapes
        def previous(layer):
            cached = getattr(layer, "_toolorchestra_compiled", None)
            if cached is None:
                cached = torch.compile(layer.forward)
                object.__setattr__(layer, "_toolorchestra_compiled", cached)
            return cached
        lp._compiled_forward = previous


def worker(args) -> dict:
    import copy

    import torch
    from gpu_grpo_e2e import word_tokenizer
    from transformers import Qwen3ForCausalLM

    from orchestrator.engines.interface import SamplingParams
    from orchestrator.engines.hf import HFEngine
    from training.ppo import micro_logprobs, response_logprobs
    from training.samples import TurnSample, collate_samples

    mode, device = args.worker, torch.device(args.device)
    use_mode(mode)
    cfg = model_config(args)
    torch.manual_seed(0)
    policy = Qwen3ForCausalLM(cfg).to(device).eval()                  # float32 master weights (eval: no dropout, as train.py)
    reference = copy.deepcopy(policy).eval().requires_grad_(False)
    tok = word_tokenizer(cfg.vocab_size)
    cuda = device.type == "cuda"
    amp = torch.bfloat16 if cuda else None                            # model.dtype bfloat16 on CUDA
    out: dict = {"mode": mode, "phases": {}}
    clock = Clock(device)
    shapes = parse_shapes(args.decode_shapes)

    # ---- decode
    engine = HFEngine(policy, tok, device=str(device), decode="static", max_batch=max(r for r, _, _ in shapes),
                      compute_dtype=amp)
    engine._static.compile = "whole" if mode == "previous" else mode
    g = torch.Generator().manual_seed(1)
    calls, first = [], None
    for rows, width, tokens in shapes:
        prompts = [torch.randint(0, cfg.vocab_size - 2, (width - (i % 4),), generator=g).tolist() for i in range(rows)]
        with clock:
            gens = engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=tokens, seed=3))
        calls.append(clock.row(shape=f"{rows}x{width}x{tokens}", tokens=sum(len(x.token_ids) for x in gens)))
        print(f"[{mode}] decode {calls[-1]}", flush=True)
        if first is None:
            first = {"tokens": [x.token_ids for x in gens], "logprobs": [x.logprobs for x in gens]}
    rows, width, tokens = shapes[0]
    prompts = [torch.randint(0, cfg.vocab_size - 2, (width,), generator=g).tolist() for _ in range(rows)]
    warm = []
    for _ in range(args.repeats):
        with clock:
            engine.generate(prompts, SamplingParams(temperature=1.0, max_tokens=tokens, seed=4))
        warm.append(clock.wall)
    again = []
    for rows_, width_, tokens_ in shapes:                             # the same calls warm: compile seconds
        ps = [torch.randint(0, cfg.vocab_size - 2, (width_ - (i % 4),), generator=g).tolist() for i in range(rows_)]
        with clock:
            engine.generate(ps, SamplingParams(temperature=1.0, max_tokens=tokens_, seed=5))
        again.append(clock.wall)
    out["phases"]["decode"] = summarize(calls, again, rows * tokens / min(warm))
    out["first_decode"] = first
    del engine

    # ---- reference, old policy, update
    lengths = [int(x) for x in args.update_lengths.split(",")]
    micro = [[TurnSample(torch.randint(0, cfg.vocab_size - 2, (n // 2 - i % 3,), generator=g).tolist(),
                         torch.randint(0, cfg.vocab_size - 2, (n - n // 2,), generator=g).tolist(),
                         [1] * (n - n // 2), None, 1.0, "t", 0) for i in range(args.micro)] for n in lengths]
    pad = tok.pad_token_id
    cast = (lambda: torch.autocast("cuda", dtype=amp)) if cuda else (lambda: torch.autocast("cpu", enabled=False))

    def nograd(model, name=None):
        rows = []
        for m in micro:
            with cast(), clock:
                micro_logprobs(model, [m], pad, 1.0, device)
            rows.append(clock.row(length=max(len(s.prompt_ids) + len(s.response_ids) for s in m)))
            if name:
                print(f"[{mode}] {name} {rows[-1]}", flush=True)
        return rows

    def train_pass():
        rows = []
        for m in micro:
            batch = collate_samples(m, pad).to(device)
            with clock:
                with cast():
                    logp = response_logprobs(policy, batch, 1.0)
                logp.sum().backward()
            rows.append(clock.row(length=batch.input_ids.shape[1], tokens=int(batch.response_mask.sum())))
        policy.zero_grad(set_to_none=True)
        return rows

    ref = nograd(reference, "reference")
    out["phases"]["reference"] = summarize(ref, [r["wall_s"] for r in nograd(reference)])
    old = nograd(policy, "old")
    out["phases"]["old"] = summarize(old, [r["wall_s"] for r in nograd(policy)])
    upd = train_pass()
    for r in upd:
        print(f"[{mode}] update {r}", flush=True)
    steady = [train_pass() for _ in range(args.repeats)]
    best = min(sum(r["wall_s"] for r in rows) for rows in steady)
    out["phases"]["update"] = summarize(upd, [min(rows[i]["wall_s"] for rows in steady) for i in range(len(upd))],
                                        sum(r["tokens"] for r in upd) / best)
    out["first_step_s"] = round(sum(p["first_pass_s"] for p in out["phases"].values()), 2)
    out["compiles"] = sum(p["compiles"] for p in out["phases"].values())
    return out


def summarize(calls: list[dict], warm: list[float], rate: float | None = None) -> dict:
    first = sum(c["wall_s"] for c in calls)
    return {"calls": calls, "first_pass_s": round(first, 2), "cpu_s": round(sum(c["cpu_s"] for c in calls), 1),
            "compile_s": round(first - sum(warm), 2), "compiles": sum(c["compiles"] for c in calls),
            "compiles_after_first_call": sum(c["compiles"] for c in calls[1:]),
            **({"tokens_per_s": round(rate, 1)} if rate else {})}


def compare(results: dict) -> dict:
    """The first decode call's outputs of each mode against the first mode's."""
    modes = list(results)
    base = results[modes[0]]["first_decode"]
    out = {}
    for m in modes[1:]:
        other = results[m]["first_decode"]
        same = total = 0
        diff = 0.0
        for ta, tb, la, lb in zip(base["tokens"], other["tokens"], base["logprobs"], other["logprobs"]):
            total += max(len(ta), len(tb))
            k = 0
            while k < min(len(ta), len(tb)) and ta[k] == tb[k]:
                k += 1
            same += k
            diff = max([diff] + [abs(a - b) for a, b in zip(la[:k], lb[:k])])
        out[f"{m} vs {modes[0]}"] = {"equal_token_prefix_share": round(same / max(1, total), 4),
                                     "max_abs_logprob_diff": diff}
    return out


def table(results: dict) -> str:
    lines = ["| mode | phase | first pass s | of it compiling s | CPU s | graphs (after its first call) | steady tokens/s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for mode, r in results.items():
        for name, p in r["phases"].items():
            rate = f"{p['tokens_per_s']:,.0f}" if "tokens_per_s" in p else ""
            lines.append(f"| {mode} | {name} | {p['first_pass_s']:.1f} | {p['compile_s']:.1f} | {p['cpu_s']:.0f} | "
                         f"{p['compiles']} ({p['compiles_after_first_call']}) | {rate} |")
        lines.append(f"| {mode} | **all (a cold first step's compiled parts)** | **{r['first_step_s']:.1f}** | | | "
                     f"{r['compiles']} | |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--modes", nargs="+", default=["previous", "regional"], choices=["previous", "regional", "none"])
    parser.add_argument("--size", choices=["small", "0.6b"], help="default: 0.6b on CUDA, small elsewhere")
    parser.add_argument("--layers", type=int, default=4, help="small: decoder layers")
    parser.add_argument("--hidden", type=int, default=128, help="small: hidden size (4 heads, 2 KV heads)")
    parser.add_argument("--vocab", type=int, default=1024, help="small: vocabulary")
    parser.add_argument("--decode-shapes", help="ROWSxPROMPTxTOKENS,... (default: per device)")
    parser.add_argument("--update-lengths", help="sequence lengths of the micro-batches (default: per device)")
    parser.add_argument("--micro", type=int, help="rows per micro-batch (default: 16 on CUDA, 4 elsewhere)")
    parser.add_argument("--repeats", type=int, default=3, help="warm repeats for the steady speeds")
    parser.add_argument("--json", type=Path, help="write every number here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    args.size = args.size or ("0.6b" if cuda else "small")
    args.decode_shapes = args.decode_shapes or ("64x512x256,64x300x200,32x128x64,64x700x300" if cuda
                                                else "8x40x32,8x24x20,4x16x12,8x70x40")
    args.update_lengths = args.update_lengths or ("400,700,256,900" if cuda else "48,80,32,100")
    args.micro = args.micro or (16 if cuda else 4)
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return 0
    results, info = {}, {"args": {k: str(v) for k, v in vars(args).items() if k != "worker"}}
    for mode in args.modes:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor", "TRITON_CACHE_DIR": f"{cache}/triton"}
            if not cuda:
                env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
            cmd = [sys.executable, __file__, "--worker", mode, *sys.argv[1:]]
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
            for line in proc.stdout:
                if line.startswith("RESULT "):
                    results[mode] = json.loads(line[7:])
                else:
                    print(line, end="", flush=True)
            if proc.wait() != 0 or mode not in results:
                print(f"mode {mode}: the worker failed (rc {proc.returncode})", flush=True)
                continue
        r = results[mode]
        print(f"== {mode}: first step's compiled parts {r['first_step_s']:.1f} s, {r['compiles']} graphs; " +
              ", ".join(f"{k} {p['first_pass_s']:.1f} s ({p['compiles']} graphs)" for k, p in r["phases"].items()),
              flush=True)
        if args.json:
            args.json.write_text(json.dumps({"info": info, "results": results}, indent=1))
    if len(results) > 1:
        info["outputs"] = compare(results)
        print(json.dumps(info["outputs"]))
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"info": info, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
