"""Typed training config: YAML <-> dataclasses one to one, overrides with type checks."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from training.config import ConfigError, TrainConfig, load_config, save_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "training" / "configs").glob("*.yaml"))


def test_defaults_are_the_papers_update_values():
    cfg = load_config(None)
    assert (cfg.optim.lr, cfg.optim.weight_decay, cfg.optim.grad_clip, cfg.optim.scheduler) == (1e-6, 0.01, 1.0, "constant")
    assert (cfg.algorithm.eps_low, cfg.algorithm.eps_high, cfg.algorithm.dual_clip) == (0.2, 0.28, 10.0)
    assert (cfg.algorithm.kl_coef, cfg.algorithm.kl_type, cfg.algorithm.ppo_epochs) == (1e-4, "mse", 1)
    assert (cfg.rollout.tasks_per_step, cfg.rollout.rollouts_per_task, cfg.rollout.max_turns) == (16, 8, 30)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_shipped_configs_load_and_cover_every_key(path):
    import yaml

    cfg = load_config(path)
    raw = yaml.safe_load(path.read_text())
    # one to one: every section and key of the dataclasses is written out in the YAML
    for section in dataclasses.fields(TrainConfig):
        assert section.name in raw, f"{path.name}: section {section.name} missing"
        keys = {f.name for f in dataclasses.fields(getattr(cfg, section.name))}
        assert set(raw[section.name]) == keys, f"{path.name}: {section.name} keys differ"


def test_paper_config_holds_the_papers_values():
    cfg = load_config(ROOT / "training" / "configs" / "paper.yaml")
    assert (cfg.rollout.tasks_per_step, cfg.rollout.rollouts_per_task, cfg.rollout.temperature) == (16, 8, 1.0)
    assert (cfg.rollout.max_turns, cfg.rollout.max_tokens, cfg.rollout.context_tokens) == (30, 8768, 24000)
    assert (cfg.optim.lr, cfg.algorithm.kl_coef, cfg.trainer.epochs) == (1e-6, 1e-4, 10)


def test_overrides_parse_as_yaml_and_are_type_checked():
    cfg = load_config(None, ["optim.lr=1e-5", "rollout.constrained=true", "optim.betas=[0.9, 0.95]",
                             "data.default_preference={outcome: 1, cost: 0.5}", "tools.catalog=null",
                             "rollout.temperature=1"])
    assert cfg.optim.lr == 1e-5 and cfg.rollout.constrained is True and cfg.optim.betas == [0.9, 0.95]
    assert cfg.data.default_preference == {"outcome": 1.0, "cost": 0.5}
    assert isinstance(cfg.rollout.temperature, float)      # an int widens to a float field


@pytest.mark.parametrize("override, message", [
    ("optim.lr=fast", "optim.lr: expected a number, got str 'fast'"),
    ("rollout.max_turns=2.5", "rollout.max_turns: expected an integer, got float 2.5"),
    ("rollout.constrained=maybe", "rollout.constrained: expected true or false"),
    ("engine.kind=sglang", "engine.kind: 'sglang' is not one of ['hf', 'vllm']"),
    ("optim.lrr=1", "optim.lrr: unknown key 'lrr' in optim"),
    ("optimiser.lr=1", "unknown key 'optimiser' in the top level"),
    ("optim.lr", "expected key=value"),
    ("optim.lr.x=1", "optim.lr.x: optim.lr is a value, not a section"),
    ("data.default_preference={cost: cheap}", "data.default_preference.cost: expected a number"),
    ("rollout.rollouts_per_task=0", "rollout.rollouts_per_task: must be >= 1"),
    ("engine.static_memory_fraction=0", "engine.static_memory_fraction: must be a number in (0, 1]"),
    ("engine.static_memory_fraction=1.5", "engine.static_memory_fraction: must be a number in (0, 1]"),
    ("engine.compile=fast", "engine.compile: 'fast' is not one of ['regional', 'whole', 'none']"),
])
def test_bad_overrides_name_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_unknown_yaml_key_is_named_with_the_known_ones(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("optim:\n  learning_rate: 1.0e-6\n")
    with pytest.raises(ConfigError, match=r"optim: unknown key\(s\) \['learning_rate'\]; known: .*'lr'") as err:
        load_config(path)
    assert str(err.value).startswith(f"{path}: optim: unknown key(s)")   # the file and the key


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(None, ["optim.lr=3e-6", "run.name=x"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(tmp_path / "config.yaml") == cfg


def test_cli_reports_a_bad_override_without_a_traceback():
    out = subprocess.run([sys.executable, str(ROOT / "training" / "train.py"), "--config",
                          str(ROOT / "training" / "configs" / "paper.yaml"), "optim.lr=fast"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 2
    assert "error: optim.lr: expected a number, got str 'fast'" in out.stderr and "Traceback" not in out.stderr


def test_cli_prints_the_resolved_config(capsys):
    """Its main() in this process (the command itself runs in the test above)."""
    from training.train import main

    code = main(["--config", str(ROOT / "training" / "configs" / "paper.yaml"), "optim.lr=2e-6", "--print-config"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "lr: 2.0e-06" in out.out and load_config(ROOT / "training" / "configs" / "paper.yaml").optim.lr != 2e-6


@pytest.mark.parametrize("override, where", [("tools.topk=30", "qa.train.retrieval.topk"),
                                             ("rollout.tau2_user_model=gpt-5", "tau2.train.user.model"),
                                             ("reward.judge_model=gpt-5", "qa.train.judge.model")])
def test_a_setting_that_lives_in_the_profile_is_refused_naming_where(override, where):
    with pytest.raises(ConfigError, match=rf"{override.split('=')[0]} is a profile setting: write {where}"):
        load_config(ROOT / "training" / "configs" / "paper.yaml", [override])


def test_training_reads_the_profiles_train_sections(tmp_path):
    """paper.yaml's runtime and loop settings are the paper profile's qa.train / tau2.train."""
    from orchestrator.settings import load_profile
    from training.session import build_runtime, rollout_loop_config

    cfg = load_config(ROOT / "training" / "configs" / "paper.yaml")
    runtime, loop = build_runtime(cfg), rollout_loop_config(cfg)
    paper = load_profile("paper")
    assert runtime.qa == paper.section("qa", "train") and runtime.section("tau2") == paper.section("tau2", "train")
    assert runtime.prompts.style == "upstream-train" and runtime.qa.retrieval.topk == 30
    assert (loop.max_turns, loop.max_tokens, loop.temperature) == (30, 8768, 1.0)           # rollout.*
    assert (loop.tau2_user_model, loop.tau2_max_steps) == (paper.section("tau2", "train").user.model, 40)


@pytest.mark.parametrize("share_weights", [True, False])
def test_engine_static_memory_fraction_reaches_the_hf_engines_train_py_builds(train_world, tmp_path, monkeypatch,
                                                                              share_weights):
    """The local learner's engine (shared model or its own copy from model.path) and the Ray rollout
    engines get `engine.static_memory_fraction`; an explicit distributed.engine_args value wins."""
    import orchestrator.engines as engines
    from _train_world import overrides
    from training.distributed.config import DistributedConfig
    from training.distributed.group import rollout_engine_kwargs
    from training.learner import make_engine_for
    from training.policy_setup import load_policy

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **{"engine.static_memory_fraction": 0.6,
                                                                  "engine.share_weights": share_weights,
                                                                  "engine.compile": "whole"}))
    seen, make = [], engines.make_engine
    monkeypatch.setattr(engines, "make_engine", lambda kind, path, **kw: seen.append(kw) or make(kind, path, **kw))
    model, tokenizer = load_policy(str(policy), cfg.model.dtype, "cpu")
    make_engine_for(cfg, model, tokenizer, str(policy)).close()
    assert [kw["static_memory_fraction"] for kw in seen] == [0.6]
    assert [kw["static_compile"] for kw in seen] == ["whole"]                 # engine.compile
    assert rollout_engine_kwargs(cfg, DistributedConfig(backend="ray"), ipc=False)["static_compile"] == "whole"
    assert rollout_engine_kwargs(cfg, DistributedConfig(backend="ray"), ipc=False)["static_memory_fraction"] == 0.6
    assert rollout_engine_kwargs(cfg, DistributedConfig(backend="ray", engine_args={"static_memory_fraction": 0.9}),
                                 ipc=False)["static_memory_fraction"] == 0.9
    vllm = load_config(None, overrides(tmp_path, policy, tasks, **{"engine.kind": "vllm"}))
    assert "static_memory_fraction" not in rollout_engine_kwargs(vllm, DistributedConfig(backend="ray"), ipc=False)
