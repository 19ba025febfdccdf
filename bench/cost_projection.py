"""What the paper's run would cost: wall time and GPU-hours per GRPO step, for the run, and for evaluation.

    python bench/cost_projection.py [--turns 10] [--decode-efficiency 0.854] [--markdown]

Arithmetic only (no GPU here): the measured per-GPU rates below (each with the benchmarks row
it comes from) and the paper's settings (PAPER.md §4-5, §8) combined under named assumptions.
Every input is a flag, so a reader can re-run it with their own numbers; docs/scaling.md shows
the output for the defaults and says why each default was chosen.
"""
from __future__ import annotations

import argparse
import math

# ---- measured (docs/benchmarks.md, "GPU" sections; NVIDIA H200, bf16) -----------------------------
MEASURED = {
    "matmul_peak_tflops": (781.0, "bf16 8192^3 matmul, run B/D ceiling"),
    "update_mfu_1gpu": (0.488, "ppo_update, Qwen3-0.6B shape, 8 x 2,048 tokens, run D"),
    "update_mfu_zero2": (0.430, "rank_update, DeepSpeed ZeRO-2, 2 GPUs, run E"),
    "decode_of_bound": (0.1121, "static decoder through the trainer's bf16 copy, 0.6B, 64 rows, run G (static-amp)"),
    "update_mfu_8b": (0.699, "ppo_update, Qwen3-8B shape, 1 GPU, bf16 params + AdamW, 8 x 4,096 tokens, micro 1"),
    "decode_of_full_bound_8b": (0.854, "static decoder, Qwen3-8B shape, 8 rows x 16,384-token prompts, "
                                       "of (weights + KV cache read once per step) at the measured copy rate"),
    "hbm_tb_s": (4.3, "device-to-device copy, 4.16-4.26 TB/s measured"),
    "sync_gb_s": (281.0, "NCCL broadcast of the bf16 weights, 256 MiB buckets, run E"),
    "rollout_overlap": (0.92, "collect_rollouts wall / (engine busy + longest tool chain), CPU run"),
    "eval_overhead": (1.04, "evaluation runner wall / ceil(N/c) x task time at c = 32, CPU run"),
}

# ---- the paper's settings (PAPER.md) --------------------------------------------------------------
PAPER = {
    "tasks_per_step": 16, "rollouts_per_task": 8, "max_turns": 30, "epochs": 10,
    "trainer_gpus": 16, "serving_gpus": 24,           # 2 x 8 trainer; 3 x 8 experts + retriever
    "max_prompt": 24_000, "eval_latency_min": 8.2,    # Table 1: Orchestrator-8B, minutes per query
    "eval_tasks": {"HLE": 1_900, "FRAMES": 824, "tau2": 278}, "eval_concurrency_upstream": 2,
}

# Qwen3-8B (config.json): 36 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 12,288, vocab 151,936, untied.
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP, VOCAB = 36, 4096, 32, 8, 128, 12_288, 151_936
BODY = LAYERS * (HIDDEN * (HEADS + 2 * KV_HEADS) * HEAD_DIM + HEADS * HEAD_DIM * HIDDEN + 3 * HIDDEN * MLP)
WEIGHT_BYTES = 2 * (BODY + 2 * VOCAB * HIDDEN)                      # bf16, embeddings + LM head
KV_BYTES_PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 2           # K and V, bf16


def turn_contexts(args) -> list[int]:
    """Prompt tokens of each turn's sample: the first prompt, then + (response + observation) per turn."""
    return [min(PAPER["max_prompt"], args.first_prompt + t * (args.response + args.observation))
            for t in range(args.turns)]


def train_step(args) -> dict:
    rollouts = PAPER["tasks_per_step"] * PAPER["rollouts_per_task"]
    contexts = turn_contexts(args)
    # update: 8 x body FLOPs per token (6 train + 2 reference), LM head on response tokens (x4),
    # causal attention 2 x seq^2 x heads x head_dim per layer (x4), as bench/gpu_train_step.py counts
    flops = 0.0
    for c in contexts:
        seq = c + args.response
        flops += 8 * BODY * seq + 4 * 2 * VOCAB * HIDDEN * args.response + 4 * 2 * seq**2 * HEADS * HEAD_DIM * LAYERS
    flops *= rollouts
    peak = MEASURED["matmul_peak_tflops"][0] * 1e12
    update_s = flops / (PAPER["trainer_gpus"] * peak * args.update_mfu)
    # rollouts: each turn, every rollout prefills its context and decodes `response` tokens.
    # decode step (per GPU, rollouts spread over the trainer GPUs, colocated engines): read the
    # weights + the rows' KV cache once; at `decode_efficiency` of that bound.
    rows = math.ceil(rollouts / PAPER["trainer_gpus"])
    bw = MEASURED["hbm_tb_s"][0] * 1e12
    decode_s = prefill_s = 0.0
    for c in contexts:
        mean_ctx = c + args.response / 2
        step_bound = (WEIGHT_BYTES + rows * mean_ctx * KV_BYTES_PER_TOKEN) / bw
        decode_s += args.response * step_bound / args.decode_efficiency
        prefill_s += 2 * (BODY + VOCAB * HIDDEN) * c * rows / (peak * args.prefill_mfu)
    generation_s = decode_s + prefill_s
    tools_s = args.turns * args.tool_latency                    # the longest chain of tool calls
    rollout_s = (generation_s + tools_s) * args.overlap
    sync_s = WEIGHT_BYTES / (MEASURED["sync_gb_s"][0] * 1e9)
    step_s = rollout_s + update_s + sync_s
    return {"samples": rollouts * args.turns, "update_tokens": rollouts * sum(c + args.response for c in contexts),
            "update_pflop": flops / 1e15, "update_s": update_s, "decode_s": decode_s, "prefill_s": prefill_s,
            "tools_s": tools_s, "rollout_s": rollout_s, "sync_s": sync_s, "step_s": step_s,
            "trainer_gpu_h": step_s * PAPER["trainer_gpus"] / 3600,
            "all_gpu_h": step_s * (PAPER["trainer_gpus"] + PAPER["serving_gpus"]) / 3600}


