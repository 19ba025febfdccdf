"""A rollout engine replica (a Ray actor) for split mode: generates, and takes new weights
over the weight-sync group (broadcast) or CUDA IPC handles.

The engine is any `orchestrator.engines` kind ("hf", or "vllm" with `tensor_parallel_size`
GPUs); it starts from the initial weights and is updated in place after every step.

Restarts: the driver starts these actors with `max_restarts` (distributed.rollout_restarts).  Ray
restarts a dead one by running its constructor again, i.e. with the weights it started from, not
the policy's current ones; so every engine carries the policy `version` its weights are (the
constructor's, then each sync's), and `generate` refuses a call for another version with
`StaleWeights` instead of sampling from old weights.  The driver then sends it the current
weights (training/distributed/group.py `RayPolicy.refresh`) and retries the call.

Asynchronous training (`algorithm.max_staleness > 0`) calls with `at_least=True`: the engine
serves the version it holds when it is not older than the call's (a refreshed engine may already
hold the update the others are about to receive) and stamps every generation with it
(`Generation.policy_version`, training/async_rollouts.py); an older one is refused as above.
"""
from __future__ import annotations

import os
import time

import torch

from orchestrator.engines import make_engine
from training.distributed.weight_sync import Bucket, SyncGroup, digest, receive_ipc, unpack


def can_sleep(engine) -> bool:
    """A vLLM engine on GPU started with enable_sleep_mode=True."""
    llm = getattr(engine, "llm", None)
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    return bool(config is not None and config.model_config.enable_sleep_mode and torch.cuda.is_available())


class StaleWeights(RuntimeError):
    """A generate call for a policy version this engine does not hold (it restarted since)."""


class RolloutWorker:
    def __init__(self, kind: str, model_path: str, engine_kwargs: dict, *, device: str, threads: int = 0,
                 version: int = 0):
        if threads:
            torch.set_num_threads(threads)
        self.device = torch.device("cuda", 0) if device.startswith("cuda") else torch.device("cpu")
        if kind == "hf":
            engine_kwargs = {"device": str(self.device), **engine_kwargs}
        self.kind = kind
        self.engine = make_engine(kind, model_path, **engine_kwargs)
        self.sync_group: SyncGroup | None = None
        self.asleep = False
        self.version = version            # the policy version of the weights `model_path` holds
        self.incarnation = (os.getpid(), time.time())   # a restarted actor has another

    def sleep(self) -> None:
        """Colocated: free the engine's weights and KV cache while the trainer updates
        (vLLM sleep mode level 1; a no-op for engines without it)."""
        if can_sleep(self.engine) and not self.asleep:
            self.engine.llm.sleep(level=1)
            self.asleep = True

    def _load(self, weights: dict[str, torch.Tensor]) -> None:
        """Wake the weights, load the new ones, then wake the KV cache (weights first keeps the
        peak memory at weights + one copy, not weights + KV cache + copy)."""
        if self.asleep:
            self.engine.llm.wake_up(tags=["weights"])
        self.engine.update_weights(weights)
        if self.asleep:
            self.engine.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    def ready(self) -> dict:
        """Answers once the engine is loaded: which process this is and the weights' version."""
        return {"incarnation": self.incarnation, "version": self.version}

    def generate(self, prompts: list[list[int]], params, seeds: list[int | None], version: int | None = None,
                 at_least: bool = False):
        """`version`: the policy version the call is for, exactly (synchronous training) or at least
        (`at_least`, asynchronous: each generation is then stamped with the version that made it)."""
        if version is not None and (self.version < version if at_least else self.version != version):
            raise StaleWeights(f"this engine holds policy version {self.version}, the call is for "
                               f"{'at least ' if at_least else ''}{version} (restarted since: pid {self.incarnation[0]})")
        out = self.engine.generate(prompts, params, seeds=seeds)
        if at_least:
            for gen in out:
                gen.policy_version = self.version
        return out

    def join_sync_group(self, host: str, port: int, rank: int, world: int, backend: str) -> None:
        self.sync_group = SyncGroup(host, port, rank, world, backend)

    def receive_weights(self, plan: list[Bucket], version: int) -> float:
        """Receive every bucket from trainer rank 0, then load them into the engine; seconds."""
        started = time.perf_counter()
        weights: dict[str, torch.Tensor] = {}
        for bucket, flat in self.sync_group.receive(plan):
            weights.update(unpack(bucket, flat))      # views: `flat` stays alive through them
        self._load(weights)
        self.version = version
        return time.perf_counter() - started

    def receive_ipc(self, handles: list, version: int) -> float:
        """Colocated on one GPU: copy the trainer's buckets from CUDA IPC handles; seconds."""
        started = time.perf_counter()
        weights: dict[str, torch.Tensor] = {}
        for bucket, flat in receive_ipc(handles):
            weights.update({n: t.clone() for n, t in unpack(bucket, flat)})
        self._load(weights)
        torch.cuda.synchronize()
        self.version = version
        return time.perf_counter() - started

    def weights_digest(self) -> str:
        """Digest of the engine's weights (HF engine: its model's parameters)."""
        model = getattr(self.engine, "model", None)
        if model is None:
            raise NotImplementedError(f"weights_digest: the {self.kind} engine does not expose its weights")
        return digest(model.named_parameters())
