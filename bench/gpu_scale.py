"""Many GPUs (issue 49): the Ray path `python -m training.train distributed.backend=ray` runs, at 1, 2,
4 or 8 GPUs of one host, in three layouts, on a real-size policy in the heavy-tailed tool world of
bench/async_rollouts.py.  One "Many GPUs" table row per run (docs/benchmarks.md), each target
marked met / not met.

    python bench/gpu_scale.py --gpus 1 2 --json /tmp/scale.json --table /tmp/scale.md   # 1 GPU, then 2
    python bench/gpu_scale.py --gpus 8 --model 8b --layouts colocated split           # ZeRO-3
    bash bench/gpu_suite.sh scale-2          # the same as one device call (scale-1, scale-4, scale-8)
    python bench/gpu_scale.py --device cpu --model tiny --gpus 2 --steps 2 ...        # CPU actors (gloo):
                                             # tests/test_bench_gpu_scale.py

What runs: `training.session.run` with `RayLearner.start(..., dist=...)`, i.e. `run_distributed`
(`RayPolicy` actors: DeepSpeed ZeRO ranks and HF engines; the synchronous loop or
`async_train_loop`; rewards, filters, per-turn samples, PPO, weight sync, checkpoints), with two
bench-side wrappers on the learner: the engine's replies are scripted tool calls (async_rollouts'
`ScriptedTurns`: a policy with random weights writes no tool call; each turn still decodes
`--tokens` tokens on the engine actors, which is the decode cost), and `update` counts the tokens
of the samples it trains (NeMo-RL's count, below) and the tokens the engines decoded.

World (async_rollouts.py): `--tasks-per-gpu` x `--group` rollouts per step *per GPU* (4 x 8; weak
scaling: N GPUs make N times the rollouts of one), up to `--turns` (8) turns, every expert call
sleeping a log-normal time (median `--median` 0.5 s, 99th percentile `--p99` 10 s: async_rollouts'
1 s / 20 s halved, so that a call of every layout fits a device call), `answer` with probability
`--answer-prob` per turn, the judge right with probability 0.5.  Policy: the Qwen3-0.6B or
Qwen3-8B shape (random weights, the bench's 1,200-token vocabulary), or a tiny one (CPU checks).

Layouts (N GPUs):
  colocated        N ZeRO ranks, an HF engine in each rank's process (weights handed over in process)
  split            K engine actors + M ZeRO ranks (`--split K:M`, default N/2 : N/2), NCCL broadcast
  async-cS         split with algorithm.max_staleness S (`--staleness`, default 1 2 3) in completion
                   order (algorithm.async_order=completion, old log-probs from the engine)

Figures per row, over the steady window of steps (async_rollouts.steady_window; the first step,
which compiles, never counts): steps/h (3600 / mean seconds between consecutive steps' metrics
lines); generated tokens/s per GPU (tokens the engines decoded / window seconds / N); trained
tokens/s per GPU, two counts: loss tokens (`train/tokens`, the policy's own response tokens) and
NeMo-RL's (every token of every trained sequence, prompt + response, per-turn samples each with
its whole context; NeMo-RL's E2E "Tokens/sec/GPU" = total tokens processed / (step time x GPUs));
update MFU ((6 x epochs + 2 for the KL reference's forward) x parameters x sequence tokens /
`time/update` / (trainer GPUs x the bf16 matmul rate measured at start); attention FLOPs not
counted); weight sync s (median `time/weight_sync`); GPUs busy (nvidia-smi utilization.gpu of the
N GPUs, sampled every 0.5 s, mean over the window); reward (mean of the steps' `reward/mean` with
its 95% t-interval over steps).

Targets (issue 49): weak scaling (colocated at N GPUs >= 85% of the 1-GPU colocated steps/h of the
same model, a row of the same --json file); Qwen3-8B >= 1,562 NeMo-RL tokens/s per GPU and weight
sync <= 2 s; async >= 1.5x the colocated steps/h at the same N with GPUs >= 80% busy and reward
inside the colocated run's 95% interval.

On GPUs NVLink multicast must be off (NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
NVSHMEM_DISABLE_NVLS=1, exported by bench/gpu_suite.sh): the bench refuses to start without them and
checks every actor got them (training/distributed/placement.py `forwarded_env`).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
WEAK_SCALING, NEMO_RL_8B, SYNC_8B_S, ASYNC_SPEEDUP, ASYNC_BUSY = 0.85, 1562.0, 2.0, 1.5, 0.80
# two-sided 95% t quantiles by degrees of freedom (larger: 1.96)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


# ---------------------------------------------------------------------------- world
def build_policy(folder: Path, model: str) -> Path:
    """async_rollouts' policy (its tokenizer of the tool world) at the `model` shape, random weights."""
    import torch
    from async_rollouts import build_policy as build

    dtype = torch.bfloat16 if model == "8b" else torch.float32   # 8B in float32 would be 32 GB on disk
    return build(folder, model == "tiny", "8b" if model == "8b" else "0.6b", dtype)


