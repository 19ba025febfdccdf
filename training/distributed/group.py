"""The driver's handle on the Ray actors: trainer ranks (DeepSpeed) and rollout engines.

    policy = RayPolicy.start(cfg, dist, model_path)      # places and starts every actor
    groups = collect_rollouts(tasks, policy.engine, ...)  # generation spread over the engines
    metrics = policy.update(samples, ...)                 # ZeRO data-parallel PPO step
    seconds = policy.sync()                               # new weights -> every engine
    policy.save(run_dir / "checkpoints", step, tokenizer, state, fingerprint, keep=2)

Weight sync: colocated -> in-process (the engine is in the rank's process) or CUDA IPC;
split -> bucketed broadcast from trainer rank 0 (NCCL on GPU, gloo on CPU).

Faults: rollout engines run with Ray `max_restarts` (distributed.rollout_restarts); a restarted
one holds its start-up weights, so it is sent the current ones before it serves (`RayEngine`,
`RayPolicy.refresh`; each engine carries the policy version it holds).  A trainer rank cannot
come back alone (its optimizer partition and the ranks' process group die with it): a dead rank
is `TrainerWorkerDead`, and training/session.py `run` starts every actor again from the last
checkpoint (distributed.trainer_restarts times; after that the job fails and the babysitter's
resubmission resumes the same way).

Asynchronous training (`algorithm.max_staleness > 0`, split mode): the engines generate later
steps' rollouts while the trainer ranks update (training/session.py `async_train_loop`); the
sync runs between two engine calls (training/distributed/run.py), engines serve the version they
hold if it is not older than the last one synced (`RayEngine.at_least`) and stamp each generation
with it; a restarted engine is refreshed with the trainer's weights labelled with the version
they are (`RayPolicy.trainer_ahead`: an update the engines have not been sent yet counts).
Calls to all trainer ranks are submitted as one block (`_submitting`), so the ranks run
collectives in one order whichever thread (trainer loop, engine refresh) sent them.
"""
from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.engines.interface import SamplingParams
from training.checkpoint import save_checkpoint
from training.compile_cache import compile_cache_env
from training.distributed.config import DistributedConfig, resolved_sync, validate_distributed
from training.distributed.placement import Placement, connect, forwarded_env
from training.distributed.rollout_worker import RolloutWorker, StaleWeights
from training.distributed.train_worker import TrainWorker
from training.distributed.update import combine_metrics, deepspeed_config, shard_samples
from orchestrator.engines.common import row_seeds
from training.policy_setup import reference_path
from training.precision import Precision

log = logging.getLogger("toolorchestra.distributed")


def rollout_engine_kwargs(cfg, dist: DistributedConfig, ipc: bool) -> dict[str, Any]:
    """Constructor arguments of the rollout engines: `distributed.engine_args`, then defaults.
    The weights' dtype follows `model.dtype` (training/precision.py `Precision.rollout`): an
    engine left to its own default (the HF engine: bfloat16 on a GPU) would sample from a
    rounded copy of a float32 policy, and its weights would never equal the trainer's.  So
    model.dtype float32 serves rollouts in float32 too (vLLM: twice the memory of bf16 and
    not its FlashAttention kernels); on GPUs train with bfloat16, as training/configs/paper.yaml does."""
    kwargs = dict(dist.engine_args)
    kwargs.setdefault("dtype", Precision.of(cfg.model.dtype).rollout)
    for key, value in cfg.engine.hf_kwargs().items():
        kwargs.setdefault(key, value)
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


class TrainerWorkerDead(RuntimeError):
    """A trainer rank died (its process, or its node); `rank` names it.  `restartable`: whether
    the job can start its actors again itself (set by the RayLearner that owns them)."""

    def __init__(self, message: str, rank: int):
        super().__init__(message)
        self.rank, self.restartable, self.restarts_allowed = rank, False, 0


