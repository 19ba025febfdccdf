"""The settings profiles (orchestrator/settings.py, configs/profiles/) and the one builder
(orchestrator/setup.py): merging, lookups, errors that name the key, and that training and
evaluation read the same values."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator.catalog import load_catalog
from orchestrator.settings import PROFILES_DIR, ProfileError, QASettings, Tau2Settings, available, load_profile
from orchestrator.setup import build_runtime, load_prompts, loop_config

REPO = Path(__file__).resolve().parents[2]


def test_every_shipped_profile_loads_with_every_section():
    assert {"default", "paper", "local", "local-vllm", "quickstart"} <= set(available())
    for name in available():
        profile = load_profile(name)
        for kind, uses in (("qa", ("hle", "frames", "train")), ("tau2", ("eval", "train"))):
            for use in uses:
                section = profile.section(kind, use)
                assert isinstance(section, QASettings if kind == "qa" else Tau2Settings)
                # training's orchestrator turns are the training config's rollout.*, evaluation's the profile's
                assert (section.orchestrator is None) == (use == "train"), (name, kind, use)


def test_paper_values_per_benchmark_and_for_training():
    paper = load_profile("paper")
    hle, frames, train = (paper.section("qa", u) for u in ("hle", "frames", "train"))
    assert (hle.retrieval.topk, hle.retrieval.send_eid, hle.retrieval.min_score, hle.retrieval.min_length) == (50, True, 0.1, 101)
    assert (frames.retrieval.topk, frames.retrieval.send_eid, frames.search.single_search) == (150, False, True)
    assert (train.retrieval.topk, train.retrieval.send_eid, train.retrieval.min_score, train.retrieval.min_length) == (30, True, 0.8, 101)
    assert (hle.search.doc_order, hle.search.dedupe, train.search.merge) == ("reverse", "content", "interleave")
    assert (hle.search.min_query_chars, frames.search.min_query_chars) == (5, 10)
    assert (hle.prompts, frames.prompts, train.prompts) == ("upstream-hle", "upstream-frames", "upstream-train")
    # per-benchmark expert overrides merge over the profile's per-model entries, which merge over `default`
    assert frames.expert("gpt-5").context_tokens == 160000 and frames.expert("gpt-5").max_tokens == 40000
    assert hle.expert("gpt-5").context_tokens == 120000
    assert frames.expert("Qwen3-32B").doc_chars is None and hle.expert("Qwen3-32B").doc_chars == 1000
    tau2 = paper.section("tau2", "eval")
    assert (tau2.orchestrator.max_tokens, tau2.orchestrator.temperature) == (8000, 1.0)
    assert (tau2.expert("gpt-5").max_tokens, tau2.user.model, tau2.user.max_tokens) == (40000, "gpt-5", 40000)
    assert paper.section("tau2", "train").max_steps == 40


def test_tool_model_entries_merge_over_the_model_and_default(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: default\n"
                    "qa:\n  hle:\n    experts:\n"
                    "      default: {max_tokens: 100, temperature: 0.3}\n"
                    "      m1: {max_tokens: 200}\n"
                    "      answer:m1: {context_tokens: 7}\n")
    hle = load_profile(mine).section("qa", "hle")
    assert (hle.expert("m1", "answer").max_tokens, hle.expert("m1", "answer").context_tokens) == (200, 7)
    assert hle.expert("m1", "answer").temperature == 0.3
    assert (hle.expert("m1", "search").max_tokens, hle.expert("m1", "search").context_tokens) == (200, 24000)
    assert hle.expert("other").max_tokens == 100
    # the rest of the file comes from `default` (extends), unchanged
    assert hle.retrieval.topk == 3 and load_profile(mine).section("qa", "frames") == load_profile("default").section("qa", "frames")


@pytest.mark.parametrize("text, where", [
    ("qa:\n  hle:\n    retrieval: {topk: 0}\n", r"qa\.hle\.retrieval\.topk: Input should be greater than or equal to 1"),
    ("qa:\n  hle:\n    serach: {}\n", r"qa\.hle\.serach: Extra inputs are not permitted"),
    ("qa:\n  hle:\n    experts:\n      gpt-5: {max_tokns: 3}\n", r"qa\.hle\.experts\.gpt-5\.max_tokns"),
    ("qa: [1, 2]\n", r"qa: expected a mapping"),
    ("tau3: {}\n", r"unknown top-level key\(s\) \['tau3'\]"),
    ("extends: nosuch\n", r"nosuch\.yaml: no such file"),
    ("qa: {hle: {\n", r"invalid YAML"),
])
def test_bad_profiles_name_the_file_and_the_key(tmp_path, text, where):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(ProfileError, match=where):
        load_profile(bad)


def test_missing_section_and_unknown_name_say_what_exists(tmp_path):
    only = tmp_path / "only.yaml"
    only.write_text("qa:\n  hle: {}\n")
    with pytest.raises(ProfileError, match=r"no qa\.frames section; this profile has \['qa\.hle'\]"):
        load_profile(only).section("qa", "frames")
    with pytest.raises(ProfileError, match=r"the shipped profiles are \[.*'paper'"):
        load_profile("papr")


def test_the_builder_gives_the_sections_prompts_and_serving_map():
    profile = load_profile("paper")
    frames = profile.section("qa", "frames")
    runtime = build_runtime(profile, {"qa": frames}, load_catalog())
    assert runtime.qa is frames and runtime.serve == profile.serve and runtime.prompts.style == "upstream-frames"
    assert runtime.budgets.context_tokens == frames.orchestrator.context_tokens
    local = build_runtime(load_profile("local"), {"qa": load_profile("local").section("qa", "hle")}, load_catalog())
    assert local.serve == "local" and local.prompts.style == "ours"
    with pytest.raises(ValueError, match="no 'tau2' settings"):
        runtime.section("tau2")
    config = loop_config(frames, constrained=True)
    assert (config.max_turns, config.max_tokens, config.temperature, config.constrained) == (50, 12000, 1.0, True)
    tau2 = profile.section("tau2", "eval")
    config = loop_config(tau2)
    assert (config.tau2_user_model, config.tau2_user_max_tokens, config.tau2_max_steps) == ("gpt-5", 40000, 200)
    with pytest.raises(ValueError, match="no `orchestrator`"):
        loop_config(profile.section("qa", "train"))
    assert load_prompts(profile.section("qa", "train")).style == "upstream-train"


def test_no_module_builds_a_tool_runtime_but_the_builder():
    """Every `ToolRuntime(...)` / `RoutedRuntime(...)` call outside tests is in orchestrator/setup.py."""
    builders = []
    for path in REPO.rglob("*.py"):
        rel = path.relative_to(REPO)
        if rel.parts[0] in (".venv", "tests", "runs") or "site-packages" in rel.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("ToolRuntime", "RoutedRuntime"):
                    builders.append(str(rel))
    assert builders == [], builders
    assert "cls(**fields" in (REPO / "orchestrator" / "setup.py").read_text()


def test_profiles_dir_is_where_the_docs_say():
    assert PROFILES_DIR == REPO / "configs" / "profiles"
