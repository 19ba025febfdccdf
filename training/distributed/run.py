"""`training/train.py` with `distributed.backend: ray`: the same loop, the policy on Ray actors.

    rollouts (engines on Ray) -> rewards, filters, advantages (train.py's train_step)
    -> PPO update (DeepSpeed ZeRO ranks) -> weight sync (timed) -> log -> checkpoint

`RayLearner` is `training.learner.LocalLearner`'s interface (update / save / close, an
engine, a tokenizer) over a `RayPolicy`; `training.session.train_loop` drives both, so task
sampling, rewards, filters, samples, metrics, checkpoints with auto-resume and
SIGTERM -> checkpoint + exit 143 are one piece of code.

Asynchronous training (`algorithm.max_staleness > 0`, split mode): `async_train_loop`'s producer
makes later steps' rollouts on the engine actors while `update` runs on the trainer ranks; the
update's weights reach the engines between two engine calls (the BatchingEngine's barrier runs
`RayPolicy.sync` with version step + 1, `_SyncBetweenCalls`), and each generation carries the
version of the engine that made it (training/distributed/group.py `RayEngine.at_least`).
"""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.engines.batcher import BatchingEngine
from training import checkpoint as ckpt
from training.async_rollouts import VersionedWeights
from training.config import fingerprint
from training.distributed.config import DistributedConfig
from training.distributed.group import RayPolicy, TrainerWorkerDead
from training.policy_setup import pad_token_id, reference_path
from training.samples import mini_batch_count


def _loss_settings(cfg) -> dict[str, Any]:
    a = cfg.algorithm
    return {"eps_low": a.eps_low, "eps_high": a.eps_high, "dual_clip": a.dual_clip, "kl_coef": a.kl_coef,
            "kl_type": a.kl_type, "behav_weight_cap": a.behav_weight_cap}


class _SyncBetweenCalls:
    """Asynchronous training: the RayEngine as the BatchingEngine's engine, whose weight update
    (`VersionedWeights`: the trainer ranks hold the weights, only the version travels) is
    `RayPolicy.sync(version)`, run by the batcher between two engine calls: a running episode's
    next turn uses the new weights, the calls already sent finish on the old ones."""

    def __init__(self, policy):
        self.policy, self.tokenizer, self.seconds = policy, policy.engine.tokenizer, 0.0
        self.generate = policy.engine.generate

    def update_weights(self, weights) -> None:
        self.seconds = self.policy.sync(weights.version)