class RayEngine:
    """The `Engine` interface over remote engines: each call is split across the live ones
    (row seeds kept, so samples do not depend on the split).

    An engine that dies mid-call (a `RayActorError`) is `down`: its chunk is sent again, whole,
    to a live engine (the same rows in one batch, so the same samples).  Ray restarts an actor
    started with `max_restarts`; a down engine is asked (`ready`) at each later call, without
    waiting while others are live and up to `restart_wait_s` when none is; once it answers it is
    brought to the current policy `version` (`refresh([names])`, set by RayPolicy) before it
    serves again.  Calls carry `version` (when set): an engine that holds another one refuses
    with `StaleWeights`, is refreshed, and the chunk is retried, so a restarted engine never
    samples from the weights it was started with.  An engine whose actor is gone for good
    (restarts used up, or none allowed) is `dead`; when all are, `RolloutWorkersDead`.
    `at_least` (asynchronous training): an engine holding a newer version than `version`
    serves too, and every generation comes back stamped with its engine's version."""

    def __init__(self, workers: list, names: list[str], tokenizer, *, refresh=None, restart_wait_s: float = 300.0):
        self.workers, self.names, self.tokenizer = list(workers), list(names), tokenizer
        self.dead: dict[str, str] = {}        # gone for good: name -> the error
        self.down: dict[str, str] = {}        # died, may be restarted by Ray: name -> the error
        self.restarted: list[str] = []        # each time a down engine answered again
        self.refresh, self.restart_wait_s = refresh, restart_wait_s
        self.version: int | None = None       # the policy version calls are for (None: not checked)
        self.at_least = False                 # asynchronous: calls are for `version` or newer

    def _alive(self) -> list[tuple[str, Any]]:
        return [(n, w) for n, w in zip(self.names, self.workers) if n not in self.dead and n not in self.down]

    def _revive(self) -> None:
        """Ask each down engine whether it is back; wait (up to restart_wait_s) only when no
        engine is live.  Engines back with older weights are refreshed before they serve."""
        import ray  # lazy: optional (distributed extra)
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        deadline = time.monotonic() + (self.restart_wait_s if not self._alive() else 0.0)
        stale = []
        for name in list(self.down):
            worker = self.workers[self.names.index(name)]
            while True:
                try:
                    info = ray.get(worker.ready.remote(), timeout=max(0.5, deadline - time.monotonic()))
                except (ActorUnavailableError, GetTimeoutError):       # restarting, or not yet loaded
                    if time.monotonic() >= deadline or self._alive():  # another one is back: go on
                        break
                    time.sleep(0.2)
                    continue
                except RayActorError as exc:                            # no restarts left
                    self.dead[name] = self.down.pop(name) + f"; then {_first_line(exc)}"
                    break
                del self.down[name]
                self.restarted.append(name)
                log.warning("rollout engine %s is back (pid %s, policy version %s)", name,
                            info["incarnation"][0], info["version"])
                if self.version is not None and (info["version"] < self.version if self.at_least
                                                 else info["version"] != self.version):
                    stale.append(name)
                break
        if stale:
            self._refresh(stale)

    def _refresh(self, names: list[str]) -> None:
        if self.refresh is None:
            raise RuntimeError(f"rollout engine(s) {names} hold other weights and nothing can refresh them")
        log.warning("sending policy version %s to restarted rollout engine(s) %s", self.version, names)
        self.refresh(names)

    def generate(self, prompts: list[list[int]], params: SamplingParams, *, seeds: list[int | None] | None = None):
        """`seeds`: one per row (a BatchingEngine merging seeded calls passes each row's own);
        default `params.seed + i` per row."""
        import ray  # lazy: optional (distributed extra)
        from ray.exceptions import RayActorError

        seeds = row_seeds(params, len(prompts)) if seeds is None else list(seeds)
        if len(seeds) != len(prompts):
            raise ValueError(f"RayEngine.generate: {len(seeds)} seeds for {len(prompts)} prompts")
        out: list = [None] * len(prompts)
        pending: list[tuple[int, int]] | None = None
        while pending is None or pending:
            if self.down:
                self._revive()
            alive = self._alive()
            if not alive:
                raise RolloutWorkersDead("every rollout engine has died: " + "; ".join(
                    f"{n}: {e}" for n, e in {**self.dead, **self.down}.items()) + " (the job resumes from its last "
                    "checkpoint when resubmitted)")
            if pending is None:
                pending = _split(0, len(prompts), len(alive))
            calls = [(alive[i % len(alive)], c) for i, c in enumerate(pending)]
            version = () if self.version is None else (self.version, True) if self.at_least else (self.version,)
            refs = [w.generate.remote(prompts[a:b], params, seeds[a:b], *version) for (_, w), (a, b) in calls]
            pending, stale = [], []
            for ((name, _), (a, b)), ref in zip(calls, refs):
                try:
                    out[a:b] = ray.get(ref)
                except StaleWeights:
                    stale.append(name)
                    pending.append((a, b))
                except RayActorError as exc:
                    self.down[name] = _first_line(exc)
                    log.error("rollout engine %s died (%s); retrying its %d prompts", name, self.down[name], b - a)
                    pending.append((a, b))
            if stale:
                self._refresh(sorted(set(stale)))
        return out

    def update_weights(self, state_dict_or_path) -> None:
        raise RuntimeError("RayEngine: weights are synced by RayPolicy.sync(), not update_weights")


