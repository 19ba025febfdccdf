"""Typed training configuration: dataclasses that mirror the YAML one to one.

    cfg = load_config("training/configs/quickstart.yaml", ["optim.lr=1e-4", "run.seed=3"])

Every YAML section is one dataclass below and every key one field, so the file and
this module read side by side.  Unknown keys, wrong types and bad values are
`ConfigError`s naming the key (`optim.lr: expected a number, got 'fast'`).  Overrides
`a.b=c` parse `c` as YAML (so `1e-4`, `true`, `[1, 2]`, `null` work) and go through the
same type check.  `save_config` writes the resolved config next to a run's outputs.
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from orchestrator.engines.common import STATIC_MEMORY_FRACTION, check_memory_fraction
from orchestrator.toolcall import ARG_MAX_CHARS
from training.distributed.config import DistributedConfig, DistributedConfigError, validate_distributed


_FLOAT_RE = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")


class ConfigError(ValueError):
    """A config file or override that does not fit the schema; the message names the key."""


# settings that live in the profile (`tools.profile`, configs/profiles/), not in a training config
IN_PROFILE = {"tools.topk": "qa.train.retrieval.topk", "tools.expert_max_tokens": "qa.train.experts.default.max_tokens",
              "tools.search_fee": "qa.train.costs.search_fee", "tools.code_fee": "qa.train.costs.code_fee",
              "tools.code_timeout": "qa.train.code.timeout", "rollout.tau2_user_model": "tau2.train.user.model",
              "rollout.tau2_user_max_tokens": "tau2.train.user.max_tokens",
              "rollout.tau2_max_steps": "tau2.train.max_steps", "reward.judge_model": "qa.train.judge.model"}


def _in_profile(key: str) -> str:
    if key not in IN_PROFILE:
        return ""
    return (f" ({key} is a profile setting: write {IN_PROFILE[key]} in the profile `tools.profile` names, "
            f"configs/profiles/*.yaml or a YAML file of your own that `extends:` one)")


@dataclass
class RunConfig:
    name: str = "run"
    dir: str = "runs/train"             # outputs: config, metrics, checkpoints, wandb
    seed: int = 0
    resume: str = "auto"                # "auto" (latest checkpoint in dir/checkpoints, if any) | "never" | a path
    device: str = "cpu"                 # "cpu" | "cuda" | "cuda:1" ...
    threads: int = 0                    # torch CPU threads; 0 = torch's default
    compile_cache: str | None = None    # folder for torch.compile's Inductor/Triton caches (shared storage on a
                                        # cluster: later jobs and restarts start warm); None: torch's default
                                        # (training/compile_cache.py)
    compile_artifacts: str | None = None  # one file of compiled kernels (torch.compiler's portable cache): loaded
                                        # at start when present, else written after the first step


@dataclass
class ModelConfig:
    path: str = ""                      # HF folder of the policy to train
    reference: str = "same"             # frozen KL reference: "same" (= the initial policy) or a folder
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    price_model: str | None = None      # the orchestrator's own tokens are priced as this model (None:
                                        # tools.json's orchestrator_price_model)
    gradient_checkpointing: bool = False
    compile_update: bool = True         # CUDA: the training passes' decoder layers through torch.compile
                                        # (training/logprobs.py); false: eager (off anyway with checkpointing)


@dataclass
class EngineConfig:
    kind: Literal["hf", "vllm"] = "hf"
    max_batch: int = 32                 # rows per batched forward (BatchingEngine)
    linger_ms: float = 250.0            # BatchingEngine: while episodes are away in tool calls, how long a
                                        # short batch may wait for them (at most the last engine call's
                                        # time); 0: never (docs/engines.md, docs/benchmarks.md)
    share_weights: bool = True          # hf only: the engine uses the trained model object itself
    static_memory_fraction: float = STATIC_MEMORY_FRACTION   # hf only: most of the free GPU memory one batch
                                        # shape's static KV cache may take, (0, 1]; more: the slow loop (warned)
    compile: Literal["regional", "whole", "none"] = "regional"   # hf on CUDA: the static decoder's torch.compile:
                                        # regional = the decoder layer compiled once for all layers and shapes;
                                        # whole = the whole forward as one graph (~3x the cold compile); none = eager

    def hf_kwargs(self) -> dict[str, Any]:
        """The HFEngine arguments these settings give (none for another kind)."""
        return ({"static_memory_fraction": self.static_memory_fraction, "static_compile": self.compile}
                if self.kind == "hf" else {})


@dataclass
class DataConfig:
    train_files: list[str] = field(default_factory=list)   # JSONL / parquet task files (HF datasets)
    shuffle: bool = True
    default_preference: dict[str, float] = field(default_factory=lambda: {"outcome": 1.0})


@dataclass
class RolloutConfig:
    tasks_per_step: int = 16            # paper: 16 tasks x 8 rollouts per step
    rollouts_per_task: int = 8
    max_turns: int = 30                 # paper: 30 in training
    temperature: float = 1.0
    max_tokens: int = 8768              # per orchestrator turn (paper: max response 8,768)
    context_tokens: int = 24000         # paper: ~24k prompt cap
    prompt_truncation: Literal["none", "middle"] = "none"   # a templated prompt over context_tokens: sent whole
                                        # (none) or its middle cut out (middle: first half + last half, as upstream)
    constrained: bool = False           # constrained decoding: every turn is a valid call
    max_string_chars: int = ARG_MAX_CHARS   # constrained function calls (tau2): longest string argument
    concurrency: int = 64               # episodes in flight (threads); tool calls overlap
    tau2_user: Literal["simulator", "solo"] = "simulator"   # tau2 tasks: tau2's user simulator (upstream) | no user


@dataclass
class ToolsConfig:
    catalog: str | None = None          # tools.json; None = the repository's
    profile: str = "default"            # the settings profile (configs/profiles/NAME.yaml or a path): its
                                        # qa.train / tau2.train sections give experts, judge, retrieval, costs
    serve: str | None = None            # tools.json serving map; null: the profile's `serve`
    prompts: str | None = None          # prompt folder overriding orchestrator/prompts
    index: str | None = None            # local retrieval index folder (RetrievalClient.in_process)
    retrieval_url: str | None = None    # or a running /retrieve service
    memoize_experts: bool = False       # cache expert replies by (served model, prompt): greedy experts only
    max_consecutive_failures: int = 16  # this many expert calls failing in a row stop the run, exit 1, naming the
                                        # endpoint and error (0: no limit; a step whose calls all failed stops it anyway)
    preflight_timeout: float = 30.0     # seconds for the one tiny real request (max_tokens 1) sent to each expert
                                        # before start-up; a 5xx, non-JSON or no reply stops it (0: TCP check only)


@dataclass
class RewardConfig:
    judge: Literal["exact", "contains", "llm"] = "exact"   # QA outcome: rules only, +whole-word match, +LLM judge


@dataclass
class AlgorithmConfig:
    advantage: str = "grpo"             # training.algorithms registry name
    min_group_std: float = 0.1          # drop groups with reward std below this
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip: float = 10.0
    kl_coef: float = 1e-4
    kl_type: str = "mse"
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 16       # per-turn samples per optimizer step (upstream: 16); 0 = one step per epoch
    micro_batch_size: int = 8           # samples per forward/backward (gradient accumulation)
    old_logprobs: Literal["recompute", "engine"] = "recompute"
    correct_sample_boost: float = 0.0   # upstream-only: + this to the advantage where the advantage >= 1 (upstream: 0.1)
    max_staleness: int = 0              # 0: synchronous (rollouts, then update); s > 0: step k's rollouts are made
                                        # while earlier updates run, by weights at most s versions old (docs/training.md)
    behav_weight_cap: float = 5.0       # max_staleness > 0: tokens with pi_prox / pi_behav above this leave the loss
    async_order: Literal["batch", "completion"] = "batch"   # max_staleness > 0: step k trains batch k ("batch"),
                                        # or the oldest groups done, whatever their batch (AReaL's queue: "completion")


@dataclass
class OptimConfig:
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    grad_clip: float = 1.0
    scheduler: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0


@dataclass
class TrainerConfig:
    total_steps: int = 0                # 0 = epochs x steps per epoch
    epochs: int = 10
    save_every: int = 10                # checkpoint every N steps (and at the end, and on SIGTERM)
    keep_checkpoints: int = 2


@dataclass
class LoggingConfig:
    wandb: Literal["offline", "online", "disabled"] = "offline"
    project: str = "toolorchestra"
    console: bool = True                # rich table + progress
    rollouts_every: int = 0             # write every rollout of every Nth step to rollouts.jsonl (0: never)


@dataclass
class TrainConfig:
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    tools: ToolsConfig = field(default_factory=ToolsConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)  # backend: none | ray


# ---------------------------------------------------------------------------- loading
def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> TrainConfig:
    """Read a YAML file (None: all defaults), apply `a.b=c` overrides, check every value."""
    data: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping of sections, got {type(data).__name__}")
        try:
            _check_keys(TrainConfig, data, "")      # a misspelt key in the file: name the file
        except ConfigError as exc:
            raise ConfigError(f"{path}: {exc}") from None
    for item in overrides:
        apply_override(data, item)
    cfg = from_dict(TrainConfig, data, "")
    validate(cfg)
    return cfg


def apply_override(data: dict[str, Any], item: str) -> None:
    """Set `a.b=c` in the nested dict `data` (the value parsed as YAML)."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {item!r}: expected key=value, e.g. optim.lr=1e-5")
    parts = key.strip().split(".")
    _field_type(TrainConfig, parts, key.strip())   # unknown keys fail here, before parsing
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override {item!r}: {part} is not a section")
    node[parts[-1]] = value


