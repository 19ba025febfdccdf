"""Training's library: set-up from the config and its profile, the step, the loop
(training/train.py is the script that runs it; docs/training.md).

One step, top to bottom (`train_loop`):
  1. take `rollout.tasks_per_step` tasks; run G = `rollout.rollouts_per_task` episodes of
     each concurrently (generation batched, tool calls of different rollouts overlap);
  2. judge each final answer (outcome 0/1), reward each group with its task's preference
     vector, drop unfinished rollouts and flat groups, compute group-relative advantages;
  3. one sample per valid orchestrator turn; clipped PPO + mse KL to the frozen
     reference; AdamW with grad-norm clipping; the engine takes the new weights;
  4. log (metrics.jsonl, wandb, console); checkpoint every `trainer.save_every` steps.

The policy learns in this process (training/learner.py `LocalLearner`) or on Ray actors
(training/distributed/run.py `RayLearner`).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from orchestrator.catalog import load_catalog
from orchestrator.episodes.base import LoopConfig, Task
from orchestrator.fail_closed import ExpertWatch, check_step
from orchestrator.engines.common import eos_token_ids
from orchestrator.records import Rollout
from orchestrator.runtime import ToolRuntime
from orchestrator.settings import OrchestratorSettings, Profile, ProfileError, load_profile
from orchestrator.setup import build_runtime as build, load_prompts, loop_config
from training import checkpoint as ckpt
from training.compile_cache import load_compile_artifacts, save_compile_artifacts, use_compile_cache
from training.config import ConfigError, TrainConfig, dump_yaml, fingerprint, save_run_config, to_dict
from training.metrics_log import MetricsLogger
from training.preflight import check_device, check_models, check_paths
from training.async_rollouts import RolloutProducer, drop_stale
from training.rollouts import MemoizedLLM, Preempted, collect_rollouts, mask_forced_tokens
from training.samples import build_turn_samples, mini_batch_count
from training.scoring import make_judge, rollout_metrics, score_groups
from training.tasks import TaskSampler, load_tasks


# ---------------------------------------------------------------------------- set-up pieces
def train_profile(cfg: TrainConfig) -> Profile:
    """The settings profile `tools.profile` names (its qa.train and tau2.train sections)."""
    try:
        return load_profile(cfg.tools.profile)
    except ProfileError as exc:
        raise ConfigError(f"tools.profile: {exc}") from None


def rollout_loop_config(cfg: TrainConfig, temperature: float | None = None) -> LoopConfig:
    """The episode settings: the orchestrator's turns from `rollout.*`, the tau2 user simulator
    and steps from the profile's `tau2.train` (training rollouts and the quickstart's evaluation)."""
    turns = OrchestratorSettings(max_turns=cfg.rollout.max_turns, max_tokens=cfg.rollout.max_tokens,
                                 temperature=cfg.rollout.temperature if temperature is None else temperature,
                                 context_tokens=cfg.rollout.context_tokens)
    return loop_config(train_profile(cfg).section("tau2", "train"), orchestrator=turns,
                       constrained=cfg.rollout.constrained, max_string_chars=cfg.rollout.max_string_chars,
                       tau2_user=cfg.rollout.tau2_user)


def build_runtime(cfg: TrainConfig) -> ToolRuntime:
    """The tools every rollout calls: catalog, retriever, sandbox, experts (through LLM_CALL), with
    the profile's `qa.train` and `tau2.train` settings."""
    profile = train_profile(cfg)
    sections = {"qa": profile.section("qa", "train"), "tau2": profile.section("tau2", "train")}
    retriever = None
    if cfg.tools.index:
        from retrieval.client import RetrievalClient
        retriever = RetrievalClient.in_process(cfg.tools.index)
    elif cfg.tools.retrieval_url:
        from retrieval.client import RetrievalClient
        retriever = RetrievalClient([cfg.tools.retrieval_url])
    runtime = build(profile, sections, load_catalog(cfg.tools.catalog), retriever=retriever,
                    prompts=load_prompts(sections["qa"], cfg.tools.prompts), context_tokens=cfg.rollout.context_tokens,
                    serve=cfg.tools.serve)
    if cfg.tools.memoize_experts:
        runtime.llm = MemoizedLLM(runtime.llm)
    return runtime