def _first_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


DEATH_GRACE_S = 15.0   # how long a rank's error waits for the others' calls to show a dead rank


def gather_ranks(refs: list, death_grace_s: float = DEATH_GRACE_S) -> list:
    """`ray.get` of one call per trainer rank that fails as soon as a rank dies (the other ranks
    would otherwise wait in a collective with the dead one until its timeout): TrainerWorkerDead,
    which the run restarts from.  A rank's own error can arrive before Ray reports another rank's
    death (gloo's "connection reset" when the peer's process is gone): the other calls then get
    `death_grace_s` to show a dead rank, and the error is that death; if none shows, the rank's
    error as it is."""
    import ray  # lazy: optional (distributed extra)
    from ray.exceptions import RayActorError

    rank_of = {ref: i for i, ref in enumerate(refs)}
    out: list = [None] * len(refs)
    waiting = list(refs)

    def dead(rank: int, exc: BaseException) -> TrainerWorkerDead:
        return TrainerWorkerDead(
            f"trainer rank {rank} died ({_first_line(exc)}); its optimizer partition and the ranks' "
            "process group are gone with it: the run starts every actor again from the last checkpoint", rank)

    while waiting:
        done, waiting = ray.wait(waiting, num_returns=1)
        try:
            out[rank_of[done[0]]] = ray.get(done[0])
        except RayActorError as exc:
            raise dead(rank_of[done[0]], exc) from None
        except Exception as error:
            deadline = time.monotonic() + death_grace_s
            while waiting and time.monotonic() < deadline:
                more, waiting = ray.wait(waiting, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
                for ref in more:
                    try:
                        ray.get(ref)
                    except RayActorError as exc:
                        raise dead(rank_of[ref], exc) from None
                    except Exception:
                        pass   # another rank's error: the first one is what is reported
            raise error
    return out


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
                 sync: str, placement_group, bucket_mb: int, comm_backend: str, version: int = 0):
        self.dist, self.trainers, self.rollouts, self.engine = dist, trainers, rollouts, engine
        self.sync_kind, self.pg, self.bucket_mb, self.comm_backend = sync, placement_group, bucket_mb, comm_backend
        self._plan = None
        self.version = version           # the policy version: the updates the engines' weights hold
        self.trainer_ahead = False       # the trainer ranks hold (or are making) an update not yet synced
        self._submitting = threading.Lock()   # one thread's round of calls to the ranks at a time
        self._group: list | None = None  # incarnation of each engine in trainer rank 0's sync group

    # ------------------------------------------------------------------ start
    @classmethod
    def start(cls, cfg, dist: DistributedConfig, model_path: str, tokenizer, *, total_steps: int = 1,
              version: int = 0) -> "RayPolicy":
        """Validate, connect to Ray, check resources, place and start every actor.

        cfg: the TrainConfig (run, model, engine, optim, algorithm sections are read).
        model_path: the weights to start from (the initial policy or a checkpoint's model/);
        `version`: the updates they hold (a checkpoint's step), the engines' start-up version.
        Anything started is stopped again when a later part fails.
        """
        import ray  # lazy: optional (distributed extra)

        on_gpu = cfg.run.device.startswith("cuda")
        validate_distributed(dist, device=cfg.run.device, engine_kind=cfg.engine.kind)
        connect(dist.ray_address)
        placement = Placement.for_config(dist, on_gpu)
        placement.check(ray.cluster_resources())
        pg = placement.reserve()
        policy = cls(dist, [], [], None, resolved_sync(dist, on_gpu), pg, dist.bucket_mb,
                     dist.comm_backend if dist.comm_backend != "auto" else ("nccl" if on_gpu else "gloo"), version)
        try:
            policy._start_actors(cfg, placement, model_path, tokenizer, total_steps)
        except BaseException:
            policy.shutdown()
            raise
        return policy

    def _start_actors(self, cfg, placement, model_path: str, tokenizer, total_steps: int) -> None:
        import ray  # lazy: optional (distributed extra)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        dist, device, threads = self.dist, cfg.run.device, cfg.run.threads
        ipc = self.sync_kind == "cuda_ipc"     # engine in its own process on the rank's GPU

        # actors compile into the same caches; NVLink multicast stays off in them as in the driver
        actor_env = {**forwarded_env(), **compile_cache_env(cfg.run.compile_cache)}

        def on(i: int, resources: dict, gpu_share: float = 1.0) -> dict:
            return dict(num_cpus=resources.get("CPU", 0) * gpu_share, num_gpus=resources.get("GPU", 0) * gpu_share,
                        scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=i),
                        **({"runtime_env": {"env_vars": actor_env}} if actor_env else {}))

        n = dist.trainer_workers
        share = 0.5 if ipc else 1.0
        self.trainers = [ray.remote(TrainWorker).options(**on(i, placement.trainer_bundles[i], share)).remote(
            i, n, device=device, threads=threads) for i in range(n)]
        engine_kwargs = rollout_engine_kwargs(cfg, dist, ipc)
        # engines start while the trainer ranks load; Ray restarts a dead one (with these arguments:
        # the start-up weights and version; RayEngine brings it up to date before it serves)
        engine = ray.remote(RolloutWorker)
        restarts = {"max_restarts": dist.rollout_restarts}
        if ipc:
            self.rollouts = [engine.options(**on(i, placement.trainer_bundles[i], 0.5), **restarts).remote(
                cfg.engine.kind, model_path, engine_kwargs, device=device, threads=threads, version=self.version)
                for i in range(n)]
        elif dist.mode == "split":
            self.rollouts = [engine.options(**on(n + j, placement.rollout_bundles[j]), **restarts).remote(
                cfg.engine.kind, model_path, engine_kwargs, device=device, threads=threads, version=self.version)
                for j in range(dist.rollout_workers)]
        master = ray.get(self.trainers[0].address.remote())

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
                                gradient_checkpointing=cfg.model.gradient_checkpointing, seed=cfg.run.seed,
                                compile_update=cfg.model.compile_update)
                 for t in self.trainers] + [w.ready.remote() for w in self.rollouts])
        if self.sync_kind == "inprocess":
            ray.get([t.start_engine.remote(cfg.engine.kind, model_path, engine_kwargs) for t in self.trainers])
            self.engine = RayEngine(self.trainers, [f"trainer-{i}" for i in range(n)], tokenizer)
        else:
            self.engine = RayEngine(self.rollouts, [f"rollout-{j}" for j in range(len(self.rollouts))], tokenizer,
                                    refresh=self.refresh, restart_wait_s=dist.restart_wait_s)
            self.engine.version = self.version
        if self.sync_kind == "broadcast":
            self._group = self._join_sync_group(range(len(self.rollouts)))

    def _join_sync_group(self, engines) -> list:
        """A new weight-sync group of trainer rank 0 and the engines `engines` (indices); returns
        their incarnations (a group with a dead member cannot be used again: it is re-formed)."""
        import ray  # lazy: optional (distributed extra)

        host, port = ray.get(self.trainers[0].address.remote())
        engines = list(engines)
        world = 1 + len(engines)
        calls = [self.trainers[0].join_sync_group.remote(host, port, world, self.comm_backend)]
        calls += [self.rollouts[j].join_sync_group.remote(host, port, 1 + k, world, self.comm_backend)
                  for k, j in enumerate(engines)]
        ray.get(calls)
        return [info["incarnation"] for info in ray.get([self.rollouts[j].ready.remote() for j in engines])]

    def _trainer_get(self, refs: list) -> list:
        return gather_ranks(refs)

    def refresh(self, names: list[str]) -> None:
        """Send the trainer's current weights to the named engines only (restarted ones), while the
        others generate: a weight-sync group of trainer rank 0 and them (broadcast), or CUDA IPC
        from their ranks.  The full group is re-formed at the next sync.  They are policy version
        `self.version`, or the next one while an update not yet synced is made (asynchronous
        training: the ranks send after the update they are running)."""
        import ray  # lazy: optional (distributed extra)

        engines = [int(n.rsplit("-", 1)[1]) for n in names]
        plan = self._weight_plan()
        if self.sync_kind == "cuda_ipc":
            with self._submitting:
                version = self.version + self.trainer_ahead
                handles = [t.export_ipc.remote(plan) for t in self.trainers]
            handles = self._trainer_get(handles)
            ray.get([self.rollouts[j].receive_ipc.remote(handles[j], version) for j in engines])
            self._on_ranks(lambda t: t.release_ipc.remote())
            return
        self._group = None
        self._join_sync_group(engines)
        with self._submitting:
            version = self.version + self.trainer_ahead
            receives = [self.rollouts[j].receive_weights.remote(plan, version) for j in engines]
            sends = [t.send_weights.remote(plan) for t in self.trainers]
        self._trainer_get(sends)
        ray.get(receives)

    def _on_ranks(self, call) -> list:
        """`call(rank)` on every trainer rank, sent as one block (see `_submitting`); the results."""
        with self._submitting:
            refs = [call(t) for t in self.trainers]
        return self._trainer_get(refs)

    def _weight_plan(self):
        if self._plan is None:
            self._plan = self._trainer_get([self.trainers[0].weight_plan.remote(self.bucket_mb)])[0]
        return self._plan

    # ------------------------------------------------------------------ step
    def update(self, samples, *, pad_id: int, temperature: float, micro_batch_size: int, ppo_epochs: int,
               mini_batches: int, old_logprobs: str, seed: int, loss: dict) -> dict[str, float]:
        """One PPO step over every trainer rank; the metrics `ppo_update` reports, plus time."""
        import ray  # lazy: optional (distributed extra)

        if self.sync_kind == "cuda_ipc":   # colocated engines give their GPU memory to the update
            ray.get([w.sleep.remote() for w in self.rollouts])
        shards = shard_samples(samples, len(self.trainers), mini_batches, micro_batch_size)
        settings = {"pad_id": pad_id, "temperature": temperature, "ppo_epochs": ppo_epochs,
                    "old_logprobs": old_logprobs, "seed": seed, "loss": loss}
        with self._submitting:
            self.trainer_ahead = True
            refs = [t.update.remote(s, settings) for t, s in zip(self.trainers, shards)]
        per_rank = self._trainer_get(refs)
        out = combine_metrics(per_rank)
        out["time/update"] = max(r["seconds"] for r in per_rank)
        out["train/lr"] = per_rank[0]["lr"]
        return out

    def skip_update(self) -> None:
        """A step without samples: only the LR schedule advances."""
        self._on_ranks(lambda t: t.scheduler_step.remote())

    def sync(self, version: int | None = None) -> float:
        """Push the trainer's weights to every engine as policy `version` (default: the next one);
        returns seconds (logged per step).  Engines restarting are waited for; the sync group is
        re-formed when one of its members restarted (or a refresh replaced it)."""
        import ray  # lazy: optional (distributed extra)

        if self.sync_kind == "inprocess":
            seconds = max(self._on_ranks(lambda t: t.sync_inprocess.remote()))
            self.trainer_ahead = False
            return seconds
        incarnations = self._engines_back()
        plan, version = self._weight_plan(), self.version + 1 if version is None else version
        if self.sync_kind == "cuda_ipc":   # trainer rank i -> the engine on the same GPU
            handles = self._on_ranks(lambda t: t.export_ipc.remote(plan))
            seconds = max(ray.get([w.receive_ipc.remote(h, version) for w, h in zip(self.rollouts, handles)]))
            self._on_ranks(lambda t: t.release_ipc.remote())
        else:
            if self._group != incarnations:
                log.warning("re-forming the weight-sync group (a rollout engine restarted since it was formed)")
                self._group = self._join_sync_group(range(len(self.rollouts)))
            with self._submitting:
                receives = [w.receive_weights.remote(plan, version) for w in self.rollouts]
                sends = [t.send_weights.remote(plan) for t in self.trainers]
            seconds = max(self._trainer_get(sends) + ray.get(receives))
        self.version = self.engine.version = version
        self.trainer_ahead = False
        self.engine.down.clear()          # every engine answered and holds this version
        return seconds

    def _engines_back(self) -> list:
        """Each engine's incarnation, once it answers: one restarting is waited for (up to
        distributed.restart_wait_s); one gone for good stops the job (resubmitted, it resumes)."""
        import ray  # lazy: optional (distributed extra)
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        out = []
        for j, w in enumerate(self.rollouts):
            deadline = time.monotonic() + self.dist.restart_wait_s
            while True:
                try:
                    out.append(ray.get(w.ready.remote(), timeout=max(0.5, deadline - time.monotonic()))["incarnation"])
                    break
                except (ActorUnavailableError, GetTimeoutError) as exc:
                    error = exc
                except RayActorError as exc:
                    error, deadline = exc, 0.0
                if time.monotonic() >= deadline:
                    raise RolloutWorkersDead(f"rollout-{j} is not answering ({_first_line(error)}); weights cannot "
                                             "be synced: resubmit the job, it resumes from the last checkpoint") from None
                time.sleep(0.2)
        return out

    # ------------------------------------------------------------------ checkpoints
    def save(self, root: Path, step: int, tokenizer, state: dict, fingerprint: dict, keep: int) -> Path:
        """A training.checkpoint checkpoint whose model/ holds the full weights and whose
        deepspeed/ holds every rank's optimizer partition."""
        import ray  # lazy: optional (distributed extra)

        root = Path(root)
        staged = _Staged(root / f".model-{step:08d}", root / f".deepspeed-{step:08d}")
        for folder in (staged.model_dir, staged.deepspeed_dir):
            shutil.rmtree(folder, ignore_errors=True)
        self._on_ranks(lambda t: t.save_deepspeed.remote(str(staged.deepspeed_dir)))
        self._on_ranks(lambda t: t.save_model.remote(str(staged.model_dir)))
        state = {**state, "scheduler": ray.get(self.trainers[0].scheduler_state.remote())}
        return save_checkpoint(root, step, staged, tokenizer, state, fingerprint, keep=keep)

    def load(self, checkpoint_path: Path, scheduler_state: dict | None) -> None:
        """Every rank takes its optimizer partition (and the weights) from a checkpoint."""
        import ray  # lazy: optional (distributed extra)

        folder = Path(checkpoint_path) / "deepspeed"
        if not folder.is_dir():
            raise FileNotFoundError(f"{checkpoint_path}: no deepspeed/ folder (written by a single-process run?); "
                                    "resume it with distributed.backend: none, or start over (run.resume=never)")
        ray.get([t.load_deepspeed.remote(str(folder), scheduler_state) for t in self.trainers])

    def weights_digests(self) -> dict[str, str]:
        """Digest of the trainer's weights and of every engine's (equal after `sync`)."""
        import ray  # lazy: optional (distributed extra)

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
        import ray  # lazy: optional (distributed extra)
        from ray.util.placement_group import remove_placement_group

        for actor in self.trainers + self.rollouts:
            ray.kill(actor)
        self.trainers, self.rollouts = [], []
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None
