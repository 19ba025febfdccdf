"""Scale-out: Ray placement, DeepSpeed ZeRO training ranks, rollout engines, weight sync, Slurm.

    config.py          the `distributed:` config section (DistributedConfig) and its checks
    placement.py       connect to Ray, check the cluster holds the config, reserve bundles
    train_worker.py    a DeepSpeed rank as a Ray actor (+ its engine when colocated)
    rollout_worker.py  an engine replica as a Ray actor (split mode)
    weight_sync.py     bucket plan, in-process / CUDA IPC / broadcast transports, digests
    update.py          the PPO update sharded over data-parallel ranks
    group.py           RayPolicy / RayEngine: the driver's handle on all of the above
    run.py             the training loop with distributed.backend: ray
    slurm.py           sbatch / squeue / sacct / scontrol / scancel as typed calls

Nothing here is imported by the single-process path: Ray and DeepSpeed stay optional.
"""
