"""`training/train.py` with `distributed.backend: ray`: the same step, its parts on Ray actors.

    rollouts (engines on Ray) -> rewards, filters, advantages (here, as in train.py)
    -> PPO update (DeepSpeed ZeRO ranks) -> weight sync (timed) -> log -> checkpoint

Everything the single-process loop does with data (task sampling, rewards, filters,
samples, metrics, checkpoints with auto-resume, SIGTERM -> checkpoint + exit 143) is the
same code: only where the model lives differs.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from orchestrator.context import Budgets
from orchestrator.loop import LoopConfig, Task
from orchestrator.records import Rollout
from training import checkpoint as ckpt
from training.distributed.config import DistributedConfig
from training.samples import build_turn_samples
from training.trainer import (MemoizedLLM, Preempted, TaskSampler, collect_rollouts, load_tasks, make_judge,
                              rollout_metrics, score_groups)


def _loss_settings(cfg) -> dict[str, Any]:
    a = cfg.algorithm
    return {"eps_low": a.eps_low, "eps_high": a.eps_high, "dual_clip": a.dual_clip, "kl_coef": a.kl_coef,
            "kl_type": a.kl_type}


def run_distributed(cfg, dist: DistributedConfig | None = None, *, runtime=None,
                    judge: Callable[[Task, Rollout], bool] | None = None, policy=None) -> dict[str, Any]:
    """Train as `cfg` says with the actors `cfg.distributed` (or `dist`) describes.

    `runtime`/`judge` override the config's tools and judge (tests); `policy`: an already
    started RayPolicy to use (and leave running), else one is started and shut down here.
    """
    from transformers import AutoTokenizer

    from training.config import dump_yaml, fingerprint, save_config, to_dict
    from training.distributed.group import RayPolicy
    from training.engines.batcher import BatchingEngine
    from training.logging import MetricsLogger
    from training.train import _append_rollouts, build_runtime

    dist = dist or cfg.distributed
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    torch.manual_seed(cfg.run.seed)
    tasks = load_tasks(cfg.data.train_files, cfg.data.default_preference)
    total_steps = cfg.trainer.total_steps or cfg.trainer.epochs * max(1, len(tasks) // cfg.rollout.tasks_per_step)
    resume_from = ckpt.resolve_resume(cfg.run.resume, run_dir / "checkpoints")
    checkpoint = ckpt.verify_checkpoint(resume_from, fingerprint(cfg)) if resume_from else None
    model_path = str(checkpoint.model_dir) if checkpoint else cfg.model.path
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    layout = {"trainer_workers": dist.trainer_workers, "zero_stage": dist.zero_stage}
    state = checkpoint.load_state() if checkpoint else {}
    if checkpoint and state.get("distributed", layout) != layout:   # checked before any actor starts
        raise ckpt.CheckpointError(
            f"checkpoint {checkpoint.path} was written by {state['distributed']} but this config has {layout}: "
            "DeepSpeed's optimizer partitions only load into the same ranks and stage; resume with those "
            "distributed settings, or start a new run.dir from its model/ folder")
    owned = policy is None
    policy = policy or RayPolicy.start(cfg, dist, model_path, tokenizer, total_steps=total_steps)
    sampler = TaskSampler(len(tasks), cfg.run.seed, cfg.data.shuffle)
    start_step, wandb_id = 0, None
    if checkpoint:
        policy.load(checkpoint.path, state.get("scheduler"))
        ckpt.set_rng_state(state["rng"])
        sampler.position, start_step, wandb_id = state["data_position"], checkpoint.step, state.get("wandb_id")

    engine = BatchingEngine(policy.engine, max_batch=cfg.engine.max_batch)
    runtime = runtime or build_runtime(cfg)
    judge = judge or make_judge(cfg.reward.judge, cfg.reward.judge_model)
    loop_config = LoopConfig(max_turns=cfg.rollout.max_turns, temperature=cfg.rollout.temperature,
                             max_tokens=cfg.rollout.max_tokens, constrained=cfg.rollout.constrained,
                             budgets=Budgets(context_tokens=cfg.rollout.context_tokens))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    logger = MetricsLogger(run_dir, config=to_dict(cfg), name=cfg.run.name, project=cfg.logging.project,
                           wandb_mode=cfg.logging.wandb, wandb_id=wandb_id, console=cfg.logging.console,
                           resume_step=start_step, total_steps=total_steps)
    logger.message(f"[bold]config[/]:\n{dump_yaml(cfg)}")
    logger.message(f"{len(tasks)} tasks, {total_steps} steps on Ray: {dist.trainer_workers} trainer rank(s) "
                   f"(ZeRO-{dist.zero_stage}), {dist.mode} engines, weight sync {policy.sync_kind}; "
                   + (f"resuming from {checkpoint.path} (step {start_step})" if checkpoint else "starting fresh"))

    def save(step: int, data_position: int) -> None:
        state = {"rng": ckpt.rng_state(), "data_position": data_position, "step": step, "wandb_id": logger.wandb_id,
                 "distributed": layout}
        path = policy.save(run_dir / "checkpoints", step, tokenizer, state, fingerprint(cfg),
                           keep=cfg.trainer.keep_checkpoints)
        logger.message(f"checkpoint: {path}")

    metrics: dict[str, Any] = {}
    try:
        with ckpt.Preemption() as preempt:
            for step in range(start_step, total_steps):
                started, position = time.monotonic(), sampler.position
                batch = [tasks[i] for i in sampler.take(cfg.rollout.tasks_per_step)]
                try:
                    groups = collect_rollouts(batch, engine, runtime, loop_config,
                                              rollouts_per_task=cfg.rollout.rollouts_per_task, seed=cfg.run.seed,
                                              step=step, price_model=cfg.model.price_model,
                                              concurrency=cfg.rollout.concurrency,
                                              should_stop=lambda: preempt.requested)
                except Preempted:
                    save(step, position)
                    logger.close()
                    os._exit(ckpt.PREEMPTED_EXIT_CODE)
                rollout_time = time.monotonic() - started
                scored = score_groups(batch, groups, judge, estimator=cfg.algorithm.advantage,
                                      min_group_std=cfg.algorithm.min_group_std)
                samples = build_turn_samples(scored.rollouts, scored.advantages)
                update: dict[str, float] = {}
                if samples:
                    update = policy.update(samples, pad_id=pad_id, temperature=cfg.rollout.temperature,
                                           micro_batch_size=cfg.algorithm.micro_batch_size,
                                           ppo_epochs=cfg.algorithm.ppo_epochs, mini_batches=cfg.algorithm.mini_batches,
                                           old_logprobs=cfg.algorithm.old_logprobs,
                                           seed=cfg.run.seed * 100_003 + step, loss=_loss_settings(cfg))
                    update["time/weight_sync"] = policy.sync()
                else:
                    policy.skip_update()   # the LR schedule advances once per step, as in train.py
                rewards = [r for g in scored.rewards for r in g]
                metrics = {**rollout_metrics(groups), **update, "reward/mean": sum(rewards) / max(1, len(rewards)),
                           "filter/groups_kept": float(scored.groups_kept),
                           "filter/rollouts_kept": float(len(scored.rollouts)), "train/samples": float(len(samples)),
                           "train/tokens": float(sum(sum(s.loss_mask) for s in samples)), "data/epoch": sampler.epoch,
                           "time/rollout": rollout_time, "time/step": time.monotonic() - started}
                if isinstance(runtime.llm, MemoizedLLM):
                    metrics["tools/expert_cache_hits"] = float(runtime.llm.hits)
                logger.log(step + 1, metrics)
                if cfg.logging.rollouts_every and (step + 1) % cfg.logging.rollouts_every == 0:
                    _append_rollouts(run_dir / "rollouts.jsonl", step + 1, batch, groups)
                if (step + 1) % cfg.trainer.save_every == 0 or step + 1 == total_steps or preempt.requested:
                    save(step + 1, sampler.position)
                if preempt.requested:
                    logger.close()
                    os._exit(ckpt.PREEMPTED_EXIT_CODE)
    finally:
        engine.close()
        if owned:
            policy.shutdown()
    logger.close()
    return metrics
