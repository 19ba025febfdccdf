"""Weight-sync time from a trainer process to a rollout engine process (training/distributed).

    python bench/weight_sync.py                         # SmolLM2-135M (fp32), gloo, 3 bucket sizes
    python bench/weight_sync.py --model PATH --bucket-mb 64 256 --repeats 5 --write

Transports timed, each end to end (the engine holds the new weights when the clock stops):
- broadcast: trainer rank 0 -> engine process over a gloo SyncGroup (split mode on CPU;
  NCCL on GPU uses the same code), per bucket size, then `HFEngine.update_weights`;
- in-process: `HFEngine.update_weights(state_dict)` in the trainer's process (colocated).
Medians of `--repeats` runs (this machine's timings vary up to 4x between runs).
`--write` replaces the "Weight sync (CPU)" part of the "Scale-out" section of docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from _report import write_section  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _engine_side(model: str, port: int, plans, repeats: int, out) -> None:
    import torch

    from training.distributed.weight_sync import SyncGroup, unpack
    from orchestrator.engines.hf import HFEngine

    torch.set_num_threads(1)
    engine = HFEngine(model, device="cpu")
    group = SyncGroup("127.0.0.1", port, 1, 2, "gloo")
    for plan in plans:
        for _ in range(repeats):
            group.broadcast(torch.zeros(1))          # start together
            started = time.perf_counter()
            weights = {}
            for bucket, flat in group.receive(plan):
                weights.update(unpack(bucket, flat))
            engine.update_weights(weights)
            out.put(time.perf_counter() - started)


def measure(model: str, bucket_mbs: list[float], repeats: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from training.distributed.weight_sync import SyncGroup, plan_buckets
    from orchestrator.engines.hf import HFEngine

    torch.set_num_threads(1)
    trainer = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    weights = dict(trainer.named_parameters())
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    plans = [plan_buckets(weights.items(), mb) for mb in bucket_mbs]
    port, out = _free_port(), mp.get_context("spawn").Queue()
    peer = mp.get_context("spawn").Process(target=_engine_side, args=(model, port, plans, repeats, out))
    peer.start()
    group = SyncGroup("127.0.0.1", port, 0, 2, "gloo")
    rows = []
    for mb, plan in zip(bucket_mbs, plans):
        times = []
        for _ in range(repeats):
            group.broadcast(torch.zeros(1))
            group.send(plan, weights)
            times.append(out.get(timeout=600))
        rows.append({"transport": f"broadcast (gloo), {mb:g} MiB buckets", "buckets": len(plan),
                     "median_s": statistics.median(times), "min_s": min(times)})
    peer.join()
    engine = HFEngine(model, device="cpu")
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        engine.update_weights({n: t.detach() for n, t in weights.items()})
        times.append(time.perf_counter() - started)
    rows.append({"transport": "in-process (colocated)", "buckets": 1, "median_s": statistics.median(times),
                 "min_s": min(times)})
    return {"bytes": nbytes, "rows": rows}


def write_doc(result: dict, command: str, model: str) -> None:
    """Replace the "### Weight sync" part of docs/benchmarks.md's "## Scale-out" section."""
    gb = result["bytes"] / 1e9
    lines = ["### Weight sync (CPU)", "",
             f"Trainer -> rollout engine, {Path(model).name} fp32 ({gb:.2f} GB of weights): seconds until the "
             "engine holds the new weights (bucketed broadcast + `update_weights`, or `update_weights` alone "
             "in-process). Two processes on one machine, gloo over loopback; medians of the repeats. The same "
             "code on GPUs (NCCL, CUDA IPC) is measured in \"GPU\" below.", "",
             f"Machine: 2-core CPU, 24 GiB; shared with other workers during measurement. Python "
             f"{platform.python_version()}.", "", f"Command: `{command}`", "",
             "| transport | buckets | median s | min s | GB/s (median) |", "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['transport']} | {r['buckets']} | {r['median_s']:.3f} | {r['min_s']:.3f} | "
                     f"{gb / r['median_s']:.2f} |")
    write_section("\n".join(lines), under="## Scale-out", first=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model folder (default: the embedded SmolLM2-135M)")
    parser.add_argument("--bucket-mb", type=float, nargs="+", default=[16, 64, 256])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--write", action="store_true", help="write the Scale-out section of docs/benchmarks.md")
    args = parser.parse_args()
    if args.model is None:
        from orchestrator.embedded import smollm2_path
        args.model = str(smollm2_path())
    result = measure(args.model, args.bucket_mb, args.repeats)
    for r in result["rows"]:
        print(f"{r['transport']:40s} buckets={r['buckets']:3d}  median {r['median_s']:.3f} s  min {r['min_s']:.3f} s")
    if args.write:
        shown = " ".join(a for a in sys.argv[1:])
        write_doc(result, f"python bench/weight_sync.py {shown}".strip(), args.model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
