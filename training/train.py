"""Train an orchestrator with GRPO on multi-turn tool rollouts (PAPER.md §4-5).

    python training/train.py --config training/configs/quickstart.yaml [key=value ...]
    python training/train.py --config training/configs/paper.yaml optim.lr=5e-7 run.dir=runs/x

One step, top to bottom (`run` below):
  1. take `rollout.tasks_per_step` tasks; run G = `rollout.rollouts_per_task` episodes of
     each concurrently (generation batched, tool calls of different rollouts overlap);
  2. judge each final answer (outcome 0/1), reward each group with its task's preference
     vector, drop unfinished rollouts and flat groups, compute group-relative advantages;
  3. one sample per valid orchestrator turn; clipped PPO + mse KL to the frozen
     reference; AdamW with grad-norm clipping; the engine takes the new weights;
  4. log (metrics.jsonl, wandb, console); checkpoint every `trainer.save_every` steps.

`run.resume: auto` continues from the newest checkpoint in `<run.dir>/checkpoints`;
SIGTERM (Slurm pre-emption) saves a checkpoint and exits with status 143.
"""
from __future__ import annotations

import os
import sys

# `python training/train.py` puts training/ first on sys.path (where a module could shadow a
# standard-library one, and `import training` would fail); use the repo root instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
if sys.path and os.path.abspath(sys.path[0] or ".") == _HERE:
    sys.path[0] = os.path.dirname(_HERE)

import argparse  # noqa: E402
import copy  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402

from orchestrator.catalog import load_catalog  # noqa: E402
from orchestrator.context import Budgets, Prompts  # noqa: E402
from orchestrator.fail_closed import FailClosed, check_step  # noqa: E402
from orchestrator.loop import LoopConfig, Task  # noqa: E402
from orchestrator.records import Rollout  # noqa: E402
from orchestrator.runtime import ToolRuntime  # noqa: E402
from training import checkpoint as ckpt  # noqa: E402
from training.config import ConfigError, TrainConfig, dump_yaml, fingerprint, load_config, save_config, to_dict  # noqa: E402
from orchestrator.engines.common import eos_token_ids  # noqa: E402
from training.losses import PPOClipLoss  # noqa: E402
from training.metrics_log import MetricsLogger  # noqa: E402
from training.ppo import check_logprob_path, ppo_update  # noqa: E402
from training.precision import Precision  # noqa: E402
from training.preflight import check_device  # noqa: E402
from training.policy_setup import (load_policy, make_optimizer, make_scheduler, pad_token_id,  # noqa: E402,F401
                                   reference_path)
from training.rollouts import MemoizedLLM, Preempted, collect_rollouts, mask_forced_tokens  # noqa: E402
from training.samples import build_turn_samples, mini_batch_count  # noqa: E402
from training.scoring import make_judge, rollout_metrics, score_groups  # noqa: E402
from training.tasks import TaskSampler, load_tasks  # noqa: E402


# ---------------------------------------------------------------------------- set-up pieces
def rollout_loop_config(cfg: TrainConfig, temperature: float | None = None) -> LoopConfig:
    """The episode settings `rollout.*` gives (training rollouts and the quickstart's evaluation)."""
    return LoopConfig(max_turns=cfg.rollout.max_turns,
                      temperature=cfg.rollout.temperature if temperature is None else temperature,
                      max_tokens=cfg.rollout.max_tokens, constrained=cfg.rollout.constrained,
                      max_string_chars=cfg.rollout.max_string_chars,
                      tau2_user=cfg.rollout.tau2_user, tau2_user_model=cfg.rollout.tau2_user_model,
                      tau2_max_steps=cfg.rollout.tau2_max_steps, tau2_user_max_tokens=cfg.rollout.tau2_user_max_tokens,
                      budgets=Budgets(context_tokens=cfg.rollout.context_tokens))


