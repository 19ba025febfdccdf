"""Scoring a step's rollouts: outcome (judge or environment) -> preference reward -> filters
-> group-relative advantages (PAPER.md §4), and the step's rollout metrics.

    scored = score_groups(tasks, groups, judge, ...)
    samples = build_turn_samples(scored.rollouts, scored.advantages)   # training.samples
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from evaluation.scoring.judge import Judge
from orchestrator.loop import Task
from orchestrator.records import Rollout
from training.filters import has_final_answer
from training.group_scores import score_group
from training.rewards import reward_inputs


# ---------------------------------------------------------------------------- rewards
@dataclass
class ScoredBatch:
    rollouts: list[Rollout]                 # trained on: finished, in a group with reward std >= min
    advantages: list[float]                 # one per kept rollout
    rewards: list[list[float]] = field(default_factory=list)   # per group, over all its rollouts
    groups_kept: int = 0


def score_groups(tasks: Sequence[Task], groups: Sequence[Sequence[Rollout]],
                 judge: Callable[[Task, Rollout], bool], *, estimator: str = "grpo",
                 min_group_std: float = 0.1, boost: float = 0.0) -> ScoredBatch:
    """Outcome of every rollout, then per group (`training.group_scores.score_group`):
    preference rewards, the reward-std filter and advantages over ALL G rollouts, unfinished
    ones at outcome 0 (reward 0), as PAPER.md §4 and upstream do; only then are the
    unfinished rollouts left out of training (upstream's `valid_answers`).  Sets
    `Rollout.outcome` (0 or 1) and `Rollout.reward` on every rollout.  `judge` decides QA
    outcomes (`judged`); `boost`: upstream's correct-sample advantage boost (0 = off)."""
    scored = ScoredBatch([], [])
    for task, group in zip(tasks, groups):
        for rollout in group:
            rollout.outcome = int(rollout.finished and bool(judged(task, rollout, judge)))
        if not group:
            scored.rewards.append([])
            continue
        score = score_group([reward_inputs(r) for r in group], task.preference, [has_final_answer(r) for r in group],
                            estimator=estimator, min_std=min_group_std, boost=boost)
        for rollout, reward in zip(group, score.rewards):
            rollout.reward = reward
        scored.rewards.append(score.rewards)
        scored.groups_kept += int(score.kept)
        for rollout, advantage, trained in zip(group, score.advantages, score.trained):
            if trained:
                scored.rollouts.append(rollout)
                scored.advantages.append(advantage)
    return scored


def judged(task: Task, rollout: Rollout, judge: Callable[[Task, Rollout], bool]) -> bool:
    """A finished rollout's outcome: the judge's verdict (QA), or the environment's, which the
    function-calling episode already stored (tau2's task reward, orchestrator/domains/outcome.py)."""
    if task.kind == "tau2":
        return rollout.outcome == 1
    return judge(task, rollout)


def make_judge(kind: str, model: str | None = None, style: str = "lenient",
               max_tokens: int = 2048) -> Callable[[Task, Rollout], bool]:
    """QA outcome through evaluation.scoring.judge: "exact" (upstream's rules), "contains" (+ the
    reference as a whole word of the answer), "llm" (+ `model` as judge via LLM_CALL)."""
    judge = Judge(model, style=style, max_tokens=max_tokens) if kind == "llm" else Judge(kind)
    return lambda task, r: judge(task.question, r.final_answer, task.answer or "").correct


# ---------------------------------------------------------------------------- metrics
def rollout_metrics(groups: Sequence[Sequence[Rollout]]) -> dict[str, float]:
    """Means over every rollout of the step (filters not applied); also per task kind
    (`rollout/accuracy_<kind>`, `rollout/finished_<kind>`, `reward/mean_<kind>`: the mean
    reward of all rollouts, unfinished ones at 0, as `reward/mean`)."""
    flat = [r for g in groups for r in g]
    n = max(1, len(flat))
    turns = [t for r in flat for t in r.turns]
    out = {
        "rollout/count": float(len(flat)),
        "rollout/accuracy": sum(r.outcome or 0 for r in flat) / n,
        "rollout/finished": sum(r.finished for r in flat) / n,
        "rollout/cost": sum(r.cost for r in flat) / n,
        "rollout/latency": sum(r.latency for r in flat) / n,
        "rollout/turns": len(turns) / n,
        "rollout/valid_turns": sum(t.valid for t in turns) / max(1, len(turns)),
        "rollout/response_tokens": sum(len(t.response_ids or []) for t in turns) / n,
        # tool calls of the step that failed (expert server, sandbox, retriever), retries spent
        "tools/errors": float(sum(t.expert is not None and t.expert.error is not None for t in turns)),
    }
    for r in flat:
        for alias, c in r.tool_calls.items():
            out[f"calls/{alias}"] = out.get(f"calls/{alias}", 0.0) + c / n
    for kind in sorted({r.kind for r in flat}):   # per task kind, e.g. a mixed QA + tau2 run
        of_kind = [r for r in flat if r.kind == kind]
        rewards = [r.reward for r in of_kind if r.reward is not None]
        out[f"rollout/accuracy_{kind}"] = sum(r.outcome or 0 for r in of_kind) / len(of_kind)
        out[f"rollout/finished_{kind}"] = sum(r.finished for r in of_kind) / len(of_kind)
        out[f"reward/mean_{kind}"] = sum(rewards) / max(1, len(rewards))
    return out
