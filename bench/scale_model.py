"""The scaling model of docs/scaling.md section 3 (a prediction, not a measurement): every figure of
the "Many GPUs" table (docs/benchmarks.md) for bench/gpu_scale.py's default world, from one-GPU
measurements, before any many-GPU run.

    python bench/scale_model.py            # the table's predicted column (markdown)

Per step and GPU (weak scaling: each GPU adds --tasks-per-gpu x --group rollouts) the schedule is
bench/async_schedule_model.py's replay of the producer's rules on drawn rollouts (log-normal tools,
`--decode` s of decoding a turn, the update `--update` s); what a layout changes:
  colocated  every GPU updates its share (the per-GPU update time stays `u`), ZeRO-2's reduce costs
             `--zero2-factor` of the update rate; engines and update share the GPUs (the sync steps)
  split K:M  M trainer GPUs update all the samples (u x N / M); K engines decode (the same per-turn
             time: decode is latency-bound at these row counts); weights broadcast over NCCL
  async      split with max_staleness s in completion order (the replay's `completion` rule)
Inputs (flags; defaults measured, docs/benchmarks.md): the update u = 10 s per 128 rollouts on one
H200 (async bench's `time/update`), a turn's decode 0.8 s (64 tokens in the tool world), the
weights' broadcast 281 GB/s (NCCL, H200 pair; the published H100 NVLink 450 GB/s per direction is
the ceiling), ZeRO-2 over 2 GPUs at 43.0 / 48.8 of the one-GPU MFU, the bf16 matmul rate 790 TFLOP/s.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))

from async_schedule_model import rollout_turns, simulate

# parameters of the bench's policies (1,200-token vocabulary): 0.6B shape tied, 8B shape untied
PARAMS = {"0.6b": 28 * (1024 * 2048 * 2 + 1024 * 1024 * 2 + 3 * 1024 * 3072) + 1200 * 1024,
          "8b": 36 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 12288) + 2 * 1200 * 4096}


def world(args, tasks: int) -> SimpleNamespace:
    return SimpleNamespace(tasks=tasks, group=args.group, turns=args.turns, answer_prob=args.answer_prob,
                           median=args.median, p99=args.p99, decode=args.decode, update=0.0, gpu_per_step=0.0,
                           steps=args.steps, warmup=args.warmup)


def per_gpu_tokens(args) -> dict:
    """Per GPU and step: tokens decoded, samples trained and their tokens (rollouts drawn as the
    bench draws them; unfinished rollouts and flat groups are not trained)."""
    rng, w = random.Random(0), world(args, args.tasks_per_gpu)
    turns, kept, seq = [], 0, 0
    for _ in range(2000):
        r = rollout_turns(rng, w)
        finished = len(r) < args.turns or rng.random() < args.answer_prob
        turns.append(len(r))
        if finished:
            kept += len(r)
            seq += sum(args.prompt + k * args.growth + args.response for k in range(len(r)))
    n = args.tasks_per_gpu * args.group
    flat = 2 * 0.5 ** args.group
    return {"turns": statistics.mean(turns), "decoded": n * statistics.mean(turns) * args.tokens,
            "samples": n * kept / 2000 * (1 - flat), "sequence_tokens": n * seq / 2000 * (1 - flat)}


def schedule(args, tasks: int, update: float, staleness: int, decode: float) -> float:
    """Steps per hour (mean over seeds) of the replay."""
    w = world(args, tasks)
    w.update, w.decode = update, decode
    order = "completion" if staleness else "batch"
    return statistics.mean(simulate(w, staleness, order, seed)["steps_per_hour"] for seed in range(args.seeds))


def rows(args) -> list[dict]:
    tok = per_gpu_tokens(args)
    out = []
    for model in args.models:
        params = PARAMS[model]
        u1 = args.update / (16 * 8) * args.tasks_per_gpu * args.group   # one GPU's share at the 0.6B shape
        mfu1 = 8 * PARAMS["0.6b"] * tok["sequence_tokens"] / (u1 * args.peak * 1e12)
        if model == "8b":   # the 8B update at --mfu-8b (the 0.6B tool-world rate does not carry over)
            mfu1 = args.mfu_8b
            u1 = 8 * params * tok["sequence_tokens"] / (mfu1 * args.peak * 1e12)
        weights_gb = params * 2 / 1e9
        for n in args.gpus:
            if model == "8b" and n < 8:
                continue
            zero = 1.0 if n == 1 else args.zero2_factor
            u = u1 / zero
            k, m = n // 2, n - n // 2
            gather = weights_gb / args.gather_gbs if model == "8b" else 0.0   # ZeRO-3: the full weights first
            layouts = [("colocated", u, 0, n, weights_gb / args.copy_gbs + gather)]
            if n >= 2:
                sync = weights_gb / args.nccl_gbs + gather
                layouts.append((f"split {k}:{m}", u * n / m, 0, m, sync))
                layouts += [(f"split {k}:{m} async s={s} completion", u * n / m, s, m, sync) for s in args.staleness]
            for name, update, s, trainers, sync in layouts:
                decode = args.decode_8b if model == "8b" else args.decode
                rate = schedule(args, args.tasks_per_gpu * n, update + sync, s, decode)
                step = 3600 / rate
                decode_busy = args.decode_busy * decode / args.decode   # s a step some engine kernel runs
                if name == "colocated":
                    busy = min(1.0, (update + decode_busy) / step)
                else:
                    busy = min(1.0, (trainers * update + (n - trainers) * decode_busy) / (n * step))
                out.append({"gpus": n, "layout": name, "model": model, "steps_per_hour": rate,
                            "generated": tok["decoded"] / step, "trained": tok["sequence_tokens"] / step,
                            "mfu": mfu1 * zero, "sync": sync, "busy": busy})
    for r in out:
        base = next((b for b in out if b["gpus"] == 1 and b["layout"] == "colocated" and b["model"] == r["model"]),
                    None)
        same = next(b for b in out if b["gpus"] == r["gpus"] and b["layout"] == "colocated" and b["model"] == r["model"])
        r["weak"] = r["steps_per_hour"] / base["steps_per_hour"] if base and r["layout"] == "colocated" else None
        r["speedup"] = r["steps_per_hour"] / same["steps_per_hour"] if "async" in r["layout"] else None
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--models", nargs="+", default=["0.6b", "8b"])
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--tasks-per-gpu", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--answer-prob", type=float, default=0.2)
    p.add_argument("--median", type=float, default=0.5)
    p.add_argument("--p99", type=float, default=10.0)
    p.add_argument("--decode", type=float, default=0.8, help="s a turn decodes (H200 async bench)")
    p.add_argument("--decode-8b", type=float, default=1.0, help="s a turn decodes at 8B (assumed: 64 x ~15 ms)")
    p.add_argument("--decode-busy", type=float, default=2.0, help="engine-busy s a step (H200: 12 - 10 s update)")
    p.add_argument("--update", type=float, default=10.0, help="update s per 16 x 8 rollouts, 0.6B, one H200")
    p.add_argument("--zero2-factor", type=float, default=43.0 / 48.8, help="ZeRO-2 MFU / one-GPU MFU (0.6B)")
    p.add_argument("--mfu-8b", type=float, default=0.40, help="assumed 8B update MFU under ZeRO-3 + checkpointing")
    p.add_argument("--peak", type=float, default=790.0, help="bf16 matmul TFLOP/s (H100: 778-798 measured)")
    p.add_argument("--nccl-gbs", type=float, default=281.0, help="weight broadcast GB/s (H200 pair, measured)")
    p.add_argument("--gather-gbs", type=float, default=100.0, help="ZeRO-3 gather of the 8B weights, GB/s "
                   "(assumed: 361 GB/s all-reduce bus rate measured on 8 H100s, less per-parameter overheads)")
    p.add_argument("--copy-gbs", type=float, default=1000.0, help="in-process weight copy GB/s (colocated)")
    p.add_argument("--prompt", type=int, default=560, help="first prompt tokens (system + user + tools)")
    p.add_argument("--growth", type=int, default=50, help="tokens a turn adds to the context (call + reply)")
    p.add_argument("--response", type=int, default=20, help="a sample's response tokens (the scripted call)")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--seeds", type=int, default=5)
    args = p.parse_args()
    tok = per_gpu_tokens(args)
    print(f"per GPU and step: {tok['turns']:.2f} turns a rollout, {tok['decoded']:,.0f} tokens decoded, "
          f"{tok['samples']:.1f} samples of {tok['sequence_tokens']:,.0f} tokens trained")
    print("| GPUs | layout | model | steps/h | generated tok/s/GPU | trained (NeMo-RL) tok/s/GPU | update MFU | "
          "sync s | GPUs busy | weak scaling | vs colocated |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows(args):
        weak = f"{r['weak']:.0%}" if r["weak"] is not None else "-"
        speed = f"{r['speedup']:.2f}x" if r["speedup"] is not None else "-"
        print(f"| {r['gpus']} | {r['layout']} | {r['model']} | {r['steps_per_hour']:.0f} | {r['generated']:,.0f} | "
              f"{r['trained']:,.0f} | {r['mfu']:.1%} | {r['sync']:.3f} | {r['busy']:.0%} | {weak} | {speed} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