def make_engine_for(cfg: TrainConfig, model, tokenizer):
    from orchestrator.engines import make_engine

    if cfg.engine.kind == "hf" and cfg.engine.share_weights:
        engine = make_engine("hf", model, tokenizer=tokenizer, device=cfg.run.device, max_batch=cfg.engine.max_batch,
                             compute_dtype=Precision.of(cfg.model.dtype).compute)
    else:   # weights in the dtype the training forward computes in (not the engine's own default)
        engine = make_engine(cfg.engine.kind, cfg.model.path, dtype=Precision.of(cfg.model.dtype).rollout)
    try:
        from orchestrator.engines.batcher import BatchingEngine
    except ImportError:
        return engine
    return BatchingEngine(engine, max_batch=cfg.engine.max_batch)


def build_runtime(cfg: TrainConfig) -> ToolRuntime:
    """The tools every rollout calls: catalog, retriever, sandbox, experts (through LLM_CALL)."""
    retriever = None
    if cfg.tools.index:
        from retrieval.client import RetrievalClient
        retriever = RetrievalClient.in_process(cfg.tools.index)
    elif cfg.tools.retrieval_url:
        from retrieval.client import RetrievalClient
        retriever = RetrievalClient([cfg.tools.retrieval_url])
    budgets = Budgets(context_tokens=cfg.rollout.context_tokens)
    runtime = ToolRuntime(catalog=load_catalog(cfg.tools.catalog), profile=cfg.tools.profile, retriever=retriever,
                          prompts=Prompts.load(cfg.tools.prompts), budgets=budgets, topk=cfg.tools.topk,
                          code_timeout=cfg.tools.code_timeout, expert_max_tokens=cfg.tools.expert_max_tokens,
                          search_fee=cfg.tools.search_fee, code_fee=cfg.tools.code_fee)
    if cfg.tools.memoize_experts:
        runtime.llm = MemoizedLLM(runtime.llm)
    return runtime


def _strip_tokens(rollout: Rollout) -> dict[str, Any]:
    d = rollout.to_dict()
    for turn in d["turns"]:
        for key in ("prompt_ids", "response_ids", "logprobs", "loss_mask"):
            turn.pop(key, None)
    return d


# ---------------------------------------------------------------------------- where the policy learns
class LocalLearner:
    """The policy in this process (`distributed.backend: none`): model, frozen reference,
    AdamW + LR schedule, engine.  `training.distributed.run.RayLearner` is the same
    interface over Ray actors; `train_loop` drives either."""

    backend = "none"

    def __init__(self, cfg: TrainConfig, checkpoint: ckpt.Checkpoint | None, state: dict[str, Any], total_steps: int):
        if checkpoint:
            ckpt.require_backend(checkpoint, state, self.backend, reference_path=reference_path(cfg))
        self.cfg = cfg
        self.model, self.tokenizer = load_policy(str(checkpoint.model_dir) if checkpoint else cfg.model.path,
                                                 cfg.model.dtype, cfg.run.device)
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
        self.optimizer = make_optimizer(model, cfg)
        self.scheduler = make_scheduler(self.optimizer, cfg.optim.scheduler, cfg.optim.warmup_steps, total_steps)
        self.scaler = Precision.of(cfg.model.dtype).scaler(cfg.run.device)    # float16 only
        if checkpoint:
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
            if self.scaler is not None and state.get("grad_scaler"):
                self.scaler.load_state_dict(state["grad_scaler"])
        self.loss_fn = PPOClipLoss(cfg.algorithm.eps_low, cfg.algorithm.eps_high, cfg.algorithm.dual_clip,
                                   cfg.algorithm.kl_coef, cfg.algorithm.kl_type)
        self.engine = make_engine_for(cfg, model, self.tokenizer)
        self.description = f"on {cfg.run.device} ({cfg.model.dtype})"

    def update(self, samples: list, step: int) -> dict[str, float]:
        """PPO step on `samples` (none: nothing to learn), new weights to the engine, one LR step."""
        cfg = self.cfg
        update: dict[str, float] = {}
        if samples:
            with Precision.of(cfg.model.dtype).autocast(cfg.run.device):   # bf16/fp16 math on float32 weights
                update = ppo_update(self.model, self.reference, self.optimizer, samples, self.loss_fn,
                                    pad_id=pad_token_id(self.tokenizer), device=torch.device(cfg.run.device),
                                    temperature=cfg.rollout.temperature, micro_batch_size=cfg.algorithm.micro_batch_size,
                                    ppo_epochs=cfg.algorithm.ppo_epochs,
                                    mini_batches=mini_batch_count(len(samples), cfg.algorithm.ppo_mini_batch_size),
                                    grad_clip=cfg.optim.grad_clip, old_logprobs=cfg.algorithm.old_logprobs,
                                    seed=cfg.run.seed * 100_003 + step, scaler=self.scaler)
            if not (cfg.engine.kind == "hf" and cfg.engine.share_weights):
                self.engine.update_weights(self.model.state_dict())
        self.scheduler.step()
        return {**update, "train/lr": self.scheduler.get_last_lr()[0]}

    def save(self, step: int, state: dict[str, Any]) -> Path:
        state = {**state, "backend": self.backend, "optimizer": self.optimizer.state_dict(),
                 "scheduler": self.scheduler.state_dict(),
                 **({"grad_scaler": self.scaler.state_dict()} if self.scaler is not None else {})}
        return ckpt.save_checkpoint(Path(self.cfg.run.dir) / "checkpoints", step, self.model, self.tokenizer, state,
                                    fingerprint(self.cfg), keep=self.cfg.trainer.keep_checkpoints)

    def close(self) -> None:
        getattr(self.engine, "close", lambda: None)()


