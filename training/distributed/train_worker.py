"""One data-parallel training rank (a Ray actor): the policy under DeepSpeed ZeRO, the frozen
reference, and, when colocated, a rollout engine in the same process.

Created by `training.distributed.group.RayPolicy`; every method below is called on all
ranks at once unless it says "rank 0".  Devices: a rank sees the one GPU Ray gave it
(`cuda:0`) or runs on CPU (gloo); DeepSpeed's process group holds only the trainer ranks.
"""
from __future__ import annotations

import importlib
import os
import socket
import time
from typing import Any

import torch

from orchestrator.engines import make_engine
from training.checkpoint import rng_state
from training.distributed.update import rank_update
from training.distributed.weight_sync import Bucket, SyncGroup, digest, full_meta, ipc_handles, plan_buckets
from training.logprobs import set_layer_compile
from training.losses import PPOClipLoss
from training.policy_setup import make_scheduler
from training.ppo import check_logprob_path


def init_deepspeed(backend: str) -> None:
    """`deepspeed.init_distributed` without DeepSpeed's shared-memory all-reduce op.  On CPU its
    torch backend builds that op (a C++ JIT compile: ~50 s of CPU the first time on a machine or
    venv) and maps a 67 MB /dev/shm buffer it never unlinks, for `inference_all_reduce`
    (tensor-parallel inference), which training never calls: every collective here goes through
    torch.distributed.  (DeepSpeed has no setting for it; on GPU no such op is built.)"""
    import deepspeed  # lazy: optional (distributed extra)

    # by module name: the attribute `deepspeed.comm.torch` is the torch package (comm's star import)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False)


