"""The tau2 episode (PAPER.md §1, §7): the orchestrator as a tau2 agent, talking to tau2's user
simulator through tau2's own `Orchestrator`, scored by tau2's `evaluate_simulation`.  Training
(`training.rollouts.collect_rollouts`) and evaluation (`evaluation/run_tau2.py`) both run it.

A `kind: tau2` Task carries its tau2 task in `metadata.tau2_task` and its environment as either
`metadata.tau2_domain` (a domain of the tau2 package: airline, retail, telecom) or
`metadata.domain_dir` (a synthesized domain folder, registered with tau2 by
orchestrator/domains/tau2_env.py).  tau2 applies the task's `initial_state` and scores every reward
basis it knows (DB, ENV_ASSERTION, ACTION, COMMUNICATE; NL_ASSERTION through tau2's own LLM
judge).  The user simulator is `LoopConfig.tau2_user_model` (a configs/models.yaml name;
upstream: GPT-5), served through `runtime.llm`; the episode stops after
`LoopConfig.tau2_max_steps` messages (upstream trains with 40).

`LoopConfig.tau2_user: solo` runs orchestrator/episodes/tau2_solo.py instead (no user).

The Rollout: one Turn per policy message (episodes/tau2_agent.py), `finished` when the
conversation ended by itself (the user or the agent stopped), `outcome` = tau2's reward,
`info` = {"reward", "termination", "simulation" (tau2's SimulationRun as JSON), "user_cost"}.
A conversation tau2 cut (max_steps, too_many_errors) is scored by tau2 (reward 0) and stays
unfinished; under the profile's `train_unfinished` (`runtime.section("tau2")`; paper's
`tau2.train`) it also carries `info["train_unfinished"] = True`, which training's filter 1
(training/filters.py `has_final_answer`) trains like a finished one: upstream marks every
rollout whose simulation wrote a reward as valid (generation_quick3.py:1363, `correct > -1`).
"""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from orchestrator.context import TokenCounter
from orchestrator.episodes.base import LoopConfig, Task, task_catalog
from orchestrator.episodes.tau2_solo import run_solo_episode
from orchestrator.records import Rollout

USER_MODES = ("simulator", "solo")


def tau2_domain_name(task: Task) -> str:
    """The tau2 registry name of the task's environment (a synthesized folder is registered once)."""
    meta = task.metadata or {}
    if meta.get("domain_dir"):
        from orchestrator.domains.tau2_env import register_domain  # lazy: pulls in tau2

        if not Path(meta["domain_dir"]).is_dir():
            raise ValueError(f"task {task.id}: metadata.domain_dir {meta['domain_dir']!r} is not a folder")
        # registered under its folder: two folders of one domain name are two environments
        return register_domain(meta["domain_dir"], name=str(Path(meta["domain_dir"]).resolve()))
    if meta.get("tau2_domain"):
        return meta["tau2_domain"]
    raise ValueError(f"task {task.id}: a tau2 task needs metadata.domain_dir (a domain folder) or "
                     "metadata.tau2_domain (a tau2 domain name, e.g. airline)")


def tau2_task_of(task: Task):
    """The task's tau2 Task, validated by tau2's own model (errors name the task and field)."""
    from orchestrator.episodes import tau2_agent  # noqa: F401 - quiets litellm / tau2 logging first
    from tau2.data_model.tasks import Task as Tau2Task  # lazy: optional (tau2 extra), heavy

    raw = (task.metadata or {}).get("tau2_task")
    if isinstance(raw, Tau2Task):
        return raw
    if not isinstance(raw, dict):
        raise ValueError(f"task {task.id}: metadata.tau2_task must be a tau2 Task (a mapping)")
    try:
        return Tau2Task.model_validate(raw)
    except ValidationError as exc:
        raise ValueError(f"task {task.id}: metadata.tau2_task is not a valid tau2 Task: "
                         f"{str(exc).splitlines()[0]}") from None


def instruction_of(task: Task) -> str:
    """What ends the agent's system prompt: `metadata.instruction` (evaluation's --preference: training's
    instruction without a problem line), else the question of a ToolScale task (`domain_dir`; its
    instruction: tools, prices, preference); a tau2-package task's question is a placeholder."""
    meta = task.metadata or {}
    return meta.get("instruction") or (task.question if meta.get("domain_dir") else "")