# ---------------------------------------------------------------------------- the loop
@dataclass
class Session:
    """Everything a run holds, whichever backend learns; built by `open_session`,
    advanced by `train_step`, driven by `train_loop`."""

    cfg: TrainConfig
    tasks: list[Task]
    learner: Any                  # LocalLearner, or training.distributed.run.RayLearner
    sampler: TaskSampler
    runtime: ToolRuntime
    judge: Callable[[Task, Rollout], bool]
    loop_config: LoopConfig
    logger: MetricsLogger
    start_step: int
    total_steps: int

    def save(self, step: int, data_position: int) -> Path:
        state = {"rng": ckpt.rng_state(), "data_position": data_position, "step": step,
                 "wandb_id": self.logger.wandb_id}
        path = self.learner.save(step, state)
        self.logger.message(f"checkpoint: {path}")
        return path


def resume_point(cfg: TrainConfig) -> tuple[ckpt.Checkpoint | None, dict[str, Any]]:
    """The verified checkpoint `run.resume` names (None: start fresh) and its trainer state."""
    resume_from = ckpt.resolve_resume(cfg.run.resume, Path(cfg.run.dir) / "checkpoints")
    checkpoint = ckpt.verify_checkpoint(resume_from, fingerprint(cfg)) if resume_from else None
    return checkpoint, (checkpoint.load_state() if checkpoint else {})


def open_session(cfg: TrainConfig, tasks: list[Task], total_steps: int, learner, checkpoint, state: dict[str, Any],
                 runtime: ToolRuntime | None, judge) -> Session:
    """Data position, RNG and wandb run from the checkpoint; tools, judge, logger."""
    sampler = TaskSampler(len(tasks), cfg.run.seed, cfg.data.shuffle)
    start_step, wandb_id = 0, None
    if checkpoint:
        ckpt.set_rng_state(state["rng"])
        sampler.position, start_step, wandb_id = state["data_position"], checkpoint.step, state.get("wandb_id")
    run_dir = Path(cfg.run.dir)
    logger = MetricsLogger(run_dir, config=to_dict(cfg), name=cfg.run.name, project=cfg.logging.project,
                           wandb_mode=cfg.logging.wandb, wandb_id=wandb_id, console=cfg.logging.console,
                           resume_step=start_step, total_steps=total_steps)
    logger.message(f"[bold]config[/] (saved to {run_dir / 'config.yaml'}):\n{dump_yaml(cfg)}")
    logger.message(f"{len(tasks)} tasks, {total_steps} steps {learner.description}; "
                   + (f"resuming from {checkpoint.path} (step {start_step})" if checkpoint else "starting fresh"))
    loop_config = rollout_loop_config(cfg)
    return Session(cfg, tasks, learner, sampler, runtime or build_runtime(cfg),
                   judge or make_judge(cfg.reward.judge, cfg.reward.judge_model), loop_config, logger,
                   start_step, total_steps)


