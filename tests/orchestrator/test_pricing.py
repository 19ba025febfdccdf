"""Whose price an expert call pays (a profile's `pricing`, orchestrator/settings.py PRICING):
the alias model's (`as_alias`: a stand-in reports what the paper's tools would cost) or the
served model's (`as_served`: the open profile's gpt-oss for GPT-5)."""
from __future__ import annotations

import pytest

from orchestrator.catalog import load_catalog
from orchestrator.context import EpisodeState
from orchestrator.records import ExpertCall, LLMResponse, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.settings import ProfileError, available, load_profile
from orchestrator.setup import build_runtime

MILLION = Usage(1_000_000, 1_000_000)


def _runtime(profile, catalog, **kw) -> ToolRuntime:
    def llm(model, messages, **_):
        return LLMResponse(model=model, text="<answer>4</answer>", usage=MILLION)

    return build_runtime(profile, {"qa": profile.section("qa", "hle")}, catalog, llm=llm, **kw)


def _charged(runtime: ToolRuntime, model: str) -> float:
    call = ExpertCall(tool="answer", alias="a", model=model)
    runtime.ask(call, [{"role": "user", "content": "2 + 2?"}], runtime.catalog)
    return call.cost


def test_every_shipped_profile_charges_what_the_implicit_rule_charged():
    """Before `pricing` existed a served model was charged at its own price when tools.json had a
    row for it, else at the alias model's: every shipped profile keeps exactly those charges."""
    catalog = load_catalog()
    alias_models = {spec.model for tool in catalog.tools for spec in tool.aliases.values()}
    for name in available():
        runtime = _runtime(load_profile(name), catalog)
        for model in sorted(alias_models):
            served = runtime.served(model)
            before = served if served != model and served in catalog.prices else model
            assert runtime.priced(model, catalog) == before, (name, model, served)
            assert _charged(runtime, model) == pytest.approx(catalog.llm_cost(before, MILLION)), (name, model)


def test_open_charges_gpt_oss_and_local_charges_gpt5_by_hand():
    catalog = load_catalog()
    open_, local = load_profile("open"), load_profile("local")
    assert (open_.pricing, local.pricing, load_profile("default").pricing) == ("as_served", "as_alias", "as_alias")
    # 1M prompt + 1M completion tokens: gpt-oss-120b $0.15 + $0.60; gpt-5 $1.25 + $10.00
    assert _charged(_runtime(open_, catalog), "gpt-5") == pytest.approx(0.75)
    assert _charged(_runtime(local, catalog), "gpt-5") == pytest.approx(11.25)
    # the same open serving map charged as the alias: GPT-5's price although gpt-oss answered
    assert _charged(_runtime(open_, catalog, pricing="as_alias"), "gpt-5") == pytest.approx(11.25)
    # basic tools mode: the orchestrator answers for every alias, charged as itself when priced ($0.20 + $0.20)
    assert _charged(_runtime(local, catalog, override_model="Qwen3-8B"), "gpt-5") == pytest.approx(0.4)


def test_as_served_needs_a_price_for_every_served_model(tmp_path):
    catalog = load_catalog()
    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: local\npricing: as_served\n")
    with pytest.raises(ValueError, match=r"pricing: as_served .* no price for \['smollm2-135m'\] "
                                         r"\(served under profiles\.local\).*`pricing: as_alias`"):
        _runtime(load_profile(mine), catalog)
    with pytest.raises(ValueError, match=r"pricing: 'cheapest' is not one of \['as_alias', 'as_served'\]"):
        ToolRuntime(catalog=catalog, pricing="cheapest")


def test_unknown_pricing_in_a_profile_names_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: default\npricing: served\n")
    with pytest.raises(ProfileError, match=r"bad\.yaml: pricing: 'served' is not one of \['as_alias', 'as_served'\]"):
        load_profile(bad)


def test_a_whole_call_under_open_is_charged_at_the_served_price():
    runtime = _runtime(load_profile("open"), load_catalog())
    alias = next(a for a, s in runtime.catalog.tool("answer").aliases.items() if s.model == "gpt-5")
    call, answer = runtime.call("answer", alias, EpisodeState("2 + 2?"))
    assert call.error is None and answer == "4"
    assert call.cost == pytest.approx(0.75)