def parameter_count(policy: Path) -> int:
    from safetensors import safe_open

    total = 0
    for f in sorted(policy.glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                total += math.prod(st.get_slice(name).get_shape())
    return total


class ScriptedRayTurns:
    """async_rollouts.ScriptedTurns over the learner's engine (a RayEngine, or the asynchronous
    learner's sync-between-calls wrapper), counting the tokens the engines really decoded."""

    def __init__(self, engine, answer_prob: float):
        from async_rollouts import ScriptedTurns

        self.inner = ScriptedTurns(engine, answer_prob)
        self.tokenizer, self.decoded, self._lock = engine.tokenizer, 0, threading.Lock()
        real = engine.generate

        def counting(prompts, params, **kw):
            out = real(prompts, params, **kw)
            with self._lock:
                self.decoded += sum(len(g.token_ids) for g in out)
            return out
        self.inner.engine = _Calls(counting, engine)

    def generate(self, prompts, params, *, seeds=None):
        return self.inner.generate(prompts, params, seeds=seeds)

    def update_weights(self, weights):
        self.inner.update_weights(weights)


class _Calls:
    """`engine` with its generate replaced (ScriptedTurns calls engine.generate / update_weights)."""

    def __init__(self, generate, engine):
        self.generate, self.engine, self.tokenizer = generate, engine, engine.tokenizer

    def update_weights(self, weights):
        self.engine.update_weights(weights)


def instrument(learner, cfg, answer_prob: float):
    """The learner with scripted tool calls on its engine and token counts in each step's metrics."""
    from orchestrator.engines.batcher import BatchingEngine

    inner = learner.engine.engine
    learner.engine.close()
    scripted = ScriptedRayTurns(inner, answer_prob)
    learner.engine = BatchingEngine(scripted, max_batch=cfg.engine.max_batch, linger_ms=cfg.engine.linger_ms)
    update, counted = learner.update, [0]

    def counting_update(samples, step):
        out = update(samples, step)
        out["bench/sequence_tokens"] = float(sum(len(s.prompt_ids) + len(s.response_ids) for s in samples))
        out["bench/decoded_tokens"] = float(scripted.decoded - counted[0])   # since the last update
        counted[0] = scripted.decoded
        stats = learner.engine.stats
        out["bench/rows_per_engine_call"] = stats.rows / max(1, stats.engine_calls)
        return out
    learner.update = counting_update
    return learner


class GpuBusyAll:
    """nvidia-smi utilization.gpu of the GPUs `ids` every `period` s: (time, mean percent) samples
    (none where nvidia-smi is missing or no GPU is named: the CPU)."""

    def __init__(self, ids: list[int], period: float = 0.5):
        self.samples: list[tuple[float, float]] = []
        self.ids, self.period, self._stop = ",".join(map(str, ids)), period, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while self.ids and not self._stop.is_set():
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                      "-i", self.ids], check=False, capture_output=True, text=True, timeout=5).stdout.split()
                values = [float(v) for v in out]
                self.samples.append((time.time(), sum(values) / len(values)))
            except (OSError, ValueError, ZeroDivisionError, subprocess.SubprocessError):
                return
            time.sleep(self.period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)