def train_step(s: Session, step: int, batch: list[Task], groups: list[list[Rollout]]) -> dict[str, Any]:
    """Steps 2-6 on one batch of rollout groups: score, filter, samples, PPO update, sync."""
    cfg = s.cfg
    # forced tokens were the constraint's choice, not the policy's (each turn records its constraint)
    mask_forced_tokens(groups, s.learner.tokenizer, eos_token_ids(s.learner.tokenizer, cfg.model.path))
    scored = score_groups(batch, groups, s.judge, estimator=cfg.algorithm.advantage,
                          min_group_std=cfg.algorithm.min_group_std, boost=cfg.algorithm.correct_sample_boost)
    samples = build_turn_samples(scored.rollouts, scored.advantages)
    update = s.learner.update(samples, step)   # 5-6: also advances the LR schedule when samples is empty
    rewards = [r for g in scored.rewards for r in g]
    metrics = {**rollout_metrics(groups), **update, "reward/mean": sum(rewards) / max(1, len(rewards)),
               "filter/groups_kept": float(scored.groups_kept), "filter/rollouts_kept": float(len(scored.rollouts)),
               "train/samples": float(len(samples)), "train/tokens": float(sum(sum(x.loss_mask) for x in samples)),
               "train/optimizer_steps": float(cfg.algorithm.ppo_epochs * mini_batch_count(len(samples), cfg.algorithm.ppo_mini_batch_size)
                                              if samples else 0),
               "data/epoch": s.sampler.epoch}
    if isinstance(s.runtime.llm, MemoizedLLM):
        metrics["tools/expert_cache_hits"] = float(s.runtime.llm.hits)
    return metrics


def train_loop(s: Session) -> dict[str, Any]:
    """Steps `start_step`..`total_steps`: rollouts, `train_step`, log, checkpoint; SIGTERM ->
    checkpoint + exit 143.  Returns the last step's metrics."""
    cfg, metrics = s.cfg, {}
    with ckpt.Preemption() as preempt:
        for step in range(s.start_step, s.total_steps):
            started, position = time.monotonic(), s.sampler.position
            batch = [s.tasks[i] for i in s.sampler.take(cfg.rollout.tasks_per_step)]
            try:   # 1. rollouts
                with s.logger.progress(f"step {step + 1} rollouts", len(batch)) as bar:
                    job = bar.add_task("rollouts", total=len(batch) * cfg.rollout.rollouts_per_task)
                    groups = collect_rollouts(
                        batch, s.learner.engine, s.runtime, s.loop_config,
                        rollouts_per_task=cfg.rollout.rollouts_per_task, seed=cfg.run.seed, step=step,
                        price_model=cfg.model.price_model, concurrency=cfg.rollout.concurrency,
                        should_stop=lambda: preempt.requested, on_done=lambda i, r: bar.advance(job))
            except Preempted:   # the weights are still those of `step`: save them and the data position
                s.save(step, position)
                s.logger.close()
                os._exit(ckpt.PREEMPTED_EXIT_CODE)   # abandon the running episodes' threads
            check_step(groups, step + 1)   # fail closed: every call failed for one configuration reason
            rollout_time = time.monotonic() - started
            metrics = train_step(s, step, batch, groups)   # 2-6
            metrics.update({"time/rollout": rollout_time, "time/step": time.monotonic() - started})
            s.logger.log(step + 1, metrics)   # 7
            if cfg.logging.rollouts_every and (step + 1) % cfg.logging.rollouts_every == 0:
                _append_rollouts(Path(cfg.run.dir) / "rollouts.jsonl", step + 1, batch, groups)
            if (step + 1) % cfg.trainer.save_every == 0 or step + 1 == s.total_steps or preempt.requested:
                s.save(step + 1, s.sampler.position)
            if preempt.requested:
                s.logger.close()
                os._exit(ckpt.PREEMPTED_EXIT_CODE)
    return metrics


