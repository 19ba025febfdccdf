"""tau2-bench through the real `tau2` package: one simulation per task, its record, the
tau2-format results file, and re-scoring saved results files with tau2's evaluator.

A simulation is tau2's own `Orchestrator` (agent <-> user <-> environment) with our
`OrchestratorAgent` and `LLMCallUser`, scored by tau2's `evaluate_simulation` (DB replay,
actions, communicated info). pass^1 = mean task success, tau2's definition.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Before tau2 (and so litellm) is imported: litellm otherwise tries to download its price map at
# import, with retries and sleeps; tau2 logs its registry at DEBUG. We price with tools.json.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LOGURU_LEVEL", "ERROR")

from tau2.data_model.simulation import Results, RewardInfo, SimulationRun, TerminationReason
from tau2.data_model.tasks import Task as Tau2Task
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation
from tau2.metrics.agent_metrics import compute_metrics, is_successful
from tau2.orchestrator.orchestrator import Orchestrator
from tau2.registry import registry
from tau2.utils.utils import get_now

from evaluation.tau2_agent import EXPERT_TOOL, AgentConfig, LLMCallUser, OrchestratorAgent

DOMAINS = ("airline", "retail", "telecom")   # PAPER.md §8: 50 / 114 / 114 tasks (base split)
AGENT_NAME = "toolorchestra_orchestrator"
USER_NAME = "llm_call_user"


@dataclass
class Tau2Job:
    id: str            # "<domain>/<task id>": unique across domains
    domain: str
    task: Tau2Task


@dataclass
class Tau2Setup:
    agent: AgentConfig
    user_model: str
    user_temperature: float = 0.0
    max_steps: int = 200
    max_errors: int = 10
    seed: int = 300


def load_jobs(domains: list[str], task_ids: list[str] | None = None, limit: int | None = None) -> list[Tau2Job]:
    """tau2's base split of each domain (optionally only `task_ids`, first `limit` per domain)."""
    from tau2.run import get_tasks

    jobs = []
    for domain in domains:
        tasks = get_tasks(task_set_name=domain, task_split_name="base")
        if task_ids:
            missing = set(task_ids) - {t.id for t in tasks}
            tasks = [t for t in tasks if t.id in task_ids]
            if missing and not tasks:
                raise ValueError(f"--task-ids {sorted(missing)}: not in tau2's {domain} base split")
        jobs += [Tau2Job(f"{domain}/{t.id}", domain, t) for t in tasks[:limit]]
    return jobs


def _tool_mix(agent: OrchestratorAgent, sim: SimulationRun) -> tuple[dict[str, int], dict[str, int]]:
    """Calls per expert alias and per domain tool the agent emitted; calls per expert model."""
    calls, models = Counter(), Counter()
    for step in agent.steps:
        if step.tool == EXPERT_TOOL:
            calls[step.alias] += 1
            models[step.model] += 1
    for msg in sim.messages:
        if msg.role == "assistant" and getattr(msg, "tool_calls", None):
            calls.update(tc.name for tc in msg.tool_calls)
    return dict(calls), dict(models)


def simulate(setup: Tau2Setup, job: Tau2Job) -> dict[str, Any]:
    """Run one tau2 simulation and score it; return our results record (with tau2's dump)."""
    environment = registry.get_env_constructor(job.domain)()
    agent = OrchestratorAgent(environment.get_tools(), environment.get_policy(), setup.agent)
    try:
        user_tools = environment.get_user_tools()
    except Exception:  # domains without user tools raise here (airline, retail)
        user_tools = None
    user = LLMCallUser(tools=user_tools, instructions=str(job.task.user_scenario), llm=setup.user_model,
                       llm_args={"temperature": setup.user_temperature}, catalog=setup.agent.catalog)
    simulation = Orchestrator(domain=job.domain, agent=agent, user=user, environment=environment, task=job.task,
                              max_steps=setup.max_steps, max_errors=setup.max_errors, seed=setup.seed).run()
    simulation.trial = 0
    simulation.reward_info = evaluate_simulation(simulation=simulation, task=job.task, domain=job.domain,
                                                 evaluation_type=EvaluationType.ALL, solo_mode=False)
    reward = simulation.reward_info.reward
    calls, models = _tool_mix(agent, simulation)
    said = [m.content for m in simulation.messages if m.role == "assistant" and m.content]
    tokens = Counter()
    for step in agent.steps:
        tokens.update(step.tokens)
    return {"id": job.id, "status": "ok", "domain": job.domain, "task_id": job.task.id,
            "question": str(job.task.user_scenario),
            "reference": json.dumps([a.get_func_format() for a in (job.task.evaluation_criteria.actions or [])])
            if job.task.evaluation_criteria else None,
            "prediction": said[-1] if said else None, "reward": reward, "correct": is_successful(reward),
            "stop_reason": simulation.termination_reason.value, "cost": simulation.agent_cost or 0.0,
            "user_cost": simulation.user_cost, "latency": sum(s.latency for s in agent.steps),
            "tokens": {"prompt": tokens["prompt_tokens"], "completion": tokens["completion_tokens"]},
            "tool_calls": calls, "expert_models": models, "turns": [asdict(s) for s in agent.steps],
            "mode": setup.agent.mode, "model": setup.agent.price_model,
            "simulation": simulation.model_dump(mode="json")}