def _field_type(cls, parts: list[str], key: str):
    """The annotated type at dotted `parts` under dataclass `cls`; ConfigError if unknown."""
    tp: Any = cls
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(tp):
            if typing.get_origin(tp) is dict:      # free-form mapping (e.g. a preference)
                return typing.get_args(tp)[1]
            raise ConfigError(f"{key}: {'.'.join(parts[:i])} is a value, not a section")
        hints = typing.get_type_hints(tp)
        if part not in hints:
            where = ".".join(parts[:i]) or "the top level"
            raise ConfigError(f"{key}: unknown key {part!r} in {where}; known: {sorted(hints)}{_in_profile(key)}")
        tp = hints[part]
    return tp


def _reject_unknown(hints: dict[str, Any], data: dict, where: str) -> None:
    unknown = sorted(set(data) - set(hints))
    if unknown:
        hint = "".join(_in_profile(f"{where}.{k}" if where else k) for k in unknown)
        raise ConfigError(f"{where + ': ' if where else ''}unknown key(s) {unknown}; known: {sorted(hints)}{hint}")


def _check_keys(cls, data: Any, where: str) -> None:
    """Only the key names of `data` against dataclass `cls`, recursively (from_dict checks the rest)."""
    if not isinstance(data, dict):
        return
    hints = typing.get_type_hints(cls)
    _reject_unknown(hints, data, where)
    for name, tp in hints.items():
        if name in data and dataclasses.is_dataclass(tp):
            _check_keys(tp, data[name], f"{where}.{name}" if where else name)


