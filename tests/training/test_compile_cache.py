"""run.compile_cache: torch.compile's caches in one named folder (training/compile_cache.py)."""
from __future__ import annotations

import os

import pytest

from _train_world import fake_runtime, overrides
from training.compile_cache import compile_cache_env, use_compile_cache
from training.config import ConfigError, load_config

VARS = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


@pytest.fixture
def clean_env(monkeypatch):
    for name in VARS:   # setenv first: the original value (or its absence) comes back after the test
        monkeypatch.setenv(name, "unset-by-test")
        monkeypatch.delenv(name)


def test_unset_changes_nothing(clean_env):
    assert compile_cache_env(None) == {} and use_compile_cache(None) == {}
    assert not any(name in os.environ for name in VARS)


def test_a_folder_gets_both_caches_and_inductor_reads_it(tmp_path, clean_env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = use_compile_cache("shared/cc")
    root = (tmp_path / "shared" / "cc").resolve()
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(root / "inductor"), "TRITON_CACHE_DIR": str(root / "triton")}
    assert (root / "inductor").is_dir() and (root / "triton").is_dir()
    from torch._inductor.runtime.runtime_utils import cache_dir
    assert cache_dir() == str(root / "inductor")          # the variable torch actually reads


def test_a_folder_that_cannot_be_made_is_one_error_naming_the_setting(tmp_path, clean_env):
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ConfigError, match=r"run\.compile_cache: cannot create .*file/inductor"):
        use_compile_cache(str(tmp_path / "file"))
    assert not any(name in os.environ for name in VARS)


def test_a_training_run_sets_the_caches_before_it_builds_the_learner(tmp_path, train_world, clean_env):
    """The learner (policy, reference, engine) is where compiling starts: the caches must be set by then."""
    from training.learner import LocalLearner
    from training.session import run

    policy, tasks = train_world
    cfg = load_config(None, overrides(tmp_path, policy, tasks, **{"trainer.total_steps": 1,
                                                                  "run.compile_cache": str(tmp_path / "cc")}))
    seen = []

    def make_learner(*args):
        seen.append(tuple(os.environ.get(name) for name in VARS))
        return LocalLearner(*args)
    run(cfg, runtime=fake_runtime(), make_learner=make_learner)
    assert seen == [(str((tmp_path / "cc" / "inductor").resolve()), str((tmp_path / "cc" / "triton").resolve()))]