def train_judge(cfg: TrainConfig) -> Callable[[Task, Rollout], bool]:
    """`reward.judge` with the profile's `qa.train.judge` (model, prompt, budget) for `llm`."""
    settings = train_profile(cfg).section("qa", "train").judge
    if cfg.reward.judge == "llm" and not settings.model:
        raise ConfigError(f"reward.judge: llm needs qa.train.judge.model in the profile {cfg.tools.profile!r} "
                          f"(an LLM_CALL model name)")
    return make_judge(cfg.reward.judge, settings.model, style=settings.prompt, max_tokens=settings.max_tokens)


def preflight_roles(cfg: TrainConfig, tasks: list[Task], judge) -> dict[str, str]:
    """The models besides the experts that the run calls through the gateway: the LLM judge (when
    `judge` is not given) and the tau2 user simulator (tau2 tasks with `rollout.tau2_user: simulator`)."""
    roles = {}
    if judge is None and cfg.reward.judge == "llm":
        model = train_profile(cfg).section("qa", "train").judge.model
        if model:
            roles[model] = "judge (reward.judge llm)"
    user = rollout_loop_config(cfg).tau2_user_model
    if user and cfg.rollout.tau2_user == "simulator" and any(t.kind == "tau2" for t in tasks):
        roles.setdefault(user, "tau2 user simulator")
    return roles


def _strip_tokens(rollout: Rollout) -> dict[str, Any]:
    d = rollout.to_dict()
    for turn in d["turns"]:
        for key in ("prompt_ids", "response_ids", "logprobs", "loss_mask"):
            turn.pop(key, None)
    return d


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
    resume_groups: tuple[int, dict[int, list[int]]] | None = None   # async: (first batch, trained slots)
    watch: ExpertWatch | None = None    # the experts' calls counted: fails the run closed (`check_calls`)

    def check_calls(self, groups: list[list[Rollout]], step: int) -> None:
        """Fail closed (FailClosed, exit 1) before training on step `step`'s rollouts: a configuration or
        permanent error in its calls (check_step), `tools.max_consecutive_failures` expert calls in a row
        failed, or every expert call since the previous step failed (no usable sample)."""
        check_step(groups, step)
        if self.watch is not None:
            self.watch.check(step)

    def save(self, step: int, data_position: int, groups: tuple[int, dict[int, list[int]]] | None = None) -> Path:
        """A checkpoint of the weights after `step` updates; `data_position`: the sampler's position
        before the first batch not (wholly) trained; `groups` (asynchronous training): that batch's
        number and the slots of it and of later batches already trained."""
        state = {"rng": ckpt.rng_state(), "data_position": data_position, "step": step,
                 "wandb_id": self.logger.wandb_id}
        if self.cfg.algorithm.max_staleness > 0:   # the weights saved are this version (updates applied)
            state["policy_version"] = step
            first, trained = groups if groups is not None else (step, {})
            state["first_batch"], state["trained_slots"] = first, {int(j): list(v) for j, v in trained.items()}
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
    start_step, wandb_id, groups = 0, None, None
    if checkpoint:
        ckpt.set_rng_state(state["rng"])
        sampler.position, start_step, wandb_id = state["data_position"], checkpoint.step, state.get("wandb_id")
        if "first_batch" in state:   # an asynchronous run's checkpoint (older ones: first batch = step)
            groups = _resume_groups(state)
    run_dir = Path(cfg.run.dir)
    logger = MetricsLogger(run_dir, config=to_dict(cfg), name=cfg.run.name, project=cfg.logging.project,
                           wandb_mode=cfg.logging.wandb, wandb_id=wandb_id, console=cfg.logging.console,
                           resume_step=start_step, total_steps=total_steps)
    logger.message(f"[bold]config[/] (saved to {run_dir / 'config.yaml'}):\n{dump_yaml(cfg)}")
    logger.message(f"{len(tasks)} tasks, {total_steps} steps {learner.description}; "
                   + (f"resuming from {checkpoint.path} (step {start_step})" if checkpoint else "starting fresh"))
    loop_config = rollout_loop_config(cfg)
    runtime = runtime or build_runtime(cfg)
    return Session(cfg, tasks, learner, sampler, runtime, judge or train_judge(cfg), loop_config, logger, start_step,
                   total_steps, groups, watch_experts(runtime, cfg.tools.max_consecutive_failures))


