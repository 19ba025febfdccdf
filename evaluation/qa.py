"""Solving one HLE/FRAMES question in one of the paper's three settings, and its record.

Modes (PAPER.md §9, Table 1):
- "all":   the full tool set of tools.json; aliases served per `--profile`, priced as the
           alias's model;
- "basic": the same tools, but every alias is the orchestrator model itself (served by
           it and priced as it);
- "none":  no tools: the orchestrator model answers directly with one call.

The record keeps what a researcher needs to audit a run: prediction and verdict (rule +
judge's raw reply), every turn's call, expert, tokens, dollars, seconds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from evaluation.runner import TaskFailed
from evaluation.scoring.judge import Judge
from orchestrator.catalog import Catalog
from orchestrator.context import Prompts
from orchestrator.extract import extract_answer
from orchestrator.gateway import get_llm_response
from orchestrator.benchmarks import BenchmarkTask
from orchestrator.loop import LoopConfig, Task, run_episode
from orchestrator.records import Rollout, Turn, Usage
from orchestrator.runtime import ToolRuntime

MODES = ("all", "basic", "none")


@dataclass
class QASetup:
    """What every task of a run shares.  `model` is the served orchestrator, `price_model`
    its row in tools.json's price table."""

    mode: str
    model: str
    price_model: str
    catalog: Catalog
    runtime: ToolRuntime | None       # None in "none" mode
    policy: Any                       # orchestrator.policy.ChatPolicy / TokenPolicy
    loop: LoopConfig
    judge: Judge
    prompts: Prompts
    llm: Callable[..., Any] | None = None   # "none" mode's call (default LLM_CALL)
    preference: Any = None                  # evaluation.preference.StatedPreference (--preference), or None
    direct_max_tokens: int = 2048


def basic_tools(catalog: Catalog, price_model: str) -> dict[str, dict[str, str]]:
    """Task.tools for "basic tools": every QA alias -> the orchestrator's own model."""
    return {t.name: {alias: price_model for alias in t.aliases}
            for t in catalog.tools if t.kind in ("search", "code", "answer")}


def _usage_dict(usage: Usage) -> dict[str, int]:
    return {"prompt": usage.prompt_tokens, "completion": usage.completion_tokens}


def turn_record(turn: Turn) -> dict[str, Any]:
    """One turn as the viewer and report read it (token ids are left out: not needed here)."""
    expert = turn.expert
    usage = turn.policy_usage + (expert.usage if expert else Usage())
    return {
        "index": turn.index,
        "reasoning": turn.response_text,
        "tool": turn.tool_call.name if turn.tool_call else None,
        "alias": expert.alias if expert else (turn.tool_call.arguments.get("model") if turn.tool_call else None),
        "model": expert.model if expert else None,
        "valid": turn.valid,
        "invalid_reason": turn.invalid_reason,
        "output": expert.output if expert else None,
        "error": expert.error if expert else None,
        "tokens": _usage_dict(usage),
        "policy_tokens": _usage_dict(turn.policy_usage),
        "cost": turn.policy_cost + (expert.cost if expert else 0.0),
        "latency": expert.latency if expert else 0.0,
        "policy_latency": turn.policy_latency,
    }


def rollout_record(rollout: Rollout) -> dict[str, Any]:
    """The money/time/tool fields of a record, from a rollout."""
    usage = Usage()
    models: dict[str, int] = {}
    answered = [t.expert for t in rollout.turns if t.expert is not None and t.expert.reply is not None]
    for turn in rollout.turns:
        usage = usage + turn.policy_usage
        if turn.expert is not None:
            usage = usage + turn.expert.usage
            models[turn.expert.model] = models.get(turn.expert.model, 0) + 1
    return {"prediction": rollout.final_answer, "response": answered[-1].reply if rollout.finished and answered else None,
            "finished": rollout.finished, "stop_reason": rollout.stop_reason,
            "cost": rollout.cost, "latency": rollout.latency, "tokens": _usage_dict(usage),
            "tool_calls": rollout.tool_calls, "expert_models": models,
            "turns": [turn_record(t) for t in rollout.turns]}


def _solve_direct(setup: QASetup, task: BenchmarkTask) -> dict[str, Any]:
    llm = setup.llm or get_llm_response
    prompt = setup.prompts.render("expert_direct", question=task.question)
    reply = llm(setup.model, [{"role": "user", "content": prompt}], temperature=setup.loop.temperature,
                max_tokens=setup.direct_max_tokens, price_model=setup.price_model, catalog=setup.catalog)
    cost = setup.catalog.llm_cost(setup.price_model, reply.usage)
    # With no tools the model's own call is the work, so its seconds are the latency.
    turn = {"index": 0, "reasoning": reply.text, "tool": None, "alias": None, "model": setup.price_model,
            "valid": True, "invalid_reason": None, "output": None, "error": None,
            "tokens": _usage_dict(reply.usage), "cost": cost, "latency": reply.latency}
    return {"prediction": extract_answer(reply.text), "response": reply.text, "finished": True, "stop_reason": "direct",
            "cost": cost, "latency": reply.latency, "tokens": _usage_dict(reply.usage),
            "tool_calls": {}, "expert_models": {}, "turns": [turn]}


def _partial(setup: QASetup, task: BenchmarkTask, record: dict[str, Any]) -> dict[str, Any]:
    return {"question": task.question, "reference": task.answer, **record, "mode": setup.mode,
            "model": setup.price_model, "meta": task.meta}


def play(setup: QASetup, task: BenchmarkTask) -> Rollout:
    """The orchestration loop on one task ("all" / "basic" mode), as evaluation runs it and the
    server (orchestrator/serve/) serves it."""
    tools = basic_tools(setup.catalog, setup.price_model) if setup.mode == "basic" else None
    metadata = {**task.meta, "files": task.files} if task.files else task.meta
    # --preference: the orchestrator reads the problem as training states it (evaluation/preference.py)
    question = setup.preference.instruction(task.question) if setup.preference else task.question
    return run_episode(Task(task.id, question, task.answer, tools=tools, metadata=metadata),
                       setup.policy, setup.runtime, setup.loop)


def solve(setup: QASetup, task: BenchmarkTask) -> dict[str, Any]:
    """Run one task and judge it; raises (-> an error record) when the policy or judge fails."""
    started = time.perf_counter()
    if setup.mode == "none":
        record = _solve_direct(setup, task)
    else:
        rollout = play(setup, task)
        record = rollout_record(rollout)
        if rollout.stop_reason.startswith("error"):
            raise TaskFailed(f"{rollout.stop_reason} (after {len(rollout.turns)} turns)", _partial(setup, task, record))
    episode_s = time.perf_counter() - started
    try:
        # the hle judge reads the whole answer text (HLE's [response]), the others the prediction
        verdict = setup.judge(task.question, record["prediction"], task.answer, response=record.get("response"))
    except Exception as exc:   # the episode's spending stays on the error record
        raise TaskFailed(f"judge: {type(exc).__name__}: {exc}", _partial(setup, task, record)) from exc
    out = {"id": task.id, "status": "ok", "question": task.question, "reference": task.answer,
           **record, "correct": verdict.correct, "verdict": verdict.to_dict(),
           "mode": setup.mode, "model": setup.price_model, "meta": task.meta,
           "wall_s": round(episode_s, 3)}
    if verdict.correct is None and verdict.rule != "no_reference":   # unreadable: a judge error, not a wrong answer
        out.update(status="error", error=f"JudgeError: judge {verdict.judge_model!r} gave no readable verdict: "
                                         f"{(verdict.raw or '')[:200]!r}")
    return out
