"""The driver's handle on the Ray actors: trainer ranks (DeepSpeed) and rollout engines.

    policy = RayPolicy.start(cfg, dist, model_path)      # places and starts every actor
    groups = collect_rollouts(tasks, policy.engine, ...)  # generation spread over the engines
    metrics = policy.update(samples, ...)                 # ZeRO data-parallel PPO step
    seconds = policy.sync()                               # new weights -> every engine
    policy.save(run_dir / "checkpoints", step, tokenizer, state, fingerprint, keep=2)

Weight sync: colocated -> in-process (the engine is in the rank's process) or CUDA IPC;
split -> bucketed broadcast from trainer rank 0 (NCCL on GPU, gloo on CPU).
"""
from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.engine import SamplingParams
from training.distributed.config import DistributedConfig, resolved_sync, validate_distributed
from training.distributed.update import combine_metrics, deepspeed_config, shard_samples
from orchestrator.engines.common import row_seeds

log = logging.getLogger("toolorchestra.distributed")


def rollout_engine_kwargs(cfg, dist: DistributedConfig, ipc: bool) -> dict[str, Any]:
    """Constructor arguments of the rollout engines: `distributed.engine_args`, then defaults.
    The weights' dtype follows `model.dtype` (training/precision.py `Precision.rollout`): an
    engine left to its own default (the HF engine: bfloat16 on a GPU) would sample from a
    rounded copy of a float32 policy, and its weights would never equal the trainer's.  So
    model.dtype float32 serves rollouts in float32 too (vLLM: twice the memory of bf16 and
    not its FlashAttention kernels); on GPUs train with bfloat16, as training/configs/paper.yaml does."""
    from training.precision import Precision

    kwargs = dict(dist.engine_args)
    kwargs.setdefault("dtype", Precision.of(cfg.model.dtype).rollout)
    if cfg.engine.kind == "vllm":
        if dist.mode == "split" and dist.tensor_parallel > 1:
            kwargs.setdefault("tensor_parallel_size", dist.tensor_parallel)
        elif dist.mode == "split":
            kwargs.setdefault("in_process", True)   # new weights arrive as tensors, not files
        if ipc and dist.engine_sleep:
            kwargs.setdefault("enable_sleep_mode", True)
    return kwargs


class RolloutWorkersDead(RuntimeError):
    """Every rollout engine is gone; the message names them and the errors."""


class RayEngine:
    """The `Engine` interface over remote engines: each call is split across the live ones
    (row seeds kept, so samples do not depend on the split); a chunk whose engine died is
    retried on the others."""

    def __init__(self, workers: list, names: list[str], tokenizer):
        self.workers, self.names, self.tokenizer = list(workers), list(names), tokenizer
        self.dead: dict[str, str] = {}

    def _alive(self) -> list[tuple[str, Any]]:
        return [(n, w) for n, w in zip(self.names, self.workers) if n not in self.dead]

    def generate(self, prompts: list[list[int]], params: SamplingParams):
        import ray
        from ray.exceptions import RayActorError

        seeds = row_seeds(params, len(prompts))
        pending = [(0, len(prompts))]
        out: list = [None] * len(prompts)
        while pending:
            alive = self._alive()
            if not alive:
                raise RolloutWorkersDead("every rollout engine has died: " + "; ".join(
                    f"{n}: {e}" for n, e in self.dead.items()) + " (the job resumes from its last checkpoint "
                    "when resubmitted)")
            chunks = [c for start, stop in pending for c in _split(start, stop, len(alive))]
            calls = [(alive[i % len(alive)], c) for i, c in enumerate(chunks)]
            refs = [w.generate.remote(prompts[a:b], params, seeds[a:b]) for (_, w), (a, b) in calls]
            pending = []
            for ((name, _), (a, b)), ref in zip(calls, refs):
                try:
                    out[a:b] = ray.get(ref)
                except RayActorError as exc:
                    self.dead[name] = str(exc).splitlines()[0][:200]
                    log.error("rollout engine %s died (%s); retrying its %d prompts on the others",
                              name, self.dead[name], b - a)
                    pending.append((a, b))
        return out

    def update_weights(self, state_dict_or_path) -> None:
        raise RuntimeError("RayEngine: weights are synced by RayPolicy.sync(), not update_weights")