def _failed_simulation(record: dict, seed: int) -> SimulationRun:
    """tau2's own stand-in for a crashed run (skip_failed_samples): reward 0, skipped."""
    now = get_now()
    return SimulationRun(id=f"{record['id']}_failed", task_id=record["id"].split("/", 1)[1], start_time=now,
                         end_time=now, duration=float(record.get("wall_s") or 0.0),
                         termination_reason=TerminationReason.AGENT_ERROR, messages=[], trial=0, seed=seed,
                         reward_info=RewardInfo(reward=0.0, info={"note": record.get("error")}), skipped=True)


def write_tau2_results(out_dir: Path, records: list[dict], setup: Tau2Setup) -> list[Path]:
    """One tau2 `Results` file per domain (`tau2_<domain>.json`), from the run's records.

    Built from results.jsonl at the end of every (resumed) run, so it always matches it.
    Error records enter as tau2 does with skip_failed_samples: reward 0, `skipped`.
    """
    from tau2.run import get_info, get_tasks

    by_id = {r["id"]: r for r in records}
    paths = []
    for domain in sorted({r["id"].split("/", 1)[0] for r in by_id.values()}):
        recs = [r for r in by_id.values() if r["id"].startswith(domain + "/")]
        wanted = {r["id"].split("/", 1)[1] for r in recs}
        tasks = [t for t in get_tasks(task_set_name=domain, task_split_name="base") if t.id in wanted]
        sims = [SimulationRun.model_validate(r["simulation"]) if r.get("status") == "ok"
                else _failed_simulation(r, setup.seed) for r in recs]
        c = setup.agent
        info = get_info(domain=domain, agent=AGENT_NAME, user=USER_NAME, llm_agent=c.model,
                        llm_args_agent={"temperature": c.temperature, "mode": c.mode, "price_model": c.price_model,
                                        "profile": c.profile},
                        llm_user=setup.user_model, llm_args_user={"temperature": setup.user_temperature},
                        num_trials=1, max_steps=setup.max_steps, max_errors=setup.max_errors, seed=setup.seed)
        path = out_dir / f"tau2_{domain}.json"
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(Results(info=info, tasks=tasks, simulations=sims).model_dump_json(indent=2))
        os.replace(tmp, path)
        paths.append(path)
    return paths


def load_task_set(path: str | Path) -> list[Tau2Task]:
    """A tau2 tasks file (a JSON list of tasks, e.g. data/tau2/domains/retail/tasks.json of the tau2
    version a run used: 0.1.3's retail has 115 tasks, today's 114)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of tau2 tasks (a domain's tasks.json)")
    return [Tau2Task.model_validate(t) for t in data]


def _score(sim: SimulationRun, task: Tau2Task | None, domain: str, solo: bool) -> float:
    if task is None:
        return 0.0
    return evaluate_simulation(simulation=sim, task=task, domain=domain, evaluation_type=EvaluationType.ALL,
                               solo_mode=solo).reward


def rescore(path: str | Path, task_set: str | Path | None = None) -> dict[str, Any]:
    """Re-score a tau2 results file with tau2's evaluator, as labelled and as matched by content.

    Tasks: `task_set` (a tasks.json of the tau2 version the run used) if given, else the file's
    own tasks (the run's task set), else the installed tau2's.  "labelled" grades
    each simulation against the task its `task_id` names (0 when the set has no such task);
    "matched" against the task its content shows (evaluation/tau2_match.py), over matched
    simulations only.  `changed` lists labelled rewards that differ from the stored ones.
    """
    from tau2.scripts.evaluate_trajectories import is_solo_mode

    from evaluation.tau2_match import match_simulations

    results = Results.load(Path(path))
    domain = results.info.environment_info.domain_name
    if task_set is not None:
        tasks = {t.id: t for t in load_task_set(task_set)}
    elif results.tasks:
        tasks = {t.id: t for t in results.tasks}
    else:
        from tau2.run import get_tasks

        tasks = {t.id: t for t in get_tasks(task_set_name=domain)}
    solo = is_solo_mode(results)
    fresh = results.model_copy(deep=True)
    report = match_simulations(results.simulations, tasks)
    changed, labelled, matched, recovered = [], [], [], 0
    for sim, match in zip(fresh.simulations, report.matches):
        stored = sim.reward_info.reward if sim.reward_info else None
        reward = _score(sim, tasks.get(sim.task_id), domain, solo)
        labelled.append(reward)
        if stored is None or abs(stored - reward) > 1e-6:
            changed.append({"task_id": sim.task_id, "stored": stored, "rescored": reward})
        if match.task_id is not None:
            m_reward = reward if match.task_id == sim.task_id else _score(sim, tasks[match.task_id], domain, solo)
            matched.append(m_reward)
            recovered += stored is not None and abs(stored - m_reward) <= 1e-6
    stored_pass1 = (compute_metrics(results).pass_hat_ks.get(1)
                    if all(s.reward_info for s in results.simulations) else None)
    def success(rewards: list[float]) -> float | None:
        return sum(map(is_successful, rewards)) / len(rewards) if rewards else None

    return {"file": str(path), "domain": domain, "simulations": len(fresh.simulations), "tasks": len(tasks),
            "pass1": success(labelled), "stored_pass1": stored_pass1, "changed": changed,
            "matched_pass1": success(matched), "matched": len(matched), "unmatched": report.unmatched,
            "mislabelled": report.mislabelled, "match_how": report.counts(), "matched_reward_recovered": recovered,
            "relabelled": [{"label": m.label, "task_id": m.task_id, "how": m.how}
                           for m in report.matches if not m.label_ok]}
