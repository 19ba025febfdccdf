"""Two GPUs: DeepSpeed ZeRO-2 policy update across ranks, and the GPU weight-sync transports.

    torchrun --nproc_per_node 2 bench/gpu_distributed.py [--rows 16 --seq 2048]

Measured with the scale-out code (training/distributed):
  zero2    `rank_update` on both ranks (--zero-stage 3, --offload: the other DeepSpeed layouts), the step's rows dealt by `shard_samples`
           (Qwen3-0.6B shape, random bf16 weights); tokens/s per GPU and MFU;
  nccl     `SyncGroup` broadcast of the updated weights, rank 0 -> rank 1 (split mode), in
           `--bucket-mb` buckets, into a plain model on rank 1; digests compared;
  cuda_ipc rank 0's buckets as CUDA IPC handles, rebuilt and copied by another process on
           the same GPU (colocated mode); digests compared.
FLOPs are counted as in bench/gpu_train_step.py.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

IPC_CHILD = """
import pickle, sys, time, torch
sys.path.insert(0, {repo!r})
from training.distributed.weight_sync import receive_ipc, unpack, digest
torch.cuda.init(); torch.zeros(1, device="cuda")            # CUDA start-up outside the timing
handles = pickle.load(open({path!r}, "rb"))
t = time.perf_counter()
weights = {{}}
for bucket, flat in receive_ipc(handles):
    weights.update({{n: v.clone() for n, v in unpack(bucket, flat)}})
torch.cuda.synchronize()
print(time.perf_counter() - t, digest(weights.items()))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=16, help="rows per step, all ranks together")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--bucket-mb", type=float, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--zero-stage", type=int, default=2, choices=[2, 3])
    parser.add_argument("--offload", action="store_true", help="DeepSpeed optimizer offload to CPU")
    parser.add_argument("--skip-sync", action="store_true", help="only the policy update")
    parser.add_argument("--profile", action="store_true", help="one profiled step: GPU busy time vs wall, top ops")
    parser.add_argument("--no-overlap", action="store_true", help="overlap_comm off (train.py turns it on with NCCL)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()

    import deepspeed
    from transformers import Qwen3ForCausalLM

    from gpu_train_step import _profile, counted_flops, make_samples, matmul_ceiling, qwen3_config, time_steps
    from training.distributed.update import deepspeed_config, rank_update, shard_samples
    from training.distributed.weight_sync import SyncGroup, digest, ipc_handles, plan_buckets, unpack
    from training.losses import PPOClipLoss

    deepspeed.init_distributed(dist_backend="nccl")
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    ceiling = matmul_ceiling(device)
    cfg = qwen3_config(tiny=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
        reference = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval().requires_grad_(False)
    # as training/distributed/train_worker.py: with offload, DeepSpeed's own (CPU) AdamW from the config
    optimizer = None if args.offload else torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=deepspeed_config(
        zero_stage=args.zero_stage, grad_clip=1.0, dtype="bfloat16", offload_optimizer=args.offload,
        optimizer={"lr": 1e-6, "weight_decay": 0.01}, overlap_comm=not args.no_overlap))
    samples = make_samples(cfg.vocab_size, args.rows, args.seq, args.prompt)
    shard = shard_samples(samples, world, 1, args.micro)[rank]
    loss_fn = PPOClipLoss()
    def step():
        return rank_update(engine, reference, shard, loss_fn, world=world, pad_id=0, device=device, temperature=1.0)
    times = time_steps(step, 2, args.repeats, device)
    if args.profile:
        _profile(step, f"rank {rank}", rows=20 if rank == 0 else 0)
    step_s = statistics.median(times)
    flops = counted_flops(cfg, args.rows, args.seq, args.prompt)
    result = {"device": torch.cuda.get_device_name(), "gpus": world, "torch": torch.__version__,
              "bf16_ceiling_tflops": ceiling / 1e12,
              f"zero{args.zero_stage}" + ("_offload" if args.offload else "") + ("_no_overlap" if args.no_overlap else ""): {
                  "median_s": step_s, "tokens_per_s_per_gpu": args.rows * args.seq / step_s / world,
                  "mfu": flops / step_s / world / ceiling, "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30}}
    if args.skip_sync:              # ZeRO-3 partitions the parameters: the sync below reads full ones
        return _report(result, rank, args.out)

    # ---- nccl broadcast: rank 0 (trainer) -> rank 1 (an engine's copy)
    named = dict(engine.module.named_parameters())
    plan = plan_buckets(named.items(), args.bucket_mb)
    nbytes = sum(t.numel() * t.element_size() for t in named.values())
    port = 29611
    group = SyncGroup(os.environ.get("MASTER_ADDR", "127.0.0.1"), port, min(rank, 1), 2, "nccl") if rank < 2 else None
    if rank == 1:
        with torch.device(device):
            copy = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    sync_times = []
    for _ in range(args.repeats):
        torch.distributed.barrier()
        t = time.perf_counter()
        if rank == 0:
            group.send(plan, named)
        elif rank == 1:
            weights = {}
            for bucket, flat in group.receive(plan):
                weights.update(unpack(bucket, flat))
            copy.load_state_dict(weights, strict=False)
            torch.cuda.synchronize()
        sync_times.append(time.perf_counter() - t)
    mine = digest(named.items()) if rank == 0 else digest(copy.named_parameters()) if rank == 1 else ""
    digests = [None] * world
    torch.distributed.all_gather_object(digests, mine)
    result["nccl"] = {"bytes": nbytes, "buckets": len(plan), "median_s": statistics.median(sync_times),
                      "gb_per_s": nbytes / statistics.median(sync_times) / 1e9, "weights_equal": digests[0] == digests[1]}

    # ---- cuda ipc: rank 0's buckets, rebuilt by another process on the same GPU
    if rank == 0:
        handles, buffers = ipc_handles(plan, named, device)
        with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as f:
            pickle.dump(handles, f)
        child = subprocess.run([sys.executable, "-c", IPC_CHILD.format(repo=str(REPO), path=f.name)],
                               capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": str(device.index)})
        if child.returncode == 0:
            seconds, child_digest = child.stdout.split()[-2:]
            result["cuda_ipc"] = {"median_s": float(seconds), "gb_per_s": nbytes / float(seconds) / 1e9,
                                  "weights_equal": child_digest == digests[0]}
        else:
            result["cuda_ipc"] = {"error": child.stderr[-800:]}
        del handles, buffers
    return _report(result, rank, args.out)


def _report(result: dict, rank: int, out: str) -> int:
    torch.distributed.barrier()
    if rank == 0:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "gpu_distributed.json").write_text(json.dumps(result, indent=1))
        print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