def watch_experts(runtime: ToolRuntime, limit: int) -> ExpertWatch:
    """Count the runtime's expert calls (orchestrator/fail_closed.py `ExpertWatch`), beneath the reply
    cache when there is one (a cache hit is no call); a runtime an earlier run watched is watched anew."""
    holder, attr = (runtime.llm, "_llm") if isinstance(runtime.llm, MemoizedLLM) else (runtime, "llm")
    inner = getattr(holder, attr)
    if isinstance(inner, ExpertWatch):
        inner = inner.llm
    watch = ExpertWatch(inner, limit)
    setattr(holder, attr, watch)
    return watch


def _resume_groups(state: dict[str, Any]) -> tuple[int, dict[int, list[int]]]:
    """(first batch not wholly trained, {batch: slots trained}) of an asynchronous checkpoint's state."""
    return int(state["first_batch"]), {int(j): list(v) for j, v in state["trained_slots"].items()}


def check_resumable_groups(cfg: TrainConfig, checkpoint, state: dict[str, Any]) -> None:
    """A checkpoint written in completion order may have trained some groups of batches past its
    first untrained one; only completion order resumes that without losing or retraining groups
    (checked before anything starts or is written)."""
    if checkpoint is None or "first_batch" not in state:
        return
    first_batch, trained = _resume_groups(state)
    if (first_batch, trained) == (checkpoint.step, {}):
        return
    if cfg.algorithm.max_staleness == 0 or cfg.algorithm.async_order != "completion":
        raise ConfigError(f"algorithm.async_order: {checkpoint.path} was written in completion order with groups of "
                          f"batches {first_batch} and later trained ahead of their steps ({trained}); resuming it "
                          f"with max_staleness={cfg.algorithm.max_staleness}, async_order={cfg.algorithm.async_order} "
                          f"would lose or retrain them: resume with algorithm.async_order=completion and "
                          f"max_staleness > 0 (or start over: run.resume=never)")


def train_step(s: Session, step: int, batch: list[Task], groups: list[list[Rollout]]) -> dict[str, Any]:
    """Steps 2-6 on one batch of rollout groups: score, filter, samples, PPO update, sync."""
    cfg = s.cfg
    # forced tokens were the constraint's choice, not the policy's (each turn records its constraint)
    mask_forced_tokens(groups, s.learner.tokenizer, eos_token_ids(s.learner.tokenizer, cfg.model.path))
    scored = score_groups(batch, groups, s.judge, estimator=cfg.algorithm.advantage,
                          min_group_std=cfg.algorithm.min_group_std, boost=cfg.algorithm.correct_sample_boost)
    samples = build_turn_samples(scored.rollouts, scored.advantages)
    stale = {}
    if cfg.algorithm.max_staleness > 0:   # asynchronous: each turn's version within the bound
        samples, stale = drop_stale(samples, step, cfg.algorithm.max_staleness)
    update = s.learner.update(samples, step)   # 5-6: also advances the LR schedule when samples is empty
    save_compile_artifacts(cfg.run.compile_artifacts)   # once: after the first step that compiled
    rewards = [r for g in scored.rewards for r in g]
    metrics = {**rollout_metrics(groups), **update, "reward/mean": sum(rewards) / max(1, len(rewards)),
               "filter/groups_kept": float(scored.groups_kept), "filter/rollouts_kept": float(len(scored.rollouts)),
               "train/samples": float(len(samples)), "train/tokens": float(sum(sum(x.loss_mask) for x in samples)),
               "train/optimizer_steps": float(cfg.algorithm.ppo_epochs * mini_batch_count(len(samples), cfg.algorithm.ppo_mini_batch_size)
                                              if samples else 0),
               "data/epoch": s.sampler.epoch, **stale}
    if isinstance(s.runtime.llm, MemoizedLLM):
        metrics["tools/expert_cache_hits"] = float(s.runtime.llm.hits)
    return metrics


def _collect(s: Session, step: int, batch: list[Task], should_stop: Callable[[], bool], on_done=None,
             unconstrained_logprobs: bool = False, **more) -> list[list[Rollout]]:
    """`collect_rollouts` with the run's settings; `more`: its on_group / slots (asynchronous training)."""
    cfg = s.cfg
    return collect_rollouts(batch, s.learner.engine, s.runtime, s.loop_config,
                            rollouts_per_task=cfg.rollout.rollouts_per_task, seed=cfg.run.seed, step=step,
                            price_model=cfg.model.price_model, concurrency=cfg.rollout.concurrency,
                            should_stop=should_stop, on_done=on_done, unconstrained_logprobs=unconstrained_logprobs,
                            max_prompt_tokens=prompt_cap(cfg), **more)