def matmul_tflops() -> float | None:
    """The bf16 matmul rate of GPU 0 (8192^3, mean of 10 after 3 warm-ups), in a child process so
    this one holds no CUDA context while the actors run."""
    code = ("import torch,time\na=torch.randn(8192,8192,device='cuda',dtype=torch.bfloat16);b=torch.randn_like(a)\n"
            "for _ in range(3): a@b\ntorch.cuda.synchronize();t=time.perf_counter()\n"
            "for _ in range(10): a@b\ntorch.cuda.synchronize();print(10*2*8192**3/(time.perf_counter()-t)/1e12)")
    try:
        out = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120)
        return float(out.stdout.split()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


# ---------------------------------------------------------------------------- layouts
def layouts(args, n: int) -> list[tuple[str, dict, dict]]:
    """(layout name, DistributedConfig fields, config overrides) for N GPUs."""
    common = {"backend": "ray", "zero_stage": args.zero_stage, "cpus_per_worker": args.cpus_per_worker,
              "bucket_mb": args.bucket_mb}
    out = []
    if "colocated" in args.layouts:
        out.append(("colocated", {**common, "mode": "colocated", "trainer_workers": n}, {}))
    if n < 2:
        return out
    k, m = (int(x) for x in args.split.split(":")) if args.split else (n // 2, n - n // 2)
    if k + m != n or k < 1 or m < 1:
        raise SystemExit(f"--split {args.split}: K:M engine : trainer GPUs must add up to --gpus {n}, each >= 1")
    split = {**common, "mode": "split", "trainer_workers": m, "rollout_workers": k}
    if "split" in args.layouts:
        out.append((f"split {k}:{m}", split, {}))
    if "async" in args.layouts:
        for s in args.staleness:
            out.append((f"split {k}:{m} async s={s} completion", split,
                        {"algorithm.max_staleness": s, "algorithm.async_order": "completion",
                         "algorithm.old_logprobs": "engine", "engine.share_weights": "false"}))
    return out


def run_layout(args, n: int, layout: str, dist_fields: dict, extra: dict, policy_dir: Path, root: Path,
               peak_tflops: float | None, params: int) -> dict:
    import ray
    from async_rollouts import TOOLS, lognormal_runtime
    from transformers import AutoTokenizer

    from training.config import load_config
    from training.distributed.config import DistributedConfig
    from training.distributed.group import RayPolicy
    from training.distributed.run import RayLearner
    from training.session import run

    tasks_n = args.tasks_per_gpu * n
    name = f"{n}gpu-" + layout.replace(" ", "-").replace(":", "x").replace("=", "")
    run_dir, tasks = root / name, root / f"tasks-{tasks_n}.jsonl"
    shutil.rmtree(run_dir, ignore_errors=True)   # a --workdir used before: this run's rows only
    tasks.write_text("".join(json.dumps({"id": f"t{i}", "question": f"Compute item {i}.", "answer": "1",
                                         "tools": TOOLS}) + "\n" for i in range(tasks_n)))
    gpu = args.device.startswith("cuda")
    over = {"run.dir": str(run_dir), "run.device": args.device, "run.resume": "never", "run.threads": args.threads,
            "model.path": str(policy_dir), "model.dtype": "bfloat16" if gpu else "float32",
            "model.price_model": "Qwen3-8B", "model.gradient_checkpointing": str(args.model == "8b").lower(),
            "engine.kind": "hf", "engine.max_batch": tasks_n * args.group,
            "data.train_files": f"[{tasks}]", "rollout.tasks_per_step": tasks_n,
            "rollout.rollouts_per_task": args.group, "rollout.max_turns": args.turns,
            "rollout.max_tokens": args.tokens, "rollout.context_tokens": args.context_tokens,
            "rollout.constrained": "false", "rollout.concurrency": tasks_n * args.group,
            "algorithm.micro_batch_size": args.micro_batch, "trainer.total_steps": args.steps,
            "trainer.save_every": 10_000, "logging.wandb": "disabled", "logging.console": "false",
            "optim.lr": "1e-6", **extra}
    if args.compile_cache:
        over["run.compile_cache"] = args.compile_cache
    cfg = load_config(None, [f"{k}={v}" for k, v in over.items()])
    dist = DistributedConfig(**dist_fields)
    runtime, drawn = lognormal_runtime(args.median, args.p99, seed=1)
    judge_rng, judge_lock = random.Random(2), threading.Lock()

    def judge(task, rollout):
        with judge_lock:
            return judge_rng.random() < 0.5

    row: dict = {"gpus": n, "layout": layout, "model": args.model, "rollouts_per_step": tasks_n * args.group,
                 "parameters": params, "card": args.card, "command": args.command, "commit": args.commit,
                 "date": time.strftime("%Y-%m-%d"), "run_dir": str(run_dir)}
    policy = None
    started = time.perf_counter()
    try:
        policy = RayPolicy.start(cfg, dist, str(policy_dir), AutoTokenizer.from_pretrained(policy_dir),
                                 total_steps=args.steps)
        row["start_s"] = time.perf_counter() - started
        row["nvls_off_in_actors"] = all(
            all(env.get(k) == v for k, v in NVLS_OFF.items())
            for env in ray.get([a.__ray_call__.remote(lambda self: dict(os.environ))
                                for a in policy.trainers + policy.rollouts]))
        # the GPUs Ray gave the actors (nvidia-smi's indices), the ones whose busy share is sampled
        row["gpu_ids"] = sorted({int(i) for ids in ray.get([a.__ray_call__.remote(lambda self: ray.get_gpu_ids())
                                                            for a in policy.trainers + policy.rollouts]) for i in ids})
        before = policy.weights_digests()

        def make_learner(c, checkpoint, state, total):
            learner = instrument(RayLearner.start(c, checkpoint, state, total, dist=dist, policy=policy), c,
                                 args.answer_prob)
            if args.no_save:   # Qwen3-8B: fp32 master weights + AdamW state are ~96 GB of checkpoint
                learner.save = lambda step, state: Path(c.run.dir) / "checkpoints" / f"not-saved-{step}"
            return learner
        with GpuBusyAll(row["gpu_ids"]) as busy:
            run(cfg, runtime=runtime, judge=judge, make_learner=make_learner)
        after = policy.weights_digests()
        trainer = after.pop("trainer")
        row.update({"weights_changed": trainer != before["trainer"],
                    "engines_equal_trainer": bool(after) and all(d == trainer for d in after.values()),
                    "engines": sorted(after), "sync_kind": policy.sync_kind, "tool_calls": len(drawn),
                    "wall_s": time.perf_counter() - started})
        row.update(summarize(run_dir, busy.samples, n, dist, cfg, peak_tflops, params))
    except Exception as exc:   # noqa: BLE001 (the row says what failed; the next layout runs)
        row["error"] = f"{type(exc).__name__}: {exc}"[:1000]
    finally:
        if policy is not None:
            policy.shutdown()
    return row


def summarize(run_dir: Path, busy: list, n: int, dist, cfg, peak_tflops: float | None, params: int) -> dict:
    from async_rollouts import busy_mean, steady_window

    from training.metrics_log import read_metrics

    metrics = read_metrics(run_dir / "metrics.jsonl")
    by_step = {int(m["step"]): m for m in metrics}
    first, last = steady_window(cfg.algorithm.max_staleness, cfg.trainer.total_steps)
    window = [k for k in range(max(first, 2), last + 1) if k in by_step and k - 1 in by_step]
    if not window:   # a short run is all burst and drain: every step after the first
        window = [k for k in range(2, len(metrics) + 1) if k in by_step and k - 1 in by_step]
    out: dict = {"steps_logged": len(metrics), "window": [window[0], window[-1]] if window else None,
                 "weight_sync_s": statistics.median(m["time/weight_sync"] for m in metrics)
                 if all("time/weight_sync" in m for m in metrics) and metrics else None,
                 "rows_per_engine_call": metrics[-1].get("bench/rows_per_engine_call") if metrics else None,
                 "samples_trained": sum(m["train/samples"] for m in metrics)}
    rewards = [m["reward/mean"] for m in metrics]
    if rewards:
        mean = sum(rewards) / len(rewards)
        half = (T95[min((d for d in T95 if d >= len(rewards) - 1), default=30)] if len(rewards) <= 31 else 1.96) \
            * statistics.stdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else float("inf")
        out["reward"] = {"mean": mean, "low": mean - half, "high": mean + half, "steps": len(rewards)}
    if not window:
        return out
    seconds = sum(by_step[k]["time"] - by_step[k - 1]["time"] for k in window)
    rows = [by_step[k] for k in window]
    trainer_gpus = dist.trainer_workers
    flops_per_token = (6 * cfg.algorithm.ppo_epochs + (2 if cfg.algorithm.kl_coef > 0 else 0)) * params
    update_s = sum(m.get("time/update", 0.0) for m in rows)
    out.update({
        "steps_per_hour": 3600 * len(window) / seconds,
        "generated_tokens_per_s_per_gpu": sum(m.get("bench/decoded_tokens", 0.0) for m in rows) / seconds / n,
        "trained_tokens_per_s_per_gpu": sum(m["train/tokens"] for m in rows) / seconds / n,
        "nemo_rl_tokens_per_s_per_gpu": sum(m.get("bench/sequence_tokens", 0.0) for m in rows) / seconds / n,
        "update_mfu": (flops_per_token * sum(m.get("bench/sequence_tokens", 0.0) for m in rows)
                       / (update_s * trainer_gpus * peak_tflops * 1e12)) if peak_tflops and update_s else None,
        "gpu_busy": busy_mean(busy, by_step[window[0] - 1]["time"], by_step[window[-1]]["time"]),
        "trainer_wait_s": sum(m.get("async/wait", m.get("time/rollout", 0.0)) for m in rows) / len(rows)})
    return out


# ---------------------------------------------------------------------------- targets and the table
def _same(a: dict, b: dict) -> bool:
    return a["model"] == b["model"] and a.get("card") == b.get("card")


def targets(row: dict, rows: list[dict]) -> list[str]:
    """Each target that applies to `row`, met or not met, against the rows of the same file."""
    out = []
    if row.get("error") or row.get("steps_per_hour") is None:
        return ["not measured"]
    ok = lambda c: "met" if c else "not met"
    if row["layout"] == "colocated" and row["gpus"] > 1:
        base = [r for r in rows if r["gpus"] == 1 and r["layout"] == "colocated" and _same(r, row)
                and r.get("steps_per_hour")]
        if base:
            ratio = row["steps_per_hour"] / base[-1]["steps_per_hour"]
            out.append(f"weak scaling {ratio:.0%} of 1 GPU (>= {WEAK_SCALING:.0%}): {ok(ratio >= WEAK_SCALING)}")
        else:
            out.append("weak scaling: no 1-GPU colocated row of this model and card")
    if row["model"] == "8b":
        tps = row["nemo_rl_tokens_per_s_per_gpu"]
        out.append(f"{tps:,.0f} NeMo-RL tokens/s/GPU (>= {NEMO_RL_8B:,.0f}): {ok(tps >= NEMO_RL_8B)}")
        if row.get("weight_sync_s") is not None:
            out.append(f"sync {row['weight_sync_s']:.2f} s (<= {SYNC_8B_S:g}): {ok(row['weight_sync_s'] <= SYNC_8B_S)}")
    if "async" in row["layout"]:
        sync = [r for r in rows if r["gpus"] == row["gpus"] and r["layout"] == "colocated" and _same(r, row)
                and r.get("steps_per_hour")]
        if sync:
            speed = row["steps_per_hour"] / sync[-1]["steps_per_hour"]
            out.append(f"{speed:.2f}x colocated (>= {ASYNC_SPEEDUP}x): {ok(speed >= ASYNC_SPEEDUP)}")
            band = sync[-1].get("reward")
            if band and row.get("reward"):
                inside = band["low"] <= row["reward"]["mean"] <= band["high"]
                out.append(f"reward inside colocated's 95% interval: {ok(inside)}")
        else:
            out.append(f"speed-up: no colocated row at {row['gpus']} GPUs of this model and card")
        busy = row.get("gpu_busy")
        out.append(f"GPUs busy {busy:.0%} (>= {ASYNC_BUSY:.0%}): {ok(busy >= ASYNC_BUSY)}" if busy is not None
                   else "GPUs busy: not sampled (no nvidia-smi)")
    return out


def table_row(row: dict) -> str:
    def f(v, spec):
        return "-" if v is None else format(v, spec)
    if row.get("error") or row.get("steps_per_hour") is None:
        cells = [row["gpus"], row["layout"], row["model"]] + ["error"] * 7 + [
            row.get("card"), f"`{row['command']}`", row.get("commit"), row.get("error", "no step measured")[:200]]
        return "| " + " | ".join(str(c) for c in cells) + " |"
    r = row.get("reward") or {}
    busy = row.get("gpu_busy")
    cells = [row["gpus"], row["layout"], row["model"], f(row["steps_per_hour"], ".1f"),
             f(row["generated_tokens_per_s_per_gpu"], ",.0f"),
             f"{row['trained_tokens_per_s_per_gpu']:,.0f} ({row['nemo_rl_tokens_per_s_per_gpu']:,.0f} NeMo-RL)",
             "-" if row.get("update_mfu") is None else f"{row['update_mfu']:.1%}", f(row.get("weight_sync_s"), ".3f"),
             "-" if busy is None else f"{busy:.0%}",
             f"{r['mean']:.3f} [{r['low']:.3f}, {r['high']:.3f}]" if r else "-",
             row.get("card"), f"`{row['command']}`", row.get("commit"), "; ".join(row.get("targets", []))]
    return "| " + " | ".join(str(c) for c in cells) + " |"


TABLE_HEADER = ("| GPUs | layout | model | steps/h | generated tokens/s per GPU | trained tokens/s per GPU "
                "(NeMo-RL count) | update MFU | weight sync s | GPUs busy | reward [95% interval] | card | "
                "command | commit | targets |\n|---:|---|---|---:|---:|---:|---:|---:|---:|---|---|---|---|---|")


def _commit() -> str:
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=False, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               check=False, capture_output=True, text=True, timeout=10).stdout.strip()
        return (head + ("+dirty" if dirty else "")) or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="GPU counts, each a run of every layout")
    p.add_argument("--layouts", nargs="+", default=["colocated", "split", "async"],
                   choices=["colocated", "split", "async"])
    p.add_argument("--staleness", type=int, nargs="+", default=[1, 2, 3], help="async layouts' max_staleness")
    p.add_argument("--split", help="K:M engine : trainer GPUs of the split layouts (default N/2 : N/2)")
    p.add_argument("--model", choices=["0.6b", "8b", "tiny"], default="0.6b")
    p.add_argument("--policy", type=Path, help="an existing policy folder instead of building --model's")
    p.add_argument("--zero-stage", type=int, help="default 3 for 8b, else 2")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=5, help="training steps per run (the first is not timed)")
    p.add_argument("--tasks-per-gpu", type=int, default=4)
    p.add_argument("--group", type=int, default=8, help="rollouts per task")
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64, help="decoded tokens per turn")
    p.add_argument("--answer-prob", type=float, default=0.2)
    p.add_argument("--median", type=float, default=0.5, help="tool latency median, s")
    p.add_argument("--p99", type=float, default=10.0, help="tool latency 99th percentile, s")
    p.add_argument("--context-tokens", type=int, default=8192)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--bucket-mb", type=int, default=256)
    p.add_argument("--cpus-per-worker", type=float, default=2.0)
    p.add_argument("--threads", type=int, default=0, help="run.threads (torch threads per actor; 0: torch's)")
    p.add_argument("--compile-cache", help="run.compile_cache (a later call on the same machine starts warm)")
    p.add_argument("--peak-tflops", type=float, help="bf16 matmul rate for the MFU (default: measured at start)")
    p.add_argument("--no-save", action="store_true", help="skip checkpoints (the run's last one included)")
    p.add_argument("--workdir", type=Path, help="policy and run folders here (default: a temporary folder)")
    p.add_argument("--json", type=Path, help="rows appended to this file's (the targets read its earlier rows)")
    p.add_argument("--table", type=Path, help="append each row's markdown line to this file")
    p.add_argument("--commit", default=os.environ.get("BENCH_COMMIT") or None)
    p.add_argument("--rows", type=Path, nargs="+", help="run nothing: the rows of these --json files (e.g. one per "
                   "device call), their targets marked against each other, as one table (to --table too)")
    args = p.parse_args(argv)
    args.zero_stage = args.zero_stage or (3 if args.model == "8b" else 2)
    args.command = "python bench/gpu_scale.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None
                                                                                     else sys.argv[1:]))
    args.commit = args.commit or _commit()
    return args