def _split(start: int, stop: int, parts: int) -> list[tuple[int, int]]:
    n = stop - start
    parts = max(1, min(parts, n))
    bounds = [start + n * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(parts)]


@dataclass
class _Staged:
    """Looks like a model to `training.checkpoint.save_checkpoint`: `save_pretrained` moves
    the already-written weights and DeepSpeed state into the checkpoint being assembled, so
    the manifest hashes both and the checkpoint appears atomically."""

    model_dir: Path
    deepspeed_dir: Path

    def save_pretrained(self, path, safe_serialization: bool = True) -> None:
        shutil.move(str(self.model_dir), str(path))
        shutil.move(str(self.deepspeed_dir), str(Path(path).parent / "deepspeed"))


class RayPolicy:
    """Trainer ranks + engines for one run.  Build with `RayPolicy.start`."""

    def __init__(self, dist: DistributedConfig, trainers: list, rollouts: list, engine: RayEngine,
                 sync: str, placement_group, bucket_mb: int, comm_backend: str):
        self.dist, self.trainers, self.rollouts, self.engine = dist, trainers, rollouts, engine
        self.sync_kind, self.pg, self.bucket_mb, self.comm_backend = sync, placement_group, bucket_mb, comm_backend
        self._plan = None

    # ------------------------------------------------------------------ start
    @classmethod
    def start(cls, cfg, dist: DistributedConfig, model_path: str, tokenizer, *, total_steps: int = 1) -> "RayPolicy":
        """Validate, connect to Ray, check resources, place and start every actor.

        cfg: the TrainConfig (run, model, engine, optim, algorithm sections are read).
        model_path: the weights to start from (the initial policy or a checkpoint's model/).
        Anything started is stopped again when a later part fails.
        """
        import ray

        from training.distributed.placement import Placement, connect

        on_gpu = cfg.run.device.startswith("cuda")
        validate_distributed(dist, device=cfg.run.device, engine_kind=cfg.engine.kind)
        connect(dist.ray_address)
        placement = Placement.for_config(dist, on_gpu)
        placement.check(ray.cluster_resources())
        pg = placement.reserve()
        policy = cls(dist, [], [], None, resolved_sync(dist, on_gpu), pg, dist.bucket_mb,
                     dist.comm_backend if dist.comm_backend != "auto" else ("nccl" if on_gpu else "gloo"))
        try:
            policy._start_actors(cfg, placement, model_path, tokenizer, total_steps)
        except BaseException:
            policy.shutdown()
            raise
        return policy

    def _start_actors(self, cfg, placement, model_path: str, tokenizer, total_steps: int) -> None:
        import ray
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from training.distributed.rollout_worker import RolloutWorker
        from training.distributed.train_worker import TrainWorker

        dist, device, threads = self.dist, cfg.run.device, cfg.run.threads
        ipc = self.sync_kind == "cuda_ipc"     # engine in its own process on the rank's GPU

        def on(i: int, resources: dict, gpu_share: float = 1.0) -> dict:
            return dict(num_cpus=resources.get("CPU", 0) * gpu_share, num_gpus=resources.get("GPU", 0) * gpu_share,
                        scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i))

        n = dist.trainer_workers
        share = 0.5 if ipc else 1.0
        self.trainers = [ray.remote(TrainWorker).options(**on(i, placement.trainer_bundles[i], share)).remote(
            i, n, device=device, threads=threads) for i in range(n)]
        engine_kwargs = rollout_engine_kwargs(cfg, dist, ipc)
        # engines start while the trainer ranks load
        if ipc:
            self.rollouts = [ray.remote(RolloutWorker).options(**on(i, placement.trainer_bundles[i], 0.5)).remote(
                cfg.engine.kind, model_path, engine_kwargs, device=device, threads=threads) for i in range(n)]
        elif dist.mode == "split":
            self.rollouts = [ray.remote(RolloutWorker).options(**on(n + j, placement.rollout_bundles[j])).remote(
                cfg.engine.kind, model_path, engine_kwargs, device=device, threads=threads)
                for j in range(dist.rollout_workers)]
        master = ray.get(self.trainers[0].address.remote())
        from training.policy_setup import reference_path

        reference = reference_path(cfg) if cfg.algorithm.kl_coef > 0 else None
        optim = {"lr": cfg.optim.lr, "betas": cfg.optim.betas, "eps": cfg.optim.eps,
                 "weight_decay": cfg.optim.weight_decay}
        ds = deepspeed_config(zero_stage=dist.zero_stage, grad_clip=cfg.optim.grad_clip, dtype=cfg.model.dtype,
                              offload_optimizer=dist.offload_optimizer, optimizer=optim,
                              overlap_comm=self.comm_backend == "nccl")
        scheduler = {"kind": cfg.optim.scheduler, "warmup": cfg.optim.warmup_steps, "total": total_steps}
        ray.get([t.setup.remote(master=master, backend=self.comm_backend, model_path=model_path,
                                reference_path=reference, dtype=cfg.model.dtype, ds_config=ds, optim=optim,
                                scheduler=scheduler, reference_offload=dist.reference == "offload",
                                gradient_checkpointing=cfg.model.gradient_checkpointing, seed=cfg.run.seed)
                 for t in self.trainers] + [w.ready.remote() for w in self.rollouts])
        if self.sync_kind == "inprocess":
            ray.get([t.start_engine.remote(cfg.engine.kind, model_path, engine_kwargs) for t in self.trainers])
            workers, names = self.trainers, [f"trainer-{i}" for i in range(n)]
        else:
            workers, names = self.rollouts, [f"rollout-{j}" for j in range(len(self.rollouts))]
        self.engine = RayEngine(workers, names, tokenizer)
        if self.sync_kind == "broadcast":
            self._join_sync_group(master[0])

    def _join_sync_group(self, host: str) -> None:
        import ray

        _, port = ray.get(self.trainers[0].address.remote())
        world = 1 + len(self.rollouts)
        calls = [self.trainers[0].join_sync_group.remote(host, port, world, self.comm_backend)]
        calls += [w.join_sync_group.remote(host, port, 1 + j, world, self.comm_backend)
                  for j, w in enumerate(self.rollouts)]
        ray.get(calls)

    # ------------------------------------------------------------------ step
    def update(self, samples, *, pad_id: int, temperature: float, micro_batch_size: int, ppo_epochs: int,
               mini_batches: int, old_logprobs: str, seed: int, loss: dict) -> dict[str, float]:
        """One PPO step over every trainer rank; the metrics `ppo_update` reports, plus time."""
        import ray

        if self.sync_kind == "cuda_ipc":   # colocated engines give their GPU memory to the update
            ray.get([w.sleep.remote() for w in self.rollouts])
        shards = shard_samples(samples, len(self.trainers), mini_batches, micro_batch_size)
        settings = {"pad_id": pad_id, "temperature": temperature, "ppo_epochs": ppo_epochs,
                    "old_logprobs": old_logprobs, "seed": seed, "loss": loss}
        per_rank = ray.get([t.update.remote(s, settings) for t, s in zip(self.trainers, shards)])
        out = combine_metrics(per_rank)
        out["time/update"] = max(r["seconds"] for r in per_rank)
        out["train/lr"] = per_rank[0]["lr"]
        return out

    def skip_update(self) -> None:
        """A step without samples: only the LR schedule advances."""
        import ray

        ray.get([t.scheduler_step.remote() for t in self.trainers])

    def sync(self) -> float:
        """Push the trainer's weights to every engine; returns seconds (logged per step)."""
        import ray

        if self.sync_kind == "inprocess":
            return max(ray.get([t.sync_inprocess.remote() for t in self.trainers]))
        self._check_engines_alive()
        if self._plan is None:
            self._plan = ray.get(self.trainers[0].weight_plan.remote(self.bucket_mb))
        if self.sync_kind == "cuda_ipc":   # trainer rank i -> the engine on the same GPU
            handles = ray.get([t.export_ipc.remote(self._plan) for t in self.trainers])
            seconds = max(ray.get([w.receive_ipc.remote(h) for w, h in zip(self.rollouts, handles)]))
            ray.get([t.release_ipc.remote() for t in self.trainers])
            return seconds
        sends = [t.send_weights.remote(self._plan) for t in self.trainers]
        receives = [w.receive_weights.remote(self._plan) for w in self.rollouts]
        return max(ray.get(sends + receives))

    def _check_engines_alive(self) -> None:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        for j, w in enumerate(self.rollouts):
            try:
                ray.get(w.ready.remote(), timeout=60)
            except (RayActorError, GetTimeoutError) as exc:
                raise RolloutWorkersDead(f"rollout-{j} is not answering ({str(exc).splitlines()[0][:200]}); "
                                         "weights cannot be synced: resubmit the job, it resumes from the "
                                         "last checkpoint") from None

    # ------------------------------------------------------------------ checkpoints
    def save(self, root: Path, step: int, tokenizer, state: dict, fingerprint: dict, keep: int) -> Path:
        """A training.checkpoint checkpoint whose model/ holds the full weights and whose
        deepspeed/ holds every rank's optimizer partition."""
        import ray

        from training.checkpoint import save_checkpoint

        root = Path(root)
        staged = _Staged(root / f".model-{step:08d}", root / f".deepspeed-{step:08d}")
        for folder in (staged.model_dir, staged.deepspeed_dir):
            shutil.rmtree(folder, ignore_errors=True)
        ray.get([t.save_deepspeed.remote(str(staged.deepspeed_dir)) for t in self.trainers])
        ray.get([t.save_model.remote(str(staged.model_dir)) for t in self.trainers])
        state = {**state, "scheduler": ray.get(self.trainers[0].scheduler_state.remote())}
        return save_checkpoint(root, step, staged, tokenizer, state, fingerprint, keep=keep)

    def load(self, checkpoint_path: Path, scheduler_state: dict | None) -> None:
        """Every rank takes its optimizer partition (and the weights) from a checkpoint."""
        import ray

        folder = Path(checkpoint_path) / "deepspeed"
        if not folder.is_dir():
            raise FileNotFoundError(f"{checkpoint_path}: no deepspeed/ folder (written by a single-process run?); "
                                    "resume it with distributed.backend: none, or start over (run.resume=never)")
        ray.get([t.load_deepspeed.remote(str(folder), scheduler_state) for t in self.trainers])

    def weights_digests(self) -> dict[str, str]:
        """Digest of the trainer's weights and of every engine's (equal after `sync`)."""
        import ray

        out = {"trainer": ray.get(self.trainers[0].weights_digest.remote())}
        if self.rollouts:
            out.update({f"rollout-{j}": d for j, d in enumerate(ray.get([w.weights_digest.remote()
                                                                          for w in self.rollouts]))})
        else:
            out.update({f"trainer-{i}-engine": d for i, d in enumerate(ray.get([t.engine_digest.remote()
                                                                                for t in self.trainers]))})
        return out

    def shutdown(self) -> None:
        """Stop every actor and release the placement group."""
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in self.trainers + self.rollouts:
            ray.kill(actor)
        self.trainers, self.rollouts = [], []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None