def from_dict(cls, data: Any, where: str):
    """Build dataclass `cls` from `data`, checking keys and types recursively."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where or 'config'}: expected a section (mapping), got {type(data).__name__} {data!r}")
    hints = typing.get_type_hints(cls)
    _reject_unknown(hints, data, where)
    values = {}
    for name, tp in hints.items():
        if name in data:
            key = f"{where}.{name}" if where else name
            values[name] = from_dict(tp, data[name], key) if dataclasses.is_dataclass(tp) else _check(tp, data[name], key)
    return cls(**values)


def _check(tp: Any, value: Any, key: str) -> Any:
    """`value` if it fits annotation `tp` (ints widen to floats); ConfigError naming `key` otherwise."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _check(option, value, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {value!r} fits none of {args}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: {value!r} is not one of {list(args)}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {type(value).__name__} {value!r}")
        return [_check(args[0], v, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {type(value).__name__} {value!r}")
        return {_check(args[0], k, f"{key} key"): _check(args[1], v, f"{key}.{k}") for k, v in value.items()}
    if tp is float:
        if isinstance(value, str) and _FLOAT_RE.match(value.strip()):
            return float(value)   # YAML 1.1 (PyYAML) reads `1e-6` (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {type(value).__name__} {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {type(value).__name__} {value!r}"
                              " (quote it in YAML)")
        return value
    raise ConfigError(f"{key}: unsupported annotation {tp!r} (a bug in training/config.py)")


def validate(cfg: TrainConfig) -> None:
    """Cross-field and range checks the types cannot express."""
    positive = {
        "rollout.tasks_per_step": cfg.rollout.tasks_per_step, "rollout.rollouts_per_task": cfg.rollout.rollouts_per_task,
        "rollout.max_turns": cfg.rollout.max_turns, "rollout.max_tokens": cfg.rollout.max_tokens,
        "rollout.concurrency": cfg.rollout.concurrency, "rollout.max_string_chars": cfg.rollout.max_string_chars,
        "engine.max_batch": cfg.engine.max_batch,
        "algorithm.ppo_epochs": cfg.algorithm.ppo_epochs,
        "algorithm.micro_batch_size": cfg.algorithm.micro_batch_size, "trainer.save_every": cfg.trainer.save_every,
        "trainer.keep_checkpoints": cfg.trainer.keep_checkpoints,
    }
    for key, v in positive.items():
        if v < 1:
            raise ConfigError(f"{key}: must be >= 1, got {v}")
    if cfg.tools.max_consecutive_failures < 0:
        raise ConfigError(f"tools.max_consecutive_failures: must be >= 0 (0: no limit), got "
                          f"{cfg.tools.max_consecutive_failures}")
    if cfg.tools.preflight_timeout < 0:
        raise ConfigError(f"tools.preflight_timeout: must be >= 0 seconds (0: no start-up request), got "
                          f"{cfg.tools.preflight_timeout}")
    if cfg.engine.linger_ms < 0:
        raise ConfigError(f"engine.linger_ms: must be >= 0 (0: no lingering), got {cfg.engine.linger_ms}")
    try:
        check_memory_fraction(cfg.engine.static_memory_fraction, "engine.static_memory_fraction")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if cfg.optim.lr <= 0 or cfg.optim.grad_clip <= 0:
        raise ConfigError(f"optim.lr and optim.grad_clip must be > 0, got {cfg.optim.lr}, {cfg.optim.grad_clip}")
    if len(cfg.optim.betas) != 2 or not all(0 <= b < 1 for b in cfg.optim.betas):
        raise ConfigError(f"optim.betas: expected two numbers in [0, 1), got {cfg.optim.betas}")
    if cfg.rollout.temperature < 0:
        raise ConfigError(f"rollout.temperature: must be >= 0, got {cfg.rollout.temperature}")
    if cfg.algorithm.ppo_mini_batch_size < 0:
        raise ConfigError(f"algorithm.ppo_mini_batch_size: must be >= 0 (0: the whole step in one optimizer step), "
                          f"got {cfg.algorithm.ppo_mini_batch_size}")
    if cfg.algorithm.correct_sample_boost < 0:
        raise ConfigError(f"algorithm.correct_sample_boost: must be >= 0 (0: off, the paper's form; upstream 0.1), "
                          f"got {cfg.algorithm.correct_sample_boost}")
    _validate_async(cfg)
    if cfg.trainer.total_steps < 0 or cfg.trainer.epochs < 1:
        raise ConfigError(f"trainer.total_steps must be >= 0 and trainer.epochs >= 1, got "
                          f"{cfg.trainer.total_steps}, {cfg.trainer.epochs}")
    if cfg.distributed.backend == "ray":
        try:
            validate_distributed(cfg.distributed, device=cfg.run.device, engine_kind=cfg.engine.kind)
        except DistributedConfigError as exc:
            raise ConfigError(str(exc)) from None


def _validate_async(cfg: TrainConfig) -> None:
    """`algorithm.max_staleness` and what asynchronous training needs of the other sections."""
    a = cfg.algorithm
    if a.max_staleness < 0:
        raise ConfigError(f"algorithm.max_staleness: must be >= 0 (0: synchronous training; 1, 2, ...: rollouts "
                          f"may come from weights that many updates old), got {a.max_staleness}")
    if a.behav_weight_cap <= 1:
        raise ConfigError(f"algorithm.behav_weight_cap: must be > 1 (tokens with pi_prox / pi_behav above it leave "
                          f"the loss; AReaL's behav_imp_weight_cap), got {a.behav_weight_cap}")
    if a.max_staleness == 0:
        return
    why = f"algorithm.max_staleness={a.max_staleness} (asynchronous training)"
    if a.old_logprobs != "engine":
        raise ConfigError(f"algorithm.old_logprobs: {why} takes each token's behaviour log-prob from the engine "
                          f"that sampled it (the decoupled objective's pi_behav; pi_prox is recomputed); "
                          f"set algorithm.old_logprobs=engine")
    if cfg.engine.kind == "hf" and cfg.engine.share_weights:
        raise ConfigError(f"engine.share_weights: {why} generates while the trainer updates, so the engine needs "
                          f"its own copy of the weights; set engine.share_weights=false")
    if cfg.engine.kind == "vllm" and cfg.rollout.constrained:
        raise ConfigError(f"engine.kind: {why} with rollout.constrained needs the log-probs before the constraint, "
                          f"which only engine.kind=hf reports; use engine.kind=hf or rollout.constrained=false")
    if cfg.distributed.backend == "ray" and cfg.distributed.mode != "split":
        raise ConfigError(f"distributed.mode: {why} on Ray needs mode=split: the rollout engines generate on "
                          f"resources of their own while the trainer ranks update (colocated engines share the "
                          f"ranks' process or GPU and wait for the update); set distributed.mode=split or "
                          f"algorithm.max_staleness=0")


def to_dict(cfg: TrainConfig) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def dump_yaml(cfg: TrainConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False)


def save_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write the resolved config as YAML (atomically): loading it back gives the same config."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dump_yaml(cfg))
    tmp.replace(path)


CONFIG_HISTORY = "config_history.jsonl"


def _flat(data: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def save_run_config(cfg: TrainConfig, run_dir: str | Path, step: int) -> None:
    """Write `<run_dir>/config.yaml`.  When the one there holds other values (a resume with changed
    settings), first append it to `config_history.jsonl`: {"until": time, "step": the step the run
    goes on from (the metrics up to it were logged under that config), "changed": {"section.key":
    {"from", "to"}}, "config"}, so the run folder still says how every logged step was made."""
    run_dir = Path(run_dir)
    path = run_dir / "config.yaml"
    if path.exists():
        old = yaml.safe_load(path.read_text()) or {}
        a, b = _flat(old), _flat(yaml.safe_load(dump_yaml(cfg)))
        changed = {k: {"from": a.get(k), "to": b.get(k)} for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
        if changed:
            entry = {"until": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "step": step, "changed": changed,
                     "config": old}
            with (run_dir / CONFIG_HISTORY).open("a", encoding="utf-8") as f:
                f.write(json.dumps(entry, default=str) + "\n")
    save_config(cfg, path)


def fingerprint(cfg: TrainConfig) -> dict[str, Any]:
    """What a checkpoint must agree on to be resumed (model and optimisation shape, not run length)."""
    return {"model.path": cfg.model.path, "model.dtype": cfg.model.dtype,
            "algorithm.advantage": cfg.algorithm.advantage, "optim.scheduler": cfg.optim.scheduler,
            "data.train_files": list(cfg.data.train_files),
            "rollout.tasks_per_step": cfg.rollout.tasks_per_step}