class TrainWorker:
    def __init__(self, rank: int, world: int, *, device: str, threads: int = 0):
        if threads:
            torch.set_num_threads(threads)
        self.rank, self.world = rank, world
        self.device = torch.device("cuda", 0) if device.startswith("cuda") else torch.device("cpu")
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.engine = self.reference = self.rollout = None
        self.sync_group: SyncGroup | None = None
        self._ipc_keepalive: list = []

    def address(self) -> tuple[str, int]:
        """This node's address and a free port on it (rank 0 hosts the rendezvous)."""
        import ray  # lazy: optional (distributed extra)

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    # ------------------------------------------------------------------ set-up
    def setup(self, *, master: tuple[str, int], backend: str, model_path: str, reference_path: str | None,
              dtype: str, ds_config: dict, optim: dict, scheduler: dict, reference_offload: bool,
              gradient_checkpointing: bool, seed: int, compile_update: bool = True) -> dict[str, Any]:
        """Join the trainer ranks' process group (`master`: rank 0's address and port), load
        the policy (+ reference), wrap it in DeepSpeed; returns {"params": count}."""
        import deepspeed  # lazy: optional (distributed extra)
        from transformers import AutoModelForCausalLM  # lazy: heavy (seconds to import)

        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world), LOCAL_RANK="0", LOCAL_SIZE="1",
                          MASTER_ADDR=master[0], MASTER_PORT=str(master[1]))
        init_deepspeed(backend)
        torch.manual_seed(seed)
        torch_dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch_dtype).eval()
        if gradient_checkpointing:
            model.gradient_checkpointing_enable()
        if reference_path is not None:
            ref_device = "cpu" if reference_offload else self.device
            self.reference = AutoModelForCausalLM.from_pretrained(reference_path, dtype=torch_dtype).to(ref_device)
            self.reference.eval().requires_grad_(False)
            set_layer_compile(self.reference, compile_update)
        set_layer_compile(model, compile_update)
        self.reference_offload = reference_offload
        optimizer = None
        if "optimizer" not in ds_config:   # client optimizer: torch AdamW, no compiled DeepSpeed op
            optimizer = torch.optim.AdamW(model.parameters(), lr=optim["lr"], betas=tuple(optim["betas"]),
                                          eps=optim["eps"], weight_decay=optim["weight_decay"])
        self.engine, opt, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config)
        self.scheduler = make_scheduler(optimizer or opt, scheduler["kind"], scheduler["warmup"], scheduler["total"])
        check_logprob_path(self.engine.module, self.engine.module.get_input_embeddings().weight.shape[0], self.device)
        return {"params": sum(p.numel() for p in model.parameters())}

    # ------------------------------------------------------------------ update
    def update(self, shard, settings: dict) -> dict[str, float]:
        """This rank's share of one PPO step (training.distributed.update.rank_update)."""
        loss_fn = PPOClipLoss(**settings["loss"])
        started = time.perf_counter()
        metrics = rank_update(self.engine, self.reference, shard, loss_fn, world=self.world,
                              pad_id=settings["pad_id"], device=self.device, temperature=settings["temperature"],
                              ppo_epochs=settings["ppo_epochs"], old_logprobs=settings["old_logprobs"],
                              seed=settings["seed"], reference_offload=self.reference_offload)
        self.scheduler.step()
        metrics["seconds"] = time.perf_counter() - started
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        return metrics

    def scheduler_step(self) -> None:
        self.scheduler.step()

    # ------------------------------------------------------------------ weights
    def _full_weights(self, names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Full (un-partitioned) parameters; under ZeRO-3 gathered, collectively on all ranks."""
        import deepspeed  # lazy: optional (distributed extra)

        params = dict(self.engine.module.named_parameters())
        chosen = [params[n] for n in (names or list(params))]
        if getattr(self.engine, "zero_optimization_stage", lambda: 0)() == 3:
            with deepspeed.zero.GatheredParameters(chosen, modifier_rank=None):
                return {n: p.detach().clone() for n, p in zip(names or list(params), chosen)}
        return {n: p.detach() for n, p in zip(names or list(params), chosen)}

    def weight_plan(self, bucket_mb: float) -> list[Bucket]:
        return plan_buckets(((n, full_meta(p)) for n, p in self.engine.module.named_parameters()), bucket_mb)

    def weights_digest(self) -> str:
        return digest(self._full_weights().items())

    def join_sync_group(self, host: str, port: int, world: int, backend: str) -> None:
        """Rank 0: become rank 0 of the weight-sync group with the rollout engines."""
        self.sync_group = SyncGroup(host, port, 0, world, backend)

    def send_weights(self, plan: list[Bucket]) -> float:
        """Broadcast the new weights bucket by bucket (rank 0 sends; under ZeRO-3 all ranks
        gather each bucket).  Returns seconds."""
        started = time.perf_counter()
        for bucket in plan:
            tensors = self._full_weights([m.name for m in bucket.tensors])
            if self.rank == 0:
                self.sync_group.send([bucket], tensors)
        return time.perf_counter() - started

    def export_ipc(self, plan: list[Bucket]) -> list:
        """Colocated on one GPU: CUDA IPC handles of the packed buckets; the buffers they
        point into stay alive here until `release_ipc`."""
        handles, self._ipc_keepalive = [], []
        for bucket in plan:
            h, buffers = ipc_handles([bucket], self._full_weights([m.name for m in bucket.tensors]), self.device)
            handles += h
            self._ipc_keepalive += buffers
        return handles

    def release_ipc(self) -> None:
        self._ipc_keepalive = []

    # ------------------------------------------------------------------ colocated engine
    def start_engine(self, kind: str, model_path: str, engine_kwargs: dict) -> None:
        """An engine in this process (colocated mode), built from the initial weights."""
        if kind == "hf":
            engine_kwargs = {"device": str(self.device), **engine_kwargs}
        self.rollout = make_engine(kind, model_path, **engine_kwargs)

    def generate(self, prompts: list[list[int]], params, seeds: list[int | None], version: int | None = None):
        """Colocated: this rank's engine (it lives and dies with the rank, so `version`, which
        guards restarted rollout engines, is not checked)."""
        return self.rollout.generate(prompts, params, seeds=seeds)

    def sync_inprocess(self) -> float:
        """Colocated: hand the new weights to this process's engine; returns seconds."""
        started = time.perf_counter()
        self.rollout.update_weights(self._full_weights())
        return time.perf_counter() - started

    def engine_digest(self) -> str:
        return digest(self.rollout.model.named_parameters()) if hasattr(self.rollout, "model") else ""

    # ------------------------------------------------------------------ checkpoints
    def save_deepspeed(self, folder: str) -> None:
        """All ranks: DeepSpeed's own checkpoint (partitioned optimizer state) into `folder`."""
        self.engine.save_checkpoint(folder, tag="state")

    def load_deepspeed(self, folder: str, scheduler_state: dict | None) -> None:
        path, _ = self.engine.load_checkpoint(folder, tag="state", load_module_strict=True,
                                              load_optimizer_states=True, load_lr_scheduler_states=False)
        if path is None:
            raise FileNotFoundError(f"{folder}: no DeepSpeed state (tag 'state') to resume from")
        if scheduler_state is not None:
            self.scheduler.load_state_dict(scheduler_state)

    def save_model(self, folder: str) -> None:
        """Rank 0 (after `_full_weights` on all ranks under ZeRO-3): a from_pretrained folder."""
        weights = {n: t.to("cpu") for n, t in self._full_weights().items()}
        if self.rank == 0:
            self.engine.module.save_pretrained(folder, state_dict=weights, safe_serialization=True)

    def scheduler_state(self) -> dict:
        return self.scheduler.state_dict()

    def rng_state(self) -> dict:
        return rng_state()

    def ready(self) -> bool:
        return True