def run(cfg: TrainConfig, *, runtime: ToolRuntime | None = None,
        judge: Callable[[Task, Rollout], bool] | None = None, make_learner: Callable | None = None) -> dict[str, Any]:
    """Train as `cfg` says; return the last step's metrics.  `runtime`/`judge` override the
    config's tools and judge (tests and custom environments).  The policy learns in this
    process (`distributed.backend: none`) or on Ray actors (`ray`, docs/cluster.md);
    `make_learner(cfg, checkpoint, state, total_steps)` overrides that choice."""
    if cfg.distributed.backend != "ray":   # (Ray places the policy on its workers' devices)
        check_device(cfg.run.device)
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    save_config(cfg, run_dir / "config.yaml")
    for stale in ckpt.remove_stale_temps(run_dir / "checkpoints"):
        print(f"removed {stale}: the temporary folder of a save that was killed", file=sys.stderr)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    # the schedule counts training steps, also those whose batch was filtered empty
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
    torch.manual_seed(cfg.run.seed)
    tasks = load_tasks(cfg.data.train_files, cfg.data.default_preference)
    total_steps = cfg.trainer.total_steps or cfg.trainer.epochs * max(1, len(tasks) // cfg.rollout.tasks_per_step)
    checkpoint, state = resume_point(cfg)
    if make_learner is None and cfg.distributed.backend == "ray":   # same config, placed on Ray (docs/cluster.md)
        from training.distributed.run import RayLearner
        make_learner = RayLearner.start
    learner = (make_learner or LocalLearner)(cfg, checkpoint, state, total_steps)
    try:
        s = open_session(cfg, tasks, total_steps, learner, checkpoint, state, runtime, judge)
        metrics = train_loop(s)
    finally:
        learner.close()
    s.logger.close()
    return metrics


def run_distributed(cfg, dist=None, *, runtime=None,
                    judge: Callable[[Task, Rollout], bool] | None = None, policy=None) -> dict[str, Any]:
    """`run` with the Ray actors `cfg.distributed` (or `dist`, a DistributedConfig) describes.

    `runtime`/`judge` override the config's tools and judge (tests); `policy`: an already
    started RayPolicy to use (and leave running), else one is started and shut down here.
    """
    from training.distributed.run import RayLearner

    return run(cfg, runtime=runtime, judge=judge, make_learner=lambda c, checkpoint, state, total: RayLearner.start(
        c, checkpoint, state, total, dist=dist, policy=policy))


def _append_rollouts(path: Path, step: int, tasks: list[Task], groups: list[list[Rollout]]) -> None:
    import json

    with path.open("a") as f:
        for task, group in zip(tasks, groups):
            for r in group:
                f.write(json.dumps({"step": step, "question": task.question, "reference": task.answer,
                                    **_strip_tokens(r)}) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="overrides: section.key=value, the value parsed as YAML "
                                            "(e.g. optim.lr=1e-5 rollout.constrained=true)")
    parser.add_argument("--config", type=Path, required=True, help="a YAML file in training/configs/")
    parser.add_argument("overrides", nargs="*", help="key=value overrides")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.print_config:
        print(dump_yaml(cfg), end="")
        return 0
    try:
        run(cfg)
    except (ConfigError, ckpt.CheckpointError, FileNotFoundError, ValueError, FailClosed) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
