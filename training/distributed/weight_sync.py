"""Moving the trainer's new weights to the rollout engines after every step.

Three transports, one bucket plan:

- in-process: the engine lives in the trainer's process (colocated); it gets the state dict
  (`engine.update_weights(tensors)`), no copy beyond a dtype cast;
- CUDA IPC: engine and trainer are separate processes on the same GPU (colocated); the
  trainer sends CUDA IPC handles of each bucket (`torch.multiprocessing.reductions`),
  the engine maps the same memory;
- broadcast: engines on other GPUs or nodes (split); trainer rank 0 broadcasts each
  bucket over a process group of its own (NCCL on GPU, gloo on CPU) that holds only
  itself and the engines, so it never touches the trainer's data-parallel group.

Parameters are grouped into buckets of at most `bucket_mb` MiB per dtype and sent as one
flat tensor each: few large messages instead of hundreds of small ones.
"""
from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Iterable, Iterator

import torch


@dataclass(frozen=True)
class TensorMeta:
    name: str
    shape: tuple[int, ...]
    dtype: str                  # "float32", "bfloat16", ...

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class Bucket:
    """Tensors sent as one flat tensor of `dtype` (their numels add up to `numel`)."""

    dtype: str
    tensors: tuple[TensorMeta, ...]

    @property
    def numel(self) -> int:
        return sum(t.numel for t in self.tensors)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def full_meta(t: torch.Tensor) -> torch.Tensor:
    """`t` as planning sees it: a DeepSpeed ZeRO-3 parameter is an empty shard outside a
    gather (`ds_shape` holds its real shape), so it is described by a meta tensor of that shape."""
    shape = getattr(t, "ds_shape", None)
    return torch.empty(tuple(shape), dtype=t.dtype, device="meta") if shape is not None else t


def plan_buckets(named: Iterable[tuple[str, torch.Tensor]], bucket_mb: float) -> list[Bucket]:
    """Group (name, tensor) pairs, in order, into per-dtype buckets of <= bucket_mb MiB.

    A tensor larger than the limit gets a bucket of its own.  Tied weights appear once
    (the caller passes `named_parameters()`, which lists a shared tensor once).
    """
    limit = bucket_mb * 2**20
    open_: dict[str, list[TensorMeta]] = {}
    sizes: dict[str, int] = {}
    buckets: list[Bucket] = []
    for name, t in named:
        dtype = str(t.dtype).removeprefix("torch.")
        nbytes = t.numel() * t.element_size()
        metas = open_.setdefault(dtype, [])
        if metas and sizes[dtype] + nbytes > limit:
            buckets.append(Bucket(dtype, tuple(metas)))
            metas = open_[dtype] = []
        if not metas:
            sizes[dtype] = 0
        metas.append(TensorMeta(name, tuple(t.shape), dtype))
        sizes[dtype] += nbytes
    buckets += [Bucket(d, tuple(metas)) for d, metas in open_.items() if metas]
    return buckets


def pack(bucket: Bucket, tensors: dict[str, torch.Tensor], device) -> torch.Tensor:
    """The bucket's tensors flattened into one [numel] tensor on `device`."""
    return torch.cat([tensors[m.name].detach().reshape(-1).to(device=device, dtype=_dtype(bucket.dtype))
                      for m in bucket.tensors])


def unpack(bucket: Bucket, flat: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, view) pairs over a flat [numel] tensor; views share its memory."""
    offset = 0
    for m in bucket.tensors:
        yield m.name, flat[offset:offset + m.numel].view(m.shape)
        offset += m.numel


def digest(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 over names and float32 bytes, in name order: equal digests = equal weights."""
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda kv: kv[0]):
        h.update(name.encode())
        h.update(t.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()


class SyncGroup:
    """A process group of trainer rank 0 (rank 0 here) and the engines (ranks 1..world-1),
    built from its own TCPStore, so it exists beside (not inside) the default group.

    backend: "gloo" (CPU tensors) or "nccl" (CUDA tensors).
    """

    def __init__(self, host: str, port: int, rank: int, world_size: int, backend: str,
                 timeout_s: float = 600.0):
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.store = torch.distributed.TCPStore(host, port, world_size, is_master=rank == 0, timeout=timeout,
                                                wait_for_workers=False)
        if backend == "gloo":
            self.pg = torch.distributed.ProcessGroupGloo(self.store, rank, world_size, timeout)
        elif backend == "nccl":
            self.pg = torch.distributed.ProcessGroupNCCL(self.store, rank, world_size)
        else:
            raise ValueError(f"SyncGroup backend {backend!r}: use gloo or nccl")
        self.device = torch.device("cpu") if backend == "gloo" else torch.device("cuda", torch.cuda.current_device())

    def broadcast(self, flat: torch.Tensor) -> None:
        """Send (rank 0) or receive (others) `flat` in place."""
        opts = torch.distributed.BroadcastOptions()
        opts.rootRank = 0
        self.pg.broadcast([flat], opts).wait()

    def send(self, plan: list[Bucket], tensors: dict[str, torch.Tensor]) -> float:
        """Rank 0: broadcast every bucket; returns seconds."""
        started = time.perf_counter()
        for bucket in plan:
            self.broadcast(pack(bucket, tensors, self.device))
        if self.backend == "nccl":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    def receive(self, plan: list[Bucket]) -> Iterator[tuple[Bucket, torch.Tensor]]:
        """Other ranks: yield each bucket's flat tensor as it arrives."""
        for bucket in plan:
            flat = torch.empty(bucket.numel, dtype=_dtype(bucket.dtype), device=self.device)
            self.broadcast(flat)
            yield bucket, flat


def ipc_handles(plan: list[Bucket], tensors: dict[str, torch.Tensor], device) -> tuple[list, list]:
    """Colocated, separate processes on one GPU: CUDA IPC handles of each packed bucket.

    Returns (handles, buffers): send `handles` (small, picklable) to the engine; keep
    `buffers` alive until it has copied them (the handles point into their memory).
    """
    from torch.multiprocessing.reductions import reduce_tensor  # lazy: heavy (torch)

    buffers = [pack(bucket, tensors, device) for bucket in plan]
    return [(bucket, reduce_tensor(flat)) for bucket, flat in zip(plan, buffers)], buffers


def receive_ipc(handles: list) -> Iterator[tuple[Bucket, torch.Tensor]]:
    """Rebuild each bucket from its CUDA IPC handle (same GPU, no copy)."""
    for bucket, (rebuild, args) in handles:
        yield bucket, rebuild(*args)
