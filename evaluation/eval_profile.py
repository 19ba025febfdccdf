"""Evaluation settings selected by --profile (configs/eval_profiles.yaml): budgets, prompts,
top-k, judge and how each expert is called.  The `paper` profile holds upstream's values.

    settings = load_eval_profile("paper", benchmark="hle")
    settings.orchestrator.max_tokens      # 12000
    settings.expert("Qwen2.5-Math-7B-Instruct").context_tokens   # 2000
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.runtime import ExpertSettings

DEFAULT_PROFILES = Path(__file__).resolve().parents[1] / "configs" / "eval_profiles.yaml"


class EvalProfileError(ValueError):
    """A problem in the profiles file, as one line: file, key, problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OrchestratorSettings(_Strict):
    max_tokens: int = Field(ge=1)
    max_turns: int = Field(ge=1)
    temperature: float = Field(ge=0)


class JudgeSettings(_Strict):
    model: str | None = None
    prompt: Literal["lenient", "upstream"] = "lenient"
    max_tokens: int = Field(2048, ge=1)


class EvalSettings(_Strict):
    orchestrator: OrchestratorSettings
    prompts: Literal["ours", "upstream"] = "ours"
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    topk: dict[str, int] = Field(default_factory=dict)
    send_eid: bool = False
    search_fee: Literal["web", "tokens", "none"] = "none"
    experts: dict[str, ExpertSettings] = Field(default_factory=dict)
    overrides: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def expert(self, model: str) -> ExpertSettings:
        return self.experts.get(model) or self.experts.get("default") or ExpertSettings()


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_eval_profile(profile: str | None, benchmark: str, path: str | Path | None = None) -> EvalSettings:
    """The settings of `profile` (its section, else `default`) with `overrides.<benchmark>` merged in."""
    path = Path(path) if path else DEFAULT_PROFILES
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise EvalProfileError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise EvalProfileError(f"{path}: invalid YAML: {exc}") from None
    name = profile if profile in data else "default"
    if name not in data:
        raise EvalProfileError(f"{path}: no section {profile!r} and no 'default' section")
    section = data[name]
    if not isinstance(section, dict):
        raise EvalProfileError(f"{path}: {name}: expected a mapping")
    merged = _merge(section, (section.get("overrides") or {}).get(benchmark, {}))
    # A per-model expert entry may give only some fields: fill the rest from the profile's `default`.
    experts = merged.get("experts") or {}
    base = experts.get("default", {})
    merged["experts"] = {k: (v if k == "default" else _merge(base, v or {})) for k, v in experts.items()}
    try:
        return EvalSettings.model_validate(merged)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise EvalProfileError(f"{path}: {name}.{loc}: {err['msg']}") from None
