"""The one builder: a profile's settings (orchestrator/settings.py) -> the runtime and loop settings
an episode runs with.  Training (training/setup.py), run_hle.py / run_frames.py, run_tau2.py and
the quickstarts all come through here, so one profile gives one behaviour wherever it is read.

    profile = load_profile("paper")
    runtime = build_runtime(profile, {"qa": profile.section("qa", "frames")}, catalog, retriever=client)
    config = loop_config(profile.section("qa", "frames"))
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.catalog import Catalog
from orchestrator.context import UPSTREAM_PROMPTS_DIR, Budgets, Prompts, TokenCounter
from orchestrator.episodes.base import LoopConfig
from orchestrator.runtime import ToolRuntime
from orchestrator.settings import OrchestratorSettings, Profile, QASettings, Tau2Settings


def load_prompts(settings: QASettings | Tau2Settings | None, folder: str | Path | None = None) -> Prompts:
    """The prompt files of a section's style: `ours` -> orchestrator/prompts/ (or `folder`);
    `upstream-<x>` -> orchestrator/prompts/upstream/<x>/ (or `folder`), assembled upstream's way."""
    style = getattr(settings, "prompts", "ours")
    if style == "ours":
        return Prompts.load(folder)
    return Prompts.load(folder or UPSTREAM_PROMPTS_DIR / style.removeprefix("upstream-"), style=style)


def build_runtime(profile: Profile | None, sections: dict[str, Any], catalog: Catalog, *,
                  retriever=None, prompts: Prompts | None = None, context_tokens: int | None = None,
                  override_model: str | None = None, serve: str | None = None, pricing: str | None = None,
                  llm=None, run_code=None,
                  counter: TokenCounter | None = None, cls: type[ToolRuntime] = ToolRuntime, **extra) -> ToolRuntime:
    """The runtime of a run that plays the episode kinds in `sections` (kind -> settings section).

    `serve` and `pricing` (default: the profile's) name the tools.json serving map and whose price
    its calls pay (orchestrator/settings.py PRICING); `prompts` default to the
    QA section's style; `context_tokens` (the orchestrator's context cap; default the section's)
    sizes the ours-style documents; `llm` / `run_code` replace the gateway and the sandbox (tests,
    memoised experts); `counter` cuts expert contexts in a tokenizer's tokens (default ~4 characters
    a token); `cls` and `extra` build a subclass (the quickstart's routed runtime)."""
    qa = sections.get("qa")
    if prompts is None:
        prompts = load_prompts(qa)
    orch = next((s.orchestrator for s in sections.values() if getattr(s, "orchestrator", None)), None)
    cap = context_tokens or (orch.context_tokens if orch else Budgets().context_tokens)
    fields: dict[str, Any] = {"catalog": catalog, "sections": dict(sections),
                              "serve": serve if serve is not None else (profile.serve if profile else None),
                              "retriever": retriever, "prompts": prompts, "budgets": Budgets(context_tokens=cap),
                              "override_model": override_model}
    if pricing or profile:
        fields["pricing"] = pricing or profile.pricing
    if llm is not None:
        fields["llm"] = llm
    if run_code is not None:
        fields["run_code"] = run_code
    if counter is not None:
        fields["counter"] = counter
    return cls(**fields, **extra)


def loop_config(settings: QASettings | Tau2Settings, orchestrator: OrchestratorSettings | None = None,
                **fields) -> LoopConfig:
    """The loop settings of a section: the orchestrator's turns (its `orchestrator`, or the one
    given: training's `rollout.*`) and, for tau2, the user simulator and steps.  `fields` set
    what only the caller knows (constrained decoding, the tau2 user mode)."""
    orch = orchestrator or settings.orchestrator
    if orch is None:
        raise ValueError("this settings section has no `orchestrator` (a `train` use): pass the training "
                         "config's rollout settings as `orchestrator`")
    values: dict[str, Any] = {"max_turns": orch.max_turns, "temperature": orch.temperature,
                              "max_tokens": orch.max_tokens, "budgets": Budgets(context_tokens=orch.context_tokens)}
    if isinstance(settings, Tau2Settings):
        values.update(tau2_user_model=settings.user.model, tau2_user_temperature=settings.user.temperature,
                      tau2_user_max_tokens=settings.user.max_tokens, tau2_max_steps=settings.max_steps,
                      tau2_max_errors=settings.max_errors, tau2_seed=settings.seed)
    values.update(fields)
    return LoopConfig(**values)