def run_tau2_episode(task: Task, policy, runtime, config: LoopConfig, counter: TokenCounter | None = None) -> Rollout:
    """One tau2 conversation of `task` (see the module docstring).  `metadata.call_expert: false`
    leaves call_expert out (a plain tau2 agent: run_tau2.py --mode none)."""
    if config.tau2_user == "solo":
        return run_solo_episode(task, policy, runtime, config, counter)
    if config.tau2_user != "simulator":
        raise ValueError(f"tau2_user {config.tau2_user!r}: choose one of {USER_MODES}")
    from orchestrator.episodes.tau2_agent import LLMCallUser, PolicyAgent  # lazy: pulls in tau2
    from tau2.orchestrator.orchestrator import Orchestrator  # lazy: optional (tau2 extra), heavy
    from tau2.registry import registry

    domain = tau2_domain_name(task)
    tau2_task = tau2_task_of(task)
    catalog = task_catalog(runtime.catalog, task)
    counter = counter or TokenCounter(getattr(getattr(policy, "engine", None), "tokenizer", None))
    rollout = Rollout(task_id=task.id, kind="tau2", stop_reason="max_turns")
    environment = registry.get_env_constructor(domain)()
    agent = PolicyAgent(environment.get_tools(), environment.get_policy(), policy=policy, runtime=runtime,
                        catalog=catalog, config=config, rollout=rollout, counter=counter,
                        instruction=instruction_of(task),
                        experts=(task.metadata or {}).get("call_expert", True))
    try:
        user_tools = environment.get_user_tools()
    except Exception:  # noqa: BLE001 - domains without user tools raise here (airline, retail)
        user_tools = None
    user_model = config.tau2_user_model or getattr(policy, "model", None)
    if not user_model:
        raise ValueError("tau2 episodes with a user simulator need LoopConfig.tau2_user_model "
                         "(the profile's tau2.<use>.user.model; run_tau2.py: --user-model)")
    user = LLMCallUser(tools=user_tools, instructions=str(tau2_task.user_scenario), llm=user_model,
                       llm_args={"temperature": config.tau2_user_temperature,
                                 "max_tokens": config.tau2_user_max_tokens}, catalog=runtime.catalog,
                       call=runtime.llm)
    try:
        simulation = Orchestrator(domain=domain, agent=agent, user=user, environment=environment, task=tau2_task,
                                  max_steps=config.tau2_max_steps, max_errors=config.tau2_max_errors,
                                  seed=config.tau2_seed).run()
    except Exception as exc:  # noqa: BLE001 - the policy, the user or tau2 failed: the rollout is dropped
        if not rollout.stop_reason.startswith("error"):
            rollout.stop_reason = f"error: {type(exc).__name__}: {exc}"
        return rollout
    return _scored(rollout, simulation, tau2_task, domain, runtime)


def _scored(rollout: Rollout, simulation, tau2_task, domain: str, runtime) -> Rollout:
    """`rollout` with tau2's verdict on `simulation` (reward, termination, the last message, the
    simulation itself); an evaluator that cannot score drops the rollout (stop_reason "error: ...")."""
    from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # lazy: optional (tau2 extra), heavy

    simulation.trial = 0
    basis = {b.value for b in (tau2_task.evaluation_criteria.reward_basis if tau2_task.evaluation_criteria else [])}
    kind = EvaluationType.ALL_WITH_NL_ASSERTIONS if "NL_ASSERTION" in basis else EvaluationType.ALL
    try:
        simulation.reward_info = evaluate_simulation(simulation=simulation, task=tau2_task, domain=domain,
                                                     evaluation_type=kind, solo_mode=False)
    except Exception as exc:  # noqa: BLE001 - an evaluator that cannot score: the rollout is dropped
        rollout.stop_reason = f"error: evaluator: {type(exc).__name__}: {exc}"
        return rollout
    termination = simulation.termination_reason.value
    rollout.stop_reason = termination
    rollout.finished = termination in ("user_stop", "agent_stop")
    rollout.outcome = float(simulation.reward_info.reward)
    said = [m.content for m in simulation.messages if m.role == "assistant" and m.content]
    rollout.final_answer = said[-1] if said else None
    rollout.info = {"reward": rollout.outcome, "termination": termination, "evaluator": "tau2",
                    "user_cost": simulation.user_cost, "simulation": simulation.model_dump(mode="json")}
    if not rollout.finished and runtime.section("tau2").train_unfinished:
        rollout.info["train_unfinished"] = True
    return rollout
