"""Where the policy learns in this process (`distributed.backend: none`): model, frozen
reference, AdamW + LR schedule, engine.  training/distributed/run.py `RayLearner` is the same
interface over Ray actors; training/session.py `train_loop` drives either."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from orchestrator import engines   # engines.make_engine, looked up per call (a test wraps it)
from orchestrator.engines.batcher import BatchingEngine
from orchestrator.engines.capture_lock import exclusive_of_capture
from training import checkpoint as ckpt
from training.async_rollouts import VersionedEngine, VersionedWeights
from training.config import TrainConfig, fingerprint
from training.logprobs import set_layer_compile
from training.losses import PPOClipLoss
from training.policy_setup import load_policy, make_optimizer, make_scheduler, pad_token_id, reference_path
from training.ppo import check_logprob_path, ppo_update
from training.precision import Precision
from training.samples import mini_batch_count


def make_engine_for(cfg: TrainConfig, model, tokenizer, folder: str | Path, version: int = 0):
    """The rollout engine over `model` (shared, or a copy), behind a BatchingEngine.  `folder`: the
    saved model `model` was loaded from (model.path, or a checkpoint's or a trained run's model
    folder); an engine with its own weights loads them from there, so it starts from `model`'s
    weights, not model.path's.  Asynchronous training (`algorithm.max_staleness > 0`): an hf engine
    gets a copy of `model` (it generates while the trainer updates), and a `VersionedEngine` stamps
    each generation with the weights' version (`version` = updates applied so far)."""
    versioned = cfg.algorithm.max_staleness > 0
    if cfg.engine.kind == "hf" and (cfg.engine.share_weights or versioned):
        source = model
        if versioned:
            source = copy.deepcopy(model).requires_grad_(False)
        engine = engines.make_engine("hf", source, tokenizer=tokenizer, device=cfg.run.device,
                                     max_batch=cfg.engine.max_batch, compute_dtype=Precision.of(cfg.model.dtype).compute,
                                     **cfg.engine.hf_kwargs())
    else:   # weights in the dtype the training forward computes in (not the engine's own default)
        engine = engines.make_engine(cfg.engine.kind, str(folder), dtype=Precision.of(cfg.model.dtype).rollout,
                                     **cfg.engine.hf_kwargs())
    if versioned:
        engine = VersionedEngine(engine, version)
    return BatchingEngine(engine, max_batch=cfg.engine.max_batch, linger_ms=cfg.engine.linger_ms)