def prompt_cap(cfg: TrainConfig) -> int | None:
    """Tokens a rollout turn's templated prompt is cut to (`rollout.prompt_truncation: middle`), or None."""
    return cfg.rollout.context_tokens if cfg.rollout.prompt_truncation == "middle" else None


def _after_step(s: Session, step: int, batch: list[Task], groups: list[list[Rollout]], metrics: dict[str, Any],
                next_position: Callable[[], tuple[int, Any]], preempt: ckpt.Preemption,
                keys: list[tuple[int, int]] | None = None) -> None:
    """7: log, rollouts.jsonl, checkpoint (at `next_position()`: the data position of the first batch not
    trained, and for `Session.save` what async training tells of its groups), pre-emption exit."""
    cfg = s.cfg
    s.logger.log(step + 1, metrics)
    if cfg.logging.rollouts_every and (step + 1) % cfg.logging.rollouts_every == 0:
        _append_rollouts(Path(cfg.run.dir) / "rollouts.jsonl", step + 1, batch, groups, keys)
    if (step + 1) % cfg.trainer.save_every == 0 or step + 1 == s.total_steps or preempt.requested:
        s.save(step + 1, *next_position())
    if preempt.requested:
        s.logger.close()
        os._exit(ckpt.PREEMPTED_EXIT_CODE)


def train_loop(s: Session) -> dict[str, Any]:
    """Steps `start_step`..`total_steps`: rollouts, `train_step`, log, checkpoint; SIGTERM ->
    checkpoint + exit 143.  Returns the last step's metrics.  `algorithm.max_staleness > 0`:
    `async_train_loop`."""
    if s.cfg.algorithm.max_staleness > 0:
        return async_train_loop(s)
    cfg, metrics = s.cfg, {}
    with ckpt.Preemption() as preempt:
        for step in range(s.start_step, s.total_steps):
            started, position = time.monotonic(), s.sampler.position
            batch = [s.tasks[i] for i in s.sampler.take(cfg.rollout.tasks_per_step)]
            try:   # 1. rollouts
                with s.logger.progress(f"step {step + 1} rollouts", len(batch)) as bar:
                    job = bar.add_task("rollouts", total=len(batch) * cfg.rollout.rollouts_per_task)
                    groups = _collect(s, step, batch, lambda: preempt.requested or _tripped(s),
                                      lambda i, r: bar.advance(job))
            except Preempted:   # the weights are still those of `step`: save them and the data position
                if _tripped(s):   # too many expert calls failed in a row: stop, nothing saved or trained
                    s.watch.check(step + 1)
                s.save(step, position)
                s.logger.close()
                os._exit(ckpt.PREEMPTED_EXIT_CODE)   # abandon the running episodes' threads
            s.check_calls(groups, step + 1)   # fail closed: the experts failed (docs/reliability.md)
            rollout_time = time.monotonic() - started
            metrics = train_step(s, step, batch, groups)   # 2-6
            metrics.update({"time/rollout": rollout_time, "time/step": time.monotonic() - started})
            _after_step(s, step, batch, groups, metrics, lambda: (s.sampler.position, None), preempt)   # 7
    return metrics


