"""A run's settings: one typed profile, loaded from one YAML file, read by training and evaluation.

    profile = load_profile("paper")                  # configs/profiles/paper.yaml
    hle = profile.section("qa", "hle")               # QASettings: orchestrator, experts, judge, retrieval ...
    train = profile.section("qa", "train")           # upstream's *training* values, which differ
    tau2 = profile.section("tau2", "eval")           # Tau2Settings: plus agent text, user simulator, steps

A profile file has one section per episode kind (`qa`, `tau2`: the kinds registered in
`EPISODE_SETTINGS`), and under each kind one entry per use (`hle`, `frames`, `gaia`, `train`;
`eval`, `train`).  `defaults` under a kind is merged under each of its uses; `extends: NAME`
at the top merges the whole file over another profile.  Within `experts`, each model's entry
is merged over `experts.default`.  `serve` names the tools.json serving map (which model
answers for each alias's model: `local` = the embedded SmolLM2; null = each model itself), and
`pricing` says at whose price its expert calls are charged (PRICING).

Training (training/train.py `tools.profile`) and evaluation (`--profile`) take these objects
unchanged and turn them into a runtime with orchestrator/setup.py, the one builder.
"""
from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

PROFILES_DIR = Path(__file__).resolve().parents[1] / "configs" / "profiles"


# How expert calls under a serving map are charged (a profile's `pricing`):
#   as_alias  - at the alias's model's price (tools.json `prices`): a stand-in such as the `local`
#               SmolLM2 reports what the paper's tools would cost;
#   as_served - at the served model's own price (the `open` profile's gpt-oss-120b for GPT-5): what
#               the run really spends; every served model then needs a price row.
Pricing = Literal["as_alias", "as_served"]
PRICING: tuple[str, ...] = get_args(Pricing)


