"""The sandbox's fee: the paper's price per second of wall time, or none (deterministic rewards)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from orchestrator.catalog import load_catalog
from orchestrator.context import EpisodeState
from orchestrator.records import LLMResponse, Usage
from orchestrator.runtime import ToolRuntime
from orchestrator.settings import CostSettings, QASettings


def _runtime(code_fee: str, seconds: float) -> ToolRuntime:
    def llm(model, messages, **kw):
        return LLMResponse(model=model, text="```python\nprint(2)\n```", usage=Usage(10, 5))

    def run_code(code, timeout):
        return SimpleNamespace(stdout="2\n", stderr="", exit_code=0, timed_out=False, duration_s=seconds)

    return ToolRuntime(catalog=load_catalog(), llm=llm, run_code=run_code,
                       sections={"qa": QASettings(costs=CostSettings(code_fee=code_fee))})


def test_code_fee_seconds_charges_wall_time_and_none_charges_tokens_only():
    catalog = load_catalog()
    alias = next(iter(catalog.tool("enhance_reasoning").aliases))
    tokens = catalog.llm_cost(catalog.tool("enhance_reasoning").aliases[alias].model, Usage(10, 5))
    costs = {}
    for fee, seconds in (("seconds", 2.0), ("seconds", 3.0), ("none", 2.0), ("none", 3.0)):
        call, _ = _runtime(fee, seconds).call("enhance_reasoning", alias, EpisodeState("What is 1 + 1?"))
        assert call.error is None and call.output == "2"
        costs[fee, seconds] = call.cost
    assert costs["seconds", 2.0] == pytest.approx(tokens + 2.0 * catalog.fees.code_per_second)
    assert costs["seconds", 3.0] - costs["seconds", 2.0] == pytest.approx(catalog.fees.code_per_second)
    assert costs["none", 2.0] == costs["none", 3.0] == pytest.approx(tokens)   # wall time no longer enters


def test_unknown_code_fee_in_a_profile_is_named(tmp_path):
    from orchestrator.settings import ProfileError, load_profile

    mine = tmp_path / "mine.yaml"
    mine.write_text("extends: default\nqa:\n  train:\n    costs: {code_fee: wall}\n")
    with pytest.raises(ProfileError, match=r"mine.yaml: qa.train.costs.code_fee: Input should be 'seconds' or 'none'"):
        load_profile(mine)
