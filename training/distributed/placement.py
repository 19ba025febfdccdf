"""Where the actors go: connect to Ray, check the cluster can hold the config, reserve bundles.

    connect("local")          # a Ray instance inside this process tree (one machine)
    connect("auto")           # the cluster slurm/train.sbatch started (RAY_ADDRESS)
    plan = Placement.for_config(dist, on_gpu=True)
    plan.check(ray.cluster_resources())     # fails *before* anything starts, saying what is missing
    pg = plan.reserve(timeout_s=120)

Bundles: one per trainer rank ({"GPU": 1} on GPU) and, in split mode, one per rollout
engine ({"GPU": tensor_parallel}); each also reserves `cpus_per_worker` CPUs.  Colocated
mode puts each rank's engine in the rank's own process, so it needs no bundle of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

from training.distributed.config import DistributedConfig, DistributedConfigError, gpus_needed


# set in the driver, passed to every actor (runtime_env): on a shared multi-GPU host NVLink multicast must
# stay off in every process that uses NCCL, PyTorch's symmetric memory or NVSHMEM
FORWARDED_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


def forwarded_env() -> dict[str, str]:
    """The driver's values of `FORWARDED_ENV` (those set), for the actors' runtime_env."""
    import os

    return {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}


def connect(address: str, *, num_cpus: int | None = None):
    """ray.init for "local" (start one here) or "auto"/"host:port" (join); idempotent."""
    import ray  # lazy: optional (distributed extra)

    if ray.is_initialized():
        return ray
    # Actors import `training.*` like this process does: the package is installed (pip -e),
    # or slurm/train.sbatch puts the repository on PYTHONPATH for every node.
    if address == "local":
        # address="local": always a new instance, never a cluster someone else started here
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level="WARNING")
    else:
        ray.init(address=address, logging_level="WARNING")
    return ray


@dataclass
class Placement:
    trainer_bundles: list[dict[str, float]]
    rollout_bundles: list[dict[str, float]]
    gpus: int

    @classmethod
    def for_config(cls, dist: DistributedConfig, on_gpu: bool) -> "Placement":
        cpu = {"CPU": dist.cpus_per_worker}
        trainer = [{**cpu, **({"GPU": 1} if on_gpu else {})} for _ in range(dist.trainer_workers)]
        rollout = [] if dist.mode == "colocated" else [
            {**cpu, **({"GPU": dist.tensor_parallel} if on_gpu else {})} for _ in range(dist.rollout_workers)]
        return cls(trainer, rollout, gpus_needed(dist, on_gpu))

    def check(self, resources: dict[str, float]) -> None:
        """Raise DistributedConfigError when the cluster lacks the GPUs or CPUs asked for."""
        have_gpu, have_cpu = resources.get("GPU", 0), resources.get("CPU", 0)
        need_cpu = sum(b.get("CPU", 0) for b in self.trainer_bundles + self.rollout_bundles)
        if self.gpus > have_gpu:
            raise DistributedConfigError(
                f"distributed: this config needs {self.gpus} GPUs ({len(self.trainer_bundles)} trainer ranks"
                + (f" + {len(self.rollout_bundles)} engines x {self.rollout_bundles[0].get('GPU', 0):g}"
                   if self.rollout_bundles else "") + f") but the Ray cluster has {have_gpu:g}; lower "
                "distributed.trainer_workers / rollout_workers / tensor_parallel, use mode: colocated, "
                "or allocate more GPUs (sbatch --gpus-per-node / --nodes)")
        if need_cpu > have_cpu:
            raise DistributedConfigError(
                f"distributed: this config reserves {need_cpu:g} CPUs (distributed.cpus_per_worker="
                f"{self.trainer_bundles[0]['CPU']:g} per actor) but the Ray cluster has {have_cpu:g}; "
                "lower distributed.cpus_per_worker")

    def reserve(self, timeout_s: float = 120.0):
        """A placement group holding every bundle (trainer ranks first); waits until placed."""
        import ray  # lazy: optional (distributed extra)
        from ray.util.placement_group import placement_group

        bundles = self.trainer_bundles + self.rollout_bundles
        pg = placement_group(bundles, strategy="PACK")
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            ray.util.remove_placement_group(pg)
            raise DistributedConfigError(f"Ray could not place {bundles} within {timeout_s:g} s "
                                         f"(cluster: {ray.available_resources()})")
        return pg