def async_train_loop(s: Session) -> dict[str, Any]:
    """`train_loop` with rollouts made ahead by a `RolloutProducer` (training/async_rollouts.py):
    batch j starts once the weights are version >= j - `algorithm.max_staleness`, so it runs while
    the updates before step j do (and beside the tails of the batches before it).  Step k trains
    batch k (`algorithm.async_order: batch`) or the oldest `rollout.tasks_per_step` groups done
    (`completion`).  The engine takes each step's new weights between turns (`learner.update`
    pushes them, stamped with version step + 1).  A checkpoint records the policy version, the
    data position of the first batch not wholly trained and the groups of it and of later batches
    that were; the groups made ahead are not saved: a resume makes the untrained ones again (same
    tasks, same rollout seeds) from the checkpoint's weights (docs/async-training.md, "Resume", says why their
    versions then differ)."""
    cfg, metrics = s.cfg, {}
    bound = cfg.algorithm.max_staleness

    def take(step: int) -> tuple[list[Task], int]:
        position = s.sampler.position
        return [s.tasks[i] for i in s.sampler.take(cfg.rollout.tasks_per_step)], position

    def collect(j: int, batch: list[Task], slots: list[int], stop: Callable[[], bool], on_group) -> None:
        _collect(s, j, batch, lambda: stop() or preempt.requested or _tripped(s), unconstrained_logprobs=True,
                 on_group=on_group, slots=slots)

    first, trained = s.resume_groups or (s.start_step, {})
    with ckpt.Preemption() as preempt:
        producer = RolloutProducer(take, collect, start=s.start_step, stop=s.total_steps, max_staleness=bound,
                                   version=s.start_step, per_step=cfg.rollout.tasks_per_step,
                                   order=cfg.algorithm.async_order, first_batch=first, trained=trained).begin()

        def resume_point() -> tuple[int, tuple[int, dict[int, list[int]]]]:
            batch, position, done = producer.resume_point(lambda: s.sampler.position)
            return position, (batch, done)
        try:
            last = time.monotonic()
            for step in range(s.start_step, s.total_steps):
                waited = time.monotonic()
                item = None
                while item is None:
                    item = producer.get(step, timeout=0.5)
                    if item is not None and isinstance(item.error, Preempted):
                        item = None   # the producer stopped for the pre-emption: save below
                    if item is None and _tripped(s):   # expert calls failing in a row: stop, nothing saved
                        producer.stop()
                        s.watch.check(step + 1)
                    if item is None and preempt.requested:   # the weights are those of `step`
                        producer.stop()
                        s.save(step, *resume_point())
                        s.logger.close()
                        os._exit(ckpt.PREEMPTED_EXIT_CODE)
                waited = time.monotonic() - waited
                if item.error is not None:
                    raise item.error
                s.check_calls(item.groups, step + 1)
                metrics = train_step(s, step, item.batch, item.groups)   # 2-6: pushes version step + 1
                producer.publish(step + 1)
                now = time.monotonic()
                lags = [step - j for j, _ in item.keys]
                metrics.update({"time/rollout": item.rollout_time, "time/step": now - last, "async/wait": waited,
                                "async/admitted_staleness": sum(step - v for v in item.admitted_versions)
                                / max(1, len(item.admitted_versions)),
                                "async/groups_of_other_batches": float(sum(lag != 0 for lag in lags)),
                                "async/group_lag_max": float(max([0, *lags]))})
                last = now
                _after_step(s, step, item.batch, item.groups, metrics, resume_point, preempt, item.keys)
        finally:
            producer.stop()
    return metrics


def _tripped(s: Session) -> bool:
    return s.watch is not None and s.watch.tripped is not None


def run(cfg: TrainConfig, *, runtime: ToolRuntime | None = None,
        judge: Callable[[Task, Rollout], bool] | None = None, make_learner: Callable | None = None) -> dict[str, Any]:
    """Train as `cfg` says; return the last step's metrics.  `runtime`/`judge` override the
    config's tools and judge (tests and custom environments).  The policy learns in this
    process (`distributed.backend: none`) or on Ray actors (`ray`, docs/cluster.md);
    `make_learner(cfg, checkpoint, state, total_steps)` overrides that choice.

    A trainer rank that dies (Ray: `TrainerWorkerDead`, restartable when the learner started its
    actors) ends this attempt: the actors are stopped, and the run starts them again and resumes
    from the newest checkpoint in run.dir (`run.resume: auto`), up to distributed.trainer_restarts
    times; then the error ends the job (resubmitted, it resumes the same way).  A restart resumes
    only from a checkpoint this call saved (`saved_since`); with none, from what run.resume said
    (`never`: start over), so a restart never picks up an older run's checkpoint in run.dir."""
    restarts, before = 0, _checkpoint_stamps(cfg)
    while True:
        try:
            return _run_once(cfg, runtime=runtime, judge=judge, make_learner=make_learner)
        except Exception as exc:
            if not getattr(exc, "restartable", False) or restarts >= exc.restarts_allowed:
                raise
            restarts += 1
            print(f"{exc}; restart {restarts} of {exc.restarts_allowed}: resuming from the newest checkpoint",
                  file=sys.stderr)
            saved = saved_since(before, _checkpoint_stamps(cfg))
            if saved is not None:
                cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, resume=str(saved)))