def evaluation(args) -> list[dict]:
    rows = []
    per_task_min = PAPER["eval_latency_min"] * MEASURED["eval_overhead"][0]
    for name, n in PAPER["eval_tasks"].items():
        for c in (PAPER["eval_concurrency_upstream"], args.eval_concurrency):
            wall_h = math.ceil(n / c) * per_task_min / 60
            rows.append({"benchmark": name, "tasks": n, "concurrency": c, "wall_h": wall_h,
                         "gpu_h": wall_h * (args.eval_policy_gpus + PAPER["serving_gpus"])})
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=10, help="mean orchestrator turns per rollout (paper: cap 30)")
    p.add_argument("--response", type=int, default=500, help="generated tokens per turn (paper: cap 8,768)")
    p.add_argument("--first-prompt", type=int, default=1_500, help="first turn's prompt tokens (instructions, tools, question)")
    p.add_argument("--observation", type=int, default=1_000, help="tool output tokens added to the context per turn")
    p.add_argument("--tool-latency", type=float, default=20.0, help="mean seconds per tool call (PAPER.md §2: 8-96 s)")
    p.add_argument("--tasks", type=int, default=4_000, help="training tasks per epoch (ToolScale ~4k)")
    p.add_argument("--update-mfu", type=float, default=MEASURED["update_mfu_8b"][0],
                   help="the update's MFU (measured 0.699 at 8B on 1 GPU; ZeRO's communication not included)")
    p.add_argument("--decode-efficiency", type=float, default=MEASURED["decode_of_full_bound_8b"][0],
                   help="decode's share of the weights + KV-cache bound (measured 0.854 at 8B / 8 rows / 16k "
                        "contexts; 0.872 at 64 rows x 2k, 0.973 at 64 x 8k)")
    p.add_argument("--prefill-mfu", type=float, default=MEASURED["update_mfu_1gpu"][0],
                   help="prefill's MFU (assumed as the update's forward)")
    p.add_argument("--overlap", type=float, default=1.0, help="rollout wall / (generation + longest tool chain)")
    p.add_argument("--eval-concurrency", type=int, default=32)
    p.add_argument("--eval-policy-gpus", type=int, default=1, help="GPUs serving the orchestrator in evaluation")
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args()
    s = train_step(args)
    steps = args.epochs_steps = PAPER["epochs"] * math.ceil(args.tasks / PAPER["tasks_per_step"])
    print(f"Qwen3-8B: {BODY / 1e9:.2f}B body parameters, {WEIGHT_BYTES / 1e9:.1f} GB of bf16 weights, "
          f"{KV_BYTES_PER_TOKEN / 1e3:.0f} kB of KV cache per token")
    print(f"contexts per turn: {turn_contexts(args)}")
    rows = [("per-turn samples per step", f"{s['samples']:,}"), ("tokens through the update per step", f"{s['update_tokens']:,}"),
            ("update PFLOP per step (train + reference)", f"{s['update_pflop']:,.0f}"),
            ("update s (16 GPUs)", f"{s['update_s']:,.0f}"), ("prefill s", f"{s['prefill_s']:,.0f}"),
            ("decode s", f"{s['decode_s']:,.0f}"), ("tool chain s", f"{s['tools_s']:,.0f}"),
            ("rollout phase s", f"{s['rollout_s']:,.0f}"), ("weight sync s", f"{s['sync_s']:.2f}"),
            ("**step s**", f"**{s['step_s']:,.0f}**"), ("trainer GPU-hours per step", f"{s['trainer_gpu_h']:.2f}"),
            ("GPU-hours per step incl. 24 serving GPUs", f"{s['all_gpu_h']:.2f}"),
            (f"steps ({PAPER['epochs']} epochs x {args.tasks:,} tasks / 16)", f"{steps:,}"),
            ("**run wall time, days**", f"**{steps * s['step_s'] / 86400:,.1f}**"),
            ("run GPU-hours, trainer only", f"{steps * s['trainer_gpu_h']:,.0f}"),
            ("run GPU-hours incl. serving", f"{steps * s['all_gpu_h']:,.0f}")]
    print("| quantity | value |\n|---|---:|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print("\n| benchmark | tasks | concurrency | wall h | GPU-hours (policy + 24 serving) |\n|---|---:|---:|---:|---:|")
    for r in evaluation(args):
        print(f"| {r['benchmark']} | {r['tasks']:,} | {r['concurrency']} | {r['wall_h']:,.1f} | {r['gpu_h']:,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