class RayLearner:
    """Trainer ranks (DeepSpeed ZeRO) and rollout engines on Ray, for `train_loop`."""

    backend = "ray"

    def __init__(self, cfg, dist: DistributedConfig, policy, tokenizer, owned: bool):
        self.cfg, self.dist, self.policy, self.tokenizer, self.owned = cfg, dist, policy, tokenizer, owned
        self.layout = {"trainer_workers": dist.trainer_workers, "zero_stage": dist.zero_stage}
        self.versioned = cfg.algorithm.max_staleness > 0
        self._synced = None
        if self.versioned:   # engines serve the version they hold (not older than the last synced) and stamp it
            policy.engine.at_least = True
            self._synced = _SyncBetweenCalls(policy)
        self.engine = BatchingEngine(self._synced or policy.engine, max_batch=cfg.engine.max_batch,
                                     linger_ms=cfg.engine.linger_ms)
        self.description = (f"on Ray: {dist.trainer_workers} trainer rank(s) (ZeRO-{dist.zero_stage}), {dist.mode} "
                            f"engines, weight sync {policy.sync_kind}")

    @classmethod
    def start(cls, cfg, checkpoint: ckpt.Checkpoint | None, state: dict[str, Any], total_steps: int, *,
              dist: DistributedConfig | None = None, policy=None) -> "RayLearner":
        """Check the checkpoint (before any actor starts), then start the actors (or use the
        already started `policy`, left running on close) and load the checkpoint into them."""
        from transformers import AutoTokenizer  # lazy: heavy (seconds to import)

        dist = dist or cfg.distributed
        layout = {"trainer_workers": dist.trainer_workers, "zero_stage": dist.zero_stage}
        if checkpoint:
            ckpt.require_backend(checkpoint, state, cls.backend, reference_path=reference_path(cfg))
            if state.get("distributed", layout) != layout:
                raise ckpt.CheckpointError(
                    f"checkpoint {checkpoint.path} was written by {state['distributed']} but this config has "
                    f"{layout}: DeepSpeed's optimizer partitions only load into the same ranks and stage; resume "
                    "with those distributed settings, or start a new run.dir from its model/ folder")
        model_path = str(checkpoint.model_dir) if checkpoint else cfg.model.path
        tokenizer = AutoTokenizer.from_pretrained(model_path)
        owned = policy is None
        version = checkpoint.step if checkpoint else 0   # the updates the start-up weights hold
        if policy is not None and cfg.algorithm.max_staleness > 0 and policy.version != version:
            raise ValueError(f"RayLearner: the given RayPolicy is at policy version {policy.version}, the run starts "
                             f"at {version}; asynchronous training stamps samples with it (start one at {version})")
        policy = policy or RayPolicy.start(cfg, dist, model_path, tokenizer, total_steps=total_steps, version=version)
        try:
            if checkpoint:
                policy.load(checkpoint.path, state.get("scheduler"))
            return cls(cfg, dist, policy, tokenizer, owned)
        except BaseException:
            if owned:
                policy.shutdown()
            raise

    def update(self, samples: list, step: int) -> dict[str, float]:
        """ZeRO data-parallel PPO step, then the timed weight sync; one LR step either way.
        A trainer rank dying raises `TrainerWorkerDead`, restartable when this learner started
        the actors (training/session.py `run` then starts them again from the last checkpoint)."""
        with self._restartable():
            return self._update(samples, step)

    @contextmanager
    def _restartable(self):
        try:
            yield
        except TrainerWorkerDead as exc:
            exc.restartable = self.owned
            exc.restarts_allowed = self.dist.trainer_restarts
            raise

    def _update(self, samples: list, step: int) -> dict[str, float]:
        update: dict[str, float] = {}
        if not samples:
            self.policy.skip_update()   # the LR schedule advances once per step, as in train.py
            if not self.versioned:
                return update
        else:
            cfg = self.cfg

            update = self.policy.update(samples, pad_id=pad_token_id(self.tokenizer),
                                        temperature=cfg.rollout.temperature,
                                        micro_batch_size=cfg.algorithm.micro_batch_size,
                                        ppo_epochs=cfg.algorithm.ppo_epochs,
                                        mini_batches=mini_batch_count(len(samples), cfg.algorithm.ppo_mini_batch_size),
                                        old_logprobs="decoupled" if self.versioned else cfg.algorithm.old_logprobs,
                                        seed=cfg.run.seed * 100_003 + step, loss=_loss_settings(cfg))
        if self.versioned:   # between two engine calls; an empty step moves the version (same weights)

            self.engine.update_weights(VersionedWeights(None, step + 1))
            update["time/weight_sync"] = self._synced.seconds
        else:
            update["time/weight_sync"] = self.policy.sync()
        return update

    def save(self, step: int, state: dict[str, Any]) -> Path:
        state = {**state, "backend": self.backend, "distributed": self.layout}
        with self._restartable():
            return self.policy.save(Path(self.cfg.run.dir) / "checkpoints", step, self.tokenizer, state,
                                    fingerprint(self.cfg), keep=self.cfg.trainer.keep_checkpoints)

    def close(self) -> None:
        # actors first: an engine call or refresh blocked in a collective with a dead rank (NCCL waits
        # for its timeout) then fails at once, so the batcher's worker thread can be joined
        try:
            if self.owned:
                self.policy.shutdown()
        finally:
            self.engine.close()