def retarget(files: list[Path], table: Path | None) -> int:
    """--rows: every row of `files`, its targets marked against all of them, one table."""
    rows = [r for f in files for r in json.loads(f.read_text())["rows"]]
    lines = [TABLE_HEADER]
    for row in rows:
        row["targets"] = targets(row, rows)
        lines.append(table_row(row))
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if table:
        table.write_text(text)
    return 0


def main(argv=None) -> int:
    args = parse(argv)
    if args.rows:
        return retarget(args.rows, args.table)
    gpu = args.device.startswith("cuda")
    if gpu:
        missing = [f"{k}={v}" for k, v in NVLS_OFF.items() if os.environ.get(k) != v]
        if missing:
            raise SystemExit("NVLink multicast must be off on a shared multi-GPU host: export " + " ".join(missing)
                             + " (bash bench/gpu_suite.sh scale-N does)")
        import torch
        have = torch.cuda.device_count()
        if max(args.gpus) > have:
            raise SystemExit(f"--gpus {max(args.gpus)}: this machine has {have} GPU(s)")
        args.card = torch.cuda.get_device_name(0)
    else:
        args.card = "cpu"
    if ROOT not in [Path(p).resolve() for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # actors
    peak = args.peak_tflops or (matmul_tflops() if gpu else None)
    from training.distributed.placement import connect
    connect("local", num_cpus=None if gpu else max(2, os.cpu_count() or 2))
    rows = json.loads(args.json.read_text())["rows"] if args.json and args.json.exists() else []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.workdir or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        policy = args.policy or (root / f"policy-{args.model}")
        if args.policy is None and not (policy / "config.json").exists():
            build_policy(policy, args.model)
        params = parameter_count(policy)
        if args.policy is not None:   # rows name what was run, not --model's default
            kind = json.loads((policy / "config.json").read_text()).get("model_type", "model")
            args.model = f"{kind} {params / 1e6:.2f}M"
        for n in args.gpus:
            for layout, dist_fields, extra in layouts(args, n):
                row = run_layout(args, n, layout, dist_fields, extra, policy, root, peak, params)
                row["peak_tflops"] = peak
                row["targets"] = targets(row, rows)
                row["table_row"] = table_row(row)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k != "table_row"}), flush=True)
                print(row["table_row"], flush=True)
                if args.json:
                    args.json.parent.mkdir(parents=True, exist_ok=True)
                    args.json.write_text(json.dumps({"rows": rows}, indent=1))
                if args.table:
                    new = not args.table.exists()
                    with args.table.open("a") as f:
                        f.write((TABLE_HEADER + "\n" if new else "") + row["table_row"] + "\n")
    mine = rows[-sum(len(layouts(args, n)) for n in args.gpus):]
    return 0 if all("error" not in r and r.get("engines_equal_trainer") for r in mine) else 1


if __name__ == "__main__":
    raise SystemExit(main())