class LocalLearner:
    """The policy in this process (`distributed.backend: none`): model, frozen reference,
    AdamW + LR schedule, engine.  `training.distributed.run.RayLearner` is the same
    interface over Ray actors; `train_loop` drives either."""

    backend = "none"

    def __init__(self, cfg: TrainConfig, checkpoint: ckpt.Checkpoint | None, state: dict[str, Any], total_steps: int):
        if checkpoint:
            ckpt.require_backend(checkpoint, state, self.backend, reference_path=reference_path(cfg))
        self.cfg = cfg
        folder = str(checkpoint.model_dir) if checkpoint else cfg.model.path
        self.model, self.tokenizer = load_policy(folder, cfg.model.dtype, cfg.run.device)
        model = self.model
        check_logprob_path(model, model.get_input_embeddings().weight.shape[0], torch.device(cfg.run.device))
        self.reference = None
        if cfg.algorithm.kl_coef > 0:   # frozen: the initial policy ("same") or another folder
            ref_path = reference_path(cfg)
            reuse = not checkpoint and ref_path == cfg.model.path
            self.reference = (copy.deepcopy(model).to(Precision.of(cfg.model.dtype).frozen) if reuse
                              else load_policy(ref_path, cfg.model.dtype, cfg.run.device, frozen=True)[0])
            self.reference.requires_grad_(False)
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        for m in (model, self.reference):
            if m is not None:
                set_layer_compile(m, cfg.model.compile_update)
        self.optimizer = make_optimizer(model, cfg)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim.scheduler, cfg.optim.warmup_steps, total_steps)
        self.scaler = Precision.of(cfg.model.dtype).scaler(cfg.run.device)    # float16 only
        if checkpoint:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            if self.scaler is not None and state.get("grad_scaler"):
                self.scaler.load_state_dict(state["grad_scaler"])
        self.loss_fn = PPOClipLoss(cfg.algorithm.eps_low, cfg.algorithm.eps_high, cfg.algorithm.dual_clip,
                                   cfg.algorithm.kl_coef, cfg.algorithm.kl_type,
                                   behav_weight_cap=cfg.algorithm.behav_weight_cap)
        self.engine = make_engine_for(cfg, model, self.tokenizer, folder, version=checkpoint.step if checkpoint else 0)
        self._decoder = self.engine
        while hasattr(self._decoder, "engine"):   # BatchingEngine / VersionedEngine -> the engine itself
            self._decoder = self._decoder.engine
        self._rows_logged: dict[str, int] = {}
        self.description = f"on {cfg.run.device} ({cfg.model.dtype})"

    def update(self, samples: list, step: int) -> dict[str, float]:
        """PPO step on `samples` (none: nothing to learn), new weights to the engine, one LR step."""
        cfg = self.cfg
        update: dict[str, float] = {}
        versioned = cfg.algorithm.max_staleness > 0
        if samples:
            # asynchronous: the rollout thread's CUDA-graph captures wait for this update (capture_lock.py)
            with exclusive_of_capture(versioned), Precision.of(cfg.model.dtype).autocast(cfg.run.device):
                update = ppo_update(self.model, self.reference, self.optimizer, samples, self.loss_fn,
                                    pad_id=pad_token_id(self.tokenizer), device=torch.device(cfg.run.device),
                                    temperature=cfg.rollout.temperature, micro_batch_size=cfg.algorithm.micro_batch_size,
                                    ppo_epochs=cfg.algorithm.ppo_epochs,
                                    mini_batches=mini_batch_count(len(samples), cfg.algorithm.ppo_mini_batch_size),
                                    grad_clip=cfg.optim.grad_clip,
                                    old_logprobs="decoupled" if versioned else cfg.algorithm.old_logprobs,
                                    seed=cfg.run.seed * 100_003 + step, scaler=self.scaler)
            if not versioned and not (cfg.engine.kind == "hf" and cfg.engine.share_weights):
                self.engine.update_weights(self.model.state_dict())
        if versioned:   # between two engine calls: running episodes take their next turn with these
            self.engine.update_weights(VersionedWeights(self.model.state_dict() if samples else None, step + 1))
        self.scheduler.step()
        return {**update, **self._decode_rows(), "train/lr": self.scheduler.get_last_lr()[0]}

    def _decode_rows(self) -> dict[str, float]:
        """Rows the engine decoded per path since the last update, where it has a static decoder
        (a rise of engine/loop_rows is the static path falling back: the loop is several times slower)."""
        if not getattr(self._decoder, "static_expected", False):
            return {}
        counts, before = self._decoder.decode_rows, self._rows_logged
        self._rows_logged = {k: counts[k] for k in ("static", "loop")}
        return {f"engine/{k}_rows": float(v - before.get(k, 0)) for k, v in self._rows_logged.items()}

    def save(self, step: int, state: dict[str, Any]) -> Path:
        state = {**state, "backend": self.backend, "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(),
                 **({"grad_scaler": self.scaler.state_dict()} if self.scaler is not None else {})}
        return ckpt.save_checkpoint(Path(self.cfg.run.dir) / "checkpoints", step, self.model, self.tokenizer, state,
                                    fingerprint(self.cfg), keep=self.cfg.trainer.keep_checkpoints)

    def close(self) -> None:
        getattr(self.engine, "close", lambda: None)()