class ProfileError(ValueError):
    """A problem in a profile file, as one line: file, key, problem."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ExpertSettings(_Strict):
    """How one expert is called.  Units: tokens, characters."""

    max_tokens: int = Field(2048, ge=1, description="completion tokens per call")
    temperature: float = Field(0.0, ge=0)
    context_tokens: int = Field(24000, ge=1, description="documents + code results in the expert's prompt")
    code_tokens: int = Field(24000, ge=1, description="of which code blocks and outputs at most")
    doc_chars: int | None = Field(None, ge=1, description="each document cut to this many characters")
    answer_format: Literal["tags", "tags_brief", "boxed", "boxed_steps", "auto"] = "auto"   # boxed_steps: \boxed{} asked
                                        # in the user message, no system prompt (upstream training)
    context_minus_question: bool = True     # upstream style: the question's tokens come off context_tokens
    extra_body: dict[str, Any] = Field(default_factory=dict)


def find_expert(experts: dict[str, ExpertSettings], model: str, tool: str | None = None) -> ExpertSettings:
    """`experts["<tool>:<model>"]` (one tool's call of that model), else `experts[model]`, else
    `experts["default"]`, else the built-in defaults."""
    return ((tool and experts.get(f"{tool}:{model}")) or experts.get(model) or experts.get("default")
            or ExpertSettings())


class OrchestratorSettings(_Strict):
    max_tokens: int = Field(1024, ge=1, description="completion tokens per orchestrator turn")
    max_turns: int = Field(50, ge=1)
    temperature: float = Field(0.6, ge=0)
    context_tokens: int = Field(24000, ge=1, description="the orchestrator's prompt cap (ours style; tail kept)")


class JudgeSettings(_Strict):
    model: str | None = None            # None: the orchestrator's model; exact | contains | gaia: rules only
                                        # (evaluation/scoring/judge.py RULE_JUDGES; gaia: GAIA's leaderboard scorer)
    prompt: Literal["lenient", "upstream", "upstream-train", "hle"] = "lenient"   # hle: HLE's official judge
    max_tokens: int = Field(2048, ge=1)


class RetrievalSettings(_Strict):
    topk: int = Field(3, ge=1, description="documents per search")
    send_eid: bool = False              # the task id as `eid` (per-question document pools; HLE)
    min_score: float | None = None      # server-side filters (retrieval/server.py), upstream's HLE/training values
    min_length: int | None = Field(None, ge=0)


class SearchSettings(_Strict):
    """How a search call turns into documents in the episode (orchestrator/runtime.py `_search`)."""

    doc_order: Literal["rank", "reverse"] = "rank"      # reverse: upstream adds each search's hits last-rank first
    dedupe: Literal["id", "content"] = "id"             # upstream compares contents
    merge: Literal["append", "interleave"] = "append"   # interleave: upstream training's merge_documents
    query: Literal["ours", "upstream"] = "ours"         # ours: <query> stripped, else the question;
                                                        # upstream: split on the tags, the whole reply without them
    min_query_chars: int = Field(0, ge=0)               # a query shorter than this: no search (upstream 5, FRAMES 10)
    single_search: bool = False                         # FRAMES: the search tool is no longer offered once
                                                        # documents exist (a call to it is still carried out)


class CodeSettings(_Strict):
    timeout: float = Field(60.0, gt=0, description="sandbox wall-clock seconds")
    extraction: Literal["ours", "upstream", "none"] = "ours"   # ours: the first ```python block, stripped;
                                                        # upstream: after the last ```python up to the next ```;
                                                        # none: the expert is asked (and paid), no code runs
                                                        # (upstream's FRAMES: eval_frames.py:202-206)
    output: Literal["full", "stdout"] = "full"          # full: stdout + exit code and stderr; stdout: upstream's
    keep_empty: bool = True                             # upstream keeps a code block only when it printed something


class CostSettings(_Strict):
    search_fee: Literal["web", "tokens", "none"] = "none"
    code_fee: Literal["seconds", "none"] = "seconds"


class QASettings(_Strict):
    """A QA episode (HLE, FRAMES, training's QA tasks)."""

    # None in `train` uses: training's orchestrator turns are the training config's `rollout.*`
    orchestrator: OrchestratorSettings | None = Field(default_factory=OrchestratorSettings)
    prompts: Literal["ours", "upstream-hle", "upstream-frames", "upstream-train"] = "ours"
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    judges: dict[str, JudgeSettings] = Field(default_factory=dict)   # named judges `--judge NAME` puts in
                                                        # `judge`'s place (e.g. hle: HLE's official o3-mini judge)
    retrieval: RetrievalSettings = Field(default_factory=RetrievalSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    code: CodeSettings = Field(default_factory=CodeSettings)
    costs: CostSettings = Field(default_factory=CostSettings)
    # by "<tool>:<model>", by model, "default" for the rest
    experts: dict[str, ExpertSettings] = Field(default_factory=dict)

    def expert(self, model: str, tool: str | None = None) -> ExpertSettings:
        return find_expert(self.experts, model, tool)


class UserSettings(_Strict):
    model: str | None = None            # the user simulator (configs/models.yaml name); None: the orchestrator's
    max_tokens: int = Field(512, ge=1)
    temperature: float = Field(0.0, ge=0)


class Tau2Settings(_Strict):
    """A tau2 conversation: the agent (orchestrator), `call_expert`'s experts, the user simulator."""

    orchestrator: OrchestratorSettings | None = Field(default_factory=lambda: OrchestratorSettings(temperature=0.0))
    experts: dict[str, ExpertSettings] = Field(default_factory=dict)
    user: UserSettings = Field(default_factory=UserSettings)
    max_steps: int = Field(200, ge=1, description="tau2 max_steps: every message counts")
    max_errors: int = Field(10, ge=1)
    seed: int = 300
    expert_text: Literal["ours", "upstream", "upstream-train"] = "ours"   # call_expert's description and format
                                                        # line: ours | upstream's evaluation copy of llm_utils.py |
                                                        # its training copy (episodes/tau2_common.py)
    expert_suffix: dict[str, str] = Field(default_factory=dict)   # model -> appended to the last message it reads
    max_tool_calls: int = Field(1, ge=1)                # tool calls kept from one agent message (upstream 6)
    context: Literal["per_output", "cut_middle_turns"] = "per_output"
    train_unfinished: bool = False                      # train the turns of conversations that hit max_steps
    rewrite_models: list[str] | None = None             # the agent models (substrings of the name, any case) whose
                                                        # system prompt gets the call-expert policy and the format
                                                        # line; None: every model.  Upstream: qwen, train,
                                                        # huggingface (tu:380); others keep tau2's own prompt
    agent_chat_experts: list[str] = Field(default_factory=list)   # expert models (name substrings, any case) that
                                                        # read the agent's own chat, cut, instead of tau2's prompt
                                                        # and the plain conversation (upstream: qwen3, tu:501-504)

    def expert(self, model: str, tool: str | None = None) -> ExpertSettings:
        return find_expert(self.experts, model, tool)


# Episode kinds and the settings section each reads (orchestrator/loop.py registers how each runs).
EPISODE_SETTINGS: dict[str, type[_Strict]] = {"qa": QASettings, "tau2": Tau2Settings}


class Profile(_Strict):
    name: str
    source: str
    serve: str | None = None            # tools.json `profiles` map: which model answers for each alias model
    pricing: Pricing = "as_alias"   # whose price the serving map's calls pay (PRICING)
    sections: dict[str, dict[str, Any]] = Field(default_factory=dict)   # kind -> use -> settings

    def section(self, kind: str, use: str):
        if kind not in EPISODE_SETTINGS:
            raise ProfileError(f"{self.source}: unknown episode kind {kind!r}; known: {sorted(EPISODE_SETTINGS)}")
        uses = self.sections.get(kind, {})
        if use not in uses:
            raise ProfileError(f"{self.source}: no {kind}.{use} section; this profile has "
                               f"{[f'{kind}.{u}' for u in uses] or 'none'} (add it, or `extends:` a profile that has it)")
        return uses[use]

    def has(self, kind: str, use: str) -> bool:
        return use in self.sections.get(kind, {})


def merge(base: dict, over: dict) -> dict:
    """`over` merged into `base`, mappings key by key (a new dict; neither is changed)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def profile_path(name: str | Path) -> Path:
    """A profile name (configs/profiles/NAME.yaml) or a path to a YAML file."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml") or path.exists():
        return path
    return PROFILES_DIR / f"{name}.yaml"


def available() -> list[str]:
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _read(path: Path, chain: tuple[Path, ...] = ()) -> dict:
    if not path.exists():
        close = difflib.get_close_matches(path.stem, available(), n=1) if path.parent == PROFILES_DIR else []
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ProfileError(f"profile {path}: no such file; {hint}the shipped profiles are {available()} "
                           f"(configs/profiles/), or give a path to a YAML file")
    if path.resolve() in chain:
        raise ProfileError(f"{path}: `extends` loops back to itself ({' -> '.join(str(p) for p in chain)})")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top")
    parent = data.pop("extends", None)
    if parent is None:
        return data
    base = _read(profile_path(parent) if not str(parent).endswith((".yaml", ".yml")) else path.parent / parent,
                 chain + (path.resolve(),))
    return merge(base, data)


def _fill_experts(section: dict) -> dict:
    experts = section.get("experts") or {}
    if not isinstance(experts, dict):
        return section
    base = experts.get("default") or {}

    def full(key: str, value) -> dict:   # "<tool>:<model>" over "<model>" over "default"
        model = key.split(":", 1)[1] if ":" in key else None
        under = merge(base, experts.get(model) or {}) if model else base
        return merge(under, value or {})

    filled = {k: (v if k == "default" else full(k, v)) for k, v in experts.items()}
    return {**section, "experts": filled}


def load_profile(name: str | Path) -> Profile:
    """Read, merge (`extends`, per-kind `defaults`, `experts.default`) and validate a profile."""
    path = profile_path(name)
    data = _read(path)
    known = {"serve", "pricing", *EPISODE_SETTINGS}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ProfileError(f"{path}: unknown top-level key(s) {unknown}; expected {sorted(known)} and `extends`")
    sections: dict[str, dict[str, Any]] = {}
    for kind, cls in EPISODE_SETTINGS.items():
        uses = data.get(kind) or {}
        if not isinstance(uses, dict):
            raise ProfileError(f"{path}: {kind}: expected a mapping of uses (e.g. hle, frames, train)")
        defaults = uses.get("defaults") or {}
        for use, raw in uses.items():
            if use == "defaults":
                continue
            merged = _fill_experts(merge(defaults, raw or {}))
            try:
                sections.setdefault(kind, {})[use] = cls.model_validate(merged)
            except ValidationError as exc:
                err = exc.errors()[0]
                loc = ".".join(str(p) for p in err["loc"])
                raise ProfileError(f"{path}: {kind}.{use}.{loc}: {err['msg']}") from None
    serve = data.get("serve")
    if serve is not None and not isinstance(serve, str):
        raise ProfileError(f"{path}: serve: expected the name of a tools.json `profiles` entry or null")
    pricing = data.get("pricing", "as_alias")
    if pricing not in PRICING:
        raise ProfileError(f"{path}: pricing: {pricing!r} is not one of {list(PRICING)} (as_alias: expert calls "
                           f"charged at the alias model's price; as_served: at the served model's own price)")
    return Profile(name=path.stem, source=str(path), serve=serve, pricing=pricing, sections=sections)