def _checkpoint_stamps(cfg: TrainConfig) -> dict[Path, int]:
    """Each checkpoint under run.dir with its manifest's modification time (ns)."""
    return {p: (p / ckpt.MANIFEST).stat().st_mtime_ns for p in ckpt.list_checkpoints(Path(cfg.run.dir) / "checkpoints")}


def saved_since(before: dict[Path, int], now: dict[Path, int]) -> Path | None:
    """The newest checkpoint in `now` that is not in `before` or was written again since (None: none)."""
    new = [p for p, stamp in now.items() if before.get(p) != stamp]
    return max(new, key=lambda p: p.name) if new else None


def _run_once(cfg: TrainConfig, *, runtime: ToolRuntime | None = None,
              judge: Callable[[Task, Rollout], bool] | None = None, make_learner: Callable | None = None) -> dict[str, Any]:
    if cfg.distributed.backend != "ray":   # (Ray places the policy on its workers' devices)
        check_device(cfg.run.device)
    check_paths(cfg)
    train_profile(cfg)   # a misspelt tools.profile: one line (did you mean ...?) before anything starts
    tasks = load_tasks(cfg.data.train_files, cfg.data.default_preference)   # before anything is written
    run_dir = Path(cfg.run.dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    for restored in ckpt.recover_interrupted_saves(run_dir / "checkpoints"):
        print(f"restored {restored}: a re-save of it was killed between moving it aside and replacing it",
              file=sys.stderr)
    for stale in ckpt.remove_stale_temps(run_dir / "checkpoints"):
        print(f"removed {stale}: the temporary folder of a save that was killed", file=sys.stderr)
    if cfg.run.threads:
        torch.set_num_threads(cfg.run.threads)
    use_compile_cache(cfg.run.compile_cache)   # before anything compiles (Ray actors: group.py)
    if (note := load_compile_artifacts(cfg.run.compile_artifacts)) is not None:
        print(note, file=sys.stderr)
    # the schedule counts training steps, also those whose batch was filtered empty
    warnings.filterwarnings("ignore", message=r"Detected call of `lr_scheduler\.step\(\)` before")
    torch.manual_seed(cfg.run.seed)
    total_steps = cfg.trainer.total_steps or cfg.trainer.epochs * max(1, len(tasks) // cfg.rollout.tasks_per_step)
    checkpoint, state = resume_point(cfg)
    check_resumable_groups(cfg, checkpoint, state)
    save_run_config(cfg, run_dir, checkpoint.step if checkpoint else 0)   # a replaced config.yaml -> history
    if runtime is None:   # the gateway calls the experts: check each can be called before start-up
        runtime = build_runtime(cfg)
        check_models(tasks, runtime, preflight_roles(cfg, tasks, judge), request_s=cfg.tools.preflight_timeout)
    if make_learner is None and cfg.distributed.backend == "ray":   # same config, placed on Ray (docs/cluster.md)
        from training.distributed.run import RayLearner
        make_learner = RayLearner.start
    if make_learner is None:
        from training.learner import LocalLearner
        make_learner = LocalLearner
    learner = make_learner(cfg, checkpoint, state, total_steps)
    s = None
    try:
        s = open_session(cfg, tasks, total_steps, learner, checkpoint, state, runtime, judge)
        metrics = train_loop(s)
    finally:
        learner.close()
        if s is not None:
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


def _append_rollouts(path: Path, step: int, tasks: list[Task], groups: list[list[Rollout]],
                     keys: list[tuple[int, int]] | None = None) -> None:
    """One row per rollout; `keys` (asynchronous training): each group's (batch, slot), logged as
    `batch_step` (the step that batch was taken for, 1-based as `step`) and `slot`."""
    import json

    with path.open("a") as f:
        for k, (task, group) in enumerate(zip(tasks, groups)):
            made = {"batch_step": keys[k][0] + 1, "slot": keys[k][1]} if keys else {}
            for r in group:
                f.write(json.dumps({"step": step, **made, "question": task.question, "reference": task.answer,
                                    **_strip_tokens(r)}) + "\n")
