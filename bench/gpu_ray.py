"""The Ray scale-out path on GPUs: `training.session.run_distributed` (what
`python -m training.train distributed.backend=ray` runs) on one host's GPUs, with the
trainer tests' tiny world (tests/_train_world.py: tiny Llama policy, scripted experts).

    python bench/gpu_ray.py                     # 2 GPUs: split, then colocated
    python bench/gpu_ray.py --device cpu        # the same on the CPU (gloo), a check of the script

Layouts:
  split      1 DeepSpeed ZeRO-2 trainer actor (GPU 0) + 1 HF-engine rollout actor (GPU 1);
             weights by bucketed NCCL broadcast after every step
  colocated  2 DeepSpeed ZeRO-2 trainer actors (GPUs 0 and 1, NCCL), an HF rollout engine in
             each rank's process on its GPU, weights handed over in process
Each runs `--steps` GRPO steps (rollouts through the engine actor, update, weight sync,
checkpoint) and then checks that every engine holds exactly the trainer's weights (sha256 of
all tensors).  Printed: seconds per step and per weight sync from the run's metrics.jsonl.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))  # Ray's actors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["split", "colocated"])
    parser.add_argument("--dtypes", nargs="+", default=["float32"], help="model.dtype values to run each mode with")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()

    from _train_world import build_policy, fake_runtime, overrides, write_tasks
    from transformers import AutoTokenizer

    from training.config import load_config
    from training.distributed.config import DistributedConfig
    from training.distributed.group import RayPolicy
    from training.distributed.placement import connect
    from training.session import run_distributed
    from training.metrics_log import read_metrics

    gpu = args.device.startswith("cuda")
    connect("local", num_cpus=8 if gpu else 2)
    root = Path(tempfile.mkdtemp(prefix="gpu_ray_"))
    policy_dir = build_policy(root / "policy")
    tasks = write_tasks(root / "tasks.jsonl")
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    results = []
    for mode, dtype in [(m, d) for d in args.dtypes for m in args.modes]:
        run_root = root / f"{mode}-{dtype}"
        cfg = load_config(None, overrides(run_root, policy_dir, tasks, **{
            "trainer.total_steps": args.steps, "run.device": args.device, "algorithm.micro_batch_size": 4,
            "model.dtype": dtype}))
        dist = (DistributedConfig(backend="ray", mode="split", trainer_workers=1, rollout_workers=1, zero_stage=2,
                                  cpus_per_worker=1, bucket_mb=1)
                if mode == "split" else
                DistributedConfig(backend="ray", mode="colocated", trainer_workers=2, zero_stage=2, cpus_per_worker=1))
        started, policy = time.perf_counter(), None
        try:
            policy = RayPolicy.start(cfg, dist, str(policy_dir), tokenizer, total_steps=args.steps)
            run_distributed(cfg, dist, runtime=fake_runtime(), policy=policy)
            digests = policy.weights_digests()
            metrics = read_metrics(run_root / "run" / "metrics.jsonl")
            trainer = digests.pop("trainer")
            row = {"mode": mode, "dtype": dtype, "device": args.device, "sync": policy.sync_kind, "steps": len(metrics),
                   "wall_s": time.perf_counter() - started,
                   "step_s": statistics.median(m["time/step"] for m in metrics) if "time/step" in metrics[0] else None,
                   "weight_sync_s": statistics.median(m.get("time/weight_sync", float("nan")) for m in metrics),
                   "engines_equal_trainer": bool(digests) and all(d == trainer for d in digests.values()),
                   "engines": sorted(digests)}
        except Exception as exc:   # noqa: BLE001 (report and go on with the next layout)
            row = {"mode": mode, "dtype": dtype, "error": f"{type(exc).__name__}: {exc}"[:800]}
        finally:
            if policy is not None:
                policy.shutdown()
        results.append(row)
        print(json.dumps(row), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_ray.json").write_text(json.dumps(results, indent=1))
    return 0 if all("error" not in r and r["engines_equal_trainer"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
